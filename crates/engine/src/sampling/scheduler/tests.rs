//! Unit tests of the scheduler: CNTK's edge cases (`reference/cntk-ctf-semantics.md` §6, 39–48),
//! golden vectors through the full scheduler, restore and option validation.

use std::sync::Arc;

use super::*;
use crate::sampling::plan::SweepPlan;
use crate::sampling::randomizer::{randomize_sweep, sweep_order};

/// A timeline from sequence lengths and chunk sizes (in sequences).
fn timeline(lens: &[u32], chunk_sizes: &[usize]) -> Arc<Timeline> {
    let mut chunk_start = vec![0];
    for size in chunk_sizes {
        chunk_start.push(chunk_start[chunk_start.len() - 1] + size);
    }
    assert_eq!(chunk_start[chunk_start.len() - 1], lens.len());
    Arc::new(Timeline { seq_len: lens.to_vec().into(), chunk_start })
}

/// CNTK's `MockDeserializer`: `chunks` chunks of `per_chunk` sequences of length `len`.
fn mock(chunks: usize, per_chunk: usize, len: u32) -> Arc<Timeline> {
    timeline(&vec![len; chunks * per_chunk], &vec![per_chunk; chunks])
}

fn options(randomize: bool, window: Window, seed: u64, limit: EpochLimit) -> SamplingOptions {
    SamplingOptions { randomize, window, seed, limit, num_workers: 1, rank: 0 }
}

fn sequential(limit: EpochLimit) -> SamplingOptions {
    options(false, Window::Chunks(128), 0, limit)
}

fn whole_window(seed: u64, limit: EpochLimit) -> SamplingOptions {
    options(true, Window::Samples(u64::MAX), seed, limit)
}

fn ids(plan: &MinibatchPlan) -> Vec<u32> {
    plan.sequences.iter().map(|r| r.seq).collect()
}

/// Every minibatch of the epoch, `minibatch_size` each.
fn drain(sampler: &mut Sampler, minibatch_size: usize) -> Vec<MinibatchPlan> {
    std::iter::from_fn(|| sampler.next_minibatch(minibatch_size)).collect()
}

fn all_ids(plans: &[MinibatchPlan]) -> Vec<u32> {
    plans.iter().flat_map(ids).collect()
}

fn sampler(timeline: &Arc<Timeline>, options: SamplingOptions) -> Sampler {
    Sampler::new(Arc::clone(timeline), options).expect("valid options")
}

// ReaderLibTests.cpp TestRandomization_TwoSweeps(_AllowToCrossSweepBoundary): two sweeps of the
// 5x2 mock in every minibatch size, one worker.
#[test]
fn golden_two_sweeps_in_any_minibatch_size() {
    let t = mock(5, 2, 1);
    let expected = [6, 3, 1, 5, 9, 0, 4, 2, 7, 8, 3, 0, 8, 4, 7, 5, 2, 9, 1, 6];
    for mb in 1..=21 {
        let mut s = sampler(&t, whole_window(0, EpochLimit::Samples(20)));
        let plans = drain(&mut s, mb);
        assert_eq!(all_ids(&plans), expected, "mb {mb}");
        let mut read = 0u64;
        for plan in &plans {
            let n = plan.sequences.len() as u64;
            assert_eq!(n, (mb as u64).min(20 - read), "mb {mb}");
            assert_eq!(plan.end_of_sweep, read / 10 != (read + n) / 10, "mb {mb}");
            read += n;
            assert_eq!(plan.position, read);
        }
        assert!(s.next_minibatch(mb).is_none());
        assert!(s.next_minibatch(1).is_none());
    }
}

// ReaderLibTests.cpp TestRandomization_TwoSweeps_WithSequences: longer sequences keep the order;
// no minibatch exceeds max(mb, sequence length).
#[test]
fn golden_two_sweeps_with_long_sequences() {
    let expected = [6, 3, 1, 5, 9, 0, 4, 2, 7, 8, 3, 0, 8, 4, 7, 5, 2, 9, 1, 6];
    for len in 2..=10u32 {
        let t = mock(5, 2, len);
        for mb in [1, len as usize - 1, len as usize, 7, 25] {
            let mut s = sampler(&t, whole_window(0, EpochLimit::Sweeps(2)));
            let plans = drain(&mut s, mb);
            assert_eq!(all_ids(&plans), expected, "len {len} mb {mb}");
            for plan in &plans {
                let samples = plan.sequences.len() * len as usize;
                assert!(samples <= mb.max(len as usize), "len {len} mb {mb}");
            }
        }
    }
}

#[test]
fn no_randomizer_reads_file_order_forever() {
    let t = mock(5, 2, 1);
    let mut s = sampler(&t, sequential(EpochLimit::Samples(25)));
    let expected: Vec<u32> = (0..25).map(|i| i % 10).collect();
    assert_eq!(all_ids(&drain(&mut s, 3)), expected);
}

// §6.39 and io_tests test_text_format: a sequence longer than the minibatch comes alone.
#[test]
fn sequence_longer_than_minibatch_is_returned_alone() {
    let t = timeline(&[5, 1, 1], &[3]);
    let mut s = sampler(&t, sequential(EpochLimit::FullSweep));
    let plans = drain(&mut s, 2);
    let batches: Vec<Vec<u32>> = plans.iter().map(ids).collect();
    assert_eq!(batches, [vec![0], vec![1, 2]]);
}

// §6.40: greedy fill without skipping.
#[test]
fn greedy_fill_does_not_skip() {
    let t = timeline(&[2, 3, 1], &[3]);
    let mut s = sampler(&t, sequential(EpochLimit::FullSweep));
    let batches: Vec<Vec<u32>> = drain(&mut s, 4).iter().map(ids).collect();
    assert_eq!(batches, [vec![0], vec![1, 2]]);
}

// §6.41 and §3.2: max_samples=4 with sequences of length 3 delivers 6 samples.
#[test]
fn max_samples_overshoots_to_the_end_of_the_last_started_sequence() {
    let t = timeline(&[3, 3, 3], &[3]);
    let mut s = sampler(&t, sequential(EpochLimit::Samples(4)));
    let plan = s.next_minibatch(100).expect("one minibatch");
    assert_eq!(ids(&plan), [0, 1]);
    assert_eq!(plan.position, 6);
    assert!(s.next_minibatch(100).is_none());
    let mut s = sampler(&t, sequential(EpochLimit::Samples(4)));
    let positions: Vec<u64> = drain(&mut s, 3).iter().map(|p| p.position).collect();
    assert_eq!(positions, [3, 6]);
}

