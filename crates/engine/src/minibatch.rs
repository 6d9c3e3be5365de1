//! Minibatch assembly: [`gather`] locates a [`MinibatchPlan`]'s sequences in the parsed chunks it
//! names (every size known before a byte moves); [`Gathered::fill`] copies one tensor of the slot's
//! tensor table ([`minibatchd_shm::table`]) — into a shared-memory slot through
//! [`minibatchd_shm::SlotSource`] (the daemon) or into owned buffers ([`Gathered::to_minibatch`],
//! `dump`). It is the only place that copies sample data.

use std::collections::HashMap;
use std::sync::Arc;

use crate::format::chunk::{ParsedChunk, StreamKind, StreamSpec, StreamValues, Values};
use crate::format::errors::DataError;
use crate::sampling::{MinibatchPlan, Timeline};
use crate::Result;

pub use crate::hash::{ChunkMap, ChunkSet, IdHasher};

mod fill;
mod mixture;
mod parts;

pub use mixture::{gather_mixture, gather_mixture_copied, MixtureTensors};
pub use parts::Parts;

/// The sparse indices of a minibatch ([`MbData::Sparse`]): int32 for CTF, u64 for deepx ids
/// (a chunk's [`Indices`](crate::format::chunk::Indices) widened).
pub use minibatchd_shm::owned::Indices as MbIndices;
/// The values of a minibatch ([`MbData`]), owned (a chunk's [`Values`] may be mapped).
pub use minibatchd_shm::owned::Values as MbValues;
pub use minibatchd_shm::owned::{MbData, MbStream, Minibatch};
pub use minibatchd_shm::table::{DType, Field, SlotSource, TensorDesc};

/// Source of parsed chunks for [`gather`] (the session's held chunks: [`crate::feed::Feeder`]).
pub trait ChunkSource {
    /// The parsed chunk `chunk`.
    ///
    /// # Errors
    /// Whatever loading it failed with.
    fn chunk(&mut self, chunk: u32) -> Result<Arc<ParsedChunk>, DataError>;
}

impl<S: std::hash::BuildHasher> ChunkSource for HashMap<u32, Arc<ParsedChunk>, S> {
    fn chunk(&mut self, chunk: u32) -> Result<Arc<ParsedChunk>> {
        self.get(&chunk).cloned().ok_or_else(|| DataError::Dataset(format!("chunk {chunk} is not loaded")))
    }
}

fn i64_of(x: usize) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// Where a run of sequences of a stream lies that follow each other in one chunk (one sequence
/// of a randomized minibatch; many of one read in file order): a chunk of the [`Gathered`] and
/// its ranges there.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Index into [`Gathered::chunks`].
    chunk: usize,
    /// Index of the stream in that chunk (a mixture's sources may order their streams
    /// differently: [`gather_mixture`]).
    stream: usize,
    /// Sample range in the chunk's stream.
    s0: usize,
    s1: usize,
    /// Entry range (sparse entries, string bytes; dense: values) in the chunk's stream.
    e0: usize,
    e1: usize,
}

/// The most heap memory a producer's minibatches of up to `sequences` sequences of `streams`
/// streams take from their plans to their slots, with `in_flight` of them gathered at once: the
/// plan being built and gathered (each sequence's reference and last-use mark, at most one sweep
/// start and one chunk let go of per sequence, twice that as the vectors grow by doubling; a
/// mixture's source of each; where each lies in the chunks), and each gathered one (the chunks it
/// holds, each stream's pieces and sequence ends, the copy's list of source arrays). A minibatch
/// of millions of short sequences takes more of it than of its slot (a one-value sample is 4
/// bytes there, about 100 here); the daemon reserves it at `open`.
#[must_use]
pub fn memory_bound(sequences: u64, streams: usize, in_flight: u64) -> u64 {
    use std::mem::size_of;
    let plan = 2 * (size_of::<crate::sampling::SeqRef>() + size_of::<bool>() + size_of::<usize>() + size_of::<u32>())
        + size_of::<u32>()
        + size_of::<(usize, usize)>();
    let stream = size_of::<Piece>() + size_of::<usize>();
    let gathered = size_of::<Arc<ParsedChunk>>() + size_of::<fill::Array<'static>>() + streams.saturating_mul(stream);
    sequences.saturating_mul((plan as u64).saturating_add(in_flight.saturating_mul(gathered as u64)))
}

/// What kind of stream, with the element types a gathered stream copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Dense { dim: usize, f64: bool },
    Sparse { dim: usize, f64: bool, u64_ids: bool },
    Strings,
}

