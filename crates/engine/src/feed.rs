//! The loop every consumer of the engine runs, once: plan the next minibatch, gather its
//! sequences from the parsed chunks (loading the ones not held), retire the chunks the sampler
//! says are done. `minibatchd dump` drives a [`Feeder`] with chunks parsed in-process; the daemon's
//! producer drives one with chunks from the shared chunk cache.
//!
//! Invariant: a chunk is held from the first minibatch that needs it until the plan that retires
//! it (or until the session sheds it while it waits and memory is short, [`Feeder::shed`]: then
//! it is loaded again when next needed), so a session holds at most about one randomization
//! window of parsed chunks whatever the dataset size; a gathered minibatch keeps its own
//! references, so retiring never invalidates it. A minibatch whose chunks do not fit in memory
//! together is gathered a chunk at a time instead ([`Feeder::gather_parts`]): the same minibatch,
//! holding one chunk and copies of the minibatch's sequences.

use std::sync::Arc;

use crate::format::chunk::ParsedChunk;
use crate::format::errors::DataError;
use crate::minibatch::{gather, ChunkMap, ChunkSource, Gathered, Parts, StreamShape};
use crate::sampling::{EpochLimit, MinibatchPlan, Sampler, SamplingError, SamplingOptions, Timeline, Window};
use crate::Result;

/// Loads a chunk that is not held: parses it, or fetches it from a cache.
pub type LoadChunk<'a> = dyn FnMut(u32) -> Result<Arc<ParsedChunk>, DataError> + 'a;

/// A session's sampler and the parsed chunks it holds.
#[derive(Debug)]
pub struct Feeder {
    sampler: Sampler,
    timeline: Arc<Timeline>,
    shapes: Vec<StreamShape>,
    frame_mode: bool,
    next_index: u64,
    /// Index of the minibatch the next plan makes: `next_index` plus the plans made and not
    /// gathered yet (minibatches planned ahead to be gathered together, [`Feeder::gather_parts`]).
    planned: u64,
    /// With equal steps padded ([`crate::sampling::Tail::Pad`]): after the sampler's last
    /// minibatch, empty ones until the minibatch index reaches this.
    pad_to: Option<u64>,
    held: ChunkMap<Arc<ParsedChunk>>,
    held_bytes: usize,
    peak_chunks: usize,
    peak_bytes: usize,
}

impl Feeder {
    /// A feeder that continues `sampler` (already restored) with minibatch `next_index`, building
    /// minibatches of `shapes` (CNTK's frame mode: every sequence must have one sample).
    #[must_use]
    pub fn new(
        sampler: Sampler,
        timeline: Arc<Timeline>,
        shapes: Vec<StreamShape>,
        frame_mode: bool,
        next_index: u64,
    ) -> Self {
        Self {
            sampler,
            timeline,
            shapes,
            frame_mode,
            next_index,
            planned: next_index,
            pad_to: None,
            held: ChunkMap::default(),
            held_bytes: 0,
            peak_chunks: 0,
            peak_bytes: 0,
        }
    }

