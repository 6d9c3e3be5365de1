//! Issue #15, acceptance 6: fault injection with the real binary. Several sessions read at once —
//! randomized, several sweeps, two of them the two ranks of one job — while the daemon is killed
//! (`SIGKILL`, at a random moment: while sessions open, read or report) or stopped (`SIGTERM`),
//! then started again; every session comes back, half of them by their own saved `state()`, half
//! by session name. Over the whole run, each session's minibatches are compared with an
//! uninterrupted `minibatchd dump` of the same options, minibatch by minibatch, and must show
//! exactly the policy of `docs/daemon.md` ("Policy after a crash"):
//!
//! * resumed by `state()`: every minibatch exactly once, in order — nothing lost, nothing again;
//! * resumed by name after a clean stop: exact (`resumed.exact`), continuing after the last
//!   minibatch taken;
//! * resumed by name after `SIGKILL`: never a minibatch skipped; minibatches come again only when
//!   the `opened` reply says so (`resumed.exact == false`, back to the last checkpoint: every
//!   session is in one before its client hears of it);
//! * every minibatch delivered, again or not, is bit for bit the one `dump` prints at its index.
//!
//! The seed of the kill schedule is printed; `MINIBATCHD_FAULT_SEED=N` replays one.
//!
//! Issue 36 adds a second test: named sessions whose trainers behave as real ones do (releases
//! reported with the next request, now and then a step longer than the grace) through SIGTERM,
//! SIGKILL, reloads that remove and re-add the dataset and a full state directory, in random
//! order; every resume by name is judged against the trainer's own record — `exact` only when it
//! continues right after the last minibatch the trainer was handed. `scripts/dev/fault_probe.sh` runs
//! both for as long as asked, with more faults per run.

mod support;

use std::path::Path;
use std::time::Duration;

use minibatchd_client::protocol::{Resumed, SessionOptions, SessionState};
use minibatchd_client::Client;
use support::daemon::{json, options, train_ctf, Daemon, DEADLINE, TRAIN_STREAMS, TRAIN_STREAMS_TOML};
use support::write;

/// Daemon lifetimes ended by a fault before the one that lets every session finish.
const FAULTS: usize = 5;

/// A small deterministic generator for the schedule (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One daemon lifetime of a session, as its client saw it.
#[derive(Debug, Default)]
struct Stint {
    /// The `opened` reply's `resumed`.
    resumed: Option<Resumed>,
    /// The minibatches taken: (index, the dump line).
    taken: Vec<(u64, String)>,
}

/// `MINIBATCHD_FAULT_SEED`, else one from the clock (odd: the generator never sees 0).
fn fault_seed() -> u64 {
    std::env::var("MINIBATCHD_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.subsec_nanos().into()) | 1
    })
}

/// The minibatches of stint `i` come in order from `first`, each the line `want` (the dump) has
/// at its index.
fn check_taken(label: &str, seed: u64, i: usize, taken: &[(u64, String)], want: &[String]) {
    let Some(&(first, _)) = taken.first() else { return };
    for (k, (index, line)) in taken.iter().enumerate() {
        assert_eq!(*index, first + k as u64, "{label} (seed {seed}) stint {i}: minibatches out of order");
        let want = usize::try_from(*index).ok().and_then(|i| want.get(i));
        assert_eq!(Some(line), want, "{label} (seed {seed}) stint {i}: minibatch {index} differs from dump");
    }
}

/// A trainer's session across restarts.
struct Job {
    label: &'static str,
    opts: SessionOptions,
    by_name: bool,
    /// The uninterrupted run.
    want: Vec<String>,
    /// The last state the trainer saved (by-state jobs resume with it).
    saved: Option<SessionState>,
    stints: Vec<Stint>,
    done: bool,
    pace: Duration,
}