/// One stream of a [`Gathered`] minibatch.
#[derive(Debug, Clone)]
struct GatheredStream {
    shape: Shape,
    /// Index of the stream in the minibatch.
    index: usize,
    pieces: Vec<Piece>,
    /// Samples of the stream up to the end of each sequence, in order (the sequence offsets
    /// after the leading 0): a piece may hold several sequences.
    sequence_ends: Vec<usize>,
    samples: usize,
    entries: usize,
    /// Some piece's entry range is read from its stream's offsets (pass 3 of [`assemble`]).
    entries_later: bool,
}

/// A minibatch located but not yet copied: for every stream, where each sequence's samples lie
/// in the parsed chunks. Every size is known before a byte moves, so the daemon writes the
/// samples straight into a shared-memory slot ([`minibatchd_shm::Ring::write`]) and `dump`
/// into owned buffers ([`Gathered::to_minibatch`]) — the same copying code for both.
#[derive(Debug, Clone)]
pub struct Gathered {
    /// 0-based index in the session.
    pub index: u64,
    /// Sweep at the start of the minibatch.
    pub sweep: u64,
    /// Whether the minibatch ends at or crosses a sweep boundary.
    pub end_of_sweep: bool,
    /// Checkpoint position after this minibatch.
    pub position: u64,
    /// The data-order ledger's fingerprint of the plan.
    pub fingerprint: u64,
    chunks: Vec<Arc<ParsedChunk>>,
    streams: Vec<GatheredStream>,
    /// A mixture's minibatch: what its slot carries after the streams ([`MixtureTensors`]).
    pub mixture: Option<MixtureTensors>,
}

fn shape_of(sd: &StreamValues) -> Shape {
    match sd {
        StreamValues::Dense { dim, values } => Shape::Dense { dim: *dim, f64: matches!(values, Values::F64(_)) },
        StreamValues::Sparse { indices, values, .. } => {
            Shape::Sparse { dim: 0, f64: matches!(values, Values::F64(_)), u64_ids: indices.is_feature_ids() }
        }
        StreamValues::Strings { .. } => Shape::Strings,
    }
}

/// What one stream of every minibatch of a dataset looks like — kind, dimension, precision —
/// whatever its data: the tensor table of a minibatch without sequences (a worker's empty share)
/// is the same as that of a full one, so clients can rely on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamShape {
    /// How samples are stored.
    pub kind: StreamKind,
    /// Values per dense sample; the sparse index bound (0 for deepx ids and strings).
    pub dim: usize,
    /// Values are float64 (`precision = "float64"`).
    pub float64: bool,
}

impl std::fmt::Display for StreamShape {
    /// As a configuration says it: `dense, dim 2, float32`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let precision = if self.float64 { "float64" } else { "float32" };
        match self.kind {
            StreamKind::Dense => write!(f, "dense, dim {}, {precision}", self.dim),
            StreamKind::SparseI32 => write!(f, "sparse, dim {}, {precision}", self.dim),
            StreamKind::SparseU64 => write!(f, "sparse with 64-bit ids, {precision}"),
            StreamKind::Strings => write!(f, "strings"),
        }
    }
}

impl StreamShape {
    /// The shapes of `streams` in a dataset of the given precision.
    #[must_use]
    pub fn of(streams: &[StreamSpec], float64: bool) -> Vec<Self> {
        streams.iter().map(|s| Self { kind: s.kind, dim: s.dim, float64 }).collect()
    }

    fn shape(self) -> Shape {
        match self.kind {
            StreamKind::Dense => Shape::Dense { dim: self.dim, f64: self.float64 },
            StreamKind::SparseI32 => Shape::Sparse { dim: self.dim, f64: self.float64, u64_ids: false },
            StreamKind::SparseU64 => Shape::Sparse { dim: self.dim, f64: self.float64, u64_ids: true },
            StreamKind::Strings => Shape::Strings,
        }
    }
}

