//! The order of one sweep: CNTK's block randomizer (chunk shuffle, randomization windows, windowed
//! sequence shuffle) and the identity order of its `NoRandomizer`.
//!
//! A sweep's order is a pure function of (timeline, window, seed, sweep index)
//! (CNTK 2.7's `ChunkRandomizer.cpp` and `SequenceRandomizer.cpp`):
//!
//! 1. the chunks are shuffled with CNTK's naive swap loop by an `mt19937_64` seeded with
//!    `seed + sweep` (truncated to 32 bits, as CNTK passes it through an `unsigned int`);
//! 2. every randomized chunk `k` gets a window `[b, e)` of randomized chunk positions, counted in
//!    chunks or in samples;
//! 3. sequence positions are shuffled in increasing order by a second `mt19937_64` seeded with
//!    `seed + sweep` (full 64 bits): position `t` swaps with a random position `j` of its window
//!    provided each sequence may live in the other's chunk window.
//!
//! CNTK performs step 3 lazily, a few chunks ahead of the reader; the result equals this eager
//! pass because no swap ever reaches a chunk that has not been paged in, so every position is
//! drawn against the same array contents with the same random stream. The sampler does the same
//! ([`super::plan`], a window at a time, so that its memory does not grow with the dataset);
//! the eager pass here states the algorithm plainly and is the oracle its tests compare with.
//!
//! Fed by: the options of a session. Feeds: [`super::plan`] (the chunk shuffle and the windows)
//! and the tests (whole sweeps' orders).

use super::mt64::Mt19937_64;
use super::{to_u32, SamplingOptions, SeqRef, Timeline, Window};

/// A half-open interval `[begin, end)` of randomized chunk positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkWindow {
    /// First randomized chunk position in the window.
    pub begin: u32,
    /// One past the last randomized chunk position in the window.
    pub end: u32,
}

impl ChunkWindow {
    /// Whether randomized chunk position `k` lies in the window.
    #[must_use]
    pub fn contains(self, k: u32) -> bool {
        self.begin <= k && k < self.end
    }

    /// Number of chunks in the window.
    #[must_use]
    pub fn len(self) -> usize {
        (self.end - self.begin) as usize
    }

    /// Whether the window holds no chunk (never the case for a computed window).
    #[must_use]
    pub fn is_empty(self) -> bool {
        self.end <= self.begin
    }
}

/// One randomized sweep: the chunk permutation, the windows and the resulting sequence order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomizedSweep {
    /// `chunk_order[k]` is the original chunk at randomized position `k`.
    pub chunk_order: Vec<u32>,
    /// Randomization window of each randomized chunk position.
    pub windows: Vec<ChunkWindow>,
    /// The sweep's sequences in delivery order (all workers).
    pub sequences: Vec<SeqRef>,
}

/// Whether `options` select CNTK's block randomizer. A window of 0 (in chunks or in samples)
/// means "no randomization" in CNTK's V2 API (`MinibatchSourceConfig` maps both windows being 0
/// to `randomize = false`), so it selects the `NoRandomizer` order like `randomize = false`.
#[must_use]
pub fn uses_block_randomizer(options: &SamplingOptions) -> bool {
    options.randomize && options.window.normalized() != Window::Chunks(0)
}

/// The sequences of sweep `sweep` in delivery order, all workers together: the block-randomized
/// order when [`uses_block_randomizer`], else file order. The timeline must be valid (as checked
/// by [`super::Sampler::new`]).
#[must_use]
pub fn sweep_order(timeline: &Timeline, options: &SamplingOptions, sweep: u64) -> Vec<SeqRef> {
    if uses_block_randomizer(options) {
        randomize_sweep(timeline, options.window, options.seed, sweep).sequences
    } else {
        file_order(timeline)
    }
}

/// The original chunks this worker (`options.rank` of `options.num_workers`) reads in sweep
/// `sweep`, in the order its minibatches first need them, without the sequence shuffle (which
/// takes a tenth of a second per million sequences): when block-randomized, the chunk shuffle's
/// positions `k` with `k % num_workers == rank` (whole chunks go to one worker; the first
/// minibatch draws from the first window, `[0, e)`, and each later window starts at or after the
/// one before); in file order, every chunk (sequences are dealt round-robin). A session asks for
/// these chunks while its sweep's sequence order is still being computed.
#[must_use]
pub fn chunk_need_order(timeline: &Timeline, options: &SamplingOptions, sweep: u64) -> Vec<u32> {
    if uses_block_randomizer(options) {
        let workers = options.num_workers.max(1);
        let order = shuffle_chunks(timeline.num_chunks(), options.seed.wrapping_add(sweep));
        order.into_iter().enumerate().filter(|(k, _)| k % workers == options.rank).map(|(_, c)| c).collect()
    } else {
        (0..timeline.num_chunks()).map(to_u32).collect()
    }
}

