//! One sweep as one worker walks it: the global order plus, per position, whether the sequence
//! belongs to this worker and whether it is this worker's last use of its chunk in the sweep.
//!
//! Ownership follows CNTK (`reference/cntk-ctf-semantics.md` §2.6):
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

use super::randomizer::{file_order, randomize_sweep, uses_block_randomizer};
use super::{SamplingOptions, SeqRef, Timeline};

/// Flag bit: the sequence at this position belongs to this worker.
const LOCAL: u8 = 1;
/// Flag bit: this worker uses no later sequence of the same chunk in this sweep.
const LAST_USE: u8 = 2;

/// The order of one sweep with this worker's ownership and last-use marks.
#[derive(Debug)]
pub(crate) struct SweepPlan {
    /// Sweep index.
    pub(crate) sweep: u64,
    /// All sequences of the sweep in delivery order (every worker's).
    pub(crate) order: Vec<SeqRef>,
    /// `LOCAL` / `LAST_USE` bits per position of `order`.
    flags: Vec<u8>,
}

impl SweepPlan {
    /// Computes sweep `sweep` for worker `options.rank`.
    pub(crate) fn build(timeline: &Timeline, options: &SamplingOptions, sweep: u64) -> Self {
        let workers = options.num_workers as u64;
        let rank = options.rank as u64;
        let (order, mut flags): (Vec<SeqRef>, Vec<u8>) = if uses_block_randomizer(options) {
            let randomized = randomize_sweep(timeline, options.window, options.seed, sweep);
            let mut position = vec![0u64; randomized.chunk_order.len()];
            for (k, &chunk) in randomized.chunk_order.iter().enumerate() {
                position[chunk as usize] = k as u64;
            }
            let flags = randomized
                .sequences
                .iter()
                .map(|r| local_flag(position[r.chunk as usize] % workers == rank))
                .collect();
            (randomized.sequences, flags)
        } else {
            let order = file_order(timeline);
            let base = u128::from(sweep) * order.len() as u128;
            let flags = (0..order.len())
                .map(|i| local_flag((base + i as u128) % u128::from(workers) == u128::from(rank)))
                .collect();
            (order, flags)
        };
        mark_last_uses(&order, &mut flags, timeline.num_chunks());
        Self {
            sweep,
            order,
            flags,
        }
    }

    /// Number of sequences in the sweep.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether position `index` belongs to this worker.
    pub(crate) fn is_local(&self, index: usize) -> bool {
        self.flags[index] & LOCAL != 0
    }

    /// Whether position `index` is this worker's last use of its chunk in the sweep.
    pub(crate) fn is_last_use(&self, index: usize) -> bool {
        self.flags[index] & LAST_USE != 0
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
}

fn local_flag(local: bool) -> u8 {
    if local {
        LOCAL
    } else {
        0
    }
}

/// Sets `LAST_USE` on the last local position of every chunk.
fn mark_last_uses(order: &[SeqRef], flags: &mut [u8], num_chunks: usize) {
    let mut seen = vec![false; num_chunks];
    for (r, flag) in order.iter().zip(flags.iter_mut()).rev() {
        if *flag & LOCAL != 0 && !seen[r.chunk as usize] {
            seen[r.chunk as usize] = true;
            *flag |= LAST_USE;
        }
    }
}
