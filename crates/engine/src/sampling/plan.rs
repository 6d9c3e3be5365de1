//! One sweep as one worker walks it: the global order, produced a randomization window at a time,
//! plus, per position, the worker that owns it and whether it is this worker's last use of its
//! chunk in the sweep.
//!
//! A block-randomized sweep is not computed whole. CNTK's windowed shuffle (see
//! [`super::randomizer`]) swaps position `t` only with positions of its chunk's window, and the
//! windows move right as `t` does; so a position is final once the shuffle has reached a chunk
//! whose window begins after it, and a position past the window of the chunk being shuffled has
//! not been touched yet (it still holds its own sequence). A [`SweepPlan`] therefore keeps only the
//! positions between the oldest one its reader may still ask for and the end of the window being
//! shuffled — at most one window's sequences ([`window_sequences`]) — and a few numbers per chunk:
//! memory O(window + chunks) instead of O(sequences), with exactly the eager pass's order
//! ([`super::randomizer::randomize_sweep`], the test oracle). Going back in a sweep replays it
//! from its start, as CNTK's own `SequenceRandomizer` does.
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

use crate::hash::ChunkSet;

use super::randomizer::uses_block_randomizer;
use super::{to_u32, SamplingOptions, SeqRef, Timeline, Window};

mod shuffle;

use shuffle::Shuffle;

/// Heap bytes a plan holds per position it keeps ([`Slot`]).
pub(crate) const SLOT_BYTES: u64 = 8;

/// Heap bytes a block-randomized plan holds per chunk: chunk order, window, first position
/// (4 + 8 + 8), and its bookkeeping (first use, last use, last use before the epoch end, count
/// of final positions, order of first use: 5 × 4).
pub(crate) const PLAN_BYTES_PER_CHUNK: u64 = 40;

/// Heap bytes a block-randomized plan holds whatever the timeline: its random generator's state
/// (2.5 KiB) and its own fields, with room to spare.
pub(crate) const PLAN_FIXED_BYTES: u64 = 4 << 10;

/// One position of the sweep being shuffled: the sequence it holds and the randomized chunk
/// position that sequence came from.
#[derive(Clone, Copy)]
struct Slot {
    seq: u32,
    origin: u32,
}

/// What a sweep holds at one position, for one worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    /// The sequence and its original chunk.
    pub(crate) seq: SeqRef,
    /// The worker (rank) that owns the position.
    pub(crate) owner: u64,
    /// Whether it is this worker's last use of the chunk in the sweep.
    pub(crate) last_use: bool,
}

/// The order of one sweep with this worker's share of it.
#[derive(Debug)]
pub(crate) struct SweepPlan {
    /// Sweep index.
    pub(crate) sweep: u64,
    len: usize,
    rank: u64,
    workers: u64,
    /// Samples from the sweep start to the epoch end (`u64::MAX` past the sweep).
    epoch_offset: u64,
    order: Order,
}

#[derive(Debug)]
enum Order {
    Block(Box<Shuffle>),
    Files(FileOrder),
}

impl SweepPlan {
    /// Sweep `sweep` for worker `options.rank`; `sweep_size` and `epoch_end` bound the prefetch
    /// queries. The first window is shuffled at once, so that a plan built on another thread
    /// ([`super::NextSweepJob`]) leaves its reader little to do.
    pub(crate) fn build(
        timeline: &Timeline,
        options: &SamplingOptions,
        sweep: u64,
        sweep_size: u64,
        epoch_end: u64,
    ) -> Self {
        let sweep_start = sweep.saturating_mul(sweep_size);
        let epoch_offset = if epoch_end.saturating_sub(sweep_start) >= sweep_size {
            u64::MAX
        } else {
            epoch_end.saturating_sub(sweep_start)
        };
        let workers = options.num_workers.max(1) as u64;
        let rank = options.rank as u64;
        let order = if uses_block_randomizer(options) {
            Order::Block(Box::new(Shuffle::new(timeline, options.window, options.seed.wrapping_add(sweep))))
        } else {
            Order::Files(FileOrder::new(timeline, sweep, epoch_offset))
        };
        let mut plan = Self { sweep, len: timeline.num_sequences(), rank, workers, epoch_offset, order };
        if plan.len > 0 {
            plan.entry(timeline, 0);
        }
        plan
    }