/// All sequences in file order with their original chunk (the `NoRandomizer` order).
#[must_use]
pub fn file_order(timeline: &Timeline) -> Vec<SeqRef> {
    let mut order = Vec::with_capacity(timeline.num_sequences());
    for chunk in 0..timeline.num_chunks() {
        let chunk_id = to_u32(chunk);
        for seq in timeline.chunk_start[chunk]..timeline.chunk_start[chunk + 1] {
            order.push(SeqRef { seq: to_u32(seq), chunk: chunk_id });
        }
    }
    order
}

/// Block-randomizes sweep `sweep` with seed offset `seed` (both RNGs use `seed + sweep`).
#[must_use]
pub fn randomize_sweep(timeline: &Timeline, window: Window, seed: u64, sweep: u64) -> RandomizedSweep {
    let sweep_seed = seed.wrapping_add(sweep);
    let chunk_order = shuffle_chunks(timeline.num_chunks(), sweep_seed);
    let windows = sweep_windows(timeline, &chunk_order, window);
    let mut rng = Mt19937_64::new(sweep_seed);
    let sequences = shuffle_sequences(timeline, &chunk_order, &windows, &mut rng);
    RandomizedSweep { chunk_order, windows, sequences }
}

/// The randomization window of each randomized chunk position of `chunk_order` under `window`
/// (in chunks, or in samples; a sample window of 0 is CNTK's "no sample window": the default
/// chunk window).
#[must_use]
pub fn sweep_windows(timeline: &Timeline, chunk_order: &[u32], window: Window) -> Vec<ChunkWindow> {
    match window.normalized() {
        Window::Chunks(w) => windows_in_chunks(chunk_order.len(), w),
        Window::Samples(w) => {
            let samples: Vec<u64> = chunk_order.iter().map(|&c| chunk_samples(timeline, c)).collect();
            windows_in_samples(&samples, w)
        }
    }
}

/// CNTK's `ChunkRandomizer::Randomize`: the naive shuffle of `0..num_chunks`. `sweep_seed` is
/// truncated to 32 bits because CNTK's `Randomize` takes an `unsigned int`.
#[must_use]
pub fn shuffle_chunks(num_chunks: usize, sweep_seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..num_chunks).map(to_u32).collect();
    let mut rng = Mt19937_64::new(sweep_seed & u64::from(u32::MAX));
    rng.naive_shuffle(&mut order);
    order
}

/// `RandomizeUsingWindowInChunks`: a window of `W = max(window, 1)` chunks centred on each
/// position (`window / 2` to the left), shifted to fit inside `0..num_chunks`.
#[must_use]
pub fn windows_in_chunks(num_chunks: usize, window: usize) -> Vec<ChunkWindow> {
    let width = window.max(1);
    let half = window / 2;
    (0..num_chunks)
        .map(|k| {
            let mut begin = k.saturating_sub(half);
            let mut end = begin.saturating_add(width);
            if end > num_chunks {
                end = num_chunks;
                begin = num_chunks.saturating_sub(width);
            }
            ChunkWindow { begin: to_u32(begin), end: to_u32(end) }
        })
        .collect()
}

/// `RandomizeUsingWindowInSamples`: starting from the previous chunk's window, move the start
/// right while the chunk start is more than `window / 2` samples past it, then extend the end
/// while the next chunk ends less than `window / 2` samples after this chunk's start.
/// `chunk_samples` are the sample counts in randomized order.
#[must_use]
pub fn windows_in_samples(chunk_samples: &[u64], window: u64) -> Vec<ChunkWindow> {
    let n = chunk_samples.len();
    let half = window / 2;
    let mut starts = Vec::with_capacity(n + 1);
    starts.push(0u64);
    for &s in chunk_samples {
        starts.push(starts[starts.len() - 1] + s);
    }
    let mut windows = Vec::with_capacity(n);
    let (mut begin, mut end) = (0usize, 1usize);
    for k in 0..n {
        while starts[k] - starts[begin] > half {
            begin += 1;
        }
        begin = begin.min(k);
        end = end.max(k + 1);
        while end < n && starts[end + 1] - starts[k] < half {
            end += 1;
        }
        windows.push(ChunkWindow { begin: to_u32(begin), end: to_u32(end) });
    }
    windows
}

