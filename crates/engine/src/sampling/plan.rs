//! One sweep as one worker walks it: the global order plus, per position, whether the sequence
//! belongs to this worker and whether it is this worker's last use of its chunk in the sweep.
//!
//! Ownership follows CNTK 2.7's `SequenceRandomizer`:
//! * block randomizer: a sequence belongs to rank `origin % workers`, where `origin` is the
//!   randomized position of the chunk it came from, so whole chunks go to one worker;
//! * no randomization: sequence round-robin by global sequence position. **Deliberate difference
//!   from CNTK:** the position is counted from the start of the timeline
//!   (`sweep * num_sequences + index`). CNTK's uninterrupted run counts exactly this way, but its
//!   `NoRandomizer::SetState` restarts the count at the sequence index within the sweep, so after a
//!   restore into sweep > 0 its assignment can differ from the uninterrupted run whenever
//!   `num_sequences % workers != 0`. Counting from the timeline start makes a restore reproduce
//!   the uninterrupted run exactly.
//!
//! Fed by: [`super::randomizer`]. Feeds: [`super::scheduler`].

use crate::minibatch::ChunkSet;

use super::randomizer::{file_order, randomize_sweep, uses_block_randomizer};
use super::{to_u32, SamplingOptions, SeqRef, Timeline};

/// The order of one sweep with this worker's share of it, indexed by chunk.
#[derive(Debug)]
pub(crate) struct SweepPlan {
    /// Sweep index.
    pub(crate) sweep: u64,
    /// All sequences of the sweep in delivery order (every worker's).
    pub(crate) order: Vec<SeqRef>,
    /// Whether each position of `order` belongs to this worker.
    local: Vec<bool>,
    /// This worker's positions grouped by chunk: chunk `c` is used at
    /// `uses[use_start[c]..use_start[c + 1]]`, in increasing order.
    use_start: Vec<u32>,
    uses: Vec<u32>,
    /// This worker's chunks in order of first use.
    by_first_use: Vec<u32>,
    /// Positions from this index on start at or after the epoch end.
    end_index: usize,
}

impl SweepPlan {
    /// Computes sweep `sweep` for worker `options.rank`; `sweep_size` and `epoch_end` bound the
    /// prefetch queries.
    pub(crate) fn build(
        timeline: &Timeline,
        options: &SamplingOptions,
        sweep: u64,
        sweep_size: u64,
        epoch_end: u64,
    ) -> Self {
        let (order, local) = ordered_with_owner(timeline, options, sweep);
        let (use_start, uses, by_first_use) = index_uses(&order, &local, timeline.num_chunks());
        let mut plan = Self { sweep, order, local, use_start, uses, by_first_use, end_index: 0 };
        let sweep_start = sweep.saturating_mul(sweep_size);
        plan.end_index = if epoch_end <= sweep_start {
            0
        } else if epoch_end - sweep_start >= sweep_size {
            plan.len()
        } else {
            plan.seek(timeline, epoch_end - sweep_start).0
        };
        plan
    }

    /// Number of sequences in the sweep.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether position `index` belongs to this worker.
    pub(crate) fn is_local(&self, index: usize) -> bool {
        self.local[index]
    }

    /// Whether position `index` is this worker's last use of its chunk in the sweep.
    pub(crate) fn is_last_use(&self, index: usize) -> bool {
        self.is_local(index) && self.uses_of(self.order[index].chunk).last() == Some(&to_u32(index))
    }

    /// The first position whose start (samples from the sweep start) is `>= offset`, and that
    /// start; `(len, sweep_size)` if every sequence starts before `offset`. This is CNTK's
    /// `SequenceRandomizer::Seek` / `NoRandomizer::SetState` rule.
    pub(crate) fn seek(&self, timeline: &Timeline, offset: u64) -> (usize, u64) {
        let mut start = 0u64;
        for (index, r) in self.order.iter().enumerate() {
            if start >= offset {
                return (index, start);
            }
            start += u64::from(timeline.seq_len[r.seq as usize]);
        }
        (self.order.len(), start)
    }

