//! The parsed, columnar form of one chunk, shared (`Arc`) by every session that reads it.
//!
//! Per stream, flat buffers — no allocation per sample or per sequence:
//! * `seq_offsets[i]..seq_offsets[i + 1]` are the samples of the chunk's `i`-th sequence;
//! * dense: sample `j` is `values[j * dim .. (j + 1) * dim]`;
//! * sparse: sample `j` has entries `sample_offsets[j] .. sample_offsets[j + 1]` of `indices` and
//!   `values`, in file order, duplicates kept;
//! * strings (deepx uuids): sample `j` is `bytes[str_offsets[j] .. str_offsets[j + 1]]`.
//!
//! Streams of one sequence may have different sample counts (seq2seq, CNTK §1.11.4).

use std::sync::Arc;

use crate::format::errors::Malformed;

pub use minibatchd_sys::{Column, FileMapping};

/// Element values of a stream of a chunk, in the dataset's precision: owned when parsed, a
/// mapped range of the entry when read from the parsed cache ([`Column`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// `precision = "float32"`.
    F32(Column<f32>),
    /// `precision = "float64"`.
    F64(Column<f64>),
}

impl Values {
    /// Number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::F64(v) => v.len(),
        }
    }

    /// Whether there are no values.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.len() * 4,
            Self::F64(v) => v.len() * 8,
        }
    }

    fn shrink_to_fit(&mut self) {
        match self {
            Self::F32(x) => x.shrink_to_fit(),
            Self::F64(x) => x.shrink_to_fit(),
        }
    }

    /// The mapping the values are read from, if they are a mapped file's.
    #[must_use]
    pub fn mapping(&self) -> Option<&Arc<FileMapping>> {
        match self {
            Self::F32(x) => x.mapping(),
            Self::F64(x) => x.mapping(),
        }
    }

    fn own(&mut self) {
        match self {
            Self::F32(x) => x.own(),
            Self::F64(x) => x.own(),
        }
    }
    fn select(&self, ranges: &[(usize, usize)]) -> Self {
        match self {
            Self::F32(x) => Self::F32(select(x, ranges).into()),
            Self::F64(x) => Self::F64(select(x, ranges).into()),
        }
    }
}

/// The elements of `ranges` of `from`, one after the other.
fn select<T: Copy>(from: &[T], ranges: &[(usize, usize)]) -> Vec<T> {
    let mut out = Vec::with_capacity(ranges.iter().map(|&(a, b)| b - a).sum());
    for &(a, b) in ranges {
        out.extend_from_slice(&from[a..b]);
    }
    out
}

/// The sparse indices of one stream of a chunk.
///
/// deepx feature ids are `u64`s, delivered as such; a chunk whose ids all fit in 32 bits
/// (LIBSVM-style data numbers its features, and the hashing trick commonly uses 2^18–2^32
/// buckets) keeps them as `u32` and the gather widens them — a third less memory per feature
/// for the parse to write and the chunk cache to hold. Ids hashed to 64 bits keep 8 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Indices {
    /// CTF: int32 below the stream's dimension (CNTK's `IndexType`).
    I32(Column<i32>),
    /// deepx feature ids that all fit in 32 bits, delivered as `u64`.
    U32(Column<u32>),
    /// deepx feature ids.
    U64(Column<u64>),
}

impl Indices {
    /// Bytes held.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        match self {
            Self::I32(v) => v.len() * 4,
            Self::U32(v) => v.len() * 4,
            Self::U64(v) => v.len() * 8,
        }
    }

    /// The mapping the indices are read from, if they are a mapped file's.
    #[must_use]
    pub fn mapping(&self) -> Option<&Arc<FileMapping>> {
        match self {
            Self::I32(x) => x.mapping(),
            Self::U32(x) => x.mapping(),
            Self::U64(x) => x.mapping(),
        }
    }

    fn own(&mut self) {
        match self {
            Self::I32(x) => x.own(),
            Self::U32(x) => x.own(),
            Self::U64(x) => x.own(),
        }
    }

    fn select(&self, ranges: &[(usize, usize)]) -> Self {
        match self {
            Self::I32(x) => Self::I32(select(x, ranges).into()),
            Self::U32(x) => Self::U32(select(x, ranges).into()),
            Self::U64(x) => Self::U64(select(x, ranges).into()),
        }
    }

    /// Whether these are deepx feature ids (delivered as `u64`), however stored.
    #[must_use]
    pub fn is_feature_ids(&self) -> bool {
        !matches!(self, Self::I32(_))
    }
}

