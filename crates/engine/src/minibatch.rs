//! Minibatch assembly: [`gather`] locates a [`MinibatchPlan`]'s sequences in the parsed chunks it
//! names (every size known before a byte moves); [`Gathered::fill`] copies one tensor of the slot's
//! tensor table ([`minibatchd_shm::table`]) — into a shared-memory slot through
//! [`minibatchd_shm::SlotSource`] (the daemon) or into owned buffers ([`Gathered::to_minibatch`],
//! `dump`). It is the only place that copies sample data.

use std::collections::HashMap;
use std::sync::Arc;

use crate::format::chunk::{Indices, ParsedChunk, StreamKind, StreamSpec, StreamValues, Values};
use crate::format::errors::DataError;
use crate::sampling::{MinibatchPlan, Timeline};
use crate::Result;

pub use crate::hash::{ChunkMap, ChunkSet, IdHasher};

/// The sparse indices of a minibatch ([`MbData::Sparse`]): int32 for CTF, u64 for deepx ids
/// (a chunk's [`Indices`] widened).
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

/// Where one sequence of a stream lies: a chunk of the [`Gathered`] and its ranges there.
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
    samples: usize,
    entries: usize,
}

/// How many sequences ahead of the copy the gather prefetches their samples.
const PREFETCH_AHEAD: usize = 6;

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

/// What a mixture's minibatch carries in its slot after its streams, under the name `mixture`
/// (`minibatchd_shm::table`): the source of each sequence, the sources that completed a sweep in
/// it, and the mixture's state after it as `[step, slots, samples, ended, then per source
/// position, taken, credit, weight]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MixtureTensors {
    /// The source of each sequence, in order.
    pub sources: Vec<i32>,
    /// The sources that completed a sweep in the minibatch.
    pub sweeps_ended: Vec<i32>,
    /// The mixture's state after the minibatch, flattened.
    pub state: Vec<i64>,
}