// ReaderLibTests.cpp CheckNoDegenerateMinibatches: 3-sample sequences, epoch 100, minibatch 90
// gives minibatches of 90 and 12 samples, for both randomizers.
#[test]
fn no_degenerate_minibatch_at_the_epoch_end() {
    let t = mock(1, 50, 3);
    for opts in [sequential(EpochLimit::Samples(100)), whole_window(0, EpochLimit::Samples(100))] {
        let mut s = sampler(&t, opts);
        let sizes: Vec<usize> = drain(&mut s, 90).iter().map(|p| p.sequences.len() * 3).collect();
        assert_eq!(sizes, [90, 12]);
    }
}

// §6.42: a minibatch crosses the sweep end and continues in the re-randomized next sweep.
#[test]
fn minibatch_crosses_the_sweep_end() {
    let t = mock(5, 2, 1);
    let mut s = sampler(&t, whole_window(0, EpochLimit::Infinite));
    let plans: Vec<MinibatchPlan> = (0..4).filter_map(|_| s.next_minibatch(4)).collect();
    assert_eq!(ids(&plans[2]), [7, 8, 3, 0]);
    assert_eq!((plans[2].sweep, plans[2].end_of_sweep, plans[2].position), (0, true, 12));
    assert_eq!((plans[3].sweep, plans[3].end_of_sweep), (1, false));
    assert!(plans[..2].iter().all(|p| !p.end_of_sweep));
}

// io_tests test_large_minibatch: one minibatch of 1000 samples spans about 143 sweeps.
#[test]
fn one_minibatch_spans_many_sweeps() {
    let t = timeline(&[1; 7], &[3, 4]);
    let mut s = sampler(&t, whole_window(3, EpochLimit::Infinite));
    let plan = s.next_minibatch(1000).expect("data");
    assert_eq!(plan.sequences.len(), 1000);
    assert_eq!((plan.position, plan.end_of_sweep), (1000, true));
    let mut expected = Vec::new();
    for sweep in 0..143 {
        expected.extend(sweep_order(&t, &whole_window(3, EpochLimit::Infinite), sweep));
    }
    expected.truncate(1000);
    assert_eq!(plan.sequences, expected);
}

// After a sweep boundary the walk goes on only while the next sequence fits.
#[test]
fn continuation_into_the_next_sweep_stops_at_a_sequence_that_does_not_fit() {
    let t = timeline(&[2, 3], &[1, 1]);
    let mut s = sampler(&t, options(true, Window::Chunks(1), 0, EpochLimit::Infinite));
    // The whole first sweep (5 samples) fits; neither sequence of the next sweep fits in 1 more.
    let first = s.next_minibatch(6).expect("data");
    assert_eq!((first.sequences.len(), first.position, first.end_of_sweep), (2, 5, true));
    // Exactly full at the sweep end: the minibatch ends there.
    let mut s = sampler(&t, options(true, Window::Chunks(1), 0, EpochLimit::Infinite));
    assert_eq!(s.next_minibatch(5).expect("data").position, 5);
}

// §6.43: FULL_DATA_SWEEP, max_sweeps and max_samples end the epoch, then None forever.
#[test]
fn epoch_limits() {
    let t = timeline(&[1, 2, 3, 4], &[2, 2]);
    let cases = [
        (EpochLimit::FullSweep, 10),
        (EpochLimit::Sweeps(3), 30),
        (EpochLimit::Sweeps(0), 0),
        (EpochLimit::Samples(0), 0),
        (EpochLimit::Samples(9), 10),
    ];
    for (limit, end) in cases {
        for randomize in [false, true] {
            let mut s = sampler(&t, options(randomize, Window::Chunks(2), 5, limit));
            let plans = drain(&mut s, 3);
            assert_eq!(plans.last().map_or(0, |p| p.position), end, "{limit:?}");
            assert_eq!(s.position(), end);
            assert!(s.next_minibatch(3).is_none() && s.next_minibatch(100).is_none());
        }
    }
}

// §6.44 and io_tests test_random_seed: sweep k of seed s is sweep 0 of seed s + k.
#[test]
fn sweep_k_of_seed_s_is_sweep_0_of_seed_s_plus_k() {
    let t = timeline(&[1, 2, 3, 1, 2, 3, 1, 2], &[2, 3, 1, 2]);
    for window in [Window::Chunks(2), Window::Samples(6)] {
        let mut s = sampler(&t, options(true, window, 7, EpochLimit::Sweeps(3)));
        let all: Vec<SeqRef> = drain(&mut s, 4).into_iter().flat_map(|p| p.sequences).collect();
        for k in 0..3usize {
            let fresh = sweep_order(&t, &options(true, window, 7 + k as u64, EpochLimit::FullSweep), 0);
            assert_eq!(all[k * 8..(k + 1) * 8], fresh[..]);
        }
    }
}

// §6.45: changing the minibatch size mid-stream keeps the order.
#[test]
fn changing_the_minibatch_size_keeps_the_order() {
    let t = timeline(&[1, 3, 2, 2, 1, 4, 1, 1, 2], &[3, 2, 4]);
    let opts = options(true, Window::Chunks(2), 11, EpochLimit::Sweeps(3));
    let reference = all_ids(&drain(&mut sampler(&t, opts.clone()), 1));
    let mut s = sampler(&t, opts);
    let mut got = Vec::new();
    for mb in [1, 5, 2, 8, 3].iter().cycle() {
        match s.next_minibatch(*mb) {
            Some(plan) => got.extend(ids(&plan)),
            None => break,
        }
    }
    assert_eq!(got, reference);
}

// §6.46: restore (same sampler or a fresh one) reproduces the order, including a rewind within
// the current sweep with a non-zero seed (where CNTK's Seek bug would re-seed wrongly).
#[test]
fn restore_reproduces_the_uninterrupted_run() {
    let t = timeline(&[1, 1, 2, 1, 1, 1, 2, 1, 1, 1], &[2, 2, 2, 2, 2]);
    let opts = options(true, Window::Chunks(2), 5, EpochLimit::Sweeps(3));
    let reference = drain(&mut sampler(&t, opts.clone()), 3);
    for (i, plan) in reference.iter().enumerate() {
        let mut fresh = sampler(&t, opts.clone());
        fresh.restore(plan.position).expect("restore");
        assert_eq!(drain(&mut fresh, 3), reference[i + 1..], "fresh restore after {i}");
    }
    let mut s = sampler(&t, opts);
    let _ = drain(&mut s, 3);
    s.restore(reference[0].position).expect("rewind");
    assert_eq!(drain(&mut s, 3), reference[1..]);
}

#[test]
fn restore_in_the_middle_of_a_sequence_moves_to_the_next_start() {
    let t = timeline(&[3, 3, 3], &[3]);
    let mut s = sampler(&t, sequential(EpochLimit::Infinite));
    s.restore(4).expect("restore");
    assert_eq!(s.position(), 6);
    s.restore(8).expect("restore");
    assert_eq!(s.position(), 9, "past the last start: the next sweep starts");
    assert_eq!(ids(&s.next_minibatch(3).expect("data")), [0]);
    s.restore(u64::MAX).expect("restore");
    assert!(s.next_minibatch(3).is_none() && s.upcoming_chunks(3).is_empty());
    s.restore(21).expect("restore");
    assert_eq!((s.position(), ids(&s.next_minibatch(3).expect("data"))), (21, vec![1]));
}

