//! Issue 37, item 1, as a property: over random datasets (dense CTF, libsvm), chunk sizes, memory limits, windows,
//! minibatch sizes, workers, producer threads, parsed cache on or off, and resume points, every
//! session the daemon admits at `open` (first open or resume) delivers exactly what `minibatchd
//! dump` gives for its options — it never fails after `open`, for memory or anything else, and
//! never stalls — and the daemon's peak RSS stays within `memory_limit_bytes` plus
//! `support::daemon::DAEMON_OVERHEAD_BYTES` (`docs/daemon.md`, "Memory"). An `open` may be refused, at once and
//! only with `resource_exhausted`.
//!
//! Each case starts the real daemon. The cases come from a seeded generator: `MINIBATCHD_PROPERTY_SEED`
//! picks another sequence, `MINIBATCHD_PROPERTY_CASES` runs more (default 4, within CI's time),
//! `MINIBATCHD_PROPERTY_CASE` runs one case again (its seed is in the failure's message).

mod support;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use minibatchd_client::protocol::{ErrorCode, SessionOptions};
use minibatchd_client::{Client, ClientError, Session};
use support::daemon::{json, options, Daemon};
use support::write;

/// A case past this is a stall: the daemon is killed and the case fails.
const CASE_DEADLINE: Duration = Duration::from_secs(240);

/// `SplitMix64`: the cases' generator (deterministic from the seed, no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::try_from(self.next() % items.len() as u64).expect("an index")]
    }
}

/// One session of a case: its options, and after how many minibatches it closes and resumes
/// from its state (`None`: read through).
#[derive(Debug, Clone)]
struct Shape {
    minibatch: u64,
    window: u64,
    workers: u64,
    rank: u64,
    seed: u64,
    sweeps: u64,
    randomize: bool,
    resume_after: Option<usize>,
}

impl Shape {
    fn options(&self, slot_size: u64) -> SessionOptions {
        SessionOptions {
            max_sweeps: Some(self.sweeps),
            window_chunks: Some(self.window),
            num_workers: Some(self.workers),
            rank: Some(self.rank),
            seed: Some(self.seed),
            randomize: Some(self.randomize),
            prefetch: Some(3),
            slot_size_bytes: Some(slot_size),
            ..options(self.minibatch)
        }
    }

    fn dump_args(&self) -> Vec<String> {
        let mut args = vec![];
        for (flag, v) in [
            ("--minibatch-size", self.minibatch),
            ("--max-sweeps", self.sweeps),
            ("--window-chunks", self.window),
            ("--workers", self.workers),
            ("--rank", self.rank),
            ("--seed", self.seed),
        ] {
            args.extend([flag.to_owned(), v.to_string()]);
        }
        args.extend(["--randomize".to_owned(), self.randomize.to_string()]);
        args
    }
}

/// A dense CTF file of `lines` samples of `dim` values (the first the sample's number) at
/// `dir/data.ctf`.
fn dense_file(dir: &Path, lines: u64, dim: u64) -> std::path::PathBuf {
    let mut text = String::new();
    for i in 0..lines {
        let _ = write!(text, "|a {i}");
        for j in 1..dim {
            let _ = write!(text, " {}", (i + j) % 10);
        }
        text.push('\n');
    }
    write(dir, "data.ctf", text)
}

/// A libsvm file of `lines` samples of `features` features each (ids and values from the
/// sample's number) at `dir/data.libsvm`.
fn sparse_file(dir: &Path, lines: u64, features: u64) -> std::path::PathBuf {
    let mut text = String::new();
    for i in 0..lines {
        let _ = write!(text, "{}", i % 2);
        for j in 0..features {
            let _ = write!(text, " {}:{}", j * 13 + i % 13, (i + j) % 9 + 1);
        }
        text.push('\n');
    }
    write(dir, "data.libsvm", text)
}

/// The refusal of an open, if it was refused for memory; panics on any other failure.
fn refused_for_memory(r: Result<Session, ClientError>, what: &str) -> Option<Session> {
    match r {
        Ok(s) => Some(s),
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, .. }) => None,
        Err(e) => panic!("{what}: open failed otherwise than for memory: {e}"),
    }
}

