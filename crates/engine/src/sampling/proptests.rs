//! Property tests of the sampling layer on random timelines, windows, seeds, limits, worker counts
//! and minibatch-size schedules. The reference model is built from [`sweep_order`] plus a
//! re-derivation of CNTK's ownership rule, independently of the scheduler's internal plans.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proptest::prelude::*;

use super::randomizer::{randomize_sweep, sweep_order, uses_block_randomizer, ChunkWindow};
use super::{EpochLimit, MinibatchPlan, Sampler, SamplingOptions, SeqRef, Timeline, Window};

/// One of this worker's sequences on the global timeline, as the model expects it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    seq: SeqRef,
    sweep: u64,
    /// Global start position.
    start: u64,
    /// No later sequence of this worker in this sweep comes from the same chunk.
    last_in_sweep: bool,
}

#[derive(Debug, Clone)]
struct Case {
    timeline: Arc<Timeline>,
    options: SamplingOptions,
    sizes: Vec<usize>,
    other_sizes: Vec<usize>,
}

/// A timeline of chunks given by their sequences' lengths.
pub(super) fn timeline_of(chunks: &[Vec<u32>]) -> Timeline {
    let mut seq_len = Vec::new();
    let mut chunk_start = vec![0];
    for chunk in chunks {
        seq_len.extend(chunk);
        chunk_start.push(seq_len.len());
    }
    Timeline { seq_len: seq_len.into(), chunk_start }
}

fn timeline_strategy() -> impl Strategy<Value = Timeline> {
    prop::collection::vec(prop::collection::vec(1u32..=6, 1..=5), 1..=8).prop_map(|chunks| timeline_of(&chunks))
}

fn window_strategy() -> impl Strategy<Value = Window> {
    prop_oneof![
        (0usize..6).prop_map(Window::Chunks),
        (0u64..40).prop_map(Window::Samples),
        Just(Window::Samples(u64::MAX)),
    ]
}

fn limit_strategy() -> impl Strategy<Value = EpochLimit> {
    prop_oneof![
        Just(EpochLimit::FullSweep),
        (0u64..=3).prop_map(EpochLimit::Sweeps),
        (0u64..120).prop_map(EpochLimit::Samples),
    ]
}

fn seed_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..1000, Just(u64::MAX - 1), Just((1 << 32) - 1)]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let sizes = || prop::collection::vec(1usize..=12, 1..=5);
    (timeline_strategy(), any::<bool>(), window_strategy(), seed_strategy(), limit_strategy(), 1usize..=4)
        .prop_flat_map(move |(timeline, randomize, window, seed, limit, num_workers)| {
            (0..num_workers, sizes(), sizes()).prop_map(move |(rank, sizes, other_sizes)| Case {
                timeline: Arc::new(timeline.clone()),
                options: SamplingOptions { randomize, window, seed, limit, num_workers, rank },
                sizes,
                other_sizes,
            })
        })
}

fn sweep_size(t: &Timeline) -> u64 {
    t.samples(..)
}

fn epoch_end(t: &Timeline, limit: EpochLimit) -> u64 {
    match limit {
        EpochLimit::FullSweep => sweep_size(t),
        EpochLimit::Sweeps(k) => k * sweep_size(t),
        EpochLimit::Samples(n) => n,
        EpochLimit::Infinite => u64::MAX / 2,
        EpochLimit::Sweep(k) => (k + 1) * sweep_size(t),
    }
}

/// The rank that owns each position of sweep `sweep` (CNTK §2.6, with the global sequence
/// position counted from the timeline start for the non-randomized split).
fn owners(t: &Timeline, o: &SamplingOptions, sweep: u64) -> Vec<usize> {
    let order = sweep_order(t, o, sweep);
    if uses_block_randomizer(o) {
        let chunk_order = randomize_sweep(t, o.window, o.seed, sweep).chunk_order;
        let position: HashMap<u32, usize> = chunk_order.iter().enumerate().map(|(k, &c)| (c, k)).collect();
        order.iter().map(|r| position[&r.chunk] % o.num_workers).collect()
    } else {
        let n = order.len() as u64;
        (0..n).map(|i| usize::try_from((sweep * n + i) % o.num_workers as u64).expect("a rank")).collect()
    }
}

