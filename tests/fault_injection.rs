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
            for (k, (index, line)) in stint.taken.iter().enumerate() {
                assert_eq!(*index, first + k as u64, "{label} (seed {seed}) stint {i}: minibatches out of order");
                let want = usize::try_from(*index)
                    .ok()
                    .and_then(|i| self.want.get(i))
                    .unwrap_or_else(|| panic!("{label}: minibatch {index} past the end"));
                assert_eq!(line, want, "{label} (seed {seed}) stint {i}: minibatch {index} differs from dump");
            }
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
    let seed = std::env::var("MINIBATCHD_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.subsec_nanos().into()) | 1
    });
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
