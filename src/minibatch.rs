//! A minibatch in delivery layout: per stream, contiguous columnar buffers exactly as the
//! shared-memory slot carries them (DESIGN.md §5) — `sequence_offsets` over samples; dense values
//! `[num_samples, dim]` row-major; sparse CSR per sample (`sample_offsets`, `indices`, `values`,
//! entries in file order).
//!
//! [`assemble`] builds one from a [`MinibatchPlan`] and the parsed chunks the plan names. It is
//! the only place that copies sample data; both `dump` and the daemon use it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::format::chunk::{Indices, ParsedChunk, StreamValues, Values};
use crate::format::errors::DataError;
use crate::sampling::{MinibatchPlan, Timeline};

/// One stream of a minibatch.
#[derive(Debug, Clone, PartialEq)]
pub struct MbStream {
    /// Sample offsets of each sequence; one more than sequences.
    pub sequence_offsets: Vec<i64>,
    /// The samples.
    pub data: MbData,
}

/// Sample data of one stream of a minibatch.
#[derive(Debug, Clone, PartialEq)]
pub enum MbData {
    /// `num_samples × dim`, row-major.
    Dense {
        /// Values per sample.
        dim: usize,
        /// The values.
        values: Values,
    },
    /// CSR per sample.
    Sparse {
        /// Values per sample (the stream's `dim`).
        dim: usize,
        /// Entry offsets per sample; one more than samples.
        sample_offsets: Vec<i64>,
        /// Column indices.
        indices: Indices,
        /// Entry values.
        values: Values,
    },
    /// One string per sample.
    Strings {
        /// Byte offsets; one more than samples.
        offsets: Vec<i64>,
        /// UTF-8 bytes.
        bytes: Vec<u8>,
    },
}

impl MbStream {
    /// Number of sequences.
    #[must_use]
    pub fn num_sequences(&self) -> usize {
        self.sequence_offsets.len() - 1
    }

    /// Number of samples.
    #[must_use]
    pub fn num_samples(&self) -> usize {
        usize::try_from(*self.sequence_offsets.last().unwrap_or(&0)).unwrap_or(0)
    }
}

/// A minibatch ready for delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Minibatch {
    /// 0-based index in the session.
    pub index: u64,
    /// Sweep at the start of the minibatch.
    pub sweep: u64,
    /// Whether the minibatch ends at or crosses a sweep boundary.
    pub end_of_sweep: bool,
    /// Checkpoint position after this minibatch.
    pub position: u64,
    /// One entry per stream, in dataset order.
    pub streams: Vec<MbStream>,
}

/// Source of parsed chunks for [`assemble`].
pub trait ChunkSource {
    /// The parsed chunk `chunk`.
    ///
    /// # Errors
    /// Whatever loading it failed with.
    fn chunk(&mut self, chunk: u32) -> Result<Arc<ParsedChunk>, DataError>;
}

impl ChunkSource for HashMap<u32, Arc<ParsedChunk>> {
    fn chunk(&mut self, chunk: u32) -> Result<Arc<ParsedChunk>, DataError> {
        self.get(&chunk).cloned().ok_or_else(|| DataError::Dataset(format!("chunk {chunk} is not loaded")))
    }
}

fn empty_like(v: &Values) -> Values {
    match v {
        Values::F32(_) => Values::F32(Vec::new()),
        Values::F64(_) => Values::F64(Vec::new()),
    }
}

fn extend(dst: &mut Values, src: &Values, range: std::ops::Range<usize>) {
    match (dst, src) {
        (Values::F32(d), Values::F32(s)) => d.extend_from_slice(&s[range]),
        (Values::F64(d), Values::F64(s)) => d.extend_from_slice(&s[range]),
        // Every chunk of a dataset has the dataset's precision.
        _ => unreachable!("mixed precisions within one dataset"),
    }
}

fn extend_indices(dst: &mut Indices, src: &Indices, range: std::ops::Range<usize>) {
    match (dst, src) {
        (Indices::I32(d), Indices::I32(s)) => d.extend_from_slice(&s[range]),
        (Indices::U64(d), Indices::U64(s)) => d.extend_from_slice(&s[range]),
        _ => unreachable!("mixed index types within one stream"),
    }
}