    /// Appends to `out` (skipping chunks in `seen`) this worker's chunks used at positions
    /// `from..` before the epoch end, in order of their next use, until `out` holds `max`.
    pub(crate) fn upcoming_into(&self, from: usize, max: usize, out: &mut Vec<u32>, seen: &mut ChunkSet) {
        let until = self.end_index;
        if from >= until {
            return;
        }
        let from_u32 = to_u32(from);
        let split = self.by_first_use.partition_point(|&c| self.uses_of(c)[0] < from_u32);
        // Chunks already in use: at most a window's worth have a use left.
        let mut started: Vec<(u32, u32)> = self.by_first_use[..split]
            .iter()
            .filter_map(|&c| {
                let uses = self.uses_of(c);
                let last = *uses.last()?;
                (last >= from_u32).then(|| (uses[uses.partition_point(|&p| p < from_u32)], c))
            })
            .collect();
        started.sort_unstable();
        let fresh = self.by_first_use[split..].iter().map(|&c| (self.uses_of(c)[0], c));
        let mut started = started.into_iter().peekable();
        let mut fresh = fresh.peekable();
        loop {
            let next = match (started.peek(), fresh.peek()) {
                (Some(a), Some(b)) if a.0 < b.0 => started.next(),
                (Some(_), None) => started.next(),
                (_, Some(_)) => fresh.next(),
                (None, None) => None,
            };
            let Some((position, chunk)) = next else {
                return;
            };
            if position as usize >= until || out.len() >= max {
                return;
            }
            if seen.insert(chunk) {
                out.push(chunk);
            }
        }
    }

    /// This worker's positions of chunk `chunk`, increasing (empty if it has none).
    fn uses_of(&self, chunk: u32) -> &[u32] {
        let c = chunk as usize;
        &self.uses[self.use_start[c] as usize..self.use_start[c + 1] as usize]
    }
}

/// The order of sweep `sweep` and, per position, the rank among `options.num_workers` that owns
/// it (the same rule as [`SweepPlan`]'s, for every worker at once).
pub(crate) fn owners(timeline: &Timeline, options: &SamplingOptions, sweep: u64) -> (Vec<SeqRef>, Vec<usize>) {
    order_by_owner(timeline, options, sweep, |owner| usize::try_from(owner).unwrap_or(0))
}

/// The order of sweep `sweep` and, per position, whether it belongs to `options.rank`.
fn ordered_with_owner(timeline: &Timeline, options: &SamplingOptions, sweep: u64) -> (Vec<SeqRef>, Vec<bool>) {
    let rank = options.rank as u64;
    order_by_owner(timeline, options, sweep, |owner| owner == rank)
}

/// The order of sweep `sweep`, and `of(owner)` per position, `owner` being the worker that owns
/// it: a randomized sweep deals whole chunks round-robin in their randomized order (CNTK's
/// worker split), an ordered one deals sequences round-robin, counting on from earlier sweeps.
fn order_by_owner<T>(
    timeline: &Timeline,
    options: &SamplingOptions,
    sweep: u64,
    of: impl Fn(u64) -> T,
) -> (Vec<SeqRef>, Vec<T>) {
    let workers = options.num_workers as u64;
    if uses_block_randomizer(options) {
        let randomized = randomize_sweep(timeline, options.window, options.seed, sweep);
        let mut position = vec![0u64; randomized.chunk_order.len()];
        for (k, &chunk) in randomized.chunk_order.iter().enumerate() {
            position[chunk as usize] = k as u64;
        }
        let owner = randomized.sequences.iter().map(|r| of(position[r.chunk as usize] % workers)).collect();
        (randomized.sequences, owner)
    } else {
        let order = file_order(timeline);
        let base = u128::from(sweep) * order.len() as u128;
        let workers = u128::from(workers);
        // Below `workers`, so it fits.
        let owner = (0..order.len()).map(|i| of(u64::try_from((base + i as u128) % workers).unwrap_or(0))).collect();
        (order, owner)
    }
}

/// Groups the local positions by chunk (`use_start`, `uses`) and lists the local chunks in order
/// of first use.
fn index_uses(order: &[SeqRef], local: &[bool], num_chunks: usize) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut use_start = vec![0u32; num_chunks + 1];
    let mut by_first_use = Vec::new();
    for (r, _) in order.iter().zip(local).filter(|(_, &l)| l) {
        let c = r.chunk as usize;
        if use_start[c + 1] == 0 {
            by_first_use.push(r.chunk);
        }
        use_start[c + 1] += 1;
    }
    for c in 0..num_chunks {
        use_start[c + 1] += use_start[c];
    }
    let mut cursor = use_start.clone();
    let mut uses = vec![0u32; use_start[num_chunks] as usize];
    for (index, r) in order.iter().enumerate().filter(|&(i, _)| local[i]) {
        let c = r.chunk as usize;
        uses[cursor[c] as usize] = to_u32(index);
        cursor[c] += 1;
    }
    (use_start, uses, by_first_use)
}
