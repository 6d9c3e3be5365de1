//! Minibatches gathered a chunk at a time ([`Parts`]): where a minibatch's chunks do not fit in
//! memory together, each chunk is loaded in turn and the plan's sequences of it copied out.

use std::sync::Arc;

use super::{assemble, ChunkMap, Gathered, StreamShape};
use crate::format::chunk::ParsedChunk;
use crate::format::errors::DataError;
use crate::sampling::{MinibatchPlan, Timeline};
use crate::Result;

/// Minibatches gathered a chunk at a time, for when a minibatch's chunks do not fit in memory
/// together: each chunk is loaded in turn, the plans' sequences are copied out of it
/// ([`ParsedChunk::select`]) and the chunk is let go, so that gathering holds one chunk and the
/// copies — the minibatches' own data — at a time. Several consecutive plans gathered together
/// share each chunk's load (a chunk the cache cannot keep is parsed once for all of them, not once
/// per minibatch). The minibatches are the ones [`gather`](super::gather) makes, byte for byte.
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
    /// A chunk not taken yet, or what [`gather`](super::gather) refuses (streams not as `shapes` say, a
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