/// The data of one stream within a chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamValues {
    /// Dense samples of `dim` values.
    Dense {
        /// Values per sample.
        dim: usize,
        /// `num_samples * dim` values.
        values: Values,
    },
    /// Sparse samples (CSR per sample).
    Sparse {
        /// Entry offsets, one more than samples.
        sample_offsets: Vec<usize>,
        /// Column indices, file order.
        indices: Indices,
        /// Entry values.
        values: Values,
    },
    /// One string per sample (deepx uuids).
    Strings {
        /// Byte offsets, one more than samples.
        offsets: Vec<usize>,
        /// Concatenated UTF-8 bytes.
        bytes: Vec<u8>,
    },
}

/// One stream of a parsed chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamData {
    /// Sample offsets of each sequence; one more than sequences.
    pub seq_offsets: Vec<usize>,
    /// The samples.
    pub data: StreamValues,
    /// `seq_offsets` is `0, 1, 2, ..`: every sequence is one sample.
    unit_sequences: bool,
    /// A sparse or string stream's `sample_offsets` (`offsets`) is `0, 1, 2, ..`: every sample is
    /// one entry (a one-hot label, a uuid byte...). Always false for dense streams.
    unit_entries: bool,
}

/// `offsets` is `0, 1, .., offsets.len() - 1`.
fn is_identity(offsets: &[usize]) -> bool {
    offsets.iter().enumerate().all(|(i, &o)| o == i)
}

impl StreamData {
    /// A stream of `data` whose sequences are `seq_offsets`. The offsets are read once here to
    /// know whether they are the identity — every sequence one sample, and in a sparse stream
    /// every sample one entry, as in line-mode CTF with one-hot labels and in every deepx
    /// format — so that the gather, which reads chunks at random, need not look them up.
    #[must_use]
    pub fn new(seq_offsets: Vec<usize>, data: StreamValues) -> Self {
        let unit_sequences = is_identity(&seq_offsets);
        let unit_entries = match &data {
            StreamValues::Sparse { sample_offsets: o, .. } | StreamValues::Strings { offsets: o, .. } => is_identity(o),
            StreamValues::Dense { .. } => false,
        };
        Self { seq_offsets, data, unit_sequences, unit_entries }
    }

    /// Samples `s0..s1` of sequence `i` of the chunk.
    #[inline]
    #[must_use]
    pub fn sample_range(&self, i: usize) -> (usize, usize) {
        if self.unit_sequences {
            (i, i + 1)
        } else {
            (self.seq_offsets[i], self.seq_offsets[i + 1])
        }
    }

    /// Whether every sequence is one sample (`seq_offsets` is the identity).
    #[must_use]
    pub fn unit_sequences(&self) -> bool {
        self.unit_sequences
    }

    /// Whether every sample of a sparse or string stream is one entry.
    #[must_use]
    pub fn unit_entries(&self) -> bool {
        self.unit_entries
    }

    /// Gives back what the parse over-allocated (a `Vec` grows by doubling), so the memory a
    /// cached chunk holds is what [`StreamData::size_bytes`] reports to the cache's budget.
    pub fn shrink_to_fit(&mut self) {
        self.seq_offsets.shrink_to_fit();
        match &mut self.data {
            StreamValues::Dense { values, .. } => values.shrink_to_fit(),
            StreamValues::Sparse { sample_offsets, indices, values } => {
                sample_offsets.shrink_to_fit();
                match indices {
                    Indices::I32(x) => x.shrink_to_fit(),
                    Indices::U32(x) => x.shrink_to_fit(),
                    Indices::U64(x) => x.shrink_to_fit(),
                }
                values.shrink_to_fit();
            }
            StreamValues::Strings { offsets, bytes } => {
                offsets.shrink_to_fit();
                bytes.shrink_to_fit();
            }
        }
    }