/// This worker's sequences of the whole epoch, in order.
fn expected(t: &Timeline, o: &SamplingOptions) -> Vec<Entry> {
    let (size, end) = (sweep_size(t), epoch_end(t, o.limit));
    let mut entries = Vec::new();
    let mut sweep = 0;
    while sweep * size < end {
        let order = sweep_order(t, o, sweep);
        let owner = owners(t, o, sweep);
        let mut local = Vec::new();
        let mut start = sweep * size;
        for (r, w) in order.iter().zip(owner) {
            if w == o.rank {
                local.push(Entry { seq: *r, sweep, start, last_in_sweep: false });
            }
            start += u64::from(t.seq_len[r.seq as usize]);
        }
        let mut seen = HashSet::new();
        for e in local.iter_mut().rev() {
            e.last_in_sweep = seen.insert(e.seq.chunk);
        }
        entries.extend(local.into_iter().filter(|e| e.start < end));
        sweep += 1;
    }
    entries
}

/// Runs to the end of the epoch with `sizes` cycled, starting at schedule index `first`.
fn run(sampler: &mut Sampler, sizes: &[usize], first: usize) -> Vec<MinibatchPlan> {
    (first..).map_while(|i| sampler.next_minibatch(sizes[i % sizes.len()])).collect()
}

fn sampler(case: &Case, options: &SamplingOptions) -> Sampler {
    Sampler::new(Arc::clone(&case.timeline), options.clone()).expect("valid case")
}

/// Largest randomization window (in chunks) of the sweeps the epoch touches: the bound on chunks
/// held at once. Without randomization at most one chunk is partly consumed.
fn held_bound(t: &Timeline, o: &SamplingOptions) -> usize {
    if !uses_block_randomizer(o) {
        return 1;
    }
    let sweeps = epoch_end(t, o.limit).div_ceil(sweep_size(t)).max(1);
    (0..sweeps).flat_map(|s| randomize_sweep(t, o.window, o.seed, s).windows).map(ChunkWindow::len).max().unwrap_or(1)
}

/// Checks `retire` of every plan and the bound on held chunks against the model.
fn check_retirement(plans: &[MinibatchPlan], entries: &[Entry], bound: usize) -> Result<(), TestCaseError> {
    let mut at = 0;
    let mut open: HashSet<(u64, u32)> = HashSet::new();
    let mut retired: HashSet<(u64, u32)> = HashSet::new();
    for plan in plans {
        let batch = &entries[at..at + plan.sequences.len()];
        at += batch.len();
        let mut final_entry: Vec<Entry> = Vec::new();
        for e in batch.iter().rev() {
            if !final_entry.iter().any(|f| f.seq.chunk == e.seq.chunk) {
                final_entry.push(*e);
            }
        }
        final_entry.reverse();
        let expect: Vec<u32> = final_entry.iter().filter(|e| e.last_in_sweep).map(|e| e.seq.chunk).collect();
        prop_assert_eq!(&plan.retire, &expect);
        for e in final_entry.iter().filter(|e| e.last_in_sweep) {
            prop_assert!(retired.insert((e.sweep, e.seq.chunk)), "retired twice in a sweep");
            let later = entries[at..].iter().any(|l| l.sweep == e.sweep && l.seq.chunk == e.seq.chunk);
            prop_assert!(!later, "chunk {} used after its retirement", e.seq.chunk);
        }
        for e in batch {
            if e.last_in_sweep {
                open.remove(&(e.sweep, e.seq.chunk));
            } else {
                open.insert((e.sweep, e.seq.chunk));
            }
        }
        prop_assert!(open.len() <= bound, "{} chunks held, bound {}", open.len(), bound);
    }
    Ok(())
}