/// Locates minibatch `index` of `plan` in the chunks it names (loading them through `chunks`).
///
/// `frame_mode`: CNTK's `FramePacker` — a sequence with more than one sample is fatal.
///
/// # Errors
/// A chunk that cannot be loaded, or a frame-mode violation.
pub fn gather(
    index: u64,
    plan: &MinibatchPlan,
    timeline: &Timeline,
    shapes: &[StreamShape],
    frame_mode: bool,
    chunks: &mut dyn ChunkSource,
) -> Result<Gathered> {
    let mut held: Vec<Arc<ParsedChunk>> = Vec::new();
    let mut local_of: ChunkMap<usize> = ChunkMap::default();
    // Pass 1: resolve each sequence's chunk and prefetch its offsets; the sequences sit at random
    // places of the window, so each lookup below is a cache miss — issued together, they overlap.
    let mut located: Vec<(usize, usize)> = Vec::with_capacity(plan.sequences.len());
    for r in &plan.sequences {
        let at = if let Some(&at) = local_of.get(&r.chunk) {
            at
        } else {
            let chunk = chunks.chunk(r.chunk)?;
            if chunk.streams.len() != shapes.len() {
                // A caller that took the streams from `config().streams()` (CTF streams only) for
                // a deepx dataset: refuse instead of indexing out of bounds. Use `Dataset::streams()`.
                return Err(DataError::Dataset(format!(
                    "chunk {} has {} streams but {} stream shapes were given",
                    r.chunk,
                    chunk.streams.len(),
                    shapes.len()
                )));
            }
            held.push(chunk);
            local_of.insert(r.chunk, held.len() - 1);
            held.len() - 1
        };
        let local = (r.seq as usize)
            .checked_sub(timeline.chunk_start[r.chunk as usize])
            .filter(|&l| l < held[at].num_sequences)
            .ok_or_else(|| DataError::Dataset(format!("sequence {} is not in chunk {}", r.seq, r.chunk)))?;
        for sd in held[at].streams.iter().filter(|sd| !sd.unit_sequences()) {
            minibatchd_sys::prefetch(&sd.seq_offsets[local..=local + 1]);
        }
        located.push((at, local));
    }
    assemble(index, plan, shapes, frame_mode, held, &located, &[])
}

/// Errors unless chunk `chunk` (`parsed`, its streams in the order `map` gives) stores each of
/// `streams` with the declared kind, precision and dimension.
fn check_streams(parsed: &ParsedChunk, map: Option<&[usize]>, streams: &[GatheredStream], chunk: u32) -> Result<()> {
    for (k, out) in streams.iter().enumerate() {
        let stream = map.and_then(|m| m.get(k).copied()).unwrap_or(k);
        let Some(sd) = parsed.streams.get(stream) else {
            return Err(DataError::Dataset(format!("chunk {chunk} has no stream {stream}")));
        };
        if shape_of_kind(shape_of(&sd.data)) != shape_of_kind(out.shape) {
            return Err(DataError::Dataset(format!(
                "stream {} of chunk {chunk} is not stored as the dataset declares (kind or precision)",
                out.index
            )));
        }
        if let (StreamValues::Dense { dim, .. }, Shape::Dense { dim: declared, .. }) = (&sd.data, out.shape) {
            if *dim != declared {
                return Err(DataError::Dataset(format!(
                    "stream {} of chunk {chunk} has dimension {dim}, the dataset declares {declared}",
                    out.index
                )));
            }
        }
    }
    Ok(())
}

/// Passes 2 and 3 of [`gather`]: the sample and entry ranges of the plan's sequences, sequence
/// `i` of the plan being sequence `located[i].1` of `held[located[i].0]`. Stream `k` of the
/// minibatch is stream `maps[c][k]` of held chunk `c`, or stream `k` where `maps` has no entry
/// for it (a single dataset's chunks).
fn assemble(
    index: u64,
    plan: &MinibatchPlan,
    shapes: &[StreamShape],
    frame_mode: bool,
    held: Vec<Arc<ParsedChunk>>,
    located: &[(usize, usize)],
    maps: &[&[usize]],
) -> Result<Gathered> {
    let mut streams: Vec<GatheredStream> = shapes
        .iter()
        .enumerate()
        .map(|(si, sh)| GatheredStream {
            shape: sh.shape(),
            index: si,
            pieces: Vec::with_capacity(plan.sequences.len()),
            sequence_ends: Vec::with_capacity(plan.sequences.len()),
            samples: 0,
            entries: 0,
            entries_later: false,
        })
        .collect();
    // Each chunk's streams are checked against the declared shapes once, at its first sequence.
    let mut checked = vec![false; held.len()];
    // Pass 2: sample ranges (and prefetch the entry offsets of sparse and string streams).
    for (&(at, local), r) in located.iter().zip(&plan.sequences) {
        let map = maps.get(at).copied();
        if !checked[at] {
            check_streams(&held[at], map, &streams, r.chunk)?;
            checked[at] = true;
        }
        for (k, out) in streams.iter_mut().enumerate() {
            let stream = map.and_then(|m| m.get(k).copied()).unwrap_or(k);
            // `check_streams` found it.
            let sd = &held[at].streams[stream];
            let (s0, s1) = sd.sample_range(local);
            if frame_mode && s1 - s0 > 1 {
                return Err(DataError::NonFrame {
                    seq: u64::from(r.seq),
                    chunk: r.chunk,
                    samples: (s1 - s0) as u64,
                    stream: Some(k),
                });
            }
            // Entry ranges known from the sample range (dense, one entry a sample) now; the
            // others read the stream's offsets in pass 3, prefetched here.
            let (e0, e1) = match &sd.data {
                StreamValues::Dense { dim, .. } => (s0 * dim, s1 * dim),
                _ if sd.unit_entries() => (s0, s1),
                StreamValues::Sparse { sample_offsets: o, .. } | StreamValues::Strings { offsets: o, .. } => {
                    minibatchd_sys::prefetch(&o[s0..=s1]);
                    out.entries_later = true;
                    (0, 0)
                }
            };
            match out.pieces.last_mut() {
                // The sequence right after the last one in the same chunk: one copy for both.
                Some(last) if last.chunk == at && last.stream == stream && last.s1 == s0 => {
                    (last.s1, last.e1) = (s1, e1);
                }
                _ => out.pieces.push(Piece { chunk: at, stream, s0, s1, e0, e1 }),
            }
            out.samples += s1 - s0;
            out.entries += e1 - e0;
            out.sequence_ends.push(out.samples);
        }
    }
    // Pass 3: the entry ranges that the offsets give.
    for s in streams.iter_mut().filter(|s| s.entries_later) {
        s.entries = 0;
        for p in &mut s.pieces {
            let sd = &held[p.chunk].streams[p.stream];
            (p.e0, p.e1) = match &sd.data {
                StreamValues::Dense { dim, .. } => (p.s0 * dim, p.s1 * dim),
                StreamValues::Sparse { .. } | StreamValues::Strings { .. } if sd.unit_entries() => (p.s0, p.s1),
                StreamValues::Sparse { sample_offsets: o, .. } | StreamValues::Strings { offsets: o, .. } => {
                    (o[p.s0], o[p.s1])
                }
            };
            s.entries += p.e1 - p.e0;
        }
    }
    Ok(Gathered {
        index,
        sweep: plan.sweep,
        end_of_sweep: plan.end_of_sweep,
        position: plan.position,
        fingerprint: plan.fingerprint(),
        chunks: held,
        streams,
        mixture: None,
    })
}