    /// Number of sequences in the sweep.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// What position `index` (below [`SweepPlan::len`]) holds. Positions are meant to be asked
    /// in increasing order (the same one again is fine); an earlier one replays the sweep.
    pub(crate) fn entry(&mut self, timeline: &Timeline, index: usize) -> Entry {
        let (workers, rank) = (self.workers, self.rank);
        match &mut self.order {
            Order::Block(shuffle) => {
                let slot = shuffle.get(timeline, index, self.epoch_offset);
                let owner = if workers == 1 { 0 } else { u64::from(slot.origin) % workers };
                let last_use = owner == rank && shuffle.is_last(slot.origin, index);
                Entry { seq: shuffle.seq_ref(slot), owner, last_use }
            }
            Order::Files(files) => {
                let chunk = files.chunk_of(timeline, index);
                let owner = files.owner(index, workers);
                let last_use = owner == rank && files.last_local_in(timeline, chunk, workers, rank) == Some(index);
                Entry { seq: SeqRef { seq: to_u32(index), chunk: to_u32(chunk) }, owner, last_use }
            }
        }
    }

    /// The first position whose start (samples from the sweep start) is `>= offset`, and that
    /// start; `(len, sweep_size)` if every sequence starts before `offset`. This is CNTK's
    /// `SequenceRandomizer::Seek` / `NoRandomizer::SetState` rule. Walks the sweep from its start.
    pub(crate) fn seek(&mut self, timeline: &Timeline, offset: u64) -> (usize, u64) {
        let mut start = 0u64;
        for index in 0..self.len {
            if start >= offset {
                return (index, start);
            }
            let seq = self.entry(timeline, index).seq.seq;
            start += u64::from(timeline.seq_len[seq as usize]);
        }
        (self.len, start)
    }

    /// Appends to `out` (skipping chunks in `seen`) this worker's chunks used at positions
    /// `from..` before the epoch end, until `out` holds `max`: a prefetch hint. Every chunk named
    /// is used there. In file order they come in order of next use. Block-randomized, from what
    /// the shuffle has settled so far: first the chunks in use that are needed again, then those
    /// not used yet in order of first use, then those whose sequences are all still being
    /// shuffled, in randomized chunk order; when fewer than `max` are named, every chunk used in
    /// the rest of a sweep that ends within the epoch is. `from` is a position already read
    /// ([`SweepPlan::entry`]) or the one after it, as the sampler's cursor always is.
    pub(crate) fn upcoming_into(
        &self,
        timeline: &Timeline,
        from: usize,
        max: usize,
        out: &mut Vec<u32>,
        seen: &mut ChunkSet,
    ) {
        let mut push = |chunk: u32| {
            if out.len() >= max {
                return false;
            }
            if seen.insert(chunk) {
                out.push(chunk);
            }
            out.len() < max
        };
        match &self.order {
            Order::Block(shuffle) => {
                shuffle.upcoming(from, self.epoch_offset == u64::MAX, (self.workers, self.rank), &mut push);
            }
            Order::Files(files) => files.upcoming(timeline, from, (self.workers, self.rank), &mut push),
        }
    }
}