fn i64_of(x: usize) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// Builds minibatch `index` from `plan`, copying samples out of the chunks it names.
///
/// `frame_mode`: CNTK's `FramePacker` — a sequence with more than one sample is fatal.
///
/// # Errors
/// A chunk that cannot be loaded, or a frame-mode violation.
pub fn assemble(
    index: u64,
    plan: &MinibatchPlan,
    timeline: &Timeline,
    stream_dims: &[usize],
    frame_mode: bool,
    chunks: &mut dyn ChunkSource,
) -> Result<Minibatch, DataError> {
    let mut streams: Vec<Option<MbStream>> = vec![None; stream_dims.len()];
    for r in &plan.sequences {
        let chunk = chunks.chunk(r.chunk)?;
        if chunk.streams.len() != stream_dims.len() {
            // A caller that took the dims from `config().streams()` (CTF streams only) for a deepx
            // dataset: refuse instead of indexing out of bounds. Use `Dataset::streams()`.
            return Err(DataError::Dataset(format!(
                "chunk {} has {} streams but {} stream dimensions were given",
                r.chunk,
                chunk.streams.len(),
                stream_dims.len()
            )));
        }
        let local = r.seq as usize - timeline.chunk_start[r.chunk as usize];
        for (si, sd) in chunk.streams.iter().enumerate() {
            let out = streams[si].get_or_insert_with(|| new_stream(&sd.data, stream_dims[si]));
            let (s0, s1) = (sd.seq_offsets[local], sd.seq_offsets[local + 1]);
            if frame_mode && s1 - s0 > 1 {
                return Err(DataError::Dataset(format!(
                    "detected a non-frame sequence of size {} in frame mode (sequence {} of chunk {})",
                    s1 - s0,
                    local,
                    r.chunk
                )));
            }
            append(out, &sd.data, s0..s1);
        }
    }
    let streams = streams
        .into_iter()
        .zip(stream_dims)
        .map(|(s, &dim)| s.unwrap_or_else(|| new_stream(&StreamValues::Dense { dim, values: Values::F32(Vec::new()) }, dim)))
        .collect();
    Ok(Minibatch { index, sweep: plan.sweep, end_of_sweep: plan.end_of_sweep, position: plan.position, streams })
}

fn new_stream(like: &StreamValues, dim: usize) -> MbStream {
    let data = match like {
        StreamValues::Dense { values, .. } => MbData::Dense { dim, values: empty_like(values) },
        StreamValues::Sparse { indices, values, .. } => MbData::Sparse {
            dim,
            sample_offsets: vec![0],
            indices: match indices {
                Indices::I32(_) => Indices::I32(Vec::new()),
                Indices::U64(_) => Indices::U64(Vec::new()),
            },
            values: empty_like(values),
        },
        StreamValues::Strings { .. } => MbData::Strings { offsets: vec![0], bytes: Vec::new() },
    };
    MbStream { sequence_offsets: vec![0], data }
}

fn append(out: &mut MbStream, src: &StreamValues, samples: std::ops::Range<usize>) {
    let n = samples.len();
    match (&mut out.data, src) {
        (MbData::Dense { dim, values }, StreamValues::Dense { values: sv, .. }) => {
            extend(values, sv, samples.start * *dim..samples.end * *dim);
        }
        (MbData::Sparse { sample_offsets, indices, values, .. }, StreamValues::Sparse { sample_offsets: so, indices: si, values: sv }) => {
            let (e0, e1) = (so[samples.start], so[samples.end]);
            let base = i64_of(values.len()) - i64_of(e0);
            sample_offsets.extend(so[samples.start + 1..=samples.end].iter().map(|&o| i64_of(o) + base));
            extend_indices(indices, si, e0..e1);
            extend(values, sv, e0..e1);
        }
        (MbData::Strings { offsets, bytes }, StreamValues::Strings { offsets: so, bytes: sb }) => {
            let (b0, b1) = (so[samples.start], so[samples.end]);
            let base = i64_of(bytes.len()) - i64_of(b0);
            offsets.extend(so[samples.start + 1..=samples.end].iter().map(|&o| i64_of(o) + base));
            bytes.extend_from_slice(&sb[b0..b1]);
        }
        _ => unreachable!("a stream keeps its kind across chunks"),
    }
    let last = *out.sequence_offsets.last().unwrap_or(&0);
    out.sequence_offsets.push(last + i64_of(n));
}
