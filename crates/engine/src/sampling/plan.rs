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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::hash::ChunkSet;

use super::mt64::Mt19937_64;
use super::randomizer::{shuffle_chunks, sweep_windows, uses_block_randomizer, ChunkWindow};
use super::{to_u32, SamplingOptions, SeqRef, Timeline, Window};

/// Heap bytes a plan holds per position it keeps ([`Slot`]).
pub(crate) const SLOT_BYTES: u64 = 8;

/// Heap bytes a block-randomized plan holds per chunk: chunk order, window, first position
/// (4 + 8 + 8), and its bookkeeping (first use, last use, last use before the epoch end, count
/// of final positions, order of first use: 5 × 4).
pub(crate) const PLAN_BYTES_PER_CHUNK: u64 = 40;

/// Heap bytes a block-randomized plan holds whatever the timeline: its random generator's state
/// (2.5 KiB) and its own fields, with room to spare.
pub(crate) const PLAN_FIXED_BYTES: u64 = 4 << 10;

/// Marks a chunk not used yet.
const UNSEEN: u32 = u32::MAX;

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

/// CNTK's windowed sequence shuffle, run a chunk of positions at a time as the reader needs them.
struct Shuffle {
    /// `chunk_order[k]` is the original chunk at randomized position `k`.
    chunk_order: Vec<u32>,
    windows: Vec<ChunkWindow>,
    /// First position of each randomized chunk, and the sweep's length last.
    first: Vec<usize>,
    /// Every window is the whole sweep: every draw is taken (CNTK's default window on up to 128
    /// chunks), without its two random reads per sequence.
    whole: bool,
    seed: u64,
    rng: Mt19937_64,
    /// The next randomized chunk whose positions are to be shuffled.
    step_chunk: usize,
    /// Positions below this are final.
    final_end: usize,
    /// Positions `base..base + kept.len()`; those past them still hold their own sequences.
    kept: VecDeque<Slot>,
    base: usize,
    /// Most positions `kept` holds (its capacity, taken when first needed).
    capacity: usize,
    /// Final positions below this are entered in the bookkeeping below.
    counted: usize,
    /// Samples before position `counted`.
    counted_start: u64,
    /// The first position that starts at or after the epoch end, once counted.
    end_index: Option<usize>,
    /// Per randomized chunk: first and last final position holding one of its sequences, the
    /// last one before the epoch end, and how many of its sequences are final.
    first_use: Vec<u32>,
    last_use: Vec<u32>,
    last_in_epoch: Vec<u32>,
    settled: Vec<u32>,
    /// Randomized chunk positions in order of first use before the epoch end.
    by_first_use: Vec<u32>,
    /// The first randomized chunk position not used yet (every one before it is).
    first_unseen: usize,
    /// The prefetch hint's last `from` and how many leading entries of `by_first_use` it found
    /// another worker's or used for the last time before it (two `u32`s): a later hint starts
    /// after them, so that a hint costs about a window's chunks, not every chunk used so far.
    hint_skip: AtomicU64,
}

impl std::fmt::Debug for Shuffle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shuffle")
            .field("chunks", &self.chunk_order.len())
            .field("final_end", &self.final_end)
            .field("kept", &self.kept.len())
            .finish_non_exhaustive()
    }
}

impl Shuffle {
    fn new(timeline: &Timeline, window: Window, sweep_seed: u64) -> Self {
        let chunk_order = shuffle_chunks(timeline.num_chunks(), sweep_seed);
        let sizes: Vec<usize> = chunk_order
            .iter()
            .map(|&c| timeline.chunk_start[c as usize + 1] - timeline.chunk_start[c as usize])
            .collect();
        let windows = sweep_windows(timeline, &chunk_order, window);
        let mut first = Vec::with_capacity(sizes.len() + 1);
        first.push(0);
        for &s in &sizes {
            first.push(first[first.len() - 1] + s);
        }
        let whole_window = ChunkWindow { begin: 0, end: to_u32(chunk_order.len()) };
        let whole = windows.iter().all(|w| *w == whole_window);
        let capacity = windows.iter().map(|w| first[w.end as usize] - first[w.begin as usize]).max().unwrap_or(0);
        let chunks = chunk_order.len();
        Self {
            chunk_order,
            windows,
            first,
            whole,
            seed: sweep_seed,
            rng: Mt19937_64::new(sweep_seed),
            step_chunk: 0,
            final_end: 0,
            kept: VecDeque::new(),
            base: 0,
            capacity,
            counted: 0,
            counted_start: 0,
            end_index: None,
            first_use: vec![UNSEEN; chunks],
            last_use: vec![UNSEEN; chunks],
            last_in_epoch: vec![UNSEEN; chunks],
            settled: vec![0; chunks],
            by_first_use: Vec::new(),
            first_unseen: 0,
            hint_skip: AtomicU64::new(0),
        }
    }

