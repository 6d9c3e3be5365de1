//! CNTK's windowed sequence shuffle, run a chunk of positions at a time ([`Shuffle`]): the
//! block-randomized order a [`super::SweepPlan`] reads, with the per-chunk bookkeeping behind its
//! last uses and prefetch hints. Kept apart from the plan, which also deals file order and owners.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Slot;
use crate::sampling::mt64::{Mt19937_64, Range};
use crate::sampling::randomizer::{shuffle_chunks, sweep_windows, ChunkWindow};
use crate::sampling::{to_u32, SeqRef, Timeline, Window};

/// Marks a chunk not used yet.
const UNSEEN: u32 = u32::MAX;

/// How many positions ahead a sweep-wide window's shuffle draws its swaps (a prefetch each).
const DRAWS_AHEAD: usize = 8;

/// CNTK's windowed sequence shuffle, run a chunk of positions at a time as the reader needs them.
pub(super) struct Shuffle {
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
    /// Positions `base..` are `kept[head..]`; those past them still hold their own sequences.
    /// Positions let go of only move `head` on; the entries before it are dropped when room is
    /// needed ([`Shuffle::keep_until`]), so that reading a position costs no queue operation.
    pub(super) kept: Vec<Slot>,
    head: usize,
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
            .field("kept", &self.live())
            .finish_non_exhaustive()
    }
}

impl Shuffle {
    pub(super) fn new(timeline: &Timeline, window: Window, sweep_seed: u64) -> Self {
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
            kept: Vec::new(),
            head: 0,
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
        self.head = 0;
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
    pub(super) fn get(&mut self, timeline: &Timeline, index: usize, epoch_offset: u64) -> Slot {
        if index < self.base {
            self.rewind();
        }
        self.let_go_before(index);
        while index >= self.final_end {
            self.shuffle_next_chunk(timeline);
            self.count_final(timeline, epoch_offset);
            self.let_go_before(index);
        }
        self.slot(index)
    }

    /// How many positions are kept (`base..base + live`).
    fn live(&self) -> usize {
        self.kept.len() - self.head
    }

    /// The content of kept position `index` (`base <= index`).
    fn slot(&self, index: usize) -> Slot {
        self.kept[self.head + (index - self.base)]
    }

    /// Lets go of the positions before `index` that are final and counted.
    fn let_go_before(&mut self, index: usize) {
        let keep_from = index.min(self.counted);
        let n = keep_from.saturating_sub(self.base).min(self.live());
        self.head += n;
        self.base += n;
    }

    pub(super) fn seq_ref(&self, slot: Slot) -> SeqRef {
        SeqRef { seq: slot.seq, chunk: self.chunk_order[slot.origin as usize] }
    }

    /// Whether final position `index`, which holds a sequence of randomized chunk `origin`, is
    /// that chunk's last: every one of its sequences is final and this is the last of them.
    pub(super) fn is_last(&self, origin: u32, index: usize) -> bool {
        let k = origin as usize;
        let size = self.first[k + 1] - self.first[k];
        self.settled[k] as usize == size && self.last_use[k] as usize == index
    }

    /// Adds the untouched positions up to `end` to `kept`: each holds its own sequence.
    fn keep_until(&mut self, timeline: &Timeline, end: usize) {
        let live = self.live();
        let adding = end.saturating_sub(self.base + live);
        if self.kept.len() + adding > self.capacity {
            // Drop the positions let go of: the live ones move to the front (a window's worth at
            // most, once per randomized chunk at most).
            self.kept.drain(..self.head);
            self.head = 0;
        }
        if self.kept.capacity() < self.capacity {
            self.kept.reserve_exact(self.capacity - self.kept.len());
        }
        let mut position = self.base + live;
        while position < end {
            let k = self.first.partition_point(|&f| f <= position) - 1;
            let original = self.chunk_order[k] as usize;
            let until = end.min(self.first[k + 1]);
            let first_seq = timeline.chunk_start[original] + (position - self.first[k]);
            for offset in 0..until - position {
                self.kept.push(Slot { seq: to_u32(first_seq + offset), origin: to_u32(k) });
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
        let slots = &mut self.kept[self.head..];
        let window_first = &self.first[window.begin as usize..=window.end as usize];
        let chunks_in_window = window_first.len() - 1;
        let (start, end) = (self.first[k], self.first[k + 1]);
        if self.whole {
            // One window over the sweep: each position swaps with one anywhere in it. The draws
            // are made a few positions ahead — the same draws in the same order — so the slot
            // each swap reads is on its way into the cache before the swap needs it.
            let range = Range::new(0, total);
            let mut ahead = [0usize; DRAWS_AHEAD];
            for j in ahead.iter_mut().take(end - start) {
                *j = self.rng.draw(&range);
                minibatchd_sys::prefetch(std::slice::from_ref(&slots[*j - base]));
            }
            for t in start..end {
                let at = (t - start) % DRAWS_AHEAD;
                let j = ahead[at];
                if t + DRAWS_AHEAD < end {
                    ahead[at] = self.rng.draw(&range);
                    minibatchd_sys::prefetch(std::slice::from_ref(&slots[ahead[at] - base]));
                }
                slots.swap(t - base, j - base);
            }
        } else {
            let range = Range::new(lo, hi);
            for t in start..end {
                loop {
                    let j = self.rng.draw(&range);
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
            let slot = self.slot(index);
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

    /// See [`SweepPlan::upcoming_into`](super::SweepPlan::upcoming_into). `whole_sweep`: the epoch
    /// does not end within the sweep.
    pub(super) fn upcoming(
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