/// Reads `s` to its end as dump lines; an error after `open` fails the case.
fn read_to_end(s: &mut Session, out: &mut Vec<String>, max: usize, what: &str, stalled: &AtomicBool) {
    while out.len() < max {
        match s.next_owned() {
            Ok(Some(mb)) => {
                let names: &[&str] = if mb.streams.len() == 1 { &["a"] } else { &["__instX", "__instY"] };
                out.push(json(&mb, names));
            }
            Ok(None) => return,
            Err(e) if stalled.load(Ordering::SeqCst) => panic!("{what}: stalled, killed after {CASE_DEADLINE:?}: {e}"),
            Err(e) => panic!("{what}: an admitted session failed after open: {e}"),
        }
    }
}

/// One session of a case against its `want`ed dump: `true` when admitted (and exact), `false`
/// when its first open was refused for memory.
fn run_session(d: &Daemon, shape: &Shape, slot_size: u64, want: &[String], stalled: &AtomicBool) -> bool {
    let what = format!("{shape:?}");
    let opts = shape.options(slot_size);
    let connect = || Client::connect(&d.socket).expect("connect");
    let Some(mut s) = refused_for_memory(connect().open("data", &opts), &what) else { return false };
    let mut got = Vec::new();
    if let Some(k) = shape.resume_after {
        read_to_end(&mut s, &mut got, k, &what, stalled);
        let state = s.close().unwrap_or_else(|e| panic!("{what}: close: {e}"));
        let resumed = SessionOptions { resume: Some(state), ..opts };
        // A resume is an open: it may be refused for memory while others hold it, until they end.
        s = loop {
            if let Some(s) = refused_for_memory(connect().open("data", &resumed), &what) {
                break s;
            }
            assert!(!stalled.load(Ordering::SeqCst), "{what}: the resume was refused until the case's deadline");
            std::thread::sleep(Duration::from_millis(100));
        };
    }
    read_to_end(&mut s, &mut got, usize::MAX, &what, stalled);
    assert!(!stalled.load(Ordering::SeqCst), "{what}: the case stalled");
    assert!(got == want, "{what}: {} minibatches delivered, the dump has {}", got.len(), want.len());
    true
}

/// Three to six sessions of random shapes over a dataset of `chunks` chunks.
fn random_shapes(rng: &mut Rng, chunks: u64) -> Vec<Shape> {
    (0..rng.range(3, 6))
        .map(|_| {
            let workers = rng.range(1, 3);
            Shape {
                minibatch: rng.pick(&[32, 100, 256, 512]),
                window: rng.range(1, chunks.max(1)),
                workers,
                rank: rng.range(0, workers - 1),
                seed: rng.range(0, 1000),
                sweeps: rng.range(1, 2),
                randomize: rng.range(0, 5) > 0,
                resume_after: None,
            }
        })
        .collect()
}