    fn len(&self) -> usize {
        self.first[self.first.len() - 1]
    }

    /// Back to the sweep's start (to read a position already let go).
    fn rewind(&mut self) {
        self.rng = Mt19937_64::new(self.seed);
        self.step_chunk = 0;
        self.final_end = 0;
        self.kept.clear();
        self.base = 0;
        self.counted = 0;
        self.counted_start = 0;
        self.end_index = None;
        self.first_use.fill(UNSEEN);
        self.last_use.fill(UNSEEN);
        self.last_in_epoch.fill(UNSEEN);
        self.settled.fill(0);
        self.by_first_use.clear();
        self.first_unseen = 0;
        *self.hint_skip.get_mut() = 0;
    }

    /// The final content of position `index`, shuffling as far as it takes; positions before
    /// `index` are let go.
    fn get(&mut self, timeline: &Timeline, index: usize, epoch_offset: u64) -> Slot {
        if index < self.base {
            self.rewind();
        }
        self.let_go_before(index);
        while index >= self.final_end {
            self.shuffle_next_chunk(timeline);
            self.count_final(timeline, epoch_offset);
            self.let_go_before(index);
        }
        self.kept[index - self.base]
    }

    /// Lets go of the positions before `index` that are final and counted.
    fn let_go_before(&mut self, index: usize) {
        let keep_from = index.min(self.counted);
        while self.base < keep_from && !self.kept.is_empty() {
            self.kept.pop_front();
            self.base += 1;
        }
    }

    fn seq_ref(&self, slot: Slot) -> SeqRef {
        SeqRef { seq: slot.seq, chunk: self.chunk_order[slot.origin as usize] }
    }

    /// Whether final position `index`, which holds a sequence of randomized chunk `origin`, is
    /// that chunk's last: every one of its sequences is final and this is the last of them.
    fn is_last(&self, origin: u32, index: usize) -> bool {
        let k = origin as usize;
        let size = self.first[k + 1] - self.first[k];
        self.settled[k] as usize == size && self.last_use[k] as usize == index
    }

    /// Adds the untouched positions up to `end` to `kept`: each holds its own sequence.
    fn keep_until(&mut self, timeline: &Timeline, end: usize) {
        if self.kept.capacity() < self.capacity {
            self.kept.reserve_exact(self.capacity - self.kept.len());
        }
        let mut position = self.base + self.kept.len();
        while position < end {
            let k = self.first.partition_point(|&f| f <= position) - 1;
            let original = self.chunk_order[k] as usize;
            let until = end.min(self.first[k + 1]);
            let first_seq = timeline.chunk_start[original] + (position - self.first[k]);
            for offset in 0..until - position {
                self.kept.push_back(Slot { seq: to_u32(first_seq + offset), origin: to_u32(k) });
            }
            position = until;
        }
    }

    /// CNTK's swap loop over the positions of the next randomized chunk: each position `t` swaps
    /// with a random position of its window whose sequence may move into `t`'s window and whose
    /// window admits `t`'s sequence.
    fn shuffle_next_chunk(&mut self, timeline: &Timeline) {
        let k = self.step_chunk;
        let window = self.windows[k];
        let (lo, hi) = (self.first[window.begin as usize], self.first[window.end as usize]);
        self.keep_until(timeline, hi);
        let base = self.base;
        let total = self.len();
        let slots = &mut self.kept;
        let window_first = &self.first[window.begin as usize..=window.end as usize];
        let chunks_in_window = window_first.len() - 1;
        for t in self.first[k]..self.first[k + 1] {
            if self.whole {
                let j = self.rng.rand_range(0, total);
                slots.swap(t - base, j - base);
                continue;
            }
            loop {
                let j = self.rng.rand_range(lo, hi);
                let j_chunk = window.begin as usize + chunk_within(window_first, chunks_in_window, j);
                let j_window = self.windows[j_chunk];
                // Each sequence must stay within the window of the chunk it lands in. j == t is
                // always valid, so the loop ends.
                if window.contains(slots[j - base].origin) && j_window.contains(slots[t - base].origin) {
                    slots.swap(t - base, j - base);
                    break;
                }
            }
        }
        self.step_chunk += 1;
        // Later steps reach no position before the start of their windows, which never move left.
        self.final_end = if self.step_chunk == self.windows.len() {
            total
        } else {
            self.first[self.windows[self.step_chunk].begin as usize]
        };
    }