/// The shape a chunk's stream reports, for comparing kinds and precisions (dims aside).
fn shape_of_kind(s: Shape) -> Shape {
    match s {
        Shape::Dense { f64, .. } => Shape::Dense { dim: 0, f64 },
        Shape::Sparse { f64, u64_ids, .. } => Shape::Sparse { dim: 0, f64, u64_ids },
        Shape::Strings => Shape::Strings,
    }
}

impl Gathered {
    /// Number of streams.
    #[must_use]
    pub fn num_streams(&self) -> usize {
        self.streams.len()
    }

    /// The tensors, in slot order: per stream `sequence_offsets` then the stream's arrays.
    #[must_use]
    pub fn tensors(&self) -> Vec<TensorDesc> {
        <Self as SlotSource>::tensors(self)
    }

    /// Copies tensor `t`'s data into `out`, which is exactly `t.nbytes()` long.
    pub fn fill(&self, t: &TensorDesc, out: &mut [u8]) {
        <Self as SlotSource>::fill(self, t, out);
    }

    /// The minibatch in owned buffers (what `dump` prints).
    #[must_use]
    pub fn to_minibatch(&self) -> Minibatch {
        fn filled<T: minibatchd_sys::Pod + Default>(g: &Gathered, t: &TensorDesc) -> Vec<T> {
            let mut v = vec![T::default(); t.nbytes() / std::mem::size_of::<T>()];
            g.fill(t, minibatchd_sys::as_bytes_mut(&mut v));
            v
        }
        let values = |t: &TensorDesc| {
            if t.dtype == DType::F64 {
                MbValues::F64(filled(self, t))
            } else {
                MbValues::F32(filled(self, t))
            }
        };
        let tensors = self.tensors();
        let mut streams = Vec::with_capacity(self.streams.len());
        let mut k = 0;
        for s in &self.streams {
            let sequence_offsets = filled::<i64>(self, &tensors[k]);
            let data = match s.shape {
                Shape::Dense { dim, .. } => {
                    k += 2;
                    MbData::Dense { dim, values: values(&tensors[k - 1]) }
                }
                Shape::Sparse { dim, .. } => {
                    k += 4;
                    let indices = if tensors[k - 2].dtype == DType::U64 {
                        MbIndices::U64(filled(self, &tensors[k - 2]))
                    } else {
                        MbIndices::I32(filled(self, &tensors[k - 2]))
                    };
                    MbData::Sparse {
                        dim,
                        sample_offsets: filled(self, &tensors[k - 3]),
                        indices,
                        values: values(&tensors[k - 1]),
                    }
                }
                Shape::Strings => {
                    k += 3;
                    MbData::Strings { offsets: filled(self, &tensors[k - 2]), bytes: filled(self, &tensors[k - 1]) }
                }
            };
            streams.push(MbStream { sequence_offsets, data });
        }
        Minibatch {
            index: self.index,
            sweep: self.sweep,
            end_of_sweep: self.end_of_sweep,
            position: self.position,
            fingerprint: self.fingerprint,
            streams,
        }
    }
}

#[cfg(test)]
mod tests;