    /// The sampler.
    #[must_use]
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// The checkpoint position after the last planned minibatch.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.sampler.position()
    }

    /// Index of the next minibatch.
    #[must_use]
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Moves the sampler to `position` (a trainer's mid-run restore). Held chunks are dropped: the
    /// plans that would have retired them may lie behind the new position.
    ///
    /// # Errors
    /// A position the sampler cannot restore.
    pub fn restore(&mut self, position: u64) -> Result<(), SamplingError> {
        self.sampler.restore(position)?;
        self.held.clear();
        self.held_bytes = 0;
        self.planned = self.next_index;
        Ok(())
    }

    /// Plans the next minibatch of `size` samples; `None` at the end of the epoch. Each plan is
    /// gathered once, in order ([`Feeder::gather`], or several together with
    /// [`Feeder::gather_parts`]).
    pub fn plan(&mut self, size: usize) -> Option<MinibatchPlan> {
        let plan = self.next_plan(size)?;
        self.planned = self.planned.saturating_add(1);
        Some(plan)
    }

    fn next_plan(&mut self, size: usize) -> Option<MinibatchPlan> {
        if let Some(plan) = self.sampler.next_minibatch(size) {
            return Some(plan);
        }
        // Padding: empty minibatches at the end of the epoch, until every worker has as many
        // (counting those planned and not gathered yet).
        if self.pad_to.is_some_and(|end| self.planned < end) {
            let position = self.sampler.position();
            let sweep = position.saturating_sub(1) / self.sampler.sweep_size().max(1);
            return Some(MinibatchPlan {
                sequences: Vec::new(),
                sweep,
                end_of_sweep: false,
                position,
                retire: Vec::new(),
                samples: 0,
                next_sweeps_at: Vec::new(),
            });
        }
        None
    }

    /// Pads the epoch with empty minibatches until minibatch index `end` (equal steps with
    /// [`crate::sampling::Tail::Pad`]: `end` is the start index plus [`crate::sampling::EqualSteps::steps`]).
    pub fn pad_to(&mut self, end: u64) {
        self.pad_to = Some(end);
    }

    /// The chunks `plan` needs that are not held, then up to `ahead` chunks of the minibatches
    /// after it, each once, in order of need: what to ask a parser pool for before gathering.
    /// The next sweep's chunks are named once its order is built ([`Sampler::next_sweep_job`]:
    /// the daemon builds it off the planner); this never builds it.
    #[must_use]
    pub fn missing(&self, plan: &MinibatchPlan, ahead: usize) -> Vec<u32> {
        let mut wanted: Vec<u32> = Vec::new();
        if self.held.len() >= self.timeline.num_chunks() {
            // Every chunk is held (a window over the whole dataset, once it is loaded): nothing
            // can be missing, and the upcoming chunks need not be worked out for every minibatch.
            return wanted;
        }
        for c in plan.sequences.iter().map(|r| r.chunk).chain(self.sampler.upcoming_chunks_built(ahead)) {
            if !self.held.contains_key(&c) && !wanted.contains(&c) {
                wanted.push(c);
            }
        }
        wanted
    }

    /// Gathers `plan` as the next minibatch, loading each chunk it needs and does not hold through
    /// `load`, then retires the chunks the plan retires.
    ///
    /// # Errors
    /// What `load` returns, or a frame-mode violation. Chunks loaded before the error stay held.
    pub fn gather(&mut self, plan: &MinibatchPlan, load: &mut LoadChunk<'_>) -> Result<Gathered> {
        let mut source = HeldOrLoaded { held: &mut self.held, bytes: &mut self.held_bytes, load };
        let gathered = gather(self.next_index, plan, &self.timeline, &self.shapes, self.frame_mode, &mut source)?;
        self.peak_chunks = self.peak_chunks.max(self.held.len());
        self.peak_bytes = self.peak_bytes.max(self.held_bytes);
        for c in &plan.retire {
            if let Some(chunk) = self.held.remove(c) {
                self.held_bytes -= chunk.size_bytes();
            }
        }
        self.next_index = self.next_index.saturating_add(1);
        Ok(gathered)
    }

    /// Starts gathering `plans` (consecutive, the first the next minibatch) a chunk at a time
    /// ([`Parts`]), for a minibatch whose chunks do not fit in memory together: the chunks held
    /// give the plans' sequences they have, then every chunk held is let go; returns how many
    /// were. Go on with [`Feeder::gather_parts`].
    ///
    /// # Errors
    /// A held chunk that does not hold the plans' sequences (a timeline that is not the chunks').
    pub fn start_parts(&mut self, plans: &[MinibatchPlan], parts: &mut Parts) -> Result<usize> {
        let held: Vec<u32> = parts.missing().filter(|c| self.held.contains_key(c)).collect();
        for c in held {
            parts.take(plans, &self.timeline, c, &self.held[&c])?;
        }
        let before = self.held.len();
        self.shed(None);
        Ok(before)
    }

    /// Loads, through `load`, every chunk whose sequences `parts` still misses — first those
    /// `ready` says are ready now (in the chunk cache: no parse) —, copies the sequences of
    /// `plans` out of it and lets it go, then makes the minibatches: the ones [`Feeder::gather`]
    /// would make one by one, holding one chunk at a time. No chunk is held after it.
    ///
    /// # Errors
    /// What `load` returns, the chunks taken before kept in `parts` (call again to go on); or
    /// what [`Parts::finish`] refuses.
    pub fn gather_parts(
        &mut self,
        plans: &[MinibatchPlan],
        parts: &mut Parts,
        ready: &dyn Fn(u32) -> bool,
        load: &mut LoadChunk<'_>,
    ) -> Result<Vec<Gathered>> {
        let (mut order, later): (Vec<u32>, Vec<u32>) = parts.missing().partition(|&c| ready(c));
        order.extend(later);
        for c in order {
            let chunk = load(c)?;
            self.peak_chunks = self.peak_chunks.max(self.held.len() + 1);
            self.peak_bytes = self.peak_bytes.max(self.held_bytes + chunk.size_bytes());
            parts.take(plans, &self.timeline, c, &chunk)?;
        }
        let gathered = parts.finish(self.next_index, plans, &self.shapes, self.frame_mode)?;
        for c in plans.iter().flat_map(|p| &p.retire) {
            if let Some(chunk) = self.held.remove(c) {
                self.held_bytes -= chunk.size_bytes();
            }
        }
        self.next_index = self.next_index.saturating_add(plans.len() as u64);
        Ok(gathered)
    }

    /// Lets go of the chunks held that `plan` (the minibatch about to be gathered, if any) does
    /// not need; returns the bytes let go. A chunk let go is loaded again (through `load`) by the
    /// next minibatch that needs it, so the minibatches are the same, at the cost of those loads:
    /// what a session does when the memory limit is short and it waits — for a free slot while
    /// its client is busy, or for memory other sessions hold — so that the chunks it holds can
    /// serve, or make room for, the sessions that are moving.
    pub fn shed(&mut self, plan: Option<&MinibatchPlan>) -> usize {
        let keep: crate::minibatch::ChunkSet =
            plan.into_iter().flat_map(|p| p.sequences.iter().map(|r| r.chunk)).collect();
        let before = self.held_bytes;
        self.held.retain(|c, chunk| {
            let kept = keep.contains(c);
            if !kept {
                self.held_bytes -= chunk.size_bytes();
            }
            kept
        });
        before - self.held_bytes
    }

    /// Chunks held now.
    #[must_use]
    pub fn held_chunks(&self) -> usize {
        self.held.len()
    }

    /// Parsed bytes held now.
    #[must_use]
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Most chunks held at once so far.
    #[must_use]
    pub fn peak_chunks(&self) -> usize {
        self.peak_chunks
    }

    /// Most parsed bytes held at once so far.
    #[must_use]
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }
}

