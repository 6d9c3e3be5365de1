//! What a sampler holds is bounded by [`Sampler::memory_bound`], which the daemon reserves against
//! `memory_limit_bytes` for every session: measured here with a counting allocator over whole
//! sweeps (the plans of the current and next sweep, prefetch hints across a sweep's end), equal
//! steps and a job resumed at another worker count. A 26 GiB file of 22.5 M sequences showed the
//! need: each session's sweep orders held ~280 MiB that no budget counted, and the daemon's RSS
//! passed a 6 GiB limit by 487 MiB. Since, a sweep's order is kept a randomization window at a
//! time, and the bound grows with the window and the chunk count, not with the sequences.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use minibatchd_engine::sampling::{EpochLimit, Sampler, SamplingOptions, Tail, Timeline, Window};

/// The system allocator, counting per thread the bytes that thread allocated and freed, and their
/// peak since its last [`reset_peak`]. A test reads only its own thread's counts, so what the test
/// harness and the other tests' threads allocate meanwhile (their output, their own samplers)
/// never enters a measurement, whatever runs beside it. The sampler allocates on its caller's
/// thread only (it starts no thread), so the counts are all of its memory.
struct Counting;

thread_local! {
    /// Bytes this thread allocated minus those it freed (it may free what another allocated:
    /// the count is relative, read against a [`reset_peak`] baseline).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since this thread's last [`reset_peak`].
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// Adds `delta` bytes to this thread's count and raises its peak. The cells are const-initialized
/// and have no destructor, so they are usable (and allocate nothing) at any point of a thread's
/// life; `try_with` leaves the count alone should that ever not hold.
fn count(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

#[allow(clippy::cast_possible_wrap)] // an allocation's size is at most isize::MAX
fn size(bytes: usize) -> isize {
    bytes as isize
}

// SAFETY: every call forwards to `System` with the caller's arguments; the counters are
// thread-local cells and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged (the caller upholds `alloc`'s contract).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(size(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        count(-size(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(size(new_size) - size(layout.size()));
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Starts a new peak at what this thread holds now, and returns that (the baseline to measure
/// from).
fn reset_peak() -> isize {
    let live = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(live));
    live
}

/// The peak bytes this thread held beyond `base` since its last [`reset_peak`].
fn peak_since(base: isize) -> u64 {
    u64::try_from(PEAK.with(Cell::get) - base).unwrap_or(0)
}

/// `chunks` chunks of `per_chunk` sequences, lengths 1..=3.
fn timeline(chunks: usize, per_chunk: usize) -> Arc<Timeline> {
    let n = chunks * per_chunk;
    #[allow(clippy::cast_possible_truncation)] // i % 3 < 3
    let seq_len: Vec<u32> = (0..n).map(|i| 1 + (i % 3) as u32).collect();
    Arc::new(Timeline { seq_len: seq_len.into(), chunk_start: (0..=chunks).map(|c| c * per_chunk).collect() })
}

fn options(window: Window, workers: usize, rank: usize, limit: EpochLimit) -> SamplingOptions {
    SamplingOptions { randomize: true, window, seed: 7, limit, num_workers: workers, rank }
}

/// Walks `sampler` to its epoch's end, asking for prefetch hints before each minibatch as the
/// daemon's producer does.
fn walk(sampler: &mut Sampler, minibatch_size: usize) -> usize {
    let mut n = 0;
    loop {
        let _ = sampler.upcoming_chunks(16);
        match sampler.next_minibatch(minibatch_size) {
            Some(mb) => n += mb.sequences.len(),
            None => return n,
        }
    }
}

#[test]
fn a_sampler_walking_sweeps_stays_within_its_memory_bound() {
    let t = timeline(40, 5000);
    for window in [Window::Chunks(4), Window::Chunks(128), Window::Samples(30_000)] {
        for (workers, rank) in [(1, 0), (3, 1)] {
            let base = reset_peak();
            let o = options(window, workers, rank, EpochLimit::Sweeps(3));
            let mut s = Sampler::new(t.clone(), o.clone()).expect("sampler");
            let taken = walk(&mut s, 256);
            assert!(taken > 0);
            let peak = peak_since(base);
            let bound = Sampler::memory_bound(&t, &o, false);
            eprintln!("{window:?}, {workers} workers: peak {peak} B, bound {bound} B");
            assert!(peak <= bound, "{window:?}, {workers} workers: peak {peak} B > bound {bound} B");
            // The bound is tight enough to mean something: two plans are held at a sweep's end.
            assert!(peak * 3 > bound, "{window:?}, {workers} workers: peak {peak} B, bound {bound} B");
        }
    }
}

#[test]
fn a_small_timeline_costs_little() {
    for (chunks, per_chunk) in [(1, 10), (1, 2000), (3, 700)] {
        let t = timeline(chunks, per_chunk);
        let base = reset_peak();
        let o = options(Window::Chunks(128), 1, 0, EpochLimit::Sweeps(2));
        let mut s = Sampler::new(t.clone(), o.clone()).expect("sampler");
        walk(&mut s, 4);
        let peak = peak_since(base);
        let bound = Sampler::memory_bound(&t, &o, false);
        eprintln!("{chunks} x {per_chunk}: peak {peak} B, bound {bound} B");
        assert!(peak <= bound, "{chunks} x {per_chunk}: peak {peak} B > bound {bound} B");
    }
}

/// The peak bytes held beyond `base` since the last [`reset_peak`], checked against `bound`.
fn within_bound(what: &str, base: isize, bound: u64) -> u64 {
    let peak = peak_since(base);
    eprintln!("{what}: peak {peak} B, bound {bound} B");
    assert!(peak <= bound, "{what}: peak {peak} B > bound {bound} B");
    peak
}

#[test]
fn equal_steps_and_a_resumed_job_stay_within_the_bound_with_walks() {
    let t = timeline(40, 5000);

    let base = reset_peak();
    let o = options(Window::Chunks(4), 4, 2, EpochLimit::Sweeps(2));
    let walk_bound = Sampler::walk_memory_bound(&t, &o, false);
    let mut s = Sampler::new(t.clone(), o.clone()).expect("sampler");
    s.equalize_steps(256, Tail::Drop).expect("equal steps");
    within_bound("equal steps", base, Sampler::memory_bound(&t, &o, false) + walk_bound);
    // Once the walks are done, the sampler holds no more than without them.
    reset_peak(); // from here, what the sampler holds beyond `base`
    walk(&mut s, 256);
    within_bound("after equal steps", base, Sampler::memory_bound(&t, &o, false));

    // A job of 3 workers continued by 2, its workers a sweep and a half apart.
    let base = reset_peak();
    let o = options(Window::Chunks(4), 2, 1, EpochLimit::Sweeps(4));
    let mut s = Sampler::new(t.clone(), o.clone()).expect("sampler");
    let sweep = s.sweep_size();
    s.resume_job(&[sweep / 2, sweep, sweep * 2]).expect("resume job");
    within_bound("resuming a job", base, Sampler::memory_bound(&t, &o, true) + walk_bound);
    reset_peak(); // from here, what the sampler holds beyond `base`
    walk(&mut s, 256);
    let one_job = within_bound("a resumed job", base, Sampler::memory_bound(&t, &o, true));
    assert!(one_job > Sampler::memory_bound(&t, &o, false) / 2, "the walk holds at least a plan: {one_job} B");

    // Equal steps in a continued job: each worker's walk resumes the job too, so the sampler it
    // walks holds its own set of delivered sequences (found in review: the bound left it out).
    let base = reset_peak();
    let o = options(Window::Chunks(4), 2, 0, EpochLimit::Sweeps(4));
    let mut s = Sampler::new(t.clone(), o.clone()).expect("sampler");
    s.resume_job(&[sweep / 2, sweep, sweep * 2]).expect("resume job");
    s.equalize_steps(256, Tail::Pad).expect("equal steps");
    let bound = Sampler::memory_bound(&t, &o, true) + Sampler::walk_memory_bound(&t, &o, true);
    let peak = within_bound("equal steps in a resumed job", base, bound);
    assert!(peak > 2 * one_job, "two delivered sets at once: {peak} B, one job's sampler {one_job} B");
}

/// A sampler keeps one randomization window of positions and a few numbers per chunk: ten times
/// the sequences in chunks of the same size cost it about ten times the per-chunk tables, not ten
/// times the sweep orders.
#[test]
fn a_sampler_does_not_grow_with_the_dataset() {
    let mut peaks = Vec::new();
    for chunks in [40, 400] {
        let t = timeline(chunks, 5000);
        let o = options(Window::Chunks(4), 2, 1, EpochLimit::Sweeps(2));
        let base = reset_peak();
        let mut s = Sampler::new(t.clone(), o.clone()).expect("sampler");
        assert!(walk(&mut s, 256) > 0);
        let peak = peak_since(base);
        eprintln!("{chunks} chunks of 5000: peak {peak} B, bound {} B", Sampler::memory_bound(&t, &o, false));
        assert!(peak <= Sampler::memory_bound(&t, &o, false));
        peaks.push(peak);
    }
    // Two plans of a 4-chunk window (20,000 positions of 8 bytes each) and 400 chunks' tables:
    // well under the 2 M sequences' 8 bytes each that a whole sweep's order would take.
    assert!(peaks[1] < 600_000, "{peaks:?}");
    assert!(peaks[1] < peaks[0] * 2, "{peaks:?}");
}

#[test]
fn the_counts_are_the_measuring_threads_own() {
    const MIB: usize = 1 << 20;
    let base = reset_peak();
    let held = vec![1u8; MIB];
    assert!(peak_since(base) >= MIB as u64, "this thread's allocation is counted");
    drop(held);
    let base = reset_peak();
    std::thread::spawn(|| drop(std::hint::black_box(vec![1u8; 4 * MIB]))).join().expect("thread");
    let peak = peak_since(base);
    assert!(peak < MIB as u64, "another thread's allocation is not counted: {peak} B");
}