/// One case from `seed`: (sessions admitted, sessions refused at open, chunks evicted, seconds
/// sessions waited for memory).
fn run_case(seed: u64) -> (u64, u64, f64, f64) {
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let dim = rng.pick(&[32, 64, 128]);
    // 8 to 32 MB parsed, under a limit of 12 to 24 MiB: from about twice the parsed data's size
    // to a third of it, beside the rings. A dense CTF file, or libsvm with dim / 2 features a
    // line (4-byte ids and values: the same bytes a sample).
    let lines = rng.range(8 << 20, 32 << 20) / (dim * 4);
    let libsvm = rng.range(0, 2) == 0;
    let (file, format, streams) = if libsvm {
        (sparse_file(p, lines, dim / 2), "libsvm", String::new())
    } else {
        (dense_file(p, lines, dim), "ctf", format!("[datasets.data.streams.a]\ndim = {dim}\nformat = \"dense\"\n"))
    };
    let chunk = rng.pick(&[65_536u64, 262_144, 1_048_576]);
    let parsed = lines * dim * 4;
    let limit = rng.range(12 << 20, 24 << 20);
    let producer_threads = rng.range(1, 2);
    let parsed_cache = rng.pick(&["0", "1073741824"]);
    support::daemon::write_config(
        p,
        &format!("memory_limit_bytes = {limit}\nhost_memory_reserve_bytes = 0\nparser_threads = 2"),
        &format!(
            "[datasets.data]\nformat = \"{format}\"\nfiles = [\"{}\"]\ncache_index = false\nchunk_size_bytes = {chunk}\n\
             {streams}",
            file.display()
        ),
    );
    let d = Daemon::start(
        p,
        &[
            ("MINIBATCHD__DAEMON__PRODUCER_THREADS", producer_threads.to_string()),
            ("MINIBATCHD__DAEMON__PARSED_CACHE_BYTES", parsed_cache.to_owned()),
            ("MINIBATCHD__DAEMON__MAX_SESSIONS_PER_UID", "64".to_owned()),
        ],
    );
    let text_bytes = std::fs::metadata(&file).expect("stat").len();
    let chunks = text_bytes.div_ceil(chunk);
    let shapes = random_shapes(&mut rng, chunks);
    let case = format!(
        "seed {seed}: {lines} {format} lines of {dim} values in chunks of {chunk} B, {parsed} B parsed, limit {limit}, \
         {producer_threads} producer thread(s), parsed cache {parsed_cache}"
    );
    let mut shapes = shapes;
    let mut dumps = Vec::new();
    for shape in &mut shapes {
        let args = shape.dump_args();
        let want = d.dump("data", &args.iter().map(String::as_str).collect::<Vec<_>>());
        // Half of them close after a random minibatch and resume from their state.
        if rng.range(0, 1) == 1 && want.len() > 1 {
            shape.resume_after = Some(usize::try_from(rng.range(1, want.len() as u64 - 1)).expect("a count"));
        }
        dumps.push(want);
    }
    let slot_size = 4096 + 512 * dim * 4 * 2;
    eprintln!("{case}; sessions {shapes:?}");
    let stalled = AtomicBool::new(false);
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let admitted: Vec<bool> = std::thread::scope(|scope| {
        let (d, stalled) = (&d, &stalled);
        scope.spawn(move || {
            if finished.recv_timeout(CASE_DEADLINE) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                stalled.store(true, Ordering::SeqCst);
                d.signal(rustix::process::Signal::KILL);
            }
        });
        let readers: Vec<_> = shapes
            .iter()
            .zip(&dumps)
            .map(|(shape, want)| scope.spawn(move || run_session(d, shape, slot_size, want, stalled)))
            .collect();
        let admitted =
            readers.into_iter().map(|r| r.join().unwrap_or_else(|_| panic!("{case}: a session failed"))).collect();
        drop(done);
        admitted
    });
    let peak = support::daemon::assert_within_limit(&d, limit, &case);
    let evictions = d.metric("minibatchd_chunk_cache_evictions_total ");
    let waited = d.metric("minibatchd_session_memory_wait_seconds_total");
    let n = admitted.iter().filter(|a| **a).count() as u64;
    eprintln!(
        "{case}: {n} of {} admitted, peak RSS {} MiB, {evictions} chunks evicted, sessions waited {waited:.1} s for memory",
        admitted.len(),
        peak >> 20
    );
    (n, admitted.len() as u64 - n, evictions, waited)
}

#[test]
fn admitted_sessions_never_fail_for_memory_and_the_daemon_stays_within_its_limit() {
    let seed: u64 = std::env::var("MINIBATCHD_PROPERTY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(37);
    let cases: u64 = std::env::var("MINIBATCHD_PROPERTY_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    // One case again by its seed (the number the failure names).
    if let Some(one) = std::env::var("MINIBATCHD_PROPERTY_CASE").ok().and_then(|s| s.parse().ok()) {
        run_case(one);
        return;
    }
    let started = Instant::now();
    let (mut admitted, mut refused, mut evicted, mut waited) = (0, 0, 0, 0);
    for k in 0..cases {
        let (a, r, evictions, wait) = run_case(seed.wrapping_mul(1_000_003).wrapping_add(k));
        admitted += a;
        refused += r;
        evicted += u64::from(evictions > 0.0);
        waited += u64::from(wait > 0.0);
    }
    eprintln!(
        "{cases} cases in {:.0} s: {admitted} sessions admitted, {refused} refused at open; chunks evicted in \
         {evicted} case(s), sessions waited for memory in {waited}",
        started.elapsed().as_secs_f64()
    );
    // The cases exercise what they claim to: sessions were served, and the limit shaped runs.
    assert!(admitted > 0, "no session was admitted in any case");
    assert!(evicted > 0 && waited > 0, "no case met the memory limit");
}