/// Fewest sequences per chunk (per worker) for [`window_floor_bytes`] to estimate anything.
const FLOOR_MIN_SEQUENCES: u64 = 32;

/// A lower bound on the parsed bytes a session with `options` holds at once over `timeline`
/// (`sweep_size` samples: the sampler's [`Sampler::sweep_size`]), or 0 where none is safe to give.
///
/// With a randomization window of `W` chunks the sequences of a chunk are placed at random over
/// the positions of about `W` chunks, and the session holds the chunk from its first use to its
/// last (module docs): with `m` sequences per chunk that is on average `(m − 1) / (m + 1)` of the
/// window, so the peak over a sweep holds at least that share of `W` chunks. Each sequence has
/// at least one sample of every dense stream (`dim` values). So the bound is the dense values of
/// the `W` smallest chunks at one sample per sequence, times that share for the chunk with the
/// fewest sequences, times 0.9 for the randomness, divided among the workers (CNTK may hand each
/// whole chunks). Sparse and string streams, offsets and longer sequences are left out, so a
/// window it says does not fit cannot fit. A window in samples that covers the whole sweep counts
/// as a window of every chunk ([`sample_window_chunks`]). 0 for file order, for narrower windows in
/// samples and for epochs shorter than a sweep (they may end before the peak; the daemon's
/// ceiling still holds those); a chunk with fewer than 32 sequences per worker counts 0 (few uses,
/// short holds).
#[must_use]
pub fn window_floor_bytes(
    timeline: &Timeline,
    sweep_size: u64,
    shapes: &[StreamShape],
    options: &SamplingOptions,
) -> u64 {
    let window = window_in_chunks(timeline, sweep_size, options);
    let whole_sweep = match options.limit {
        EpochLimit::Infinite | EpochLimit::FullSweep | EpochLimit::Sweep(_) => true,
        EpochLimit::Sweeps(n) => n >= 1,
        EpochLimit::Samples(n) => n >= sweep_size,
    };
    if !options.randomize || window == 0 || !whole_sweep {
        return 0;
    }
    let workers = options.num_workers.max(1) as u64;
    let per_sequence: u64 = shapes
        .iter()
        .filter(|s| s.kind == crate::format::chunk::StreamKind::Dense)
        .map(|s| s.dim as u64 * if s.float64 { 8 } else { 4 })
        .sum();
    // Each chunk's dense values at one sample per sequence, times the share of the window it is
    // held for, for one worker.
    let mut held: Vec<u128> = timeline
        .chunk_start
        .windows(2)
        .map(|w| {
            let m = (w[1] - w[0]) as u64;
            let per_worker = m / workers;
            if per_worker < FLOOR_MIN_SEQUENCES {
                return 0;
            }
            let bytes = u128::from(m) * u128::from(per_sequence);
            bytes * 9 * u128::from(per_worker - 1) / (10 * u128::from(per_worker + 1) * u128::from(workers))
        })
        .collect();
    held.sort_unstable();
    u64::try_from(held.iter().take(window).sum::<u128>()).unwrap_or(u64::MAX)
}

/// The randomization window of `options` in chunks, for the floor: as configured, or for a
/// window in samples what [`sample_window_chunks`] says (`sweep_size` samples a sweep).
#[must_use]
pub fn window_in_chunks(timeline: &Timeline, sweep_size: u64, options: &SamplingOptions) -> usize {
    match options.window.normalized() {
        Window::Chunks(w) => w,
        Window::Samples(w) => sample_window_chunks(timeline.num_chunks(), sweep_size, w),
    }
}

/// The chunks a window of `window` samples randomizes over as a window in chunks would, for the
/// floor, over `chunks` chunks of `sweep_size` samples in all: every chunk when each of CNTK's
/// windows in samples (`randomizer::windows_in_samples`)
/// is the whole sweep — the sequences are then shuffled uniformly, as by a window of every chunk
/// — else 0. A window starts at the first chunk and ends at the last for every chunk exactly when
/// the sweep has fewer samples than half the window (or one chunk), whatever the chunk order. A
/// narrower window in samples mixes far less than its width suggests (a sequence may only move to
/// positions whose windows hold its chunk, and CNTK's windows in samples are lopsided), so no
/// bound is given for it.
#[must_use]
pub fn sample_window_chunks(chunks: usize, sweep_size: u64, window: u64) -> usize {
    if chunks <= 1 || sweep_size < window / 2 {
        chunks
    } else {
        0
    }
}

/// The held chunks, falling back to the loader.
struct HeldOrLoaded<'a, 'l> {
    held: &'a mut ChunkMap<Arc<ParsedChunk>>,
    bytes: &'a mut usize,
    load: &'a mut LoadChunk<'l>,
}

