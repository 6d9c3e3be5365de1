//! A mixture's minibatch (`crate::sampling::mixture`) from its sources' chunks: each sequence
//! read in place through its source's stream order ([`gather_mixture`]), or from copies made a
//! chunk at a time ([`gather_mixture_copied`]); and what its slot carries after the streams
//! ([`MixtureTensors`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::{assemble, ChunkSource, Gathered, StreamShape};
use crate::format::chunk::ParsedChunk;
use crate::format::errors::DataError;
use crate::sampling::{MinibatchPlan, Timeline};
use crate::Result;

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
        next_sweeps_at: Vec::new(),
    };
    let mut gathered = assemble(index, &single, shapes, false, held, located, maps)?;
    gathered.fingerprint = plan.fingerprint();
    gathered.mixture = Some(MixtureTensors::of(plan));
    Ok(gathered)
}