    /// The mapping a column of the stream is read from (read from the parsed cache), if any.
    #[must_use]
    pub fn mapping(&self) -> Option<&Arc<FileMapping>> {
        match &self.data {
            StreamValues::Dense { values, .. } => values.mapping(),
            StreamValues::Sparse { indices, values, .. } => indices.mapping().or_else(|| values.mapping()),
            StreamValues::Strings { .. } => None,
        }
    }

    /// Copies the stream's mapped columns into memory of the process's own.
    fn own_memory(&mut self) {
        match &mut self.data {
            StreamValues::Dense { values, .. } => values.own(),
            StreamValues::Sparse { indices, values, .. } => {
                indices.own();
                values.own();
            }
            StreamValues::Strings { .. } => {}
        }
    }

    /// The sequences `locals` of this stream (its sequence indices, in that order, repeats
    /// allowed), copied into a stream of their own (see [`ParsedChunk::select`]).
    #[must_use]
    pub fn select(&self, locals: &[usize]) -> Self {
        let samples: Vec<(usize, usize)> = locals.iter().map(|&i| self.sample_range(i)).collect();
        let mut seq_offsets = Vec::with_capacity(locals.len() + 1);
        seq_offsets.push(0);
        for &(s0, s1) in &samples {
            seq_offsets.push(seq_offsets[seq_offsets.len() - 1] + (s1 - s0));
        }
        // The entries of a sample range (and the offsets of its samples, rebased).
        let entries = |offsets: &[usize]| -> (Vec<(usize, usize)>, Vec<usize>) {
            let mut new_offsets = Vec::with_capacity(seq_offsets[seq_offsets.len() - 1] + 1);
            new_offsets.push(0);
            let ranges = samples
                .iter()
                .map(|&(s0, s1)| {
                    for s in s0..s1 {
                        new_offsets.push(new_offsets[new_offsets.len() - 1] + (offsets[s + 1] - offsets[s]));
                    }
                    (offsets[s0], offsets[s1])
                })
                .collect();
            (ranges, new_offsets)
        };
        let data = match &self.data {
            StreamValues::Dense { dim, values } => {
                let ranges: Vec<_> = samples.iter().map(|&(s0, s1)| (s0 * dim, s1 * dim)).collect();
                StreamValues::Dense { dim: *dim, values: values.select(&ranges) }
            }
            StreamValues::Sparse { sample_offsets, indices, values } => {
                let (ranges, sample_offsets) = entries(sample_offsets);
                StreamValues::Sparse {
                    sample_offsets,
                    indices: indices.select(&ranges),
                    values: values.select(&ranges),
                }
            }
            StreamValues::Strings { offsets, bytes } => {
                let (ranges, offsets) = entries(offsets);
                StreamValues::Strings { offsets, bytes: select(bytes, &ranges) }
            }
        };
        Self::new(seq_offsets, data)
    }

    /// Bytes held in memory of the process's own: a mapped column's are the mapping's, which
    /// [`ParsedChunk::size_bytes`] counts whole.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        // Counts lengths: [`StreamData::shrink_to_fit`] makes the capacities equal them.
        fn own(size: usize, mapped: bool) -> usize {
            if mapped {
                0
            } else {
                size
            }
        }
        let payload = match &self.data {
            StreamValues::Dense { values, .. } => own(values.size_bytes(), values.mapping().is_some()),
            StreamValues::Sparse { sample_offsets, indices, values } => {
                sample_offsets.len() * 8
                    + own(indices.size_bytes(), indices.mapping().is_some())
                    + own(values.size_bytes(), values.mapping().is_some())
            }
            StreamValues::Strings { offsets, bytes } => offsets.len() * 8 + bytes.len(),
        };
        payload + self.seq_offsets.len() * 8
    }
}