impl Job {
    fn new(label: &'static str, d: &Daemon, opts: SessionOptions, by_name: bool, pace_ms: u64) -> Self {
        let mut args: Vec<String> = vec!["--minibatch-size".into(), opts.minibatch_size.unwrap_or(1).to_string()];
        for (flag, v) in [
            ("--max-sweeps", opts.max_sweeps),
            ("--seed", opts.seed),
            ("--workers", opts.num_workers),
            ("--rank", opts.rank),
        ] {
            if let Some(v) = v {
                args.extend([flag.to_owned(), v.to_string()]);
            }
        }
        let want = d.dump("train", &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(want.len() > 100, "{label}: a run long enough to be interrupted ({} minibatches)", want.len());
        Self {
            label,
            opts,
            by_name,
            want,
            saved: None,
            stints: Vec::new(),
            done: false,
            pace: Duration::from_millis(pace_ms),
        }
    }

    /// Reads until the daemon goes away or the epoch ends. A by-state trainer counts a
    /// minibatch as taken once it has saved the state after it (a checkpoint of its own); a
    /// by-name trainer relies on the daemon, and counts what it received.
    fn run(&mut self, socket: &Path) {
        let mut opts = self.opts.clone();
        if !self.by_name {
            opts.resume.clone_from(&self.saved);
        }
        let Ok(mut s) = Client::open_when_indexed(socket, "train", &opts, Some(DEADLINE)) else { return };
        self.stints.push(Stint { resumed: s.resumed.clone(), taken: Vec::new() });
        let stint = self.stints.last_mut().expect("pushed");
        loop {
            match s.next_owned() {
                Ok(Some(mb)) => {
                    let line = json(&mb, TRAIN_STREAMS);
                    if self.by_name {
                        stint.taken.push((mb.index, line));
                        if s.state().is_err() {
                            return;
                        }
                    } else {
                        let Ok(state) = s.state() else { return };
                        stint.taken.push((mb.index, line));
                        self.saved = Some(state);
                    }
                    std::thread::sleep(self.pace);
                }
                Ok(None) => {
                    self.done = true;
                    return;
                }
                Err(_) => return,
            }
        }
    }

    /// Checks the whole run against the policy; `faults[i]` is how daemon lifetime `i` ended
    /// (`true`: SIGKILL).
    fn check(&self, seed: u64) {
        let label = self.label;
        assert!(self.done, "{label} (seed {seed}): never finished");
        // The next index the uninterrupted run would deliver.
        let mut next = 0u64;
        for (i, stint) in self.stints.iter().enumerate() {
            let Some(&(first, _)) = stint.taken.first() else { continue };
            if self.by_name {
                assert!(first <= next, "{label} (seed {seed}) stint {i}: skipped from {next} to {first}");
                if first < next {
                    // A session is in a checkpoint before its client hears of it, so a replay
                    // always comes with `resumed` (never a silent restart from the beginning).
                    let signalled = stint.resumed.as_ref().is_some_and(|r| !r.exact && r.from == "checkpoint");
                    assert!(
                        signalled,
                        "{label} (seed {seed}) stint {i}: minibatches {first}..{next} again without saying so ({:?})",
                        stint.resumed
                    );
                }
                if stint.resumed.as_ref().is_some_and(|r| r.exact) {
                    assert_eq!(
                        first, next,
                        "{label} (seed {seed}) stint {i}: an exact resume did not continue exactly"
                    );
                }
            } else {
                assert_eq!(first, next, "{label} (seed {seed}) stint {i}: a resume by state did not continue exactly");
                assert!(stint.resumed.is_none(), "{label}: a resume by state is not a resumed session");
            }
            check_taken(label, seed, i, &stint.taken, &self.want);
            next = first + stint.taken.len() as u64;
        }
        assert_eq!(next, self.want.len() as u64, "{label} (seed {seed}): the run ended at {next}");
    }
}

fn config(dir: &Path) {
    let data = write(dir, "data.ctf", train_ctf().repeat(3));
    support::daemon::write_config(
        dir,
        "ring_slots = 3\nslot_size_bytes = 65536\nsession_linger_secs = 600\ncheckpoint_interval_secs = 1\n\
         shutdown_grace_secs = 5\n",
        &format!(
            "[datasets.train]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 400\n{TRAIN_STREAMS_TOML}",
            data.display()
        ),
    );
}

#[test]
fn killed_and_stopped_daemons_lose_nothing_and_replay_only_where_they_say_so() {
    let seed = fault_seed();
    eprintln!("fault schedule seed: {seed} (MINIBATCHD_FAULT_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    config(dir.path());
    let mut d = Daemon::start(dir.path(), &[]);
    let named = |name: &str, mut o: SessionOptions| {
        o.session = Some(name.into());
        o
    };
    let sweeps = |mb: u64, n: u64, seed: u64| SessionOptions { max_sweeps: Some(n), seed: Some(seed), ..options(mb) };
    let rank = |o: SessionOptions, r: u64| SessionOptions { num_workers: Some(2), rank: Some(r), ..o };
    let mut jobs = vec![
        Job::new("by-state", &d, sweeps(8, 6, 1), false, 8),
        Job::new("by-name", &d, named("named", sweeps(5, 4, 7)), true, 8),
        Job::new("rank-0 by name", &d, named("job-r0", rank(sweeps(8, 8, 3), 0)), true, 6),
        Job::new("rank-1 by name", &d, named("job-r1", rank(sweeps(8, 8, 3), 1)), true, 6),
        Job::new("rank-1 by state", &d, rank(sweeps(6, 6, 5), 1), false, 6),
    ];
    let socket = d.socket.clone();
    let mut kills = 0;
    for round in 0..=FAULTS {
        // SIGKILL three times in four (always the first time), SIGTERM otherwise.
        let fault =
            (round < FAULTS).then(|| (round == 0 || rng.below(4) != 0, Duration::from_millis(100 + rng.below(2400))));
        std::thread::scope(|scope| {
            for job in jobs.iter_mut().filter(|j| !j.done) {
                let socket = &socket;
                scope.spawn(move || job.run(socket));
            }
            // The last lifetime (no fault): the threads end with their epochs, and the scope waits.
            if let Some((kill, after)) = fault {
                std::thread::sleep(after);
                if kill {
                    kills += 1;
                    d.signal(rustix::process::Signal::KILL);
                    let _ = d.wait();
                } else {
                    assert_eq!(d.stop().code(), Some(0), "a clean stop");
                }
            }
        });
        if round < FAULTS {
            d = Daemon::start(dir.path(), &[]);
        }
    }
    for job in &jobs {
        job.check(seed);
    }
    let replays: usize =
        jobs.iter().map(|j| j.stints.iter().map(|s| s.taken.len()).sum::<usize>() - j.want.len()).sum();
    let resumes = |exact: bool| {
        jobs.iter().flat_map(|j| &j.stints).filter(|s| s.resumed.as_ref().is_some_and(|r| r.exact == exact)).count()
    };
    eprintln!(
        "seed {seed}: {kills} SIGKILL, {} SIGTERM; by name: {} exact resumes, {} from a periodic checkpoint; \
         {replays} minibatches delivered again, each signalled",
        FAULTS - kills,
        resumes(true),
        resumes(false)
    );
    assert_eq!(d.stop().code(), Some(0));
}

/// What one trainer (a thread with a named session) was handed, across daemon lifetimes: its own
/// record, against which every resume by name is judged.
#[derive(Default)]
struct Trainer {
    name: String,
    opts: SessionOptions,
    /// The uninterrupted run (`dump`), by minibatch index.
    want: Vec<String>,
    /// What it was handed, per daemon lifetime.
    stints: Vec<Stint>,
    done: bool,
    rng: u64,
}

impl Trainer {
    fn coin(&mut self, one_in: u64) -> bool {
        let mut r = Rng(self.rng);
        let hit = r.below(one_in) == 0;
        self.rng = r.0;
        hit
    }

    /// Opens by name (retrying while the daemon is down, stopping, refusing for a full disk or
    /// a removed dataset, or still holding the previous connection) and reads until the session
    /// ends; each step releases its slot (reported with the next request, as clients do), now
    /// and then reports at once (`state`), and now and then takes longer than the grace.
    fn run(&mut self, socket: &Path, stop: &std::sync::atomic::AtomicBool) {
        use std::sync::atomic::Ordering;
        while !self.done && !stop.load(Ordering::Relaxed) {
            let opened = Client::connect(socket).and_then(|c| c.open("train", &self.opts));
            let Ok(mut s) = opened else {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            self.stints.push(Stint { resumed: s.resumed.clone(), taken: Vec::new() });
            loop {
                match s.next_owned() {
                    Ok(Some(mb)) => {
                        let handed = json(&mb, TRAIN_STREAMS);
                        self.stints.last_mut().expect("pushed").taken.push((mb.index, handed));
                        if self.coin(5) && s.state().is_err() {
                            break;
                        }
                        // Now and then a step longer than the grace (a slow evaluation).
                        let pause = if self.coin(150) { 1500 } else { 5 + self.rng % 15 };
                        std::thread::sleep(Duration::from_millis(pause));
                    }
                    Ok(None) => {
                        self.done = true;
                        let _ = s.close();
                        return;
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// Every resume by name against the trainer's own record: never a minibatch skipped; `exact`
    /// only when it continues right after the last minibatch the trainer was handed; and every
    /// minibatch, again or not, the one `dump` prints at its index.
    fn check(&self, seed: u64) -> (usize, usize) {
        let name = &self.name;
        assert!(self.done, "{name} (seed {seed}): never finished");
        let mut next = 0u64; // one past the highest index handed out so far
        let (mut exact, mut replays) = (0, 0);
        for (i, Stint { resumed, taken }) in self.stints.iter().enumerate() {
            let Some(&(first, _)) = taken.first() else { continue };
            match resumed {
                None => {
                    assert_eq!((i, first), (0, 0), "{name} (seed {seed}) stint {i}: a fresh session after the first");
                }
                Some(r) if r.exact => {
                    exact += 1;
                    assert_eq!(first, next, "{name} (seed {seed}) stint {i}: an exact resume ({r:?}) did not continue right after the last minibatch handed out");
                }
                Some(r) => {
                    replays += 1;
                    assert!(first <= next, "{name} (seed {seed}) stint {i}: skipped from {next} to {first} ({r:?})");
                }
            }
            check_taken(name, seed, i, taken, &self.want);
            next = next.max(first + taken.len() as u64);
        }
        assert_eq!(next, self.want.len() as u64, "{name} (seed {seed}): the run ended at {next}");
        (exact, replays)
    }
}

/// Writes the daemon's config: the dataset as `train`, or (`present` false) under another name,
/// as a reload that removes it.
fn faulty_config(dir: &Path, present: bool) {
    let data = dir.join("data.ctf");
    let name = if present { "train" } else { "elsewhere" };
    support::daemon::write_config(
        dir,
        "ring_slots = 4\nslot_size_bytes = 65536\nsession_linger_secs = 600\ncheckpoint_interval_secs = 1\n\
         shutdown_grace_secs = 1\n",
        &format!(
            "[datasets.{name}]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 400\n{}",
            data.display(),
            TRAIN_STREAMS_TOML.replace("datasets.train", &format!("datasets.{name}"))
        ),
    );
}

/// Inflicts fault `fault` (0 SIGTERM, 1 SIGKILL, 2 a reload that removes the dataset and adds
/// it back, 3 a full disk for a while, 4 SIGTERM during one) on the daemon `d` of `dir`.
fn inflict(fault: usize, d: &mut Daemon, dir: &Path, disk: &support::disk::SmallDisk, rng: &mut Rng) {
    match fault {
        0 => assert_eq!(d.stop().code(), Some(0), "a clean stop"),
        1 => {
            d.signal(rustix::process::Signal::KILL);
            let _ = d.wait();
        }
        2 => {
            // Each reload waited for: one still pending when the next fault comes is no fault.
            let reloads = d.reloads();
            faulty_config(dir, false);
            d.signal(rustix::process::Signal::HUP);
            d.wait_reloads(reloads + 1);
            std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));
            faulty_config(dir, true);
            d.signal(rustix::process::Signal::HUP);
            d.wait_reloads(reloads + 2);
        }
        _ => {
            let filler = disk.fill();
            std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));
            if fault == 4 {
                // The shutdown checkpoint fails (exit 1): the restart resumes from an
                // older one, and must say so.
                d.signal(rustix::process::Signal::TERM);
                let _ = d.wait();
            }
            std::fs::remove_file(filler).expect("free the disk");
        }
    }
}

/// Issue 36: the `exact` of a resume never lies. Named sessions read while the daemon suffers, in
/// random order, SIGTERM (trainers sometimes inside a step longer than the grace), SIGKILL, a
/// reload that removes the dataset and adds it back, and a full disk (the state directory on a
/// small tmpfs: checkpoints and opens fail, until it is freed). Each resume by name is checked
/// against the trainer's own record of what it was handed: never a skip; exact only when it
/// continues right after the last minibatch handed out; every minibatch the one `dump` prints.
/// `MINIBATCHD_FAULT_SEED=N` replays a schedule, `MINIBATCHD_FAULT_ROUNDS=N` runs more faults
/// (`scripts/dev/fault_probe.sh` runs it for a long time).
#[test]
fn resumes_by_name_are_exact_only_when_nothing_handed_out_comes_again_under_random_faults() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let seed = fault_seed();
    let rounds: usize = std::env::var("MINIBATCHD_FAULT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    eprintln!("fault schedule seed: {seed} (MINIBATCHD_FAULT_SEED={seed} replays it), {rounds} faults");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "data.ctf", train_ctf().repeat(3));
    let disk = support::disk::SmallDisk::mount_sized(&dir.path().join("state"), "4m");
    faulty_config(dir.path(), true);
    let log = [("MINIBATCHD_LOG", std::env::var("MINIBATCHD_FAULT_LOG").unwrap_or_else(|_| "warn".into()))];
    let mut d = Daemon::start(dir.path(), &log);
    let mut trainers: Vec<Trainer> = (0..3u64)
        .map(|k| {
            let opts = SessionOptions {
                session: Some(format!("t{k}")),
                max_sweeps: Some(4),
                seed: Some(k + 1),
                ..options(6 + k)
            };
            let args = ["--minibatch-size", &(6 + k).to_string(), "--max-sweeps", "4", "--seed", &(k + 1).to_string()]
                .map(str::to_owned);
            let want = d.dump("train", &args.iter().map(String::as_str).collect::<Vec<_>>());
            Trainer { name: format!("t{k}"), opts, want, rng: seed ^ (k + 1), ..Trainer::default() }
        })
        .collect();
    let socket = d.socket.clone();
    let stop = AtomicBool::new(false);
    let mut applied = Vec::new();
    std::thread::scope(|scope| {
        let workers: Vec<_> = trainers
            .iter_mut()
            .map(|t| {
                let (socket, stop) = (&socket, &stop);
                scope.spawn(move || t.run(socket, stop))
            })
            .collect();
        for round in 0..rounds {
            std::thread::sleep(Duration::from_millis(200 + rng.below(1300)));
            if workers.iter().all(std::thread::ScopedJoinHandle::is_finished) {
                break;
            }
            // After an unclean stop nobody knows how far a trainer got, for good: those come in
            // the last third, so that the resumes before them can be exact (and are checked).
            let pick = |n: u64, rng: &mut Rng| usize::try_from(rng.below(n)).unwrap_or(0);
            let fault = if round * 3 < rounds * 2 { [0, 2, 3][pick(3, &mut rng)] } else { pick(5, &mut rng) };
            applied.push(["SIGTERM", "SIGKILL", "reload", "disk full", "SIGTERM during a disk full"][fault]);
            inflict(fault, &mut d, dir.path(), &disk, &mut rng);
            if !d.running() {
                d = Daemon::start(dir.path(), &log);
            }
        }
        // The last lifetime: no more faults, every trainer finishes (or the deadline stops them).
        let start = std::time::Instant::now();
        while !workers.iter().all(std::thread::ScopedJoinHandle::is_finished) && start.elapsed() < DEADLINE {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let (mut exact, mut replays) = (0, 0);
    if std::env::var_os("MINIBATCHD_FAULT_VERBOSE").is_some() {
        for t in &trainers {
            for Stint { resumed: r, taken } in &t.stints {
                eprintln!(
                    "{}: {:?} {:?}",
                    t.name,
                    r.as_ref().map(|r| (r.from.clone(), r.exact)),
                    taken.first().map(|x| x.0)
                );
            }
        }
    }
    for t in &trainers {
        let (e, r) = t.check(seed);
        exact += e;
        replays += r;
    }
    eprintln!("seed {seed}: faults {applied:?}; resumes by name: {exact} exact, {replays} not exact");
    if applied.first().is_some_and(|f| *f == "SIGTERM" || *f == "reload") {
        assert!(exact > 0, "seed {seed}: a clean stop or reload came first, yet no resume was exact");
    }
    assert_eq!(d.stop().code(), Some(0));
    drop(disk);
}