#[test]
fn restore_exact_refuses_a_position_inside_a_sequence_before_the_epoch_end() {
    let t = timeline(&[3, 3, 3], &[3]);
    let mut s = sampler(&t, sequential(EpochLimit::Samples(10)));
    // Sequence starts, and the epoch's end and past it (nothing left there to lose).
    for p in [0, 3, 6, 9, 10, 11, 12] {
        s.restore_exact(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    for (p, next) in [(1, 3), (5, 6), (8, 9)] {
        match s.restore_exact(p) {
            Err(SamplingError::InsideSequence { position, next: n }) => assert_eq!((position, n), (p, next)),
            other => panic!("{p}: {other:?}"),
        }
    }
    // A job's worker inside a sequence too; the job's own positions resume.
    let mut s = sampler(&t, sequential(EpochLimit::Sweeps(2)));
    s.resume_job(&[3, 6]).expect("workers at sequence starts");
    assert!(matches!(s.resume_job(&[3, 7]), Err(SamplingError::InsideSequence { position: 7, next: 9 })));
    assert!(matches!(s.resume_job(&[4, 6]), Err(SamplingError::InsideSequence { position: 4, next: 6 })));
}

#[test]
fn restore_before_the_one_sweep_of_its_epoch_is_refused() {
    // Found by a probe: with an epoch of exactly sweep 2, a restore to position 100 delivered
    // sweeps 0 to 2.
    let t = timeline(&[3, 3, 3], &[3]);
    let mut s = sampler(&t, sequential(EpochLimit::Sweep(2)));
    assert_eq!(s.earliest_position(), 18);
    for position in [0, 4, 17] {
        match s.restore(position) {
            Err(SamplingError::BeforeEpoch { position: p, start: 18, sweep: 2 }) => assert_eq!(p, position),
            other => panic!("restore({position}): {other:?}"),
        }
    }
    assert_eq!(s.position(), 18, "a refused restore leaves the sampler where it was");
    s.restore(19).expect("inside sweep 2");
    assert_eq!(s.position(), 21);
    assert_eq!(sampler(&t, sequential(EpochLimit::FullSweep)).earliest_position(), 0);
}

/// Reference ownership of the block randomizer: rank of the randomized chunk position.
fn block_owner(t: &Timeline, opts: &SamplingOptions, sweep: u64, chunk: u32) -> usize {
    let sweep_data = randomize_sweep(t, opts.window, opts.seed, sweep);
    let k = sweep_data.chunk_order.iter().position(|&c| c == chunk).expect("chunk present");
    k % opts.num_workers
}

// §6.47: with randomization, chunks go round-robin by randomized position; all ranks together
// cover the sweep exactly once; per-rank positions diverge.
#[test]
fn workers_with_randomization_split_by_randomized_chunk() {
    let t = timeline(&[1, 2, 1, 3, 1, 1, 2, 2, 1, 1, 1], &[2, 3, 1, 2, 3]);
    let base = options(true, Window::Chunks(3), 2, EpochLimit::FullSweep);
    let mut union = Vec::new();
    let mut last_positions = Vec::new();
    for rank in 0..3 {
        let opts = SamplingOptions { num_workers: 3, rank, ..base.clone() };
        let plans = drain(&mut sampler(&t, opts.clone()), 4);
        for r in plans.iter().flat_map(|p| &p.sequences) {
            assert_eq!(block_owner(&t, &opts, 0, r.chunk), rank);
            union.push(r.seq);
        }
        last_positions.push(plans.iter().map(|p| p.position).collect::<Vec<_>>());
    }
    union.sort_unstable();
    assert_eq!(union, (0..11).collect::<Vec<_>>());
    assert!(last_positions.windows(2).any(|w| w[0] != w[1]));
}

// §2.6: a rank without chunks gets nothing; its position is the epoch end.
#[test]
fn rank_beyond_the_chunk_count_is_at_the_epoch_end() {
    let t = mock(2, 2, 1);
    let opts = SamplingOptions { num_workers: 3, rank: 2, ..whole_window(0, EpochLimit::Sweeps(2)) };
    let mut s = sampler(&t, opts);
    assert_eq!(s.position(), 8);
    assert!(s.next_minibatch(4).is_none());
    s.restore(1).expect("restore");
    assert_eq!(s.position(), 8);
}

// §6.48: without randomization, sequences go round-robin by global position and the local
// minibatch size is mb/W (+1 for rank < mb % W).
#[test]
fn workers_without_randomization_split_by_sequence() {
    let t = mock(3, 3, 1);
    for rank in 0..2 {
        let opts = SamplingOptions { num_workers: 2, rank, ..sequential(EpochLimit::Sweeps(2)) };
        let plans = drain(&mut sampler(&t, opts), 5);
        let expected: Vec<u32> = (0u32..18).filter(|&g| g as usize % 2 == rank).map(|g| g % 9).collect();
        assert_eq!(all_ids(&plans), expected);
        let local = if rank == 0 { 3 } else { 2 };
        assert!(plans.iter().all(|p| p.sequences.len() <= local));
        assert_eq!(plans[0].sequences.len(), local);
    }
}

// `EpochLimit::Sweep(k)` is sweep k of the uninterrupted run, at every rank (a trainer's epoch k
// is CNTK's sweep k): the sweeps one after the other give the rank's sequences of an
// uninterrupted run, in its order; each sweep holds every sequence once over the ranks; and the
// order does not depend on the minibatch size.
#[test]
fn one_sweep_is_that_sweep_of_the_uninterrupted_run() {
    let t = timeline(&[1, 3, 2, 1, 1, 2, 4, 1, 1, 2], &[2, 3, 1, 4]);
    for options in [whole_window(5, EpochLimit::Sweeps(4)), sequential(EpochLimit::Sweeps(4))] {
        for workers in 1..=3 {
            let mut per_sweep_union: Vec<Vec<u32>> = vec![Vec::new(); 4];
            for rank in 0..workers {
                let all = SamplingOptions { num_workers: workers, rank, ..options.clone() };
                let uninterrupted = all_ids(&drain(&mut sampler(&t, all.clone()), 1));
                let mut concatenated = Vec::new();
                for (k, union) in per_sweep_union.iter_mut().enumerate() {
                    let one = SamplingOptions { limit: EpochLimit::Sweep(k as u64), ..all.clone() };
                    let mut s = sampler(&t, one.clone());
                    let ids_1 = all_ids(&drain(&mut s, 1));
                    assert_eq!(s.position(), (k as u64 + 1) * 18, "sweep {k} ends with it");
                    assert_eq!(all_ids(&drain(&mut sampler(&t, one), 7)), ids_1, "minibatch size");
                    union.extend(&ids_1);
                    concatenated.extend(ids_1);
                }
                assert_eq!(concatenated, uninterrupted, "rank {rank} of {workers}");
            }
            for union in &mut per_sweep_union {
                union.sort_unstable();
                assert_eq!(*union, (0..10).collect::<Vec<u32>>(), "{workers} worker(s)");
            }
        }
    }
}

// Equal steps: every worker gets the fewest worker's count of minibatches, each one a prefix of
// what it gets without the cut; a restore inside the epoch keeps the cut; an infinite epoch is
// refused.
#[test]
fn equal_steps_cut_every_worker_to_the_fewest() {
    let t = timeline(&[1, 3, 2, 1, 1, 2, 4, 1, 1, 2, 5, 1], &[2, 3, 1, 4, 2]);
    let mut ragged = 0;
    for options in [
        whole_window(2, EpochLimit::Sweep(1)),
        sequential(EpochLimit::Sweeps(2)),
        options(true, Window::Chunks(2), 7, EpochLimit::FullSweep),
    ] {
        for workers in 2..=4 {
            let full: Vec<Vec<MinibatchPlan>> = (0..workers)
                .map(|rank| {
                    drain(&mut sampler(&t, SamplingOptions { num_workers: workers, rank, ..options.clone() }), 3)
                })
                .collect();
            let fewest = full.iter().map(Vec::len).min().unwrap_or(0);
            ragged += usize::from(full.iter().any(|f| f.len() != fewest));
            for (rank, uncut) in full.iter().enumerate() {
                let mut s = sampler(&t, SamplingOptions { num_workers: workers, rank, ..options.clone() });
                let equal = s.equalize_steps(3, Tail::Drop).expect("finite epoch");
                let cut = drain(&mut s, 3);
                assert_eq!(cut.len(), fewest);
                assert_eq!(
                    (equal.steps, equal.dropped, equal.padding),
                    (fewest as u64, (uncut.len() - fewest) as u64, 0)
                );
                // Padding instead: nothing is cut, and the worker is told how many empty ones follow.
                let most = full.iter().map(Vec::len).max().unwrap_or(0);
                let mut padded = sampler(&t, SamplingOptions { num_workers: workers, rank, ..options.clone() });
                let pad = padded.equalize_steps(3, Tail::Pad).expect("finite epoch");
                assert_eq!((pad.steps, pad.dropped, pad.padding), (most as u64, 0, (most - uncut.len()) as u64));
                assert_eq!(drain(&mut padded, 3), *uncut);
                assert_eq!(cut[..], uncut[..fewest]);
                if fewest > 1 {
                    let mut resumed = sampler(&t, SamplingOptions { num_workers: workers, rank, ..options.clone() });
                    resumed.equalize_steps(3, Tail::Drop).expect("finite epoch");
                    resumed.restore(cut[0].position).expect("restore");
                    assert_eq!(drain(&mut resumed, 3)[..], cut[1..]);
                }
            }
        }
    }
    assert!(ragged >= 3, "only {ragged} configurations give workers different counts");
    let mut infinite = sampler(&t, whole_window(0, EpochLimit::Infinite));
    assert!(matches!(infinite.equalize_steps(4, Tail::Drop), Err(SamplingError::EqualStepsNeedAFiniteEpoch)));
}

/// What a client may ask of the walks that run when a session opens is bounded: an epoch of 2^62
/// samples, or 2^20 workers, with equal steps is refused at once (it walked every minibatch of
/// every worker, keeping each one's end, until memory ran out); so are job positions further apart
/// than a job's workers ever stand (every sweep between them was walked).
#[test]
fn the_walks_a_client_can_ask_for_are_bounded() {
    let t = mock(4, 8, 1);
    let started = std::time::Instant::now();
    let mut long = sampler(&t, whole_window(3, EpochLimit::Samples(1 << 62)));
    match long.equalize_steps(1, Tail::Drop) {
        Err(e @ SamplingError::EqualStepsTooCostly { .. }) => {
            assert!(e.to_string().contains("use a shorter epoch"), "{e}");
        }
        other => panic!("expected EqualStepsTooCostly, got {other:?}"),
    }
    // 4,096 sequences of two samples (walked, not counted) and the setup of each of 2^20 + 1
    // workers: over 2^32.
    let many = SamplingOptions { num_workers: 1 << 20, rank: 5, ..whole_window(3, EpochLimit::FullSweep) };
    let mut wide = Sampler::new(mock(4, 1024, 2), many.clone()).expect("sampler");
    assert!(matches!(wide.equalize_steps(1, Tail::Pad), Err(SamplingError::EqualStepsTooCostly { .. })));
    // The check a caller makes before committing to a session says the same, at once.
    assert!(wide.equal_steps_walk_fits(None).is_err());
    assert!(sampler(&t, whole_window(3, EpochLimit::FullSweep)).equal_steps_walk_fits(None).is_ok());
    // Sequences of one sample are counted, not walked: as many workers cost a count each.
    let mut counted = Sampler::new(mock(4, 1024, 1), many).expect("sampler");
    assert_eq!(counted.equalize_steps(1, Tail::Pad).expect("counted").steps, 1024);
    // Counted, an epoch of 2^62 samples is 2^57 sweeps of 4 chunks: refused as well.
    assert!(sampler(&t, whole_window(3, EpochLimit::Samples(1 << 62))).equal_steps_walk_fits(None).is_err());
    // A bounded epoch is still equalized, whatever its length within the bound.
    let mut ok = sampler(&t, whole_window(3, EpochLimit::Sweeps(1000)));
    assert_eq!(ok.equalize_steps(4, Tail::Drop).expect("within the bound").steps, 8000);

    let mut job = sampler(&t, whole_window(3, EpochLimit::Infinite));
    match job.resume_job(&[0, u64::MAX]) {
        Err(e @ SamplingError::JobSpreadTooWide { from: 0, until: u64::MAX, .. }) => {
            assert!(e.to_string().contains("sequences to walk"), "{e}");
        }
        other => panic!("expected JobSpreadTooWide, got {other:?}"),
    }
    // Workers far apart whose deliveries past the earliest are many: refused by what it would
    // remember (the second worker delivered every other sequence of 2^24 sweeps: over 2^20).
    match job.resume_job(&[0, 32 << 24]) {
        Err(e @ SamplingError::JobSpreadTooWide { .. }) => assert!(e.to_string().contains("delivered"), "{e}"),
        other => panic!("expected JobSpreadTooWide, got {other:?}"),
    }
    // A job whose idle workers stand at the end of a long epoch (more workers than chunks with
    // the block randomizer) while the others are near its start is legitimate: accepted.
    // (4 chunks, 8 workers: the chunks go to workers 0..=3 in every sweep.)
    let mut idle = sampler(&t, whole_window(3, EpochLimit::Sweeps(100_000)));
    let end = 32 * 100_000;
    idle.resume_job(&[40, 41, 42, 43, end, end, end, end]).expect("idle workers at the epoch end");
    // Positions at the very end of the timeline do not overflow (a panic in this debug build).
    let mut end = sampler(&t, whole_window(3, EpochLimit::Infinite));
    let _ = end.resume_job(&[u64::MAX - 3, u64::MAX]);
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "the refusals are immediate");
}

/// How many times `plans` deliver each sequence over the whole epoch.
fn deliveries(plans: &[MinibatchPlan]) -> std::collections::BTreeMap<u32, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for r in plans.iter().flat_map(|p| &p.sequences) {
        *seen.entry(r.seq).or_insert(0) += 1;
    }
    seen
}

