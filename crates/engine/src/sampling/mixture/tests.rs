//! Tests of mixtures: realised shares at every prefix, each source's own order, the deal to
//! workers, independence of the minibatch size, exact resume at every cut (also at another world
//! size and under other weights), the epoch rules, and states no mixture produces.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::sampling::proptests::timeline_of;

fn source(chunks: &[Vec<u32>], randomize: bool, seed: u64) -> MixtureSource {
    MixtureSource { timeline: Arc::new(timeline_of(chunks)), randomize, window: Window::Chunks(2), seed }
}

fn options(weights: &[f64], epoch: MixtureEpoch, num_workers: usize, rank: usize) -> MixtureOptions {
    MixtureOptions {
        schedule: WeightSchedule::constant(Weights::new(weights).expect("valid weights")),
        epoch,
        num_workers,
        rank,
    }
}

/// Runs `mixture` for at most `steps` minibatches, sizes cycled.
fn run(mixture: &mut Mixture, sizes: &[usize], steps: usize) -> Vec<MixturePlan> {
    let mut plans = Vec::new();
    for i in 0..steps {
        match mixture.next_minibatch(sizes[i % sizes.len()]).expect("an endless source") {
            Some(plan) => plans.push(plan),
            None => break,
        }
    }
    plans
}

/// The stream of slots, in order, of a one-worker run.
fn slots(plans: &[MixturePlan]) -> Vec<MixRef> {
    plans.iter().flat_map(|p| p.sequences.iter().copied()).collect()
}

/// Source `s`'s own order as a single-dataset session (one worker, endless) gives it, `n`
/// sequences: (sweep, sequence).
fn own_order(src: &MixtureSource, n: usize) -> Vec<(u64, u32)> {
    let options = SamplingOptions {
        randomize: src.randomize,
        window: src.window,
        seed: src.seed,
        limit: EpochLimit::Infinite,
        num_workers: 1,
        rank: 0,
    };
    let mut sampler = Sampler::new(src.timeline.clone(), options).expect("a valid timeline");
    let mut out = Vec::new();
    while out.len() < n {
        let plan = sampler.next_minibatch(1).expect("an endless source");
        out.extend(plan.sequences.iter().map(|r| (plan.sweep, r.seq)));
    }
    out.truncate(n);
    out
}

/// Every source's sequences in the stream are its own order, from the start.
fn assert_each_source_in_own_order(sources: &[MixtureSource], stream: &[MixRef]) {
    for (s, src) in sources.iter().enumerate() {
        let got: Vec<(u64, u32)> =
            stream.iter().filter(|r| r.source as usize == s).map(|r| (r.sweep, r.seq.seq)).collect();
        assert_eq!(got, own_order(src, got.len()), "source {s}");
    }
}

/// The global stream of slots, put together again from every worker's plans of the same steps:
/// slot `g` of the run is worker `g mod workers`'s.
fn interleave(by_rank: &[Vec<MixturePlan>]) -> Vec<MixRef> {
    let workers = by_rank.len() as u64;
    let mut next = vec![0usize; by_rank.len()];
    let mut stream = Vec::new();
    for (step, plan) in by_rank[0].iter().enumerate() {
        let first = plan.state.slots - plan.slots;
        for g in first..plan.state.slots {
            let owner = usize::try_from(g % workers).expect("a rank");
            stream.push(by_rank[owner][step].sequences[next[owner]]);
            next[owner] += 1;
        }
        next.fill(0);
    }
    stream
}

/// At every prefix of `stream`, each source's count is within one of its share of the prefix.
fn assert_shares_within_one(weights: &Weights, stream: &[MixRef]) {
    let mut counts = vec![0u64; weights.len()];
    for (n, r) in stream.iter().enumerate() {
        counts[r.source as usize] += 1;
        let n = n as u64 + 1;
        for (s, &c) in counts.iter().enumerate() {
            // |c − n·parts/U| < 1  ⇔  |c·U − n·parts| < U
            let fair = i128::from(n) * i128::from(weights.parts()[s]);
            let have = i128::from(c) * i128::from(WEIGHT_UNITS);
            assert!(
                (have - fair).abs() < i128::from(WEIGHT_UNITS),
                "source {s}: {c} of {n} slots, share {}",
                weights.share(s)
            );
        }
    }
}

fn chunks_strategy() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(1u32..=3, 1..=4), 1..=4)
}