/// Most sequences a block-randomized sweep of `timeline` keeps at once under `options`' window:
/// those of its widest randomization window, whichever chunks the shuffle puts in it. A window of
/// `w` chunks holds at most the `w` largest; one of `w` samples spans at most `w` samples plus
/// one chunk's, and holds at most as many sequences as chunks of the shortest sequences fill that
/// span with (taking a part of the last). 0 without randomization.
#[must_use]
pub fn window_sequences(timeline: &Timeline, options: &SamplingOptions) -> u64 {
    if !uses_block_randomizer(options) {
        return 0;
    }
    let total = timeline.num_sequences() as u64;
    let sequences = timeline.chunk_start.windows(2).map(|p| (p[1] - p[0]) as u64);
    let bound = match options.window.normalized() {
        Window::Chunks(w) => {
            let mut sizes: Vec<u64> = sequences.collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            sizes.iter().take(w.max(1)).sum()
        }
        Window::Samples(w) => {
            // (sequences, samples) per chunk.
            let mut chunks: Vec<(u64, u64)> = sequences
                .zip(timeline.chunk_start.windows(2))
                .map(|(n, p)| (n, timeline.samples(p[0]..p[1])))
                .collect();
            let largest = chunks.iter().map(|c| c.1).max().unwrap_or(0);
            let mut room = w.saturating_add(largest);
            // Most sequences per sample first: a1/b1 > a2/b2 ⇔ a1·b2 > a2·b1.
            chunks
                .sort_unstable_by(|a, b| (u128::from(b.0) * u128::from(a.1)).cmp(&(u128::from(a.0) * u128::from(b.1))));
            let mut sequences = 0u64;
            for (seqs, samples) in chunks {
                if samples <= room {
                    sequences += seqs;
                    room -= samples;
                } else {
                    // A part of this chunk: at most its share of the room, rounded up.
                    let part = (u128::from(seqs) * u128::from(room)).div_ceil(u128::from(samples.max(1)));
                    sequences = sequences.saturating_add(u64::try_from(part).unwrap_or(u64::MAX));
                    break;
                }
            }
            sequences
        }
    };
    bound.min(total)
}

/// File order: sequence `i` at position `i`, dealt round-robin counting from the timeline start.
#[derive(Debug)]
struct FileOrder {
    /// `sweep * num_sequences`: the global index of the sweep's first sequence.
    base: u128,
    /// The chunk of the last position asked (positions are asked in increasing order).
    chunk: usize,
    /// The first position that starts at or after the epoch end.
    end_index: usize,
}

impl FileOrder {
    fn new(timeline: &Timeline, sweep: u64, epoch_offset: u64) -> Self {
        let len = timeline.num_sequences();
        let end_index = if epoch_offset == u64::MAX {
            len
        } else {
            let mut start = 0u64;
            timeline
                .seq_len
                .iter()
                .position(|l| {
                    let before = start;
                    start += u64::from(l);
                    before >= epoch_offset
                })
                .unwrap_or(len)
        };
        Self { base: u128::from(sweep) * len as u128, chunk: 0, end_index }
    }

    fn chunk_of(&mut self, timeline: &Timeline, index: usize) -> usize {
        let starts = &timeline.chunk_start;
        if index < starts[self.chunk] || index >= starts[self.chunk + 1] {
            self.chunk = starts.partition_point(|&s| s <= index) - 1;
        }
        self.chunk
    }

    fn owner(&self, index: usize, workers: u64) -> u64 {
        if workers == 1 {
            return 0;
        }
        // Below `workers`, so it fits.
        u64::try_from((self.base + index as u128) % u128::from(workers)).unwrap_or(0)
    }

    /// The first position at or after `at` that `rank` owns.
    fn next_local(&self, at: usize, workers: u64, rank: u64) -> usize {
        let owner = self.owner(at, workers);
        // Below `workers`, a usize count.
        at + usize::try_from((rank + workers - owner) % workers).unwrap_or(0)
    }

    /// The last position of `chunk` that `rank` owns.
    fn last_local_in(&self, timeline: &Timeline, chunk: usize, workers: u64, rank: u64) -> Option<usize> {
        let (start, end) = (timeline.chunk_start[chunk], timeline.chunk_start[chunk + 1]);
        let last = end - 1;
        let back = usize::try_from((self.owner(last, workers) + workers - rank) % workers).unwrap_or(0);
        (last >= start + back).then(|| last - back)
    }