impl MixtureTensors {
    /// The tensors of `plan`.
    #[must_use]
    pub fn of(plan: &crate::sampling::mixture::MixturePlan) -> Self {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let small = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        let st = &plan.state;
        let mut state = vec![int(st.step), int(st.slots), int(st.samples), i64::from(st.ended)];
        for s in &st.sources {
            state.extend([int(s.position), int(s.taken), s.credit, int(s.weight)]);
        }
        Self {
            sources: plan.sequences.iter().map(|r| small(r.source)).collect(),
            sweeps_ended: plan.sweeps_ended.iter().map(|&s| small(s)).collect(),
            state,
        }
    }
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

/// A mixture's minibatch ([`crate::sampling::mixture`]) from the chunks of its sources: sequence
/// `i` of `plan` comes from source `plan.sequences[i].source`, whose timeline is `timelines[s]`
/// and whose chunks `chunks[s]` gives, each in its dataset's own streams; stream `k` of the
/// minibatch is stream `orders[s][k]` of source `s`'s chunks (read in place, nothing moved or
/// copied before the slot). The minibatch's fingerprint is the mixture's; its position is the
/// number of slots taken.
///
/// # Errors
/// A chunk that cannot be loaded, a sequence of a source that `plan` does not have, or a chunk
/// without a stream its order names.
pub fn gather_mixture(
    index: u64,
    plan: &crate::sampling::mixture::MixturePlan,
    shapes: &[StreamShape],
    timelines: &[&Timeline],
    orders: &[Vec<usize>],
    chunks: &mut [&mut dyn ChunkSource],
) -> Result<Gathered> {
    let mut held: Vec<Arc<ParsedChunk>> = Vec::new();
    let mut maps: Vec<&[usize]> = Vec::new();
    let mut local_of: HashMap<(u32, u32), usize> = HashMap::new();
    let mut located: Vec<(usize, usize)> = Vec::with_capacity(plan.sequences.len());
    for r in &plan.sequences {
        let s = r.source as usize;
        let (Some(timeline), Some(order), Some(source)) = (timelines.get(s), orders.get(s), chunks.get_mut(s)) else {
            return Err(DataError::Dataset(format!("the mixture has no source {s}")));
        };
        let at = if let Some(&at) = local_of.get(&(r.source, r.seq.chunk)) {
            at
        } else {
            let chunk = source.chunk(r.seq.chunk)?;
            if order.len() != shapes.len() || order.iter().any(|&i| i >= chunk.streams.len()) {
                return Err(DataError::Dataset(format!(
                    "chunk {} of source {s} has {} streams, which the mixture's {} streams do not map onto",
                    r.seq.chunk,
                    chunk.streams.len(),
                    shapes.len()
                )));
            }
            held.push(chunk);
            maps.push(order);
            local_of.insert((r.source, r.seq.chunk), held.len() - 1);
            held.len() - 1
        };
        let local = (r.seq.seq as usize)
            .checked_sub(timeline.chunk_start.get(r.seq.chunk as usize).copied().unwrap_or(usize::MAX))
            .filter(|&l| l < held[at].num_sequences)
            .ok_or_else(|| {
                DataError::Dataset(format!("sequence {} is not in chunk {} of source {s}", r.seq.seq, r.seq.chunk))
            })?;
        located.push((at, local));
    }
    assemble_mixture(index, plan, shapes, held, &located, &maps)
}

/// A mixture's minibatch from copies of its sequences instead of whole chunks — gathered a chunk
/// at a time, when its chunks do not fit in memory together: `copies[(source, chunk)]` holds the
/// plan's sequences of that chunk, in the plan's order ([`ParsedChunk::select`]), in the
/// source's own streams (`orders` maps them as in [`gather_mixture`]). The same minibatch
/// [`gather_mixture`] makes, byte for byte.
///
/// # Errors
/// A chunk without its copy, or a copy of fewer sequences than the plan takes from the chunk.
pub fn gather_mixture_copied<S: std::hash::BuildHasher>(
    index: u64,
    plan: &crate::sampling::mixture::MixturePlan,
    shapes: &[StreamShape],
    orders: &[Vec<usize>],
    copies: &HashMap<(u32, u32), Arc<ParsedChunk>, S>,
) -> Result<Gathered> {
    let mut held: Vec<Arc<ParsedChunk>> = Vec::new();
    let mut maps: Vec<&[usize]> = Vec::new();
    // Per (source, chunk): its place in `held` and how many of its sequences are located.
    let mut at_of: HashMap<(u32, u32), (usize, usize)> = HashMap::new();
    let mut located: Vec<(usize, usize)> = Vec::with_capacity(plan.sequences.len());
    for r in &plan.sequences {
        let key = (r.source, r.seq.chunk);
        let entry = if let Some(e) = at_of.get_mut(&key) {
            e
        } else {
            let copy = copies
                .get(&key)
                .ok_or_else(|| DataError::Dataset(format!("chunk {} of source {} was not copied", key.1, key.0)))?;
            let order = orders.get(r.source as usize).filter(|o| o.len() == shapes.len()).ok_or_else(|| {
                DataError::Dataset(format!("the mixture's streams do not map onto source {}", r.source))
            })?;
            held.push(copy.clone());
            maps.push(order);
            at_of.entry(key).or_insert((held.len() - 1, 0))
        };
        let (at, next) = *entry;
        if next >= held[at].num_sequences {
            return Err(DataError::Dataset(format!(
                "the copy of chunk {} of source {} holds fewer sequences than the minibatch takes",
                key.1, key.0
            )));
        }
        entry.1 += 1;
        located.push((at, next));
    }
    assemble_mixture(index, plan, shapes, held, &located, &maps)
}

/// [`assemble`] for a mixture's plan: its sequences located in `held` (stream `k` of the
/// minibatch is stream `maps[c][k]` of held chunk `c`), with the mixture's fingerprint, position
/// (its slots taken) and tensors.
fn assemble_mixture(
    index: u64,
    plan: &crate::sampling::mixture::MixturePlan,
    shapes: &[StreamShape],
    held: Vec<Arc<ParsedChunk>>,
    located: &[(usize, usize)],
    maps: &[&[usize]],
) -> Result<Gathered> {
    let single = MinibatchPlan {
        sequences: plan.sequences.iter().map(|r| r.seq).collect(),
        sweep: 0,
        end_of_sweep: !plan.sweeps_ended.is_empty(),
        position: plan.state.slots,
        retire: Vec::new(),
        samples: plan.samples,
    };
    let mut gathered = assemble(index, &single, shapes, false, held, located, maps)?;
    gathered.fingerprint = plan.fingerprint();
    gathered.mixture = Some(MixtureTensors::of(plan));
    Ok(gathered)
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
            samples: 0,
            entries: 0,
        })
        .collect();
    // Pass 2: sample ranges (and prefetch the entry offsets of sparse and string streams).
    for (&(at, local), r) in located.iter().zip(&plan.sequences) {
        let map = maps.get(at).copied();
        for (k, out) in streams.iter_mut().enumerate() {
            let stream = map.and_then(|m| m.get(k).copied()).unwrap_or(k);
            let Some(sd) = held[at].streams.get(stream) else {
                return Err(DataError::Dataset(format!("chunk {} has no stream {stream}", r.chunk)));
            };
            if shape_of_kind(shape_of(&sd.data)) != shape_of_kind(out.shape) {
                return Err(DataError::Dataset(format!(
                    "stream {} of chunk {} is not stored as the dataset declares (kind or precision)",
                    out.index, r.chunk
                )));
            }
            if let (StreamValues::Dense { dim, .. }, Shape::Dense { dim: declared, .. }) = (&sd.data, out.shape) {
                if *dim != declared {
                    return Err(DataError::Dataset(format!(
                        "stream {} of chunk {} has dimension {dim}, the dataset declares {declared}",
                        out.index, r.chunk
                    )));
                }
            }
            let (s0, s1) = sd.sample_range(local);
            if frame_mode && s1 - s0 > 1 {
                return Err(DataError::Dataset(format!(
                    "detected a non-frame sequence of size {} in frame mode (sequence {} of the timeline, in chunk {})",
                    s1 - s0,
                    r.seq,
                    r.chunk
                )));
            }
            match &sd.data {
                StreamValues::Sparse { sample_offsets: o, .. } | StreamValues::Strings { offsets: o, .. }
                    if !sd.unit_entries() =>
                {
                    minibatchd_sys::prefetch(&o[s0..=s1]);
                }
                _ => {}
            }
            out.pieces.push(Piece { chunk: at, stream, s0, s1, e0: 0, e1: 0 });
            out.samples += s1 - s0;
        }
    }
    // Pass 3: entry ranges.
    for s in &mut streams {
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

/// Minibatches gathered a chunk at a time, for when a minibatch's chunks do not fit in memory
/// together: each chunk is loaded in turn, the plans' sequences are copied out of it
/// ([`ParsedChunk::select`]) and the chunk is let go, so that gathering holds one chunk and the
/// copies — the minibatches' own data — at a time. Several consecutive plans gathered together
/// share each chunk's load (a chunk the cache cannot keep is parsed once for all of them, not once
/// per minibatch). The minibatches are the ones [`gather`] makes, byte for byte.
#[derive(Debug)]
pub struct Parts {
    /// Per chunk of the plans, in order of first need: the (plan, position) pairs it serves.
    wanted: Vec<(u32, Vec<(usize, usize)>)>,
    /// Per entry of `wanted` taken so far: the copy of its sequences, in the order of its pairs.
    taken: Vec<Option<Arc<ParsedChunk>>>,
    /// Bytes of the copies taken (kept after [`Parts::finish`] hands them on).
    bytes: usize,
}

impl Parts {
    /// The parts of `plans` (consecutive minibatches, gathered together).
    #[must_use]
    pub fn new(plans: &[MinibatchPlan]) -> Self {
        let mut wanted: Vec<(u32, Vec<(usize, usize)>)> = Vec::new();
        let mut at: ChunkMap<usize> = ChunkMap::default();
        for (k, plan) in plans.iter().enumerate() {
            for (position, r) in plan.sequences.iter().enumerate() {
                let i = *at.entry(r.chunk).or_insert_with(|| {
                    wanted.push((r.chunk, Vec::new()));
                    wanted.len() - 1
                });
                wanted[i].1.push((k, position));
            }
        }
        let taken = vec![None; wanted.len()];
        Self { wanted, taken, bytes: 0 }
    }

    /// The chunks whose sequences are not copied yet, in order of first need.
    pub fn missing(&self) -> impl Iterator<Item = u32> + '_ {
        self.wanted.iter().zip(&self.taken).filter(|(_, t)| t.is_none()).map(|((c, _), _)| *c)
    }

    /// Copies the sequences of `plans` (those given to [`Parts::new`]) out of `parsed`, chunk
    /// `chunk` of `timeline` (no other chunk need be held meanwhile); nothing if no plan uses it.
    ///
    /// # Errors
    /// A plan sequence that `parsed` does not hold.
    pub fn take(
        &mut self,
        plans: &[MinibatchPlan],
        timeline: &Timeline,
        chunk: u32,
        parsed: &ParsedChunk,
    ) -> Result<()> {
        let Some(i) = self.wanted.iter().position(|(c, _)| *c == chunk) else { return Ok(()) };
        let start = timeline.chunk_start.get(chunk as usize).copied().unwrap_or(usize::MAX);
        let locals = self.wanted[i]
            .1
            .iter()
            .map(|&(k, position)| {
                let seq = plans.get(k).and_then(|p| p.sequences.get(position)).map_or(u32::MAX, |r| r.seq);
                (seq as usize)
                    .checked_sub(start)
                    .filter(|&l| l < parsed.num_sequences)
                    .ok_or_else(|| DataError::Dataset(format!("sequence {seq} is not in chunk {chunk}")))
            })
            .collect::<Result<Vec<usize>>>()?;
        let copy = parsed.select(&locals);
        self.bytes += copy.size_bytes();
        if let Some(old) = self.taken[i].replace(Arc::new(copy)) {
            self.bytes -= old.size_bytes();
        }
        Ok(())
    }

    /// Bytes of the copies taken so far — also once [`Parts::finish`] has handed them to the
    /// minibatches (what they hold until they are copied into their slots).
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.bytes
    }

    /// The minibatches of `plans`, numbered from `first_index`, once every chunk is taken; the
    /// copies pass to them (`self` is left empty).
    ///
    /// # Errors
    /// A chunk not taken yet, or what [`gather`] refuses (streams not as `shapes` say, a
    /// non-frame sequence in frame mode).
    pub fn finish(
        &mut self,
        first_index: u64,
        plans: &[MinibatchPlan],
        shapes: &[StreamShape],
        frame_mode: bool,
    ) -> Result<Vec<Gathered>> {
        if let Some(((chunk, _), _)) = self.wanted.iter().zip(&self.taken).find(|(_, t)| t.is_none()) {
            return Err(DataError::Dataset(format!("chunk {chunk} is not loaded")));
        }
        let mut located: Vec<Vec<(usize, usize)>> = plans.iter().map(|p| vec![(0, 0); p.sequences.len()]).collect();
        let mut held = Vec::with_capacity(self.taken.len());
        let wanted = std::mem::take(&mut self.wanted);
        for (i, ((chunk, pairs), taken)) in wanted.iter().zip(std::mem::take(&mut self.taken)).enumerate() {
            let taken = taken.ok_or_else(|| DataError::Dataset(format!("chunk {chunk} is not loaded")))?;
            if taken.streams.len() != shapes.len() {
                return Err(DataError::Dataset(format!(
                    "chunk {chunk} has {} streams but {} stream shapes were given",
                    taken.streams.len(),
                    shapes.len()
                )));
            }
            held.push(taken);
            for (j, &(k, position)) in pairs.iter().enumerate() {
                if let Some(slot) = located.get_mut(k).and_then(|l| l.get_mut(position)) {
                    *slot = (i, j);
                }
            }
        }
        plans
            .iter()
            .zip(&located)
            .zip(first_index..)
            .map(|((plan, located), index)| {
                // Each minibatch keeps only the copies it reads.
                let mut mine: ChunkMap<usize> = ChunkMap::default();
                let mut own: Vec<Arc<ParsedChunk>> = Vec::new();
                let located: Vec<(usize, usize)> = located
                    .iter()
                    .map(|&(i, j)| {
                        let at = *mine.entry(u32::try_from(i).unwrap_or(u32::MAX)).or_insert_with(|| {
                            own.push(held[i].clone());
                            own.len() - 1
                        });
                        (at, j)
                    })
                    .collect();
                assemble(index, plan, shapes, frame_mode, own, &located, &[])
            })
            .collect()
    }
}