fn sources_strategy() -> impl Strategy<Value = Vec<MixtureSource>> {
    prop::collection::vec((chunks_strategy(), any::<bool>(), 0u64..4), 1..=4)
        .prop_map(|v| v.into_iter().map(|(c, r, seed)| source(&c, r, seed)).collect())
}

fn weights_strategy(n: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![Just(0.0), 0.01f64..10.0, (1u32..50).prop_map(f64::from)], n)
        .prop_filter("a positive weight", |w| w.iter().any(|&x| x > 0.0))
}

fn case_strategy() -> impl Strategy<Value = (Vec<MixtureSource>, Vec<f64>, Vec<usize>)> {
    sources_strategy().prop_flat_map(|sources| {
        let n = sources.len();
        (Just(sources), weights_strategy(n), prop::collection::vec(1usize..9, 1..4))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn shares_stay_within_one_sequence_at_every_prefix((sources, weights, sizes) in case_strategy()) {
        let mut m = Mixture::new(&sources, options(&weights, MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
        let stream = slots(&run(&mut m, &sizes, 60));
        assert_shares_within_one(&Weights::new(&weights).expect("valid weights"), &stream);
        for (s, w) in weights.iter().enumerate() {
            if *w == 0.0 {
                prop_assert!(stream.iter().all(|r| r.source as usize != s), "a source of weight 0 was picked");
            }
        }
    }

    #[test]
    fn each_source_follows_its_own_order_across_sweeps((sources, weights, sizes) in case_strategy()) {
        let mut m = Mixture::new(&sources, options(&weights, MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
        let stream = slots(&run(&mut m, &sizes, 60));
        assert_each_source_in_own_order(&sources, &stream);
    }

    #[test]
    fn the_order_does_not_depend_on_the_minibatch_size((sources, weights, sizes) in case_strategy(), other in prop::collection::vec(1usize..9, 1..4)) {
        let mut a = Mixture::new(&sources, options(&weights, MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
        let mut b = Mixture::new(&sources, options(&weights, MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
        let sa = slots(&run(&mut a, &sizes, 40));
        let sb = slots(&run(&mut b, &other, 40));
        let n = sa.len().min(sb.len());
        prop_assert_eq!(&sa[..n], &sb[..n]);
    }

    #[test]
    fn workers_take_equal_steps_and_each_slot_once(
        (sources, weights, sizes) in case_strategy(),
        workers in 1usize..5,
    ) {
        let epoch = MixtureEpoch::FirstSweepEnd;
        let one = run(&mut Mixture::new(&sources, options(&weights, epoch, 1, 0)).expect("a valid mixture"), &sizes, 200);
        for rank in 0..workers {
            let mine = run(&mut Mixture::new(&sources, options(&weights, epoch, workers, rank)).expect("a valid mixture"), &sizes, 200);
            prop_assert_eq!(mine.len(), one.len(), "rank {} takes another number of steps", rank);
            for (p, q) in mine.iter().zip(&one) {
                let first_slot = q.state.slots - q.slots;
                let dealt: Vec<MixRef> = q.sequences.iter().enumerate()
                    .filter(|(i, _)| (first_slot + *i as u64) % workers as u64 == rank as u64)
                    .map(|(_, r)| *r).collect();
                prop_assert_eq!(&p.sequences, &dealt);
                prop_assert_eq!(&p.state, &q.state, "the state is the same on every worker");
            }
        }
    }

    #[test]
    fn a_restore_at_any_cut_and_world_size_continues_exactly(
        (sources, weights, sizes) in case_strategy(),
        cut in 0usize..30,
        workers in 1usize..4,
    ) {
        let epoch = MixtureEpoch::Samples(70);
        let whole = run(&mut Mixture::new(&sources, options(&weights, epoch, 1, 0)).expect("a valid mixture"), &sizes, 1000);
        let cut = cut.min(whole.len());
        let state = if cut == 0 { MixtureState::start(sources.len()) } else { whole[cut - 1].state.clone() };
        // Everything after the cut, as the one-worker run has it.
        let rest: Vec<MixRef> = slots(&whole[cut..]);
        let mut by_rank = Vec::new();
        for rank in 0..workers {
            let mut m = Mixture::new(&sources, options(&weights, epoch, workers, rank)).expect("a valid mixture");
            m.restore(&state).expect("a state of this mixture");
            // Sizes cycle from the cut, as the uninterrupted run's did.
            let shifted: Vec<usize> = (0..sizes.len()).map(|i| sizes[(cut + i) % sizes.len()]).collect();
            let plans = run(&mut m, &shifted, 1000);
            prop_assert_eq!(plans.len(), whole.len() - cut);
            if let Some(last) = plans.last() {
                prop_assert_eq!(&last.state, &whole.last().expect("a minibatch").state);
            }
            by_rank.push(plans);
        }
        prop_assert_eq!(interleave(&by_rank), rest);
    }

    #[test]
    fn a_change_of_weights_loses_and_repeats_nothing_and_follows_the_new_weights(
        (sources, weights, sizes) in case_strategy(),
        cut in 1usize..20,
        workers in 1usize..4,
        new in prop::collection::vec(1u32..20, 4),
    ) {
        let new: Vec<f64> = new[..sources.len()].iter().map(|&w| f64::from(w)).collect();
        let before = run(&mut Mixture::new(&sources, options(&weights, MixtureEpoch::Endless, 1, 0)).expect("a valid mixture"), &sizes, cut);
        let state = before.last().expect("a minibatch").state.clone();
        // Resumed under other weights, at another world size: every rank's slots together.
        let mut after_by_rank = Vec::new();
        for rank in 0..workers {
            let mut m = Mixture::new(&sources, options(&new, MixtureEpoch::Endless, workers, rank)).expect("a valid mixture");
            m.restore(&state).expect("a state of this mixture");
            after_by_rank.push(run(&mut m, &sizes, 25));
        }
        let after = interleave(&after_by_rank);
        let mut stream = slots(&before);
        stream.extend(&after);
        assert_each_source_in_own_order(&sources, &stream);
        assert_shares_within_one(&Weights::new(&new).expect("valid weights"), &after);
    }

    #[test]
    fn a_schedule_by_step_changes_the_weights_where_it_says(
        (sources, weights, sizes) in case_strategy(),
        from in 1u64..10,
        new in prop::collection::vec(1u32..20, 4),
        cut in 0usize..20,
    ) {
        let new: Vec<f64> = new[..sources.len()].iter().map(|&w| f64::from(w)).collect();
        let schedule = WeightSchedule::new(vec![
            WeightStage { from_step: 0, weights: Weights::new(&weights).expect("valid weights") },
            WeightStage { from_step: from, weights: Weights::new(&new).expect("valid weights") },
        ]).expect("a valid schedule");
        let opts = MixtureOptions { schedule, epoch: MixtureEpoch::Endless, num_workers: 1, rank: 0 };
        let whole = run(&mut Mixture::new(&sources, opts.clone()).expect("a valid mixture"), &sizes, 25);
        let stream = slots(&whole);
        assert_each_source_in_own_order(&sources, &stream);
        let split: usize = whole[..usize::try_from(from).expect("a small step")].iter().map(|p| p.sequences.len()).sum();
        assert_shares_within_one(&Weights::new(&weights).expect("valid weights"), &stream[..split]);
        assert_shares_within_one(&Weights::new(&new).expect("valid weights"), &stream[split..]);
        // A resume on either side of the change continues the same run.
        let cut = cut.min(whole.len() - 1);
        let mut m = Mixture::new(&sources, opts).expect("a valid mixture");
        if cut > 0 {
            m.restore(&whole[cut - 1].state).expect("a state of this mixture");
        }
        let shifted: Vec<usize> = (0..sizes.len()).map(|i| sizes[(cut + i) % sizes.len()]).collect();
        let resumed = run(&mut m, &shifted, 25 - cut);
        prop_assert_eq!(&resumed[..], &whole[cut..]);
    }

    #[test]
    fn the_first_sweep_end_ends_the_epoch_with_exactly_one_sweep_of_one_source((sources, weights, sizes) in case_strategy()) {
        let mut m = Mixture::new(&sources, options(&weights, MixtureEpoch::FirstSweepEnd, 1, 0)).expect("a valid mixture");
        let plans = run(&mut m, &sizes, 10_000);
        prop_assert!(m.next_minibatch(4).expect("an endless source").is_none());
        let last = plans.last().expect("a minibatch");
        prop_assert_eq!(last.sweeps_ended.len(), 1);
        prop_assert!(plans[..plans.len() - 1].iter().all(|p| p.sweeps_ended.is_empty()));
        let ended = last.sweeps_ended[0] as usize;
        let stream = slots(&plans);
        let mut seen: HashMap<u32, u32> = HashMap::new();
        for r in stream.iter().filter(|r| r.source as usize == ended) {
            *seen.entry(r.seq.seq).or_default() += 1;
        }
        prop_assert_eq!(seen.len(), sources[ended].timeline.num_sequences());
        prop_assert!(seen.values().all(|&c| c == 1));
        // The next epoch goes on where this one stopped.
        let mut next = Mixture::new(&sources, options(&weights, MixtureEpoch::FirstSweepEnd, 1, 0)).expect("a valid mixture");
        next.restore(&m.state().next_epoch()).expect("a state of this mixture");
        let more = run(&mut next, &sizes, 10_000);
        let mut both = stream.clone();
        both.extend(slots(&more));
        assert_each_source_in_own_order(&sources, &both);
    }
}

#[test]
fn a_sample_limit_stops_at_the_first_slot_at_or_after_it() {
    let sources = [source(&[vec![2, 2, 2]], false, 0), source(&[vec![1, 1, 1, 1]], false, 0)];
    let mut m = Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::Samples(5), 1, 0)).expect("a valid mixture");
    let plans = run(&mut m, &[100], 10);
    assert_eq!(plans.len(), 1);
    // Slots: a(2) b(1) a(2) — the third slot starts at sample 3 < 5, the fourth at 5.
    let got: Vec<(u32, u32)> = plans[0].sequences.iter().map(|r| (r.source, r.seq.seq)).collect();
    assert_eq!(got, vec![(0, 0), (1, 0), (0, 1)]);
    assert_eq!(plans[0].state.samples, 5);
    assert!(plans[0].state.ended);
    assert!(m.next_minibatch(100).expect("an endless source").is_none());
}

#[test]
fn equal_weights_alternate_and_a_two_to_one_mixture_repeats_its_pattern() {
    let sources = [source(&[vec![1; 10]], false, 0), source(&[vec![1; 10]], false, 0)];
    let mut m = Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
    let s: Vec<u32> = slots(&run(&mut m, &[6], 1)).iter().map(|r| r.source).collect();
    assert_eq!(s, vec![0, 1, 0, 1, 0, 1]);
    let mut m = Mixture::new(&sources, options(&[2.0, 1.0], MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
    let s: Vec<u32> = slots(&run(&mut m, &[9], 1)).iter().map(|r| r.source).collect();
    assert_eq!(s, vec![0, 1, 0, 0, 1, 0, 0, 1, 0]);
}

#[test]
fn weights_quantize_to_the_units_and_keep_small_positive_weights() {
    let w = Weights::new(&[1.0, 1.0, 1.0]).expect("valid weights");
    assert_eq!(w.parts().iter().sum::<u64>(), WEIGHT_UNITS);
    assert!(w.parts().iter().all(|&p| p.abs_diff(WEIGHT_UNITS / 3) <= 1));
    let w = Weights::new(&[1.0, 1e-12]).expect("valid weights");
    assert_eq!(w.parts(), &[WEIGHT_UNITS - 1, 1]);
    let w = Weights::new(&[0.0, 3.0]).expect("valid weights");
    assert_eq!(w.parts(), &[0, WEIGHT_UNITS]);
    assert_eq!(Weights::new(&[]), Err(MixtureError::NoSources));
    assert_eq!(Weights::new(&[0.0, 0.0]), Err(MixtureError::AllZero));
    assert!(matches!(Weights::new(&[1.0, -1.0]), Err(MixtureError::BadWeight { index: 1, .. })));
    assert!(matches!(Weights::new(&[f64::NAN]), Err(MixtureError::BadWeight { index: 0, .. })));
    assert!(matches!(Weights::new(&[f64::INFINITY]), Err(MixtureError::BadWeight { index: 0, .. })));
    assert_eq!(Weights::new(&[f64::MAX, f64::MAX]), Err(MixtureError::SumTooLarge));
}

#[test]
fn schedules_start_at_zero_and_increase() {
    let w = || Weights::new(&[1.0, 2.0]).expect("valid weights");
    // Found by a probe: an empty schedule was refused as a mixture without a source.
    assert_eq!(WeightSchedule::new(vec![]), Err(MixtureError::NoStages));
    assert!(matches!(
        WeightSchedule::new(vec![WeightStage { from_step: 3, weights: w() }]),
        Err(MixtureError::BadSchedule { stage: 0, step: 3 })
    ));
    assert!(matches!(
        WeightSchedule::new(vec![
            WeightStage { from_step: 0, weights: w() },
            WeightStage { from_step: 0, weights: w() }
        ]),
        Err(MixtureError::BadSchedule { stage: 1, step: 0 })
    ));
    assert!(matches!(
        WeightSchedule::new(vec![
            WeightStage { from_step: 0, weights: w() },
            WeightStage { from_step: 5, weights: Weights::new(&[1.0]).expect("valid weights") }
        ]),
        Err(MixtureError::WeightCount { given: 1, sources: 2 })
    ));
    let s = WeightSchedule::new(vec![
        WeightStage { from_step: 0, weights: w() },
        WeightStage { from_step: 5, weights: Weights::new(&[3.0, 1.0]).expect("valid weights") },
    ])
    .expect("a valid schedule");
    assert_eq!(s.at(4), &w());
    assert_eq!(s.at(5).parts()[0], WEIGHT_UNITS / 4 * 3);
    assert_eq!(s.at(u64::MAX).parts()[0], WEIGHT_UNITS / 4 * 3);
}

#[test]
fn states_no_mixture_produces_are_refused() {
    let sources = [source(&[vec![1; 4]], true, 0), source(&[vec![1; 4]], false, 0)];
    let mut m = Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
    let good = run(&mut m, &[3], 2).pop().expect("a minibatch").state;
    let mut bad = good.clone();
    bad.sources.pop();
    assert!(matches!(m.restore(&bad), Err(MixtureError::BadState(_))));
    let mut bad = good.clone();
    bad.sources[0].credit += 1;
    assert!(matches!(m.restore(&bad), Err(MixtureError::BadState(_))));
    let mut bad = good.clone();
    bad.sources[0].credit = i64::MAX;
    bad.sources[1].credit = -i64::MAX;
    assert!(matches!(m.restore(&bad), Err(MixtureError::BadState(_))));
    let mut bad = good.clone();
    bad.sources[1].position = u64::MAX;
    assert!(matches!(m.restore(&bad), Err(MixtureError::BadState(_))));
    for field in 0..4 {
        let mut bad = good.clone();
        match field {
            0 => bad.step = u64::MAX,
            1 => bad.slots = u64::MAX,
            2 => bad.samples = u64::MAX,
            _ => bad.sources[0].taken = u64::MAX,
        }
        assert!(matches!(m.restore(&bad), Err(MixtureError::BadState(_))), "field {field}");
    }
    let mut bad = good.clone();
    bad.sources[1].weight = u64::MAX;
    assert!(matches!(m.restore(&bad), Err(MixtureError::BadState(_))));
    // Found by a probe: an endless epoch that says it ended was served as an epoch with nothing
    // left; the same state ends a mixture whose epoch ends with a sweep.
    let mut bad = good.clone();
    bad.ended = true;
    assert!(matches!(m.restore(&bad), Err(MixtureError::BadState(e)) if e.contains("endless")));
    let mut first_end =
        Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::FirstSweepEnd, 1, 0)).expect("a valid mixture");
    first_end.restore(&bad).expect("an ended epoch of a mixture whose epochs end");
    // The good state still restores.
    m.restore(&good).expect("a state of this mixture");
    assert_eq!(m.state(), &good);
    assert!(Mixture::new(&sources, options(&[1.0], MixtureEpoch::Endless, 1, 0)).is_err());
    assert!(Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::Endless, 0, 0)).is_err());
    assert!(Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::Endless, 2, 2)).is_err());
    assert!(Mixture::new(&[], options(&[1.0], MixtureEpoch::Endless, 1, 0)).is_err());
}

/// Found by a hostile probe: states edited within the old bounds were served — a credit of
/// `-2W` (three sources: the bound was `3W` either way), a source's position moved by a few
/// sequences (they were skipped or served twice), slots no source took.
#[test]
fn edited_states_no_run_reaches_are_refused() {
    let w = i64::try_from(WEIGHT_UNITS).expect("fits");
    // Sources 0 and 1 of one-sample sequences, source 2 of sequences of 1 to 3 samples.
    let sources = [
        source(&[vec![1; 5], vec![1; 5]], true, 1),
        source(&[vec![1; 7]], false, 0),
        source(&[vec![1, 3, 2, 2]], true, 2),
    ];
    let mut m =
        Mixture::new(&sources, options(&[1.0, 2.0, 1.0], MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
    let good = run(&mut m, &[4], 5).pop().expect("a minibatch").state;
    let refused = |m: &mut Mixture, edit: &dyn Fn(&mut MixtureState)| {
        let mut bad = good.clone();
        edit(&mut bad);
        matches!(m.restore(&bad), Err(MixtureError::BadState(_)))
    };
    // Credits summing to 0 but past what the round-robin reaches.
    assert!(refused(&mut m, &|s| {
        s.sources[0].credit = -w;
        s.sources[1].credit = w;
        s.sources[2].credit = 0;
    }));
    assert!(refused(&mut m, &|s| {
        s.sources[0].credit = 2 * w;
        s.sources[1].credit = -w / 2;
        s.sources[2].credit = -w - w / 2;
    }));
    // A one-sample source's position is its sequences taken.
    assert!(refused(&mut m, &|s| s.sources[1].position += 3));
    assert!(refused(&mut m, &|s| s.sources[0].position -= 2));
    // Another source's position at most three samples a sequence taken, at least one.
    assert!(refused(&mut m, &|s| s.sources[2].position = 3 * s.sources[2].taken + 1));
    assert!(good.sources[2].taken > 0, "{good:?}");
    assert!(refused(&mut m, &|s| s.sources[2].position = s.sources[2].taken - 1));
    assert!(refused(&mut m, &|s| s.sources[2].taken = 1 << 53));
    // A position inside a sequence (the source's second sequence is 3 samples: 1 is its start, 2
    // and 3 are inside it) is no place a run stops.
    let inside = (1..=3 * good.sources[2].taken).find(|&p| {
        let mut probe = Mixture::new(&sources, options(&[1.0, 2.0, 1.0], MixtureEpoch::Endless, 1, 0)).expect("valid");
        let mut st = good.clone();
        st.sources[2].position = p;
        probe.restore(&st).is_err() && st.sources[2].taken <= p
    });
    assert!(inside.is_some(), "some position inside a sequence is refused");
    // Slots no source took.
    assert!(refused(&mut m, &|s| s.slots = s.sources.iter().map(|x| x.taken).sum::<u64>() + 1));
    // Fewer samples than slots (every sequence here is at least one sample).
    assert!(good.slots > 0, "{good:?}");
    assert!(refused(&mut m, &|s| s.samples = s.slots - 1));
    // Every state a run reaches restores, with the credits at their extremes over a long run.
    let mut fresh =
        Mixture::new(&sources, options(&[1.0, 2.0, 1.0], MixtureEpoch::Endless, 1, 0)).expect("a valid mixture");
    for plan in run(&mut fresh, &[1, 3, 2], 300) {
        m.restore(&plan.state).expect("a state of this mixture");
    }
}

/// Found by a hostile probe: hand-edited counts that no run writes were served — a step past the
/// slots (a later stage of a weight schedule), samples past a `max_samples` epoch without its end
/// (the epoch ended at once, unsaid), weight parts that do not sum to `W`.
#[test]
fn edited_epoch_counts_no_run_writes_are_refused() {
    // Source 0 of one-sample sequences, source 1 of sequences of 1 to 3 samples.
    let sources = [source(&[vec![1; 6], vec![1; 6]], true, 1), source(&[vec![1, 3, 2, 2]], true, 2)];
    for epoch in [MixtureEpoch::Endless, MixtureEpoch::FirstSweepEnd, MixtureEpoch::Samples(9)] {
        let mut m = Mixture::new(&sources, options(&[2.0, 1.0], epoch, 1, 0)).expect("a valid mixture");
        let plans = run(&mut m, &[3], 3);
        let good = plans[1].state.clone();
        assert!(!good.ended && good.step == 2, "{epoch:?}: {good:?}");
        let refused = |edit: &dyn Fn(&mut MixtureState)| {
            let mut bad = good.clone();
            edit(&mut bad);
            let mut m = Mixture::new(&sources, options(&[2.0, 1.0], epoch, 1, 0)).expect("a valid mixture");
            m.restore(&bad).err()
        };
        let is_bad = |e: Option<MixtureError>| matches!(e, Some(MixtureError::BadState(_)));
        assert!(is_bad(refused(&|s| s.step = s.slots + 1)), "{epoch:?}: a step past the slots");
        assert!(is_bad(refused(&|s| s.step = 0)), "{epoch:?}: slots without a minibatch");
        assert!(is_bad(refused(&|s| s.samples = s.slots * 3 + 1)), "{epoch:?}: slots longer than any sequence");
        assert!(
            is_bad(refused(&|s| s.samples = s.sources.iter().map(|x| x.position).sum::<u64>() + 1)),
            "{epoch:?}: samples no source gave"
        );
        assert!(is_bad(refused(&|s| s.sources[0].weight += 1)), "{epoch:?}: parts past W");
        assert!(
            is_bad(refused(&|s| s.sources.iter_mut().for_each(|x| x.weight = 0))),
            "{epoch:?}: no weights, sequences taken"
        );
        if let MixtureEpoch::Samples(limit) = epoch {
            assert!(is_bad(refused(&|s| s.samples = limit)), "past the limit, not ended");
            assert!(is_bad(refused(&|s| s.ended = true)), "ended below the limit");
        }
        // The state as written still restores; so does every state of the runs of each epoch,
        // and the start of each next epoch.
        let mut m = Mixture::new(&sources, options(&[2.0, 1.0], epoch, 1, 0)).expect("a valid mixture");
        m.restore(&good).expect("a state of this mixture");
        let mut walk = Mixture::new(&sources, options(&[2.0, 1.0], epoch, 1, 0)).expect("a valid mixture");
        for _ in 0..3 {
            for plan in run(&mut walk, &[1, 4, 2], 40) {
                m.restore(&plan.state).unwrap_or_else(|e| panic!("{epoch:?}: {e}: {:?}", plan.state));
            }
            let next = walk.state().next_epoch();
            m.restore(&next).expect("an epoch's start");
            walk.restore(&next).expect("an epoch's start");
        }
    }
    // A fresh state, and an epoch's start whatever the limit.
    let mut m = Mixture::new(&sources, options(&[2.0, 1.0], MixtureEpoch::Samples(0), 1, 0)).expect("a mixture");
    m.restore(&MixtureState::start(2)).expect("a fresh state");
    assert!(m.next_minibatch(3).expect("no error").is_none());
}

#[test]
fn a_later_epoch_is_the_walk_of_the_ones_before_it_at_every_world_size() {
    let sources = [source(&[vec![1, 2, 1], vec![1, 1]], true, 3), source(&[vec![1, 1, 1]], false, 0)];
    for epoch in [MixtureEpoch::FirstSweepEnd, MixtureEpoch::Samples(7)] {
        // The epochs one after the other, each continuing from the last one's final state.
        let mut m = Mixture::new(&sources, options(&[2.0, 1.0], epoch, 1, 0)).expect("a valid mixture");
        let mut epochs = Vec::new();
        for _ in 0..4 {
            epochs.push(run(&mut m, &[3], 1000));
            let next = m.state().next_epoch();
            m.restore(&next).expect("a state of this mixture");
        }
        for k in 0..4u64 {
            for workers in [1usize, 2] {
                let mut got = Vec::new();
                for rank in 0..workers {
                    let mut w = Mixture::new(&sources, options(&[2.0, 1.0], epoch, workers, rank)).expect("a mixture");
                    w.skip_epochs(k, 3, u64::MAX).expect("a walk");
                    got.push(run(&mut w, &[3], 1000));
                }
                let want = &epochs[usize::try_from(k).expect("k")];
                assert!(got.iter().all(|g| g.len() == want.len()), "{epoch:?}, epoch {k}, {workers} workers");
                for (step, plan) in want.iter().enumerate() {
                    let mut dealt: Vec<MixRef> = Vec::new();
                    for g in &got {
                        assert_eq!(g[step].state, plan.state, "the state after each minibatch");
                        dealt.extend(&g[step].sequences);
                    }
                    dealt.sort_by_key(|r| (r.source, r.seq.seq, r.sweep));
                    let mut whole = plan.sequences.clone();
                    whole.sort_by_key(|r| (r.source, r.seq.seq, r.sweep));
                    assert_eq!(dealt, whole, "{epoch:?}, epoch {k}, step {step}: each slot once");
                }
            }
        }
    }
    let mut endless = Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::Endless, 1, 0)).expect("a mixture");
    assert!(endless.skip_epochs(0, 3, 10).is_ok());
    let e = endless.skip_epochs(1, 3, 10).expect_err("an endless mixture has one epoch");
    assert!(e.to_string().contains("endless mixture"), "{e}");
    let mut long = Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::Samples(100), 1, 0)).expect("a mixture");
    let e = long.skip_epochs(2, 3, 50).expect_err("a walk past its bound");
    assert!(e.to_string().contains("more than 50 slots"), "{e}");
}

/// Found by a probe: each epoch's restart restores every source to where it stands, and a large
/// source's restore walks its sweep's order up to there — 100 times what the slots cost, and not
/// counted, so the bound meant for minutes took hours. The walk is charged for it.
#[test]
fn a_walk_to_an_epoch_is_charged_for_the_sources_restores() {
    let sources = vec![source(&[vec![1; 2000]], true, 3), source(&[vec![1; 4]], false, 0)];
    let opts = || options(&[1.0, 1.0], MixtureEpoch::FirstSweepEnd, 1, 0);
    // 100 epochs of about 8 slots: some 1,100 slots and restarts, and about 20,000 sequences
    // walked by the large source's restores (4 more at each epoch).
    let mut m = Mixture::new(&sources, opts()).expect("a mixture");
    let e = m.skip_epochs(100, 1, 5_000).expect_err("a walk past its bound");
    assert!(e.to_string().contains("more than 5000 slots"), "{e}");
    let mut m = Mixture::new(&sources, opts()).expect("a mixture");
    m.skip_epochs(100, 1, 30_000).expect("within the bound");
}

/// A walk to epoch K whose `open`'s client went away stops within 1,024 minibatches or 65,536
/// slots; not
/// cancelled, the same walk ends at the epoch.
#[test]
fn a_walk_to_an_epoch_stops_when_cancelled() {
    use std::sync::atomic::AtomicBool;
    let sources = vec![source(&[vec![1; 600], vec![1; 600]], true, 3), source(&[vec![1; 500]], false, 0)];
    let opts = || options(&[1.0, 1.0], MixtureEpoch::Samples(3000), 1, 0);
    let mut m = Mixture::new(&sources, opts()).expect("a mixture");
    let e = m.skip_epochs_unless(1, 1, u64::MAX, &AtomicBool::new(true)).expect_err("cancelled");
    assert!(e.to_string().contains("cancelled"), "{e}");
    let mut m = Mixture::new(&sources, opts()).expect("a mixture");
    assert!(m.skip_epochs_unless(1, 1, u64::MAX, &AtomicBool::new(false)).is_ok());
    // Found by a probe: minibatches of a million slots were walked for half a minute after the
    // client had gone, the flag looked at every 1,024 minibatches only. A walk of 100 epochs of
    // one 3,000-slot minibatch each looks at it every 65,536 slots too.
    let mut m = Mixture::new(&sources, opts()).expect("a mixture");
    let e = m.skip_epochs_unless(100, 3000, u64::MAX, &AtomicBool::new(true)).expect_err("cancelled");
    assert!(matches!(e, MixtureError::Cancelled), "{e}");
}

/// Found by a probe: a rank out of range was told as source 0's problem.
#[test]
fn a_bad_rank_or_worker_count_is_the_mixtures_not_a_sources() {
    let sources = vec![source(&[vec![1, 1]], false, 1), source(&[vec![1]], false, 2)];
    for (workers, rank) in [(3, 3), (0, 0)] {
        let e = Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::FirstSweepEnd, workers, rank))
            .err()
            .expect("refused")
            .to_string();
        assert!(!e.contains("source"), "{e}");
        assert!(e.contains("worker"), "{e}");
    }
}

/// The slots left in an epoch are counted up to a bound, and the mixture is where it was.
#[test]
fn the_slots_left_in_an_epoch_are_counted_without_moving_the_mixture() {
    // The second source's sweep (one sequence) ends the epoch within a few slots.
    let sources = vec![source(&[vec![1; 6]], false, 1), source(&[vec![1]], false, 2)];
    let mut m = Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::FirstSweepEnd, 1, 0)).expect("mixture");
    let all = run(
        &mut Mixture::new(&sources, options(&[1.0, 1.0], MixtureEpoch::FirstSweepEnd, 1, 0)).expect("m"),
        &[1],
        100,
    );
    let slots: u64 = all.iter().map(|p| p.slots).sum();
    assert_eq!(m.slots_left_below(1, 100).expect("walk"), Some(slots));
    assert_eq!(m.slots_left_below(1, slots).expect("walk"), None, "at least as many as asked");
    assert_eq!(m.slots_left_below(7, slots + 1).expect("walk"), Some(slots), "whatever the minibatch size");
    assert_eq!(run(&mut m, &[1], 100), all, "the walk moved nothing");
}