impl ChunkSource for HeldOrLoaded<'_, '_> {
    fn chunk(&mut self, chunk: u32) -> Result<Arc<ParsedChunk>> {
        if let Some(c) = self.held.get(&chunk) {
            return Ok(c.clone());
        }
        let c = (self.load)(chunk)?;
        *self.bytes += c.size_bytes();
        self.held.insert(chunk, c.clone());
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::chunk::{StreamData, StreamKind, StreamValues, Values};

    /// `chunks` chunks of `per` one-sample sequences, one dense stream of dim 1 whose value is the
    /// sequence's global index.
    fn dataset(chunks: usize, per: usize) -> (Arc<Timeline>, Vec<Arc<ParsedChunk>>) {
        dataset_of(&vec![per; chunks])
    }

    /// Chunks of the given numbers of one-sample sequences; one dense stream of dim 1 holding each
    /// sequence's global index.
    pub(super) fn dataset_of(sizes: &[usize]) -> (Arc<Timeline>, Vec<Arc<ParsedChunk>>) {
        let mut chunk_start = vec![0];
        for s in sizes {
            chunk_start.push(chunk_start[chunk_start.len() - 1] + s);
        }
        let total = chunk_start[sizes.len()];
        let timeline = Arc::new(Timeline { seq_len: vec![1; total].into(), chunk_start: chunk_start.clone() });
        let parsed = sizes
            .iter()
            .enumerate()
            .map(|(c, &n)| {
                let values =
                    (chunk_start[c]..chunk_start[c] + n).map(|i| f32::from(u16::try_from(i).expect("small"))).collect();
                Arc::new(ParsedChunk {
                    chunk: c,
                    num_sequences: n,
                    malformed: Vec::new(),
                    streams: vec![StreamData::new(
                        (0..=n).collect(),
                        StreamValues::Dense { dim: 1, values: Values::F32(values) },
                    )],
                })
            })
            .collect();
        (timeline, parsed)
    }

    fn values(g: &Gathered) -> Vec<f32> {
        match &g.to_minibatch().streams[0].data {
            crate::minibatch::MbData::Dense { values: crate::minibatch::MbValues::F32(v), .. } => v.clone(),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// A feeder over one randomized full sweep of `timeline` (one worker, `window` chunks).
    fn randomized_feeder(timeline: Arc<Timeline>, window: usize, seed: u64) -> Feeder {
        let options = SamplingOptions {
            randomize: true,
            window: Window::Chunks(window),
            seed,
            limit: EpochLimit::FullSweep,
            num_workers: 1,
            rank: 0,
        };
        let sampler = Sampler::new(timeline.clone(), options).expect("sampler");
        let shapes = vec![StreamShape { kind: StreamKind::Dense, dim: 1, float64: false }];
        Feeder::new(sampler, timeline, shapes, false, 0)
    }

    #[test]
    fn the_window_floor_counts_the_smallest_chunks_dense_values_per_worker() {
        // Chunks of 40, 100 and 60 one-sample sequences; a dense stream of 4 float32 and a sparse one.
        let timeline = Timeline { seq_len: vec![1; 200].into(), chunk_start: vec![0, 40, 140, 200] };
        let shapes = vec![
            StreamShape { kind: StreamKind::Dense, dim: 4, float64: false },
            StreamShape { kind: StreamKind::SparseI32, dim: 1000, float64: false },
        ];
        let options = |window, randomize, num_workers, limit| SamplingOptions {
            randomize,
            window,
            seed: 0,
            limit,
            num_workers,
            rank: 0,
        };
        let floor = |o: &SamplingOptions| window_floor_bytes(&timeline, 200, &shapes, o);
        // Each chunk's dense bytes times the share of the window it is held for at the peak,
        // 0.9 × (m − 1) / (m + 1) for its m sequences.
        let held = |m: u64| m * 16 * 9 * (m - 1) / (10 * (m + 1));
        assert_eq!(floor(&options(Window::Chunks(2), true, 1, EpochLimit::FullSweep)), held(40) + held(60));
        let all = held(40) + held(60) + held(100);
        assert_eq!(floor(&options(Window::Chunks(128), true, 1, EpochLimit::Infinite)), all);
        assert_eq!(floor(&options(Window::Chunks(128), true, 1, EpochLimit::Samples(200))), all);
        // A window in samples whose every window is the whole sweep (half of it on each side of
        // every chunk) shuffles as a window of every chunk; a narrower one gets no estimate.
        assert_eq!(floor(&options(Window::Samples(1000), true, 1, EpochLimit::FullSweep)), all);
        assert_eq!(floor(&options(Window::Samples(200), true, 1, EpochLimit::FullSweep)), 0);
        // Two workers: 20 and 30 sequences per worker are too few to count; the 100-sequence
        // chunk counts with 50 per worker, halved.
        let per_worker = |m: u64| m * 16 * 9 * (m / 2 - 1) / (10 * (m / 2 + 1) * 2);
        assert_eq!(floor(&options(Window::Chunks(128), true, 2, EpochLimit::FullSweep)), per_worker(100));
        for o in [
            options(Window::Chunks(128), false, 1, EpochLimit::FullSweep),
            options(Window::Chunks(0), true, 1, EpochLimit::FullSweep),
            options(Window::Samples(10), true, 1, EpochLimit::FullSweep),
            options(Window::Chunks(128), true, 1, EpochLimit::Samples(199)),
            options(Window::Chunks(128), true, 1, EpochLimit::Sweeps(0)),
        ] {
            assert_eq!(floor(&o), 0, "{o:?}");
        }
        // Chunks of 2, 5 and 3 sequences: a chunk is used a few times and held briefly.
        let few = Timeline { seq_len: vec![1; 10].into(), chunk_start: vec![0, 2, 7, 10] };
        assert_eq!(
            window_floor_bytes(&few, 10, &shapes, &options(Window::Chunks(3), true, 1, EpochLimit::FullSweep)),
            0
        );
        let f64_shapes = vec![StreamShape { kind: StreamKind::Dense, dim: 4, float64: true }];
        let o = options(Window::Chunks(1), true, 1, EpochLimit::FullSweep);
        assert_eq!(window_floor_bytes(&timeline, 200, &f64_shapes, &o), 40 * 32 * 9 * 39 / (10 * 41));
    }

    /// The floor is a lower bound: a whole sweep never holds fewer dense bytes at its peak, for
    /// windows in chunks and in samples, seeds and sweeps (chunks of equal size, so the peak in
    /// bytes is the peak in chunks times a chunk's values).
    #[test]
    fn the_window_floor_never_exceeds_what_a_sweep_holds() {
        let shapes = vec![StreamShape { kind: StreamKind::Dense, dim: 1, float64: false }];
        let mut checked = 0;
        for (chunks, per) in [(8usize, 32usize), (20, 40), (50, 64), (30, 100)] {
            let (timeline, parsed) = dataset(chunks, per);
            let total = (chunks * per) as u64;
            let windows = [1, 2, 3, chunks / 2, chunks - 1, chunks, 128]
                .map(Window::Chunks)
                .into_iter()
                .chain([per as u64, 3 * per as u64, total / 3, total / 2, total, 10 * total].map(Window::Samples));
            for window in windows {
                for seed in 0..3u64 {
                    for sweep in [0u64, 1] {
                        let options = SamplingOptions {
                            randomize: true,
                            window,
                            seed,
                            limit: EpochLimit::Sweep(sweep),
                            num_workers: 1,
                            rank: 0,
                        };
                        let floor = window_floor_bytes(&timeline, total, &shapes, &options);
                        let sampler = Sampler::new(timeline.clone(), options).expect("sampler");
                        let mut feeder = Feeder::new(sampler, timeline.clone(), shapes.clone(), false, 0);
                        while let Some(plan) = feeder.plan(16) {
                            feeder.gather(&plan, &mut |c| Ok(parsed[c as usize].clone())).expect("gather");
                        }
                        let peak = (feeder.peak_chunks() * per * 4) as u64;
                        assert!(
                            floor <= peak,
                            "{window:?} seed {seed} sweep {sweep}, {chunks}×{per}: floor {floor} > peak {peak}"
                        );
                        checked += usize::from(floor > 0);
                    }
                }
            }
        }
        assert!(checked > 100, "only {checked} cases had a floor to check");
    }

    #[test]
    fn every_sequence_once_loading_each_chunk_once_and_holding_only_the_window() {
        let (timeline, parsed) = dataset(12, 5);
        let mut feeder = randomized_feeder(timeline, 3, 7);
        let mut loads = vec![0usize; 12];
        let mut seen = Vec::new();
        while let Some(plan) = feeder.plan(4) {
            let g = feeder
                .gather(&plan, &mut |c| {
                    loads[c as usize] += 1;
                    Ok(parsed[c as usize].clone())
                })
                .expect("gather");
            assert_eq!(g.index + 1, feeder.next_index());
            seen.extend(values(&g));
        }
        seen.sort_by(f32::total_cmp);
        assert_eq!(seen, (0..60u16).map(f32::from).collect::<Vec<_>>(), "every sequence exactly once");
        assert_eq!(loads, vec![1; 12], "each chunk loaded once in the sweep");
        assert!(feeder.peak_chunks() <= 3 + 2, "held {} chunks with a window of 3", feeder.peak_chunks());
    }

    /// Shedding (a session waiting while memory is short) changes which chunks are loaded again,
    /// never the minibatches: shedding everything between minibatches, or all but the plan's
    /// chunks before a gather, gives exactly the minibatches of a feeder that never sheds.
    #[test]
    fn shedding_held_chunks_reloads_them_and_changes_no_minibatch() {
        let (timeline, parsed) = dataset(12, 5);
        let mut plain = randomized_feeder(timeline.clone(), 4, 9);
        let mut want = Vec::new();
        while let Some(plan) = plain.plan(3) {
            want.push(values(&plain.gather(&plan, &mut |c| Ok(parsed[c as usize].clone())).expect("gather")));
        }
        for every in [1usize, 2, 5] {
            let mut shedding = randomized_feeder(timeline.clone(), 4, 9);
            let (mut got, mut loads, mut k) = (Vec::new(), 0usize, 0usize);
            while let Some(plan) = shedding.plan(3) {
                k += 1;
                if k % every == 0 {
                    let before = shedding.held_bytes();
                    let shed = shedding.shed(Some(&plan));
                    assert_eq!(before - shed, shedding.held_bytes());
                    let needed: crate::minibatch::ChunkSet = plan.sequences.iter().map(|r| r.chunk).collect();
                    assert!(shedding.held_chunks() <= needed.len(), "only the plan's chunks stay");
                }
                let g = shedding
                    .gather(&plan, &mut |c| {
                        loads += 1;
                        Ok(parsed[c as usize].clone())
                    })
                    .expect("gather");
                got.push(values(&g));
                if k % every == 0 {
                    shedding.shed(None);
                    assert_eq!((shedding.held_chunks(), shedding.held_bytes()), (0, 0));
                }
            }
            assert_eq!(got, want, "shedding every {every} minibatches");
            assert!(loads > 12, "chunks let go were loaded again ({loads} loads)");
        }
    }

    /// Gathering a chunk at a time (a minibatch whose chunks do not fit together) makes the same
    /// minibatches as gathering them whole, holding one chunk at a time — one minibatch or
    /// several together (each chunk loaded once for all of them), now and then or always, with
    /// chunks held before it or not.
    #[test]
    fn gathering_in_parts_makes_the_same_minibatches_holding_one_chunk_at_a_time() {
        let (timeline, parsed) = dataset(12, 5);
        let mut plain = randomized_feeder(timeline.clone(), 4, 5);
        let mut want = Vec::new();
        while let Some(plan) = plain.plan(7) {
            let g = plain.gather(&plan, &mut |c| Ok(parsed[c as usize].clone())).expect("gather");
            want.push((values(&g), g.fingerprint, g.index));
        }
        for (every, together) in [(1usize, 1usize), (3, 1), (1, 4), (2, 3), (1, 100)] {
            let mut feeder = randomized_feeder(timeline.clone(), 4, 5);
            let (mut got, mut k) = (Vec::new(), 0usize);
            while let Some(plan) = feeder.plan(7) {
                k += 1;
                if k % every != 0 {
                    let g = feeder.gather(&plan, &mut |c| Ok(parsed[c as usize].clone())).expect("gather");
                    got.push((values(&g), g.fingerprint, g.index));
                    continue;
                }
                let mut plans = vec![plan];
                while plans.len() < together {
                    let Some(next) = feeder.plan(7) else { break };
                    plans.push(next);
                }
                let mut parts = Parts::new(&plans);
                let held = feeder.held_chunks();
                assert_eq!(feeder.start_parts(&plans, &mut parts).expect("start"), held);
                assert_eq!(feeder.held_chunks(), 0, "every held chunk let go");
                let mut loads = vec![0usize; 12];
                let gathered = feeder
                    .gather_parts(&plans, &mut parts, &|c| c % 2 == 0, &mut |c| {
                        loads[c as usize] += 1;
                        Ok(parsed[c as usize].clone())
                    })
                    .expect("in parts");
                assert!(loads.iter().all(|&n| n <= 1), "each chunk loaded at most once for all the plans: {loads:?}");
                assert_eq!(feeder.held_chunks(), 0, "nothing held after minibatches in parts");
                assert_eq!(gathered.len(), plans.len());
                got.extend(gathered.iter().map(|g| (values(g), g.fingerprint, g.index)));
            }
            assert_eq!(got, want, "in parts every {every} minibatches, {together} together");
        }
        // A load that fails leaves what was taken; the next call goes on with the rest.
        let mut feeder = randomized_feeder(timeline, 4, 5);
        let plans = vec![feeder.plan(7).expect("a plan")];
        let mut parts = Parts::new(&plans);
        feeder.start_parts(&plans, &mut parts).expect("start");
        let chunks: Vec<u32> = parts.missing().collect();
        assert!(chunks.len() > 1, "the first minibatch draws from several chunks: {chunks:?}");
        let err = feeder
            .gather_parts(&plans, &mut parts, &|_| false, &mut |c| {
                if c == chunks[1] {
                    Err(DataError::Dataset("no room".into()))
                } else {
                    Ok(parsed[c as usize].clone())
                }
            })
            .expect_err("the second chunk fails");
        assert_eq!(err.to_string(), "no room");
        assert_eq!(parts.missing().collect::<Vec<_>>(), chunks[1..], "the first chunk stays taken");
        let mut again = Vec::new();
        let g = feeder
            .gather_parts(&plans, &mut parts, &|_| false, &mut |c| {
                again.push(c);
                Ok(parsed[c as usize].clone())
            })
            .expect("goes on");
        assert_eq!(again, chunks[1..]);
        assert_eq!((values(&g[0]), g[0].fingerprint, g[0].index), want[0]);
    }

    /// With equal steps padded, minibatches planned ahead (to be gathered together) end at the
    /// same index as those planned one at a time: the padding counts the plans not gathered yet.
    #[test]
    fn planning_ahead_pads_to_the_same_number_of_minibatches() {
        let (timeline, parsed) = dataset(4, 5);
        for (ahead, end) in [(1u64, 6u64), (3, 6), (4, 4), (10, 9)] {
            let mut feeder = randomized_feeder(timeline.clone(), 2, 1);
            feeder.pad_to(end);
            let mut delivered = 0u64;
            loop {
                let mut plans = Vec::new();
                while (plans.len() as u64) < ahead {
                    let Some(plan) = feeder.plan(5) else { break };
                    plans.push(plan);
                }
                if plans.is_empty() {
                    break;
                }
                let mut parts = Parts::new(&plans);
                feeder.start_parts(&plans, &mut parts).expect("start");
                let gathered = feeder
                    .gather_parts(&plans, &mut parts, &|_| false, &mut |c| Ok(parsed[c as usize].clone()))
                    .expect("gather");
                delivered += gathered.len() as u64;
            }
            // 20 samples in minibatches of 5: 4 with data, padded up to `end` when it is more.
            assert_eq!(delivered, end.max(4), "{ahead} ahead, padded to {end}");
            assert_eq!(feeder.next_index(), end.max(4));
        }
    }

    #[test]
    fn missing_names_unheld_chunks_first_those_of_the_plan_and_nothing_once_all_are_held() {
        let (timeline, parsed) = dataset(6, 20);
        let mut feeder = randomized_feeder(timeline, 6, 3);
        let first = feeder.plan(4).expect("a plan");
        let mut need: Vec<u32> = Vec::new();
        for r in &first.sequences {
            if !need.contains(&r.chunk) {
                need.push(r.chunk);
            }
        }
        let wanted = feeder.missing(&first, 8);
        assert_eq!(wanted[..need.len()], need[..], "the plan's own chunks first, in order of need");
        assert_eq!(wanted.len(), 6, "then the upcoming ones, up to every chunk");
        let mut all_held_seen = false;
        let mut plan = first;
        loop {
            if feeder.held.len() == 6 {
                all_held_seen = true;
                assert!(feeder.missing(&plan, 8).is_empty());
            } else {
                let wanted = feeder.missing(&plan, 8);
                assert!(wanted.iter().all(|c| !feeder.held.contains_key(c)), "{wanted:?}");
            }
            feeder.gather(&plan, &mut |c| Ok(parsed[c as usize].clone())).expect("gather");
            let Some(next) = feeder.plan(4) else { break };
            plan = next;
        }
        assert!(all_held_seen, "the sweep held every chunk at some point");
    }

    #[test]
    fn a_load_error_reaches_the_caller_whole_and_a_restore_drops_what_was_held() {
        let (timeline, parsed) = dataset(4, 2);
        let sampler = Sampler::new(
            timeline.clone(),
            SamplingOptions {
                randomize: false,
                window: Window::Chunks(1),
                seed: 0,
                limit: EpochLimit::FullSweep,
                num_workers: 1,
                rank: 0,
            },
        )
        .expect("sampler");
        let shapes = vec![StreamShape { kind: StreamKind::Dense, dim: 1, float64: false }];
        let mut feeder = Feeder::new(sampler, timeline, shapes, false, 0);
        let plan = feeder.plan(3).expect("plan");
        assert_eq!(feeder.missing(&plan, 0), vec![0, 1]);
        let err = feeder
            .gather(&plan, &mut |c| {
                if c == 0 {
                    Ok(parsed[0].clone())
                } else {
                    Err(DataError::Dataset(format!("chunk {c} is bad")))
                }
            })
            .expect_err("chunk 1 fails");
        assert_eq!(err.to_string(), "chunk 1 is bad");
        assert_eq!(feeder.missing(&plan, 0), vec![1], "chunk 0 stays held");
        feeder.restore(0).expect("restore");
        assert_eq!(feeder.missing(&plan, 0), vec![0, 1], "a restore drops the held chunks");
    }
}

/// Issue 37, item 1: a session never fails for memory once admitted. A model of the daemon's
/// producer under a memory ceiling — a load is refused when the chunks the session holds and the
/// one asked for would pass it; the session then lets go of the chunks its minibatch does not
/// need and tries again, and if its minibatch's own chunks still do not fit, gathers it a chunk at
/// a time with the next few — over random datasets, windows, workers, ceilings (down to the
/// largest chunk) and resume points: every minibatch is the one an unlimited session makes, and
/// the chunks held never pass the ceiling.
#[cfg(test)]
mod memory_proptests {
    use proptest::prelude::*;

    use super::*;
    use crate::format::chunk::StreamKind;

    use super::tests::dataset_of as dataset;

    type Out = (Vec<u8>, u64, u64, u64);

    fn out(g: &Gathered) -> Out {
        let bytes = format!("{:?}", g.to_minibatch().streams).into_bytes();
        (bytes, g.fingerprint, g.index, g.position)
    }

    /// Runs a session from `position` (minibatch `index`) to the end, under `ceiling` bytes of held
    /// chunks (`None`: unlimited), gathering `together` minibatches at a time when one does not fit;
    /// what it delivered and the most it held.
    #[allow(clippy::too_many_arguments)]
    fn run(
        timeline: &Arc<Timeline>,
        parsed: &[Arc<ParsedChunk>],
        options: SamplingOptions,
        size: usize,
        from: (u64, u64),
        ceiling: Option<usize>,
        together: usize,
    ) -> (Vec<Out>, usize, usize) {
        let mut sampler = Sampler::new(timeline.clone(), options).expect("sampler");
        sampler.restore(from.0).expect("restore");
        let shapes = vec![StreamShape { kind: StreamKind::Dense, dim: 1, float64: false }];
        let mut feeder = Feeder::new(sampler, timeline.clone(), shapes, false, from.1);
        let mut got = Vec::new();
        let (mut most, mut in_parts) = (0usize, 0usize);
        while let Some(plan) = feeder.plan(size) {
            let mut attempt = 0;
            loop {
                // The model's ceiling: what is held (before this gather, and loaded by it) and
                // the chunk asked for.
                let mut held = feeder.held_bytes();
                let mut refused = false;
                let result = feeder.gather(&plan, &mut |c| {
                    let chunk = parsed[c as usize].clone();
                    if ceiling.is_some_and(|max| held + chunk.size_bytes() > max) {
                        refused = true;
                        return Err(DataError::Dataset("over the ceiling".into()));
                    }
                    held += chunk.size_bytes();
                    Ok(chunk)
                });
                match result {
                    Ok(g) => {
                        most = most.max(feeder.peak_bytes());
                        got.push(out(&g));
                        break;
                    }
                    Err(_) if refused && attempt == 0 => {
                        attempt += 1;
                        feeder.shed(Some(&plan));
                    }
                    Err(_) if refused => {
                        let mut plans = vec![plan.clone()];
                        while plans.len() < together && !plans[plans.len() - 1].sequences.is_empty() {
                            let Some(next) = feeder.plan(size) else { break };
                            plans.push(next);
                        }
                        let mut parts = Parts::new(&plans);
                        feeder.start_parts(&plans, &mut parts).expect("start");
                        let gathered = feeder
                            .gather_parts(&plans, &mut parts, &|_| false, &mut |c| Ok(parsed[c as usize].clone()))
                            .expect("a chunk at a time");
                        got.extend(gathered.iter().map(out));
                        in_parts += gathered.len();
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            most = most.max(feeder.held_bytes());
        }
        (got, most, in_parts)
    }

    /// The case the property is about happens: a window of four chunks under a ceiling of one.
    #[test]
    fn a_window_over_the_ceiling_is_gathered_in_parts_and_delivered_whole() {
        let (timeline, parsed) = dataset(&[10; 6]);
        let options = SamplingOptions {
            randomize: true,
            window: Window::Chunks(4),
            seed: 3,
            limit: EpochLimit::Sweeps(2),
            num_workers: 1,
            rank: 0,
        };
        let (want, _, none) = run(&timeline, &parsed, options.clone(), 8, (0, 0), None, 1);
        assert_eq!(none, 0);
        let ceiling = parsed[0].size_bytes();
        for together in [1, 3] {
            let (got, most, in_parts) = run(&timeline, &parsed, options.clone(), 8, (0, 0), Some(ceiling), together);
            assert_eq!(got, want);
            assert!(most <= ceiling);
            assert!(in_parts * 2 > want.len(), "{in_parts} of {} minibatches in parts", want.len());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        #[test]
        fn no_admitted_session_fails_for_memory_and_none_passes_the_ceiling(
            sizes in prop::collection::vec(1usize..12, 1..10),
            window in prop_oneof![(1usize..8).prop_map(Window::Chunks), (1u64..60).prop_map(Window::Samples)],
            randomize in any::<bool>(),
            seed in 0u64..1000,
            workers in 1usize..4,
            rank_pick in 0usize..4,
            size in 1usize..20,
            ceiling_pick in 0.0f64..1.0,
            together in 1usize..6,
            resume_pick in 0.0f64..1.0,
            sweeps in 1u64..3,
        ) {
            let (timeline, parsed) = dataset(&sizes);
            let options = SamplingOptions {
                randomize,
                window,
                seed,
                limit: EpochLimit::Sweeps(sweeps),
                num_workers: workers,
                rank: rank_pick % workers,
            };
            let (want, _, _) = run(&timeline, &parsed, options.clone(), size, (0, 0), None, 1);
            let largest = parsed.iter().map(|c| c.size_bytes()).max().unwrap_or(0);
            let total: usize = parsed.iter().map(|c| c.size_bytes()).sum();
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            let ceiling = largest + ((total - largest) as f64 * ceiling_pick) as usize;
            let (got, most, _) = run(&timeline, &parsed, options.clone(), size, (0, 0), Some(ceiling), together);
            prop_assert_eq!(&got, &want);
            prop_assert!(most <= ceiling, "held {} bytes under a ceiling of {}", most, ceiling);
            // Resumed at any minibatch: the rest of the uninterrupted run.
            if !want.is_empty() {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
                let cut = ((want.len() - 1) as f64 * resume_pick) as usize;
                let (position, index) = (want[cut].3, want[cut].2 + 1);
                let (rest, most, _) = run(&timeline, &parsed, options, size, (position, index), Some(ceiling), together);
                prop_assert_eq!(&rest[..], &want[cut + 1..]);
                prop_assert!(most <= ceiling);
            }
        }
    }
}