// Resume across world sizes: workers of a run of W stop at ragged positions (each after its own
// number of minibatches); a run of W' continues from all their positions. Over both runs every
// sequence of the epoch is delivered exactly once, and after the ragged band the W' workers get
// what a fresh run of W' gets.
#[test]
fn a_run_resumed_at_another_worker_count_delivers_each_sequence_once() {
    let t = timeline(&[1, 3, 2, 1, 1, 2, 4, 1, 1, 2, 5, 1, 2, 2, 1, 3], &[2, 3, 1, 4, 2, 1, 3]);
    let mut checked = 0;
    for options in [
        whole_window(2, EpochLimit::Sweeps(3)),
        sequential(EpochLimit::Sweeps(2)),
        options(true, Window::Chunks(2), 7, EpochLimit::Sweeps(2)),
        options(true, Window::Samples(5), 3, EpochLimit::Samples(40)),
    ] {
        for (w, w2) in [(4, 3), (2, 5), (3, 1), (1, 4), (5, 2), (4, 4)] {
            for cut in [0usize, 1, 3, 6] {
                // The first run: worker r takes `cut + r % 2` minibatches (ragged, as real ranks are).
                let mut taken: Vec<MinibatchPlan> = Vec::new();
                let mut positions = Vec::new();
                for rank in 0..w {
                    let mut s = sampler(&t, SamplingOptions { num_workers: w, rank, ..options.clone() });
                    for _ in 0..cut + rank % 2 {
                        match s.next_minibatch(4) {
                            Some(p) => taken.push(p),
                            None => break,
                        }
                    }
                    positions.push(s.position());
                }
                // The second run, and a fresh run of W' to compare its later sweeps with.
                let mut rest = Vec::new();
                for rank in 0..w2 {
                    let opts = SamplingOptions { num_workers: w2, rank, ..options.clone() };
                    let mut s = sampler(&t, opts.clone());
                    s.resume_job(&positions).expect("resume the job");
                    let mine = drain(&mut s, 4);
                    // A restore inside the continued run (a later checkpoint) reproduces it.
                    if mine.len() > 2 {
                        let mut again = sampler(&t, opts.clone());
                        again.resume_job(&positions).expect("resume the job");
                        again.restore(mine[1].position).expect("restore");
                        assert_eq!(drain(&mut again, 4)[..], mine[2..], "restore within the continued run");
                    }
                    // Past the band, the same minibatches as a fresh run of W'.
                    let band = positions.iter().copied().max().unwrap_or(0);
                    let sweep_size = s.sweep_size();
                    let fresh = drain(&mut sampler(&t, opts), 4);
                    let after = |plans: &[MinibatchPlan]| -> Vec<Vec<SeqRef>> {
                        plans.iter().filter(|p| p.sweep > band / sweep_size).map(|p| p.sequences.clone()).collect()
                    };
                    let (a, b) = (after(&mine), after(&fresh));
                    let n = a.len().min(b.len());
                    assert_eq!(
                        a[a.len() - n..],
                        b[b.len() - n..],
                        "W={w} W'={w2}: later sweeps differ from a fresh run's"
                    );
                    rest.extend(mine);
                }
                let mut all = taken.clone();
                all.extend(rest);
                let got = deliveries(&all);
                let expected = deliveries(
                    &(0..w)
                        .flat_map(|rank| {
                            drain(&mut sampler(&t, SamplingOptions { num_workers: w, rank, ..options.clone() }), 4)
                        })
                        .collect::<Vec<_>>(),
                );
                assert_eq!(
                    got, expected,
                    "W={w} W'={w2} cut={cut} {options:?}: deliveries per sequence differ from one run's"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 90, "{checked}");
}

// CNTK 2.7 (oracle): without randomization a worker stops as soon as its local share is full,
// without passing over the other workers' sequences that follow: 4 one-sample sequences, W = 2,
// minibatch 4 (local 2): rank 0 gets [0, 2] at position 3, rank 1 gets [1, 3] at position 4.
#[test]
fn no_randomizer_stops_once_the_local_share_is_full() {
    let t = mock(1, 4, 1);
    let expected = [(vec![0, 2], 3), (vec![1, 3], 4)];
    for (rank, (ids_expected, position)) in expected.into_iter().enumerate() {
        let opts = SamplingOptions { num_workers: 2, rank, ..sequential(EpochLimit::FullSweep) };
        let plan = sampler(&t, opts).next_minibatch(4).expect("a minibatch");
        assert_eq!(ids(&plan), ids_expected, "rank {rank}");
        assert_eq!(plan.position, position, "rank {rank}");
    }
}

// The deliberate difference: the global sequence position counts from the timeline start, so a
// restore into sweep 1 with #sequences % W != 0 matches the uninterrupted run.
#[test]
fn no_randomizer_restore_matches_uninterrupted_split() {
    let t = mock(1, 3, 1);
    let opts = SamplingOptions { num_workers: 2, rank: 1, ..sequential(EpochLimit::Sweeps(3)) };
    let reference = drain(&mut sampler(&t, opts.clone()), 2);
    let restart = reference.iter().find(|p| p.position > 3).expect("a minibatch in sweep 1");
    let mut s = sampler(&t, opts);
    s.restore(restart.position).expect("restore");
    let tail: Vec<_> = reference.iter().skip_while(|p| p.position <= restart.position).cloned().collect();
    assert_eq!(drain(&mut s, 2), tail);
}

#[test]
fn local_minibatch_size_is_at_least_one() {
    let t = mock(4, 1, 1);
    for mb in [0, 1] {
        let opts = SamplingOptions { num_workers: 4, rank: 3, ..sequential(EpochLimit::FullSweep) };
        let plans = drain(&mut sampler(&t, opts), mb);
        assert_eq!(all_ids(&plans), [3]);
    }
}

// §3.4: a minibatch that is empty for this worker (after a restore past all its sequences of the
// sweep) is still returned, without the sweep-end flag.
#[test]
fn empty_minibatch_for_this_worker_is_returned_without_sweep_end() {
    let t = mock(6, 2, 3);
    let base = SamplingOptions { num_workers: 2, rank: 0, ..whole_window(0, EpochLimit::Infinite) };
    let mut plan = SweepPlan::build(&t, &base, 0, 36, MAX_EPOCH_SAMPLES);
    let owners: Vec<u64> = (0..plan.len()).map(|i| plan.entry(&t, i).owner).collect();
    let last_local = owners.iter().rposition(|&o| o == 0).expect("rank 0 has data");
    let after = last_local + 1;
    assert!(after < plan.len(), "the sweep must end with another rank's sequence");
    let mut s = sampler(&t, base);
    s.restore(after as u64 * 3).expect("restore");
    let empty = s.next_minibatch(2).expect("epoch goes on");
    assert!(empty.sequences.is_empty() && !empty.end_of_sweep);
    assert_eq!(empty.sweep, 0);
    assert!(empty.position >= s.sweep_size());
    assert_eq!(s.next_minibatch(2).expect("data").sequences.len(), 1);
}

#[test]
fn retire_marks_the_last_use_of_each_chunk() {
    let t = mock(3, 3, 1);
    let mut s = sampler(&t, sequential(EpochLimit::FullSweep));
    let retires: Vec<Vec<u32>> = drain(&mut s, 2).into_iter().map(|p| p.retire).collect();
    assert_eq!(retires, [vec![], vec![0], vec![1], vec![], vec![2]]);
}

#[test]
fn upcoming_chunks_follow_first_need() {
    let t = mock(3, 2, 1);
    let mut s = sampler(&t, sequential(EpochLimit::Sweeps(2)));
    assert_eq!(s.upcoming_chunks(2), [0, 1]);
    assert_eq!(s.upcoming_chunks(0), Vec::<u32>::new());
    let _ = s.next_minibatch(5);
    assert_eq!(s.upcoming_chunks(5), [2, 0, 1]);
    let _ = drain(&mut s, 5);
    assert!(s.upcoming_chunks(5).is_empty());
}

#[test]
fn invalid_options_and_timelines_are_rejected() {
    let t = mock(2, 2, 1);
    let ok = sequential(EpochLimit::FullSweep);
    let err = |t: Arc<Timeline>, o: SamplingOptions| Sampler::new(t, o).expect_err("invalid");
    assert!(matches!(err(t.clone(), SamplingOptions { num_workers: 0, ..ok.clone() }), SamplingError::NoWorkers));
    assert!(matches!(
        err(t.clone(), SamplingOptions { num_workers: 2, rank: 2, ..ok.clone() }),
        SamplingError::RankOutOfRange { rank: 2, num_workers: 2 }
    ));
    let empty = Arc::new(Timeline { seq_len: vec![].into(), chunk_start: vec![0] });
    assert!(matches!(err(empty, ok.clone()), SamplingError::EmptyTimeline));
    let bad_end = Arc::new(Timeline { seq_len: vec![1, 1].into(), chunk_start: vec![0, 1] });
    assert!(matches!(err(bad_end, ok.clone()), SamplingError::MalformedChunks { .. }));
    let empty_chunk = Arc::new(Timeline { seq_len: vec![1, 1].into(), chunk_start: vec![0, 0, 2] });
    assert!(matches!(err(empty_chunk, ok.clone()), SamplingError::EmptyChunk { chunk: 0 }));
    assert!(matches!(err(timeline(&[1, 0], &[2]), ok.clone()), SamplingError::ZeroLengthSequence { seq: 1 }));
    for limit in [EpochLimit::Sweeps(u64::MAX / 3), EpochLimit::Samples(u64::MAX)] {
        let e = err(t.clone(), SamplingOptions { limit, ..ok.clone() });
        assert!(matches!(e, SamplingError::EpochTooLarge { .. }), "{e}");
        // In the options' words, not Rust's (found by a probe: "epoch limit Sweeps(…)").
        assert!(e.to_string().starts_with("epoch limit max_s"), "{e}");
    }
    assert!(Sampler::new(t, SamplingOptions { limit: EpochLimit::Samples(MAX_EPOCH_SAMPLES), ..ok }).is_ok());
}

/// Randomized chunk positions of sweep `sweep` (original chunk at each position).
fn chunk_order(t: &Timeline, opts: &SamplingOptions, sweep: u64) -> Vec<u32> {
    randomize_sweep(t, opts.window, opts.seed, sweep).chunk_order
}

// Within a sweep, once the local size is reached the walk still passes over other workers'
// sequences up to the next local one (CNTK's callback only stops at a local sequence that does
// not fit), so the checkpoint position lies after them.
#[test]
fn full_minibatch_passes_over_other_workers_sequences() {
    let t = mock(3, 1, 1);
    let opts = SamplingOptions { num_workers: 2, rank: 0, ..options(true, Window::Chunks(3), 0, EpochLimit::Infinite) };
    // Rank 0 owns randomized positions 0 and 2 of every sweep.
    let plan = sampler(&t, opts.clone()).next_minibatch(2).expect("data");
    assert_eq!(plan.sequences, [SeqRef { seq: chunk_order(&t, &opts, 0)[0], chunk: chunk_order(&t, &opts, 0)[0] }]);
    assert_eq!(plan.position, 2);
}

// At the sweep end the block randomizer continues only while the local size is not reached
// (`localSampleCount > numLocalSamplesLoaded` in `BlockRandomizer::GetNextSequences`).
#[test]
fn exactly_full_at_the_sweep_end_does_not_cross() {
    let t = mock(2, 1, 1);
    let opts = SamplingOptions { num_workers: 2, rank: 1, ..options(true, Window::Chunks(2), 0, EpochLimit::Infinite) };
    let plan = sampler(&t, opts).next_minibatch(2).expect("data");
    assert_eq!((plan.sequences.len(), plan.position, plan.end_of_sweep), (1, 2, true));
}

// The ledger's fingerprint names the sequences, their order and the sweep, and nothing else.
#[test]
fn fingerprint_names_sequences_order_and_sweep() {
    let plan = |sweep, seqs: &[u32]| MinibatchPlan {
        sequences: seqs.iter().map(|&seq| SeqRef { seq, chunk: 0 }).collect(),
        sweep,
        end_of_sweep: false,
        position: 9,
        retire: Vec::new(),
        samples: seqs.len() as u64,
        next_sweeps_at: Vec::new(),
    };
    let a = plan(1, &[3, 1, 4]);
    assert_eq!(
        a.fingerprint(),
        MinibatchPlan { position: 99, end_of_sweep: true, retire: vec![0], ..a.clone() }.fingerprint()
    );
    assert_ne!(a.fingerprint(), plan(1, &[1, 3, 4]).fingerprint(), "order");
    assert_ne!(a.fingerprint(), plan(2, &[3, 1, 4]).fingerprint(), "sweep");
    assert_ne!(a.fingerprint(), plan(1, &[3, 1]).fingerprint(), "sequences");
    assert_ne!(plan(0, &[]).fingerprint(), plan(0, &[0]).fingerprint());
}

/// The next sweep's order built away from the sampler ([`Sampler::next_sweep_job`], on another
/// thread) and installed at any point of the current sweep gives exactly the minibatches and
/// prefetch hints of a sampler that builds it itself; a job for a sweep that is no longer the next
/// one is refused.
#[test]
fn a_next_sweep_built_elsewhere_changes_nothing() {
    let t = timeline(&[1, 2, 1, 3, 1, 1, 2, 1, 1, 1, 2, 1], &[3, 4, 2, 3]);
    for (window, workers, size) in [(Window::Chunks(2), 1, 3), (Window::Chunks(128), 2, 4), (Window::Samples(5), 3, 2)]
    {
        for install_after in [0usize, 1, 3, 7] {
            let options = |rank| SamplingOptions {
                rank,
                num_workers: workers,
                ..options(true, window, 9, EpochLimit::Samples(60))
            };
            for rank in 0..workers {
                let mut plain = sampler(&t, options(rank));
                let mut helped = sampler(&t, options(rank));
                let mut in_sweep = 0;
                loop {
                    if in_sweep == install_after {
                        if let Some(job) = helped.next_sweep_job() {
                            let sweep = job.sweep();
                            let built = std::thread::spawn(move || job.build()).join().expect("built");
                            assert!(helped.install_next_sweep(built), "sweep {sweep}");
                            assert!(helped.next_sweep_job().is_none(), "built already");
                        }
                    }
                    // The hints name the next sweep's chunks only once its order is there.
                    let hints = helped.upcoming_chunks_built(4);
                    assert!(plain.upcoming_chunks(4).starts_with(&hints), "{hints:?}");
                    let (a, b) = (plain.next_minibatch(size), helped.next_minibatch(size));
                    let (Some(a), Some(b)) = (a, b) else {
                        assert!(plain.next_minibatch(size).is_none() && helped.next_minibatch(size).is_none());
                        break;
                    };
                    assert_eq!((ids(&a), a.sweep, a.position), (ids(&b), b.sweep, b.position));
                    in_sweep = if b.end_of_sweep { 0 } else { in_sweep + 1 };
                }
            }
        }
    }
    // A job for a sweep that is no longer the next one is refused.
    let mut s = sampler(&t, whole_window(1, EpochLimit::Samples(60)));
    let job = s.next_sweep_job().expect("sweep 1 is in the epoch");
    while s.next_minibatch(4).is_some_and(|mb| mb.sweep == 0) {}
    assert!(!s.install_next_sweep(job.build()), "sweep 1 is current now");
}

mod counted_equal_steps {
    use proptest::prelude::*;

    use super::*;

    /// Sequences of one sample in 1–10 chunks of 1–12.
    fn unit_timeline() -> impl Strategy<Value = Arc<Timeline>> {
        prop::collection::vec(1usize..=12, 1..=10).prop_map(|sizes| {
            let lens = vec![1u32; sizes.iter().sum()];
            timeline(&lens, &sizes)
        })
    }

    fn window() -> impl Strategy<Value = Window> {
        prop_oneof![
            (0usize..6).prop_map(Window::Chunks),
            (0u64..40).prop_map(Window::Samples),
            Just(Window::Samples(u64::MAX))
        ]
    }

    fn limit() -> impl Strategy<Value = EpochLimit> {
        prop_oneof![
            Just(EpochLimit::FullSweep),
            (1u64..=3).prop_map(EpochLimit::Sweeps),
            (0u64..150).prop_map(EpochLimit::Samples),
            (0u64..3).prop_map(EpochLimit::Sweep),
        ]
    }

    fn drain_all(s: &mut Sampler, mb: usize) -> (Vec<MinibatchPlan>, u64) {
        let mut plans = Vec::new();
        while let Some(p) = s.next_minibatch(mb) {
            plans.push(p);
        }
        (plans, s.position())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Equal steps counted (every sequence one sample) give what walking every worker's plans
        /// gives — the counts, the cut, every minibatch after it and where the worker stops —
        /// also after a restore at any minibatch, before or after equal steps are applied.
        #[test]
        fn counting_is_walking(
            t in unit_timeline(),
            randomize in any::<bool>(),
            window in window(),
            seed in 0u64..1000,
            limit in limit(),
            workers in 1usize..=5,
            mb in 1usize..=9,
            pad in any::<bool>(),
        ) {
            let tail = if pad { Tail::Pad } else { Tail::Drop };
            for rank in 0..workers {
                let o = SamplingOptions { randomize, window, seed, limit, num_workers: workers, rank };
                let mut counted = Sampler::new(t.clone(), o.clone()).expect("sampler");
                prop_assert!(counted.counts_steps());
                let mut walked = Sampler::new(t.clone(), o.clone()).expect("sampler");
                let a = counted.equalize_steps(mb, tail).expect("counted");
                let b = walked.equalize_steps_walked(mb, tail, &std::sync::atomic::AtomicBool::new(false)).expect("walked");
                prop_assert_eq!(a, b, "rank {}", rank);
                prop_assert_eq!(counted.step_cutoff, walked.step_cutoff, "rank {}", rank);
                let (plans, end) = drain_all(&mut counted, mb);
                prop_assert_eq!((&plans, end), (&drain_all(&mut walked, mb).0, walked.position()));
                for (i, p) in plans.iter().enumerate() {
                    // The daemon's order: restore, then equal steps; dump's: the other way.
                    let mut daemon = Sampler::new(t.clone(), o.clone()).expect("sampler");
                    daemon.restore(p.position).expect("restore");
                    daemon.equalize_steps(mb, tail).expect("counted");
                    let mut dump = Sampler::new(t.clone(), o.clone()).expect("sampler");
                    dump.equalize_steps(mb, tail).expect("counted");
                    dump.restore(p.position).expect("restore");
                    let rest = (plans[i + 1..].to_vec(), end);
                    prop_assert_eq!(drain_all(&mut daemon, mb), rest.clone());
                    prop_assert_eq!(drain_all(&mut dump, mb), rest);
                }
            }
        }
    }
}

/// A minibatch that crosses sweep ends says where each later sweep's sequences begin, so that a
/// ledger can count each sequence under its own sweep (found by a probe: `exactly_once` counted
/// a crossing minibatch's next-sweep sequences under the sweep it started in).
#[test]
fn a_minibatch_across_sweep_ends_says_where_each_later_sweep_begins() {
    let t = mock(2, 5, 1);
    let mut s = sampler(&t, sequential(EpochLimit::Sweeps(3)));
    let plans = drain(&mut s, 4);
    let at: Vec<(u64, Vec<usize>)> = plans.iter().map(|p| (p.sweep, p.next_sweeps_at.clone())).collect();
    // Positions 0-4, 4-8, 8-12 (crosses at 10: two of sweep 0, then sweep 1), 12-16, 16-20
    // (ends at 20: within sweep 1), 20-24 (sweep 2), 24-28, 28-30.
    assert_eq!(at[2], (0, vec![2]));
    assert_eq!(at[4], (1, vec![]), "ending at a sweep end is not crossing it");
    assert_eq!(at[5], (2, vec![]), "a minibatch that starts a sweep is in it");
    // Several sweep ends in one minibatch, across workers too.
    let mut s = sampler(&t, SamplingOptions { num_workers: 2, rank: 1, ..whole_window(3, EpochLimit::Sweeps(3)) });
    let plans = drain(&mut s, 25);
    let first = &plans[0];
    assert_eq!(first.next_sweeps_at.len(), 2, "{:?}", first.next_sweeps_at);
    // This worker's share of each sweep: each sequence once per sweep within its part.
    let mut bounds = vec![0];
    bounds.extend(&first.next_sweeps_at);
    bounds.push(first.sequences.len());
    for w in bounds.windows(2) {
        let part: Vec<u32> = first.sequences[w[0]..w[1]].iter().map(|r| r.seq).collect();
        let mut unique = part.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), part.len(), "a sweep's part repeats no sequence: {part:?}");
    }
}

/// Equal steps counted (every sequence one sample) over many sweeps with the block randomizer
/// deal every sweep's chunks: given up when cancelled too (found by a probe: only the walk looked,
/// and an `open` of 2^23 sweeps whose client had gone counted on for 15 s).
#[test]
fn an_equal_steps_count_stops_when_cancelled() {
    use std::sync::atomic::AtomicBool;
    let options =
        SamplingOptions { num_workers: 3, rank: 1, ..options(true, Window::Chunks(2), 7, EpochLimit::Sweeps(1 << 20)) };
    let mut s = Sampler::new(mock(16, 4, 1), options.clone()).expect("sampler");
    assert!(s.counts_steps());
    assert!(matches!(s.equalize_steps_unless(5, Tail::Drop, &AtomicBool::new(true)), Err(SamplingError::Cancelled)));
    assert!(matches!(s.equalize_steps_unless(5, Tail::Pad, &AtomicBool::new(true)), Err(SamplingError::Cancelled)));
    let few = SamplingOptions { limit: EpochLimit::Sweeps(3), ..options };
    let mut s = Sampler::new(mock(16, 4, 1), few).expect("sampler");
    let equal = s.equalize_steps_unless(5, Tail::Drop, &AtomicBool::new(false)).expect("counted");
    assert!(equal.steps > 0, "{equal:?}");
}

/// A walk for equal steps whose `open` was given up stops within a few thousand minibatches
/// (found by a probe: a client that went away left a core busy for 65 s); not cancelled, the same
/// sampler walks to the counts.
#[test]
fn an_equal_steps_walk_stops_when_cancelled() {
    use std::sync::atomic::AtomicBool;
    let options = SamplingOptions { num_workers: 2, rank: 1, ..whole_window(3, EpochLimit::FullSweep) };
    // Sequences of two samples: walked, not counted; 4,096 minibatches of one worker.
    let mut s = Sampler::new(mock(4, 1024, 2), options.clone()).expect("sampler");
    assert!(!s.counts_steps());
    assert!(matches!(s.equalize_steps_unless(1, Tail::Drop, &AtomicBool::new(true)), Err(SamplingError::Cancelled)));
    let mut s = Sampler::new(mock(4, 1024, 2), options).expect("sampler");
    let equal = s.equalize_steps_unless(1, Tail::Drop, &AtomicBool::new(false)).expect("walked");
    assert!(equal.steps > 1024, "{equal:?}");
    // Many workers with a minibatch or none each: stopped between workers too (found by a probe:
    // 2^20 workers over 3,000 sequences walked for 13 s after their client had gone).
    let many = SamplingOptions { num_workers: 5000, rank: 7, ..whole_window(3, EpochLimit::FullSweep) };
    let mut s = Sampler::new(mock(4, 16, 2), many).expect("sampler");
    assert!(!s.counts_steps());
    assert!(matches!(s.equalize_steps_unless(8, Tail::Pad, &AtomicBool::new(true)), Err(SamplingError::Cancelled)));
}

/// No session's position passes [`Sampler::latest_position`] (the bound an `open` refuses a
/// resume state past, now by less than a sequence instead of a sweep): every finite epoch kind,
/// sequences of several lengths, one and three workers, randomized or not, minibatch sizes from
/// one sample to past the sweep.
#[test]
fn no_position_passes_the_latest_position() {
    let t = timeline(&[1, 4, 2, 7, 1, 3, 5, 1, 2, 6, 1, 1], &[3, 2, 4, 3]);
    let sweep = t.samples(..);
    for limit in [
        EpochLimit::FullSweep,
        EpochLimit::Sweep(1),
        EpochLimit::Sweeps(2),
        EpochLimit::Samples(5),
        EpochLimit::Samples(sweep + 1),
        EpochLimit::Samples(2 * sweep - 1),
    ] {
        for randomize in [false, true] {
            for workers in [1, 3] {
                for rank in 0..workers {
                    for mb in [1, 3, 8, 50] {
                        let o = SamplingOptions {
                            num_workers: workers,
                            rank,
                            ..options(randomize, Window::Chunks(2), 3, limit)
                        };
                        let mut s = sampler(&t, o);
                        let latest = s.latest_position(u64::from(t.seq_len.max()));
                        while s.next_minibatch(mb).is_some() {
                            assert!(s.position() <= latest, "{limit:?} {randomize} {workers}/{rank} mb {mb}");
                        }
                        assert!(s.position() <= latest, "{limit:?} {randomize} {workers}/{rank} mb {mb}: the end");
                    }
                }
            }
        }
    }
}

/// A job's resume whose `open`'s client went away stops within 65,536 sequences walked; not
/// cancelled, the same resume walks to the latest position.
#[test]
fn a_job_resume_walk_stops_when_cancelled() {
    use std::sync::atomic::AtomicBool;
    let t = mock(70, 1000, 1);
    let o = SamplingOptions { num_workers: 2, rank: 0, ..whole_window(3, EpochLimit::FullSweep) };
    let positions = [10, 69_000];
    let mut s = sampler(&t, o.clone());
    assert!(matches!(s.resume_job_unless(&positions, &AtomicBool::new(true)), Err(SamplingError::Cancelled)));
    let mut s = sampler(&t, o);
    assert!(s.resume_job_unless(&positions, &AtomicBool::new(false)).is_ok());
}