/// A sequence on the sweep timeline: its id and the randomized chunk position it came from.
#[derive(Clone, Copy)]
struct Slot {
    seq: u32,
    origin: u32,
}

/// `SequenceRandomizer`'s windowed shuffle, as one eager pass over all positions.
fn shuffle_sequences(
    timeline: &Timeline,
    chunk_order: &[u32],
    windows: &[ChunkWindow],
    rng: &mut Mt19937_64,
) -> Vec<SeqRef> {
    let total = timeline.num_sequences();
    let mut slots = Vec::with_capacity(total);
    let mut position_chunk = Vec::with_capacity(total);
    let mut chunk_first_position = Vec::with_capacity(chunk_order.len() + 1);
    for (k, &chunk) in chunk_order.iter().enumerate() {
        chunk_first_position.push(slots.len());
        let chunk = chunk as usize;
        for seq in timeline.chunk_start[chunk]..timeline.chunk_start[chunk + 1] {
            slots.push(Slot { seq: to_u32(seq), origin: to_u32(k) });
            position_chunk.push(to_u32(k));
        }
    }
    chunk_first_position.push(slots.len());

    let whole = ChunkWindow { begin: 0, end: to_u32(chunk_order.len()) };
    if windows.iter().all(|w| *w == whole) {
        // Every window is the whole sweep (CNTK's default window on up to 128 chunks): every
        // swap is valid, so the first draw is taken, as the loop below would, without its two
        // random reads per sequence.
        for t in 0..slots.len() {
            let j = rng.rand_range(0, slots.len());
            slots.swap(t, j);
        }
    } else {
        shuffle_within_windows(&mut slots, &position_chunk, &chunk_first_position, windows, rng);
    }
    slots.into_iter().map(|s| SeqRef { seq: s.seq, chunk: chunk_order[s.origin as usize] }).collect()
}

/// CNTK's swap loop: each position `t` swaps with a random position of its window whose
/// sequence may move into `t`'s window and whose window admits `t`'s sequence.
fn shuffle_within_windows(
    slots: &mut [Slot],
    position_chunk: &[u32],
    chunk_first_position: &[usize],
    windows: &[ChunkWindow],
    rng: &mut Mt19937_64,
) {
    for t in 0..slots.len() {
        let window = windows[position_chunk[t] as usize];
        let first = chunk_first_position[window.begin as usize];
        let last = chunk_first_position[window.end as usize];
        loop {
            let j = rng.rand_range(first, last);
            let j_window = windows[position_chunk[j] as usize];
            // Each sequence must stay within the window of the chunk it lands in. j == t is
            // always valid, so the loop ends.
            if window.contains(slots[j].origin) && j_window.contains(slots[t].origin) {
                slots.swap(t, j);
                break;
            }
        }
    }
}