    fn upcoming(
        &self,
        timeline: &Timeline,
        from: usize,
        (workers, rank): (u64, u64),
        push: &mut impl FnMut(u32) -> bool,
    ) {
        if from >= self.end_index {
            return;
        }
        let starts = &timeline.chunk_start;
        let first_chunk = starts.partition_point(|&s| s <= from) - 1;
        for chunk in first_chunk..timeline.num_chunks() {
            let (begin, end) = (starts[chunk].max(from), starts[chunk + 1].min(self.end_index));
            if begin >= end {
                return;
            }
            if self.next_local(begin, workers, rank) < end && !push(to_u32(chunk)) {
                return;
            }
        }
    }
}

/// Calls `each(entry)` for the positions of sweep `sweep` in order, the owners counted among
/// `options.num_workers`, until it returns `false` (the same rule as [`SweepPlan`]'s, for every
/// worker at once).
pub(crate) fn walk_owners(
    timeline: &Timeline,
    options: &SamplingOptions,
    sweep: u64,
    sweep_size: u64,
    mut each: impl FnMut(Entry) -> bool,
) {
    let mut plan = SweepPlan::build(timeline, options, sweep, sweep_size, u64::MAX);
    for index in 0..plan.len() {
        if !each(plan.entry(timeline, index)) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::sampling::proptests::timeline_of as timeline;
    use crate::sampling::randomizer::{randomize_sweep, sweep_order};
    use crate::sampling::EpochLimit;

    fn options(window: Window, seed: u64, workers: usize, rank: usize) -> SamplingOptions {
        SamplingOptions { randomize: true, window, seed, limit: EpochLimit::Infinite, num_workers: workers, rank }
    }

    fn window_strategy() -> impl Strategy<Value = Window> {
        prop_oneof![(1usize..12).prop_map(Window::Chunks), (1u64..400).prop_map(Window::Samples)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Walked a position at a time, a plan gives exactly the eager pass's order (the oracle
        /// that CNTK's recorded orders check), keeps no more positions than its widest window,
        /// and marks as a chunk's last use exactly the position after which it does not come back.
        #[test]
        fn a_plan_walked_a_window_at_a_time_is_the_eager_order(
            chunks in prop::collection::vec(prop::collection::vec(1u32..=4, 1..=30), 1..=40),
            window in window_strategy(),
            seed in any::<u64>(),
            sweep in 0u64..3,
            workers in 1usize..=3,
        ) {
            let t = timeline(&chunks);
            let o = options(window, seed, workers, 0);
            let eager = randomize_sweep(&t, window, seed, sweep);
            let mut plan = SweepPlan::build(&t, &o, sweep, u64::MAX / 8, u64::MAX);
            let entries: Vec<Entry> = (0..plan.len()).map(|i| plan.entry(&t, i)).collect();
            let got: Vec<SeqRef> = entries.iter().map(|e| e.seq).collect();
            prop_assert_eq!(&got, &eager.sequences);
            let Order::Block(shuffle) = &plan.order else { panic!("randomized") };
            prop_assert!(shuffle.kept.capacity() as u64 <= window_sequences(&t, &o));
            for (i, e) in entries.iter().enumerate() {
                let k = eager.chunk_order.iter().position(|&c| c == e.seq.chunk).expect("chunk");
                prop_assert_eq!(e.owner, (k % workers) as u64);
                let later = got[i + 1..].iter().any(|r| r.chunk == e.seq.chunk);
                prop_assert_eq!(e.last_use, e.owner == 0 && !later, "position {}", i);
            }
        }

        /// Going back replays the sweep: a position asked after later ones holds what it held.
        #[test]
        fn going_back_replays_the_same_order(
            chunks in prop::collection::vec(prop::collection::vec(1u32..=4, 1..=20), 1..=20),
            window in window_strategy(),
            seed in any::<u64>(),
            back in any::<prop::sample::Index>(),
        ) {
            let t = timeline(&chunks);
            let o = options(window, seed, 1, 0);
            let order = sweep_order(&t, &o, 1);
            let mut plan = SweepPlan::build(&t, &o, 1, u64::MAX / 8, u64::MAX);
            let _ = plan.entry(&t, plan.len() - 1);
            let i = back.index(plan.len());
            prop_assert_eq!(plan.entry(&t, i).seq, order[i]);
            prop_assert_eq!(plan.seek(&t, 0), (0, 0));
        }
    }
}