    /// Enters the positions made final into the per-chunk bookkeeping.
    fn count_final(&mut self, timeline: &Timeline, epoch_offset: u64) {
        while self.counted < self.final_end {
            let index = self.counted;
            let slot = self.kept[index - self.base];
            let k = slot.origin as usize;
            if self.end_index.is_none() && self.counted_start >= epoch_offset {
                self.end_index = Some(index);
            }
            let position = to_u32(index);
            if self.end_index.is_none() {
                if self.first_use[k] == UNSEEN {
                    self.first_use[k] = position;
                    self.by_first_use.push(slot.origin);
                    while self.first_unseen < self.first_use.len() && self.first_use[self.first_unseen] != UNSEEN {
                        self.first_unseen += 1;
                    }
                }
                self.last_in_epoch[k] = position;
            }
            self.last_use[k] = position;
            self.settled[k] += 1;
            if epoch_offset != u64::MAX {
                // Only a sweep the epoch ends in needs the starts (a random read per position).
                self.counted_start += u64::from(timeline.seq_len[slot.seq as usize]);
            }
            self.counted += 1;
        }
    }

    /// See [`SweepPlan::upcoming_into`]. `whole_sweep`: the epoch does not end within the sweep.
    fn upcoming(
        &self,
        from: usize,
        whole_sweep: bool,
        (workers, rank): (u64, u64),
        push: &mut impl FnMut(u32) -> bool,
    ) {
        if self.end_index.is_some_and(|end| from >= end) {
            return;
        }
        let local = |k: u32| u64::from(k) % workers == rank;
        let size = |k: usize| self.first[k + 1] - self.first[k];
        let from_u32 = to_u32(from.min(u32::MAX as usize));
        let split = self.by_first_use.partition_point(|&k| self.first_use[k as usize] < from_u32);
        // Used for the last time before `from`: every sequence final (or the epoch's end known),
        // and the last use before the end passed. Lasting: nothing changes either again.
        let done = |k: u32| {
            let ku = k as usize;
            let settled = self.settled[ku] as usize == size(ku) || self.end_index.is_some();
            settled && (self.last_in_epoch[ku] == UNSEEN || self.last_in_epoch[ku] < from_u32)
        };
        let (last_from, skipped) = unpack(self.hint_skip.load(Ordering::Relaxed));
        let mut start = if from_u32 >= last_from { (skipped as usize).min(split) } else { 0 };
        while start < split && (!local(self.by_first_use[start]) || done(self.by_first_use[start])) {
            start += 1;
        }
        self.hint_skip.store(pack(from_u32, to_u32(start)), Ordering::Relaxed);
        // In use: needed again when a final use lies ahead, or some sequence is not final yet
        // (and the epoch does not end first).
        for &k in self.by_first_use[start..split].iter().filter(|&&k| local(k)) {
            let ku = k as usize;
            let ahead = self.last_in_epoch[ku] != UNSEEN && self.last_in_epoch[ku] >= from_u32;
            let unsettled = whole_sweep && (self.settled[ku] as usize) < size(ku);
            if (ahead || unsettled) && !push(self.chunk_order[ku]) {
                return;
            }
        }
        for &k in self.by_first_use[split..].iter().filter(|&&k| local(k)) {
            if !push(self.chunk_order[k as usize]) {
                return;
            }
        }
        if !whole_sweep {
            return;
        }
        for k in
            (self.first_unseen..self.chunk_order.len()).filter(|&k| self.first_use[k] == UNSEEN && local(to_u32(k)))
        {
            if !push(self.chunk_order[k]) {
                return;
            }
        }
    }
}

fn pack(from: u32, skipped: u32) -> u64 {
    u64::from(from) << 32 | u64::from(skipped)
}

#[allow(clippy::cast_possible_truncation)] // the halves of a u64: each fits
fn unpack(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

/// The chunk (counted from the window's first) holding position `j` of a window whose `n` chunks
/// start at `first[..n]` (`first[n]` its end): guessed as if its chunks were of one size, then
/// stepped to, so a window of chunks of about one size costs no search.
fn chunk_within(first: &[usize], n: usize, j: usize) -> usize {
    let (lo, hi) = (first[0], first[n]);
    // Positions and chunk counts fit in u32 (the sampler checks), so the product fits in u64;
    // the quotient is below `n` (as `j < hi`).
    let guess = (j - lo) as u64 * n as u64 / (hi - lo) as u64;
    let mut c = usize::try_from(guess).unwrap_or(n - 1).min(n - 1);
    while first[c] > j {
        c -= 1;
    }
    while first[c + 1] <= j {
        c += 1;
    }
    c
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