/// `upcoming_chunks` names distinct chunks, each one this worker uses later in the epoch; in file
/// order they are a prefix of the model's first-need order. Block-randomized, the sweep's order is
/// known only a window ahead, so the hint need not follow first need exactly; but when it names
/// fewer than asked, it names every chunk of the rest of a current sweep that ends within the
/// epoch.
fn check_upcoming(
    sampler: &Sampler,
    o: &SamplingOptions,
    rest: &[Entry],
    size: u64,
    end: u64,
) -> Result<(), TestCaseError> {
    let mut distinct = Vec::new();
    let mut in_sweep = 0;
    let sweep = sampler.position() / size;
    for e in rest {
        if !distinct.contains(&e.seq.chunk) {
            distinct.push(e.seq.chunk);
            if e.sweep == sweep {
                in_sweep += 1;
            }
        }
    }
    let got = sampler.upcoming_chunks(3);
    let unique: HashSet<u32> = got.iter().copied().collect();
    prop_assert_eq!(unique.len(), got.len(), "named twice: {:?}", got);
    for c in &got {
        prop_assert!(distinct.contains(c), "chunk {} named but not used again: {:?} of {:?}", c, got, distinct);
    }
    if !uses_block_randomizer(o) {
        prop_assert_eq!(&got[..], &distinct[..got.len()]);
    }
    if (sweep + 1).saturating_mul(size) <= end {
        prop_assert!(got.len() >= in_sweep.min(3), "{:?} of {:?}", got, distinct);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every worker gets exactly its share of each sweep, in order, whatever the minibatch sizes;
    /// all workers together cover each sweep exactly once.
    #[test]
    fn each_sweep_is_covered_exactly_once(case in case_strategy()) {
        let t = &case.timeline;
        let mut counts: HashMap<u32, u64> = HashMap::new();
        for rank in 0..case.options.num_workers {
            let o = SamplingOptions { rank, ..case.options.clone() };
            let model: Vec<SeqRef> = expected(t, &o).iter().map(|e| e.seq).collect();
            for sizes in [&case.sizes, &case.other_sizes] {
                let got: Vec<SeqRef> = run(&mut sampler(&case, &o), sizes, 0)
                    .into_iter().flat_map(|p| p.sequences).collect();
                prop_assert_eq!(&got, &model);
            }
            for r in &model {
                *counts.entry(r.seq).or_default() += 1;
            }
        }
        let (size, end) = (sweep_size(t), epoch_end(t, case.options.limit));
        let mut sweep = 0;
        let mut want: HashMap<u32, u64> = HashMap::new();
        while sweep * size < end {
            let mut start = sweep * size;
            for r in sweep_order(t, &case.options, sweep) {
                if start < end {
                    *want.entry(r.seq).or_default() += 1;
                }
                start += u64::from(t.seq_len[r.seq as usize]);
            }
            sweep += 1;
        }
        prop_assert_eq!(counts, want);
    }

    /// Restoring to the position reported after any minibatch continues exactly like the
    /// uninterrupted run (fresh sampler, and rewinding the same one).
    #[test]
    fn restore_continues_like_the_uninterrupted_run(case in case_strategy()) {
        let plans = run(&mut sampler(&case, &case.options), &case.sizes, 0);
        let step = (plans.len() / 6).max(1);
        let mut rewound = sampler(&case, &case.options);
        for i in (0..plans.len()).step_by(step) {
            let mut fresh = sampler(&case, &case.options);
            fresh.restore(plans[i].position).expect("restore");
            prop_assert_eq!(&run(&mut fresh, &case.sizes, i + 1), &plans[i + 1..].to_vec());
            rewound.restore(plans[i].position).expect("restore");
            prop_assert_eq!(&run(&mut rewound, &case.sizes, i + 1), &plans[i + 1..].to_vec());
        }
    }

    /// Chunks are retired at their last use in each sweep, never used again in that sweep, and
    /// at most a window's worth of chunks is held at once; the prefetch hint follows first need.
    #[test]
    fn retirement_and_prefetch_follow_the_order(case in case_strategy()) {
        let t = &case.timeline;
        let entries = expected(t, &case.options);
        let mut s = sampler(&case, &case.options);
        let mut plans = Vec::new();
        let mut consumed = 0;
        for i in 0.. {
            check_upcoming(&s, &case.options, &entries[consumed..], sweep_size(t), epoch_end(t, case.options.limit))?;
            let Some(plan) = s.next_minibatch(case.sizes[i % case.sizes.len()]) else { break };
            consumed += plan.sequences.len();
            plans.push(plan);
        }
        check_retirement(&plans, &entries, held_bound(t, &case.options))?;
    }

    /// A restore to any position lands on the first sequence starting at or after it.
    #[test]
    fn restore_snaps_to_the_next_sequence_start(case in case_strategy(), at in 0u64..400) {
        let o = SamplingOptions { num_workers: 1, rank: 0, limit: EpochLimit::Infinite, ..case.options.clone() };
        let t = &case.timeline;
        let size = sweep_size(t);
        let sweep = at / size;
        let mut start = sweep * size;
        for r in sweep_order(t, &o, sweep) {
            if start >= at {
                break;
            }
            start += u64::from(t.seq_len[r.seq as usize]);
        }
        let mut s = sampler(&case, &o);
        s.restore(at).expect("restore");
        prop_assert_eq!(s.position(), start);
    }
}