/// Nominal samples in original chunk `chunk`.
fn chunk_samples(timeline: &Timeline, chunk: u32) -> u64 {
    let chunk = chunk as usize;
    timeline.samples(timeline.chunk_start[chunk]..timeline.chunk_start[chunk + 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CNTK's `MockDeserializer`: `chunks` chunks of `per_chunk` sequences of length `len`.
    fn mock(chunks: usize, per_chunk: usize, len: u32) -> Timeline {
        Timeline {
            seq_len: vec![len; chunks * per_chunk].into(),
            chunk_start: (0..=chunks).map(|c| c * per_chunk).collect(),
        }
    }

    fn ids(order: &[SeqRef]) -> Vec<u32> {
        order.iter().map(|r| r.seq).collect()
    }

    fn randomized(window: Window, seed: u64) -> SamplingOptions {
        SamplingOptions {
            randomize: true,
            window,
            seed,
            limit: crate::sampling::EpochLimit::Infinite,
            num_workers: 1,
            rank: 0,
        }
    }

    /// Every position of a sweep that a worker owns draws from a chunk it finds early in its
    /// `chunk_need_order`: before the end of the owned part of the window `[b, e)` of the
    /// randomized chunk the position lies in. Asked for in that order, the chunks a worker's first
    /// minibatches need come first, and it asks for no chunk it never reads.
    #[test]
    fn a_sweep_needs_its_chunks_in_the_need_order_at_every_rank() {
        // Chunks of uneven sizes: 3, 1, 4, 1, 5, 9, 2, 6 sequences of 1 to 3 samples.
        let sizes = [3usize, 1, 4, 1, 5, 9, 2, 6];
        let mut chunk_start = vec![0];
        for s in sizes {
            chunk_start.push(chunk_start.last().expect("a start") + s);
        }
        let total = *chunk_start.last().expect("a start");
        let t = Timeline { seq_len: [1, 2, 3].into_iter().cycle().take(total).collect(), chunk_start };
        let mut checked = 0;
        for window in [Window::Chunks(1), Window::Chunks(2), Window::Chunks(3), Window::Samples(7), Window::Samples(12)]
        {
            for (seed, sweep) in [(0, 0), (7, 0), (7, 3), (123_456_789, 1)] {
                let r = randomize_sweep(&t, window, seed, sweep);
                let mut position = [0usize; 8];
                for (k, &c) in r.chunk_order.iter().enumerate() {
                    position[c as usize] = k;
                }
                for workers in 1..=3 {
                    for rank in 0..workers {
                        let options = SamplingOptions { num_workers: workers, rank, ..randomized(window, seed) };
                        let need = chunk_need_order(&t, &options, sweep);
                        let owned: Vec<u32> = r
                            .chunk_order
                            .iter()
                            .enumerate()
                            .filter(|(k, _)| k % workers == rank)
                            .map(|(_, &c)| c)
                            .collect();
                        assert_eq!(need, owned, "{window:?} seed {seed} sweep {sweep} rank {rank}/{workers}");
                        let mut k = 0;
                        let first = r.chunk_order[0] as usize;
                        let mut k_end = t.chunk_start[first + 1] - t.chunk_start[first];
                        for (pos, s) in r.sequences.iter().enumerate() {
                            while pos >= k_end {
                                k += 1;
                                let c = r.chunk_order[k] as usize;
                                k_end += t.chunk_start[c + 1] - t.chunk_start[c];
                            }
                            if position[s.chunk as usize] % workers != rank {
                                continue; // another worker's sequence
                            }
                            let at = need.iter().position(|&c| c == s.chunk).expect("an owned chunk");
                            let owned_in_window =
                                (0..r.windows[k].end as usize).filter(|k| k % workers == rank).count();
                            assert!(
                                at < owned_in_window,
                                "{window:?} seed {seed} sweep {sweep} rank {rank}/{workers}: position {pos} needs chunk {} \
                                 at {at} of the need order, past the {owned_in_window} owned chunks of its window {:?}",
                                s.chunk,
                                r.windows[k]
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 1000, "{checked} positions checked");
        let file = SamplingOptions { randomize: false, num_workers: 2, rank: 1, ..randomized(Window::Chunks(2), 0) };
        assert_eq!(chunk_need_order(&t, &file, 5), (0..8).collect::<Vec<u32>>());
    }

    // ReaderLibTests.cpp TestRandomization_FirstEpoch / BlockRandomizerOneEpochLegacyRandomization:
    // 5 chunks x 2 one-sample sequences, window SIZE_MAX samples.
    #[test]
    fn golden_whole_window_seed_0() {
        let t = mock(5, 2, 1);
        let order = sweep_order(&t, &randomized(Window::Samples(u64::MAX), 0), 0);
        assert_eq!(ids(&order), [6, 3, 1, 5, 9, 0, 4, 2, 7, 8]);
    }

    // ReaderLibTests.cpp TestRandomization_SecondEpoch (sweep 1 of seed 0).
    #[test]
    fn golden_whole_window_sweep_1() {
        let t = mock(5, 2, 1);
        let order = sweep_order(&t, &randomized(Window::Samples(u64::MAX), 0), 1);
        assert_eq!(ids(&order), [3, 0, 8, 4, 7, 5, 2, 9, 1, 6]);
        let seed_1 = sweep_order(&t, &randomized(Window::Samples(u64::MAX), 1), 0);
        assert_eq!(order, seed_1);
    }

    // ReaderLibTests.cpp BlockRandomizerOneEpochWithChunks1: window of 4 samples.
    #[test]
    fn golden_window_4_samples() {
        let t = mock(5, 2, 1);
        let order = sweep_order(&t, &randomized(Window::Samples(4), 0), 0);
        assert_eq!(ids(&order), [8, 9, 1, 0, 6, 7, 2, 3, 4, 5]);
    }

    // ReaderLibTests.cpp BlockRandomizerOneEpochWithChunks2: 10 chunks x 2, window of 18 samples.
    #[test]
    fn golden_window_18_samples() {
        let t = mock(10, 2, 1);
        let order = sweep_order(&t, &randomized(Window::Samples(18), 0), 0);
        assert_eq!(ids(&order), [18, 19, 7, 14, 6, 9, 8, 15, 5, 2, 10, 13, 16, 17, 1, 4, 3, 12, 11, 0]);
    }

    // ReaderLibTests.cpp TestChunkBasedRandomization: a window of k*100 samples over 100-sample
    // chunks lies inside the window of k chunks, which always spans min(n, max(k, 1)) chunks.
    #[test]
    fn chunk_windows_contain_equivalent_sample_windows() {
        let n = 10;
        for k in 0..=20usize {
            let in_chunks = windows_in_chunks(n, k);
            let in_samples = windows_in_samples(&[100; 10], k as u64 * 100);
            for (c, s) in in_chunks.iter().zip(&in_samples) {
                assert_eq!(c.len(), n.min(k.max(1)));
                assert!(s.begin >= c.begin && s.end <= c.end, "k={k}: {s:?} not in {c:?}");
            }
        }
    }

    #[test]
    fn chunk_windows_match_cntk_formula() {
        let w = windows_in_chunks(6, 3);
        let pairs: Vec<(u32, u32)> = w.iter().map(|w| (w.begin, w.end)).collect();
        assert_eq!(pairs, [(0, 3), (0, 3), (1, 4), (2, 5), (3, 6), (3, 6)]);
        let zero = windows_in_chunks(3, 0);
        assert!(zero.iter().zip(0u32..).all(|(w, k)| (w.begin, w.end) == (k, k + 1)));
        let huge = windows_in_chunks(3, usize::MAX);
        assert!(huge.iter().all(|w| (w.begin, w.end) == (0, 3)));
    }

    #[test]
    fn every_sequence_respects_its_window() {
        let t =
            Timeline { seq_len: (0..40).map(|i| 1 + i % 5).collect(), chunk_start: vec![0, 3, 9, 10, 18, 25, 31, 40] };
        for seed in 0..5 {
            let sweep = randomize_sweep(&t, Window::Chunks(2), seed, 3);
            let position: Vec<u32> = {
                let mut p = vec![0; t.num_chunks()];
                for (k, &c) in (0u32..).zip(&sweep.chunk_order) {
                    p[c as usize] = k;
                }
                p
            };
            let mut at = 0;
            for (k, &c) in sweep.chunk_order.iter().enumerate() {
                let count = t.chunk_start[c as usize + 1] - t.chunk_start[c as usize];
                for r in &sweep.sequences[at..at + count] {
                    assert!(sweep.windows[k].contains(position[r.chunk as usize]));
                }
                at += count;
            }
            let mut seqs = ids(&sweep.sequences);
            seqs.sort_unstable();
            assert_eq!(seqs, (0..40).collect::<Vec<_>>());
        }
    }

    #[test]
    fn chunk_seed_is_truncated_to_32_bits() {
        assert_eq!(shuffle_chunks(7, 3), shuffle_chunks(7, 3 + (1 << 32)));
    }

    #[test]
    fn zero_window_means_file_order() {
        let t = mock(4, 3, 2);
        let options = randomized(Window::Chunks(0), 9);
        assert!(!uses_block_randomizer(&options));
        assert_eq!(ids(&sweep_order(&t, &options, 2)), (0..12).collect::<Vec<_>>());
        // A sample window of 0 is CNTK's "no sample window": the default chunk window applies.
        let zero_samples = randomized(Window::Samples(0), 9);
        assert!(uses_block_randomizer(&zero_samples));
        assert_eq!(
            sweep_order(&t, &zero_samples, 2),
            sweep_order(&t, &randomized(Window::Chunks(crate::sampling::DEFAULT_WINDOW_CHUNKS), 9), 2)
        );
        assert_ne!(ids(&sweep_order(&t, &zero_samples, 2)), (0..12).collect::<Vec<_>>());
    }
}