/// The shape a chunk's stream reports, for comparing kinds and precisions (dims aside).
fn shape_of_kind(s: Shape) -> Shape {
    match s {
        Shape::Dense { f64, .. } => Shape::Dense { dim: 0, f64 },
        Shape::Sparse { f64, u64_ids, .. } => Shape::Sparse { dim: 0, f64, u64_ids },
        Shape::Strings => Shape::Strings,
    }
}

fn float_dtype(f64: bool) -> DType {
    if f64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Writes `values` as native-endian int64s into `out`.
fn put_i64s(out: &mut [u8], values: impl Iterator<Item = i64>) {
    for (dst, v) in out.chunks_exact_mut(8).zip(values) {
        dst.copy_from_slice(&v.to_ne_bytes());
    }
}

/// `dst.copy_from_slice(src)`, with the sizes of one sparse entry (a 4- or 8-byte index or
/// value: one-hot labels, deepx features) copied inline instead of through a `memcpy` call —
/// a minibatch of sparse samples is hundreds of such copies.
#[inline]
fn copy_small(dst: &mut [u8], src: &[u8]) {
    match (dst.len(), src.len()) {
        (4, 4) => dst.copy_from_slice(&src[..4]),
        (8, 8) => dst.copy_from_slice(&src[..8]),
        _ => dst.copy_from_slice(src),
    }
}

fn value_bytes(v: &Values, range: std::ops::Range<usize>) -> &[u8] {
    match v {
        Values::F32(x) => minibatchd_sys::as_bytes(&x[range]),
        Values::F64(x) => minibatchd_sys::as_bytes(&x[range]),
    }
}

/// The stored bytes of `range` of `v`: what the output holds, except for narrow ids
/// ([`Indices::U32`]), which the gather widens (these bytes then serve the prefetch only).
fn index_bytes(v: &Indices, range: std::ops::Range<usize>) -> &[u8] {
    match v {
        Indices::I32(x) => minibatchd_sys::as_bytes(&x[range]),
        Indices::U32(x) => minibatchd_sys::as_bytes(&x[range]),
        Indices::U64(x) => minibatchd_sys::as_bytes(&x[range]),
    }
}

/// Writes `values` as native-endian `i32`s into `out`.
fn put_i32s(out: &mut [u8], values: &[i32]) {
    for (dst, v) in out.chunks_exact_mut(4).zip(values) {
        dst.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Writes the 32-bit feature ids `ids` as native-endian `u64`s into `out`.
fn widen_ids(out: &mut [u8], ids: &[u32]) {
    for (dst, &id) in out.chunks_exact_mut(8).zip(ids) {
        dst.copy_from_slice(&u64::from(id).to_ne_bytes());
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

impl SlotSource for Gathered {
    fn index(&self) -> u64 {
        self.index
    }

    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn tensors(&self) -> Vec<TensorDesc> {
        let mut out = Vec::with_capacity(self.streams.len() * 4);
        for (si, s) in self.streams.iter().enumerate() {
            out.push(TensorDesc::vector(si, Field::SequenceOffsets, DType::I64, s.pieces.len() + 1));
            match s.shape {
                Shape::Dense { dim, f64 } => {
                    out.push(TensorDesc::matrix(si, Field::DenseValues, float_dtype(f64), s.samples, dim));
                }
                Shape::Sparse { f64, u64_ids, .. } => {
                    let ids = if u64_ids { DType::U64 } else { DType::I32 };
                    out.push(TensorDesc::vector(si, Field::SampleOffsets, DType::I64, s.samples + 1));
                    out.push(TensorDesc::vector(si, Field::Indices, ids, s.entries));
                    out.push(TensorDesc::vector(si, Field::SparseValues, float_dtype(f64), s.entries));
                }
                Shape::Strings => {
                    out.push(TensorDesc::vector(si, Field::StringOffsets, DType::I64, s.samples + 1));
                    out.push(TensorDesc::vector(si, Field::StringBytes, DType::U8, s.entries));
                }
            }
        }
        if let Some(m) = &self.mixture {
            let at = self.streams.len();
            out.push(TensorDesc::vector(at, Field::MixtureSources, DType::I32, m.sources.len()));
            out.push(TensorDesc::vector(at, Field::MixtureSweepsEnded, DType::I32, m.sweeps_ended.len()));
            out.push(TensorDesc::vector(at, Field::MixtureState, DType::I64, m.state.len()));
        }
        out
    }

    fn fill(&self, t: &TensorDesc, out: &mut [u8]) {
        if let (Some(m), Field::MixtureSources | Field::MixtureSweepsEnded | Field::MixtureState) =
            (&self.mixture, t.field)
        {
            match t.field {
                Field::MixtureSources => put_i32s(out, &m.sources),
                Field::MixtureSweepsEnded => put_i32s(out, &m.sweeps_ended),
                _ => put_i64s(out, m.state.iter().copied()),
            }
            return;
        }
        let s = &self.streams[t.stream];
        let data = |p: &Piece| &self.chunks[p.chunk].streams[p.stream].data;
        match t.field {
            Field::SequenceOffsets => {
                let mut at = 0usize;
                put_i64s(
                    out,
                    std::iter::once(0).chain(s.pieces.iter().map(|p| {
                        at += p.s1 - p.s0;
                        i64_of(at)
                    })),
                );
            }
            Field::SampleOffsets | Field::StringOffsets => {
                let mut rows = out.chunks_exact_mut(8);
                if let Some(first) = rows.next() {
                    first.copy_from_slice(&0i64.to_ne_bytes());
                }
                let mut at = 0usize;
                for p in &s.pieces {
                    let sd = &self.chunks[p.chunk].streams[p.stream];
                    if sd.unit_entries() {
                        // Entry k of the piece is sample k: its end offset is known.
                        for (k, dst) in (1..=p.s1 - p.s0).zip(&mut rows) {
                            dst.copy_from_slice(&i64_of(at + k).to_ne_bytes());
                        }
                        at += p.e1 - p.e0;
                        continue;
                    }
                    let offsets = match &sd.data {
                        StreamValues::Sparse { sample_offsets, .. } => sample_offsets,
                        StreamValues::Strings { offsets, .. } => offsets,
                        StreamValues::Dense { .. } => unreachable!("offsets of a dense stream"),
                    };
                    let base = i64_of(at) - i64_of(p.e0);
                    // The offsets first: `zip` takes from its first iterator before it finds the
                    // second exhausted, which would skip a row of the output.
                    for (&o, dst) in offsets[p.s0 + 1..=p.s1].iter().zip(&mut rows) {
                        dst.copy_from_slice(&(i64_of(o) + base).to_ne_bytes());
                    }
                    at += p.e1 - p.e0;
                }
            }
            Field::DenseValues | Field::SparseValues | Field::Indices | Field::StringBytes => {
                let src = |p: &Piece| -> &[u8] {
                    match (t.field, data(p)) {
                        (Field::DenseValues, StreamValues::Dense { values, .. })
                        | (Field::SparseValues, StreamValues::Sparse { values, .. }) => value_bytes(values, p.e0..p.e1),
                        (Field::Indices, StreamValues::Sparse { indices, .. }) => index_bytes(indices, p.e0..p.e1),
                        (Field::StringBytes, StreamValues::Strings { bytes, .. }) => &bytes[p.e0..p.e1],
                        _ => unreachable!("a stream keeps its kind across chunks (checked in gather)"),
                    }
                };
                for p in s.pieces.iter().take(PREFETCH_AHEAD) {
                    minibatchd_sys::prefetch(src(p));
                }
                let mut at = 0usize;
                for (i, p) in s.pieces.iter().enumerate() {
                    if let Some(ahead) = s.pieces.get(i + PREFETCH_AHEAD) {
                        minibatchd_sys::prefetch(src(ahead));
                    }
                    if let (Field::Indices, StreamValues::Sparse { indices: Indices::U32(ids), .. }) =
                        (t.field, data(p))
                    {
                        let ids = &ids[p.e0..p.e1];
                        widen_ids(&mut out[at..at + 8 * ids.len()], ids);
                        at += 8 * ids.len();
                        continue;
                    }
                    let bytes = src(p);
                    copy_small(&mut out[at..at + bytes.len()], bytes);
                    at += bytes.len();
                }
            }
            // Written above, with the mixture's tensors.
            Field::MixtureSources | Field::MixtureSweepsEnded | Field::MixtureState => {}
        }
    }
}

#[cfg(test)]
mod tests;