/// A parsed chunk: sequences in chunk order, streams in dataset order.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedChunk {
    /// The chunk's index in the dataset.
    pub chunk: usize,
    /// Number of sequences.
    pub num_sequences: usize,
    /// One entry per configured stream.
    pub streams: Vec<StreamData>,
    /// The malformed places its parse found and left out, per source in file order (the first
    /// `max_errors + 1` of each: more cannot change where a budget runs out): kept with the chunk
    /// where each reader charges its own budget ([`crate::dataset::Dataset::charge_per_reader`]);
    /// empty otherwise, and for a chunk of the parsed cache (only clean chunks are persisted).
    pub malformed: Vec<Vec<Malformed>>,
}

impl ParsedChunk {
    /// Whether any column is a mapped file's (read from the parsed cache).
    #[must_use]
    pub fn is_mapped(&self) -> bool {
        self.mapping().is_some()
    }

    /// The mapping of the persisted entry the chunk's mapped columns are read from, if any (one
    /// entry, one mapping, shared by its columns).
    #[must_use]
    pub fn mapping(&self) -> Option<&Arc<FileMapping>> {
        self.streams.iter().find_map(StreamData::mapping)
    }

    /// The same chunk with every column in memory of the process's own (a clone's mapped columns
    /// share the mapping, not the chunk): a mapped entry's pages are the page cache's 4 KiB pages,
    /// which the gather's random reads miss in the TLB more often than huge pages of the
    /// process's own; the daemon swaps the copy in, in the background, for the sweeps after the
    /// first. The copy is made for huge pages: its columns are always advised them (a caller
    /// whose `huge_pages` is off has no reason to copy).
    #[must_use]
    pub fn into_owned_memory(mut self) -> Self {
        self.streams.iter_mut().for_each(StreamData::own_memory);
        self
    }

    /// The sequences `locals` of this chunk (indices among its sequences, in that order, repeats
    /// allowed) copied into a chunk of their own, which keeps nothing of this one: what a
    /// minibatch gathered a chunk at a time holds of each chunk once the chunk is let go
    /// ([`crate::minibatch::Parts`]).
    #[must_use]
    pub fn select(&self, locals: &[usize]) -> Self {
        Self {
            chunk: self.chunk,
            num_sequences: locals.len(),
            streams: self.streams.iter().map(|s| s.select(locals)).collect(),
            // Charged when the chunk was loaded.
            malformed: Vec::new(),
        }
    }

    /// Bytes held by the buffers (for the memory budget). A chunk read from the parsed cache
    /// counts its whole mapping beside the copies made from it (its offsets): the
    /// checksum read every page of the mapping in, and a page of offsets that shares a 2 MiB
    /// folio with a column stays mapped as long as the column (counting only the mapped
    /// columns, a 26 GiB file's mapped chunks held ~4 % more than counted). The malformed places
    /// kept with it count too.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.streams.iter().map(StreamData::size_bytes).sum::<usize>()
            + self.mapping().map_or(0, |m| m.len())
            + std::mem::size_of::<Self>()
            + self.malformed.iter().flatten().map(|m| std::mem::size_of::<Malformed>() + m.message.len()).sum::<usize>()
    }
}

/// How a stream's samples are stored, as consumers (dump, the daemon's schema) see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// `dim` values per sample.
    Dense,
    /// CSR per sample with int32 indices below `dim` (CTF).
    SparseI32,
    /// CSR per sample with u64 feature ids as written (deepx); `dim` is 0: ids are unbounded.
    SparseU64,
    /// One byte string per sample (deepx uuids).
    Strings,
}

impl StreamKind {
    /// `dense`, `sparse` or `strings`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dense => "dense",
            Self::SparseI32 | Self::SparseU64 => "sparse",
            Self::Strings => "strings",
        }
    }
}

/// Name, storage and dimension of one stream of a dataset, in [`ParsedChunk::streams`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// The name in minibatches (the config's stream name, or a deepx tensor name).
    pub name: String,
    /// How samples are stored.
    pub kind: StreamKind,
    /// Values per dense sample; the index bound of a CTF sparse stream; 0 for deepx ids and
    /// strings.
    pub dim: usize,
}
