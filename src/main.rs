//! The `minibatchd` binary: CLI → config → command; errors → exit codes.
//!
//! Exit status: 0 on success, 1 on a data or config error (the message names file, line and byte
//! offset), 2 on usage errors (clap's own exit code).

#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Parser, Subcommand};

use minibatchd::config::Config;
use minibatchd::dump::{dump, DumpOptions};
use minibatchd_engine::dataset::{Dataset, IndexProgress};
use minibatchd_engine::sampling::{EpochLimit, SamplingOptions, Tail, Window};

/// The environment every subcommand reads, for `--help` (docs/cli.md and docs/operations.md say
/// the same).
const ENV_HELP: &str = "Environment:
  MINIBATCHD_LOG              log filter (tracing EnvFilter syntax: info, debug, minibatchd=debug,warn);
                              default info for run, warn for the other subcommands
  MINIBATCHD__SECTION__KEY    overrides a configuration key, e.g. MINIBATCHD__DAEMON__STATE_DIR=/tmp/s
  AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
  AWS_PROFILE, AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE, AWS_ALLOW_HTTP
                              object storage for s3:// files (docs/object-storage.md)
  NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID
                              set by systemd for run (readiness, status and watchdog)";

#[derive(Parser)]
#[command(
    after_help = ENV_HELP,
    name = "minibatchd",
    version,
    about = "Serves randomized minibatches of text training data with CNTK MinibatchSource semantics"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    #[command(after_help = ENV_HELP)]
    Run {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Load and validate the config, reporting every error; exit 0 if valid, 1 otherwise.
    #[command(after_help = ENV_HELP)]
    Validate {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the minibatches a session with these options would receive, as JSON lines.
    #[command(after_help = ENV_HELP)]
    Dump(Box<DumpArgs>),
    /// Build (and cache) the chunk index of a dataset.
    #[command(after_help = ENV_HELP)]
    Index {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
        /// The dataset.
        #[arg(long)]
        dataset: String,
        /// Also parse every chunk into the parsed cache (`[daemon]
        /// parsed_cache_dir`), so the daemon's first sweep reads parsed chunks instead of text.
        #[arg(long)]
        parsed: bool,
    },
}

#[derive(Args)]
#[allow(clippy::struct_excessive_bools)] // one field per command-line switch
struct DumpArgs {
    /// The config file.
    #[arg(long)]
    config: PathBuf,
    /// The dataset.
    #[arg(long, required_unless_present = "mixture", conflicts_with = "mixture")]
    dataset: Option<String>,
    /// A mixture of datasets (`[mixtures.NAME]`) instead of a dataset: each line names the source
    /// of each sequence and ends with the state to restore from (`--restore-state`).
    #[arg(long, conflicts_with_all = [
        "max_sweeps", "full_sweep", "equal_steps", "randomize", "window_chunks",
        "window_samples", "seed", "frame_mode", "restore", "restore_before",
    ])]
    mixture: Option<String>,
    /// With --mixture: start from this state, the JSON object a line's `state` holds.
    #[arg(long, value_name = "JSON", requires = "mixture")]
    restore_state: Option<String>,
    /// Minibatch size in samples (CNTK's definition), 1..=2147483647 as a session's.
    #[arg(long, conflicts_with = "minibatch_sizes", value_parser = minibatch_size)]
    minibatch_size: Option<usize>,
    /// Minibatch sizes, cycled: minibatch i uses entry i mod len.
    #[arg(long, value_delimiter = ',', value_parser = minibatch_size)]
    minibatch_sizes: Option<Vec<usize>>,
    /// Epoch size in samples (overshoots to the end of the last started sequence).
    #[arg(long, conflicts_with_all = ["max_sweeps", "full_sweep"])]
    max_samples: Option<u64>,
    /// Epoch size in sweeps.
    #[arg(long, conflicts_with = "full_sweep")]
    max_sweeps: Option<u64>,
    /// Exactly one sweep.
    #[arg(long)]
    full_sweep: bool,
    /// Equal step counts over the workers: every rank gets as many minibatches as the rank that
    /// gets the fewest (the ragged tails are dropped). One minibatch size; a finite epoch.
    #[arg(long, conflicts_with = "minibatch_sizes")]
    equal_steps: bool,
    /// With --equal-steps: `drop` the workers' ragged tails (the default), or `pad` every worker
    /// with empty minibatches up to the count of the one that gets the most (the session option
    /// `tail`).
    #[arg(long, value_name = "drop|pad", requires = "equal_steps", value_parser = ["drop", "pad"])]
    tail: Option<String>,
    /// Exactly sweep K (0-based): a trainer's epoch K.
    /// With --mixture, also with --max-samples (epoch K of epochs of that many samples), as a
    /// mixture's session takes them.
    #[arg(long, value_name = "K", conflicts_with_all = ["max_sweeps", "full_sweep"])]
    sweep: Option<u64>,
    /// Randomize (default: the dataset's [sampling] setting).
    #[arg(long, action = clap::ArgAction::Set)]
    randomize: Option<bool>,
    /// Randomization window in chunks.
    #[arg(long, conflicts_with = "window_samples")]
    window_chunks: Option<usize>,
    /// Randomization window in samples.
    #[arg(long)]
    window_samples: Option<u64>,
    /// Randomization seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Frame mode: every sequence must have exactly one sample.
    #[arg(long)]
    frame_mode: bool,
    /// Number of data-parallel workers (1..=1048576, as a session's `num_workers`).
    #[arg(long, default_value_t = 1, value_parser = workers)]
    workers: usize,
    /// This worker's rank.
    #[arg(long, default_value_t = 0)]
    rank: usize,
    /// Start at this checkpoint position.
    #[arg(long)]
    restore: Option<u64>,
    /// Restore to position POS before minibatch MB (counted from 0), as MB:POS; repeatable.
    #[arg(long, value_name = "MB:POS", value_parser = parse_restore_before)]
    restore_before: Vec<(u64, u64)>,
    /// Stop after this many minibatches.
    #[arg(long)]
    num_minibatches: Option<u64>,
    /// Print the data-order ledger instead of the data: per minibatch its index, sweep,
    /// `end_of_sweep`, position, fingerprint and the global indices of its sequences (no data is
    /// read).
    #[arg(long)]
    ledger: bool,
}

fn main() -> ExitCode {
    // Before any thread exists: evicted chunks go back to the kernel, not into malloc's heaps.
    minibatchd_sys::return_large_frees_to_the_kernel();
    // A write past the file-size limit fails with EFBIG, reported like a full disk, instead of
    // killing the process unsaid.
    let _ = minibatchd_sys::signals::ignore_file_size_limit_signal();
    // The daemon's signals are caught before anything else runs (found by a probe: a SIGHUP or
    // SIGTERM in the 1–2 ms the arguments and the log filter took killed it outright).
    let signals = (std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new("run")))
        .then(minibatchd::pipeline::ops::signals::Caught::install);
    let cli = Cli::parse();
    init_logging(matches!(cli.command, Command::Run { .. }));
    match run(cli, signals) {
        Ok(code) => code,
        // The reader of our output went away (`minibatchd dump ... | head`): what it wanted was
        // written, as ripgrep and other filters treat it.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            note(format_args!("minibatchd: error: {}", causes(&e)));
            ExitCode::from(1)
        }
    }
}

/// A minibatch size in a session's range, 1..=2^31 − 1 (found by a probe: `dump` took any
/// `u64`, and a minibatch that never fills — an endless epoch — gathered sweep after sweep into
/// memory).
fn minibatch_size(arg: &str) -> Result<usize, String> {
    use minibatchd::pipeline::control::session::MAX_MINIBATCH_SIZE;
    match arg.parse::<u64>() {
        Ok(n) if (1..=MAX_MINIBATCH_SIZE).contains(&n) => usize::try_from(n).map_err(|e| e.to_string()),
        Ok(n) => Err(format!("minibatch size {n} is out of range 1..={MAX_MINIBATCH_SIZE}")),
        Err(e) => Err(format!("{arg:?} is not a minibatch size: {e}")),
    }
}

/// `--workers`: what a session's `num_workers` may be (found by a probe: dump printed data for
/// 2^64 − 1 workers, where a session with the same options is refused).
fn workers(arg: &str) -> Result<usize, String> {
    use minibatchd::pipeline::control::session::MAX_WORKERS;
    match arg.parse::<u64>() {
        Ok(n) if (1..=MAX_WORKERS).contains(&n) => usize::try_from(n).map_err(|e| e.to_string()),
        Ok(n) => Err(format!("{n} workers is out of range 1..={MAX_WORKERS}")),
        Err(e) => Err(format!("{arg:?} is not a number of workers: {e}")),
    }
}

/// Writes a line of the command's output. A write that fails (a closed pipe, a full disk) is the
/// command's error, as `dump`'s are (found by a probe: `println!` panicked, exit 101).
fn say(line: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_fmt(line).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()).context("writing output")
}

/// Writes a line to stderr (progress, errors): where even that cannot be written, nothing is
/// left to tell, and the exit status says it.
fn note(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(line).and_then(|()| err.write_all(b"\n"));
}

/// `e` and its causes, each that says something new: errors whose message already includes their
/// source's (`"{0}"` over an I/O error) printed it twice with `{:#}`.
fn causes(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn init_logging(daemon: bool) {
    let default = if daemon { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MINIBATCHD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || minibatchd::log_lines::Escaped::new(std::io::stderr(), ansi))
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
}

/// `cli`'s command; `signals`: the daemon's signal handlers, installed first thing by `main`
/// when `run` is the first argument.
fn run(
    cli: Cli,
    signals: Option<std::io::Result<minibatchd::pipeline::ops::signals::Caught>>,
) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate { config } => {
            // The same check a SIGHUP reload makes before applying a file.
            let c = minibatchd::pipeline::ops::reload::validate(&config)?;
            let names: Vec<&str> = c.datasets.keys().map(String::as_str).collect();
            let mixtures: Vec<&str> = c.mixtures.keys().map(String::as_str).collect();
            let mixtures = if mixtures.is_empty() {
                String::new()
            } else {
                format!("; {} mixture(s): {}", mixtures.len(), mixtures.join(", "))
            };
            say(format_args!(
                "{}: valid ({} dataset(s): {}{mixtures})",
                config.display(),
                names.len(),
                names.join(", ")
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Index { config, dataset, parsed } => {
            let c = Config::load(&config)?;
            let tty = std::io::stderr().is_terminal();
            let d = open_dataset(&c, &dataset, tty)?;
            let t = d.timeline();
            let said = say(format_args!(
                "{}: {} sequences, {} samples, {} chunks",
                dataset,
                t.num_sequences(),
                t.samples(..),
                t.num_chunks()
            ));
            // The fill is what `--parsed` is for: a reader of the summary that went away does not
            // stop it (a review: the closed pipe ended the command before the fill).
            if parsed {
                fill_parsed(&c, &d, &dataset, tty)?;
            }
            said?;
            // The cache is what `index` is for (found by a probe: it exited 0 having cached
            // nothing, the warning aside).
            let uncached = d.uncached_indexes();
            if uncached > 0 {
                anyhow::bail!(
                    "{uncached} file(s) of {dataset} were indexed but their index could not be written to the index \
                     cache (the warnings above say why)"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Dump(args) => {
            let c = Config::load(&args.config)?;
            let Some(dataset) = args.dataset.as_deref() else { return dump_mixture(&c, &args) };
            if args.restore_state.is_some() {
                // Found by a probe: clap's `requires` let it through with --dataset, and the dump
                // silently started from the beginning.
                note(format_args!(
                    "minibatchd: usage error: --restore-state is a mixture's state (with --mixture); a dataset's dump \
                     starts where --restore (a position) or --sweep says"
                ));
                return Ok(ExitCode::from(2));
            }
            let d = open_dataset(&c, dataset, false)?;
            let options = match dump_options(&args, d.config()) {
                Ok(o) => o,
                Err(e) => {
                    // Usage errors, like clap's own, exit with 2.
                    note(format_args!("minibatchd: usage error: {}", causes(&e)));
                    return Ok(ExitCode::from(2));
                }
            };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
            if args.ledger {
                minibatchd::dump::ledger(&d, &options, &mut out)?;
            } else {
                dump(&d, &options, &mut out)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { config } => {
            // First (in `main` when `run` is the first argument): a SIGTERM or SIGHUP from a
            // supervisor while the daemon starts is a clean stop or a reload, not the default
            // death (found by a probe: the first 2–5 ms were open).
            let signals = match signals {
                Some(caught) => caught?,
                None => minibatchd::pipeline::ops::signals::Caught::install()?,
            };
            let c = Config::load(&config)?;
            minibatchd::pipeline::run(c, signals)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `index --parsed`: every chunk into the parsed cache, with a progress bar on a
/// terminal and a line per tenth otherwise.
fn fill_parsed(c: &Config, d: &Dataset, name: &str, tty: bool) -> anyhow::Result<()> {
    let threads = match c.daemon.parser_threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("parsing {bar:40} {pos}/{len} chunks ({per_sec}, {eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let started = std::time::Instant::now();
    // The last count printed: the parser threads report in any order (found by a probe: 8/8 was
    // printed before 7/8), and a line never goes back.
    let printed = std::sync::Mutex::new(0u64);
    let report = minibatchd::parsed_cache::fill(d, threads, &|done, total| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
            return;
        }
        let mut last = printed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tenth = |n: u64| n * 10 / total.max(1);
        if done > *last && (done == total || tenth(done) != tenth(*last)) {
            *last = done;
            note(format_args!("parsing {name}: {done}/{total} chunks"));
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let cache = d.parsed_cache().map(|p| p.dir().display().to_string()).unwrap_or_default();
    say(format_args!(
        "{name}: {} chunks in the parsed cache {cache} ({} already there, {} written, {} not kept: malformed lines, a failed write or past parsed_cache_bytes) in {:.1} s",
        report.present + report.written,
        report.present,
        report.written,
        report.not_kept,
        started.elapsed().as_secs_f64()
    ))
}

fn open_dataset(c: &Config, name: &str, progress_bar: bool) -> anyhow::Result<Dataset> {
    let cfg = c.dataset(name)?;
    let bar = progress_bar.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("indexing {bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut report = |p: IndexProgress| {
        if let Some(b) = &bar {
            b.set_length(p.bytes_total);
            b.set_position(p.bytes_done);
        }
    };
    // The daemon's bound on an index (one dataset here, so the whole index share is its own).
    let limits = minibatchd_engine::options::IndexLimits::within(c.daemon.memory_limit_bytes, 0, cfg.sources.len());
    // Object storage, when the configuration reads objects: this run's own.
    let remote = minibatchd::objects::open(c)?;
    let mut d = Dataset::open_in(cfg, &c.daemon.state_dir, limits, remote, &mut report)?;
    // `dump` and `index --parsed` parse chunks as the daemon does, under the same policy.
    let huge = minibatchd_sys::HugePages::new(c.daemon.huge_pages);
    d.set_huge_pages(huge.clone());
    let parsed = minibatchd::parsed_cache::open(&c.daemon, &huge);
    minibatchd::parsed_cache::attach(&mut d, parsed.as_ref(), minibatchd_engine::dataset::Persist::OnLoad);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(d)
}

fn dump_options(a: &DumpArgs, d: &minibatchd::config::DatasetConfig) -> anyhow::Result<DumpOptions> {
    let window = Window::from_options(a.window_chunks, a.window_samples, d.sampling.window);
    let limit = match (a.max_samples, a.max_sweeps, a.full_sweep, a.sweep) {
        (Some(n), ..) => EpochLimit::Samples(n),
        (_, Some(k), ..) => EpochLimit::Sweeps(k),
        (_, _, true, _) => EpochLimit::FullSweep,
        (.., Some(k)) => EpochLimit::Sweep(k),
        _ => EpochLimit::Infinite,
    };
    let sizes = match (&a.minibatch_sizes, a.minibatch_size) {
        (Some(v), _) => v.clone(),
        (None, Some(n)) => vec![n],
        (None, None) => bail!("give --minibatch-size N or --minibatch-sizes N,M,..."),
    };
    if sizes.is_empty() || sizes.contains(&0) {
        bail!("minibatch sizes must be at least 1");
    }
    if a.max_samples == Some(0) {
        bail!("--max-samples must be at least 1 (an epoch of 0 samples would print nothing)");
    }
    if a.sweep.is_some() && a.max_samples.is_some() {
        bail!("give at most one of --max-samples, --max-sweeps, --full-sweep, --sweep (both go together for a mixture only)");
    }
    Ok(DumpOptions {
        sampling: SamplingOptions {
            randomize: a.randomize.unwrap_or(d.sampling.randomize),
            window,
            seed: a.seed.unwrap_or(d.sampling.seed),
            limit,
            num_workers: a.workers,
            rank: a.rank,
        },
        minibatch_sizes: sizes,
        num_minibatches: a.num_minibatches,
        restore: a.restore,
        restore_before: a.restore_before.clone(),
        equal_steps: a.equal_steps,
        tail: if a.tail.as_deref() == Some("pad") { Tail::Pad } else { Tail::Drop },
        frame_mode: a.frame_mode,
    })
}

/// `dump --mixture NAME`.
fn dump_mixture(c: &Config, args: &DumpArgs) -> anyhow::Result<ExitCode> {
    use minibatchd::dump::mixture::{self, MixtureDumpOptions};
    use minibatchd_engine::sampling::mixture::{MixtureEpoch, MixtureOptions};
    let name = args.mixture.as_deref().unwrap_or_default();
    let Some(m) = c.mixtures.get(name) else {
        let known: Vec<&str> = c.mixtures.keys().map(String::as_str).collect();
        bail!("no mixture '{name}' in {} (known: {})", c.path.display(), known.join(", "));
    };
    let usage = |message: String| {
        note(format_args!("minibatchd: usage error: {message}"));
        Ok(ExitCode::from(2))
    };
    let sizes = match (&args.minibatch_sizes, args.minibatch_size) {
        (Some(v), _) => v.clone(),
        (None, Some(n)) => vec![n],
        (None, None) => return usage("give --minibatch-size N or --minibatch-sizes N,M,...".into()),
    };
    if sizes.is_empty() || sizes.contains(&0) {
        return usage("minibatch sizes must be at least 1".into());
    }
    if args.max_samples == Some(0) {
        // As a mixture's session and `[mixtures]` refuse it.
        return usage("--max-samples must be at least 1".into());
    }
    let restore = match args.restore_state.as_deref().map(mixture::parse_state) {
        Some(Err(e)) => return usage(format!("--restore-state: {e}")),
        Some(Ok(state)) => Some(state),
        None => None,
    };
    let datasets = m.datasets.iter().map(|d| open_dataset(c, d, false)).collect::<anyhow::Result<Vec<_>>>()?;
    let options = MixtureDumpOptions {
        mixture: MixtureOptions {
            schedule: m.schedule.clone(),
            epoch: args.max_samples.map_or(m.epoch, MixtureEpoch::Samples),
            num_workers: args.workers,
            rank: args.rank,
        },
        minibatch_sizes: sizes,
        num_minibatches: args.num_minibatches,
        restore,
        epoch: args.sweep,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    if args.ledger {
        mixture::ledger(&datasets, &options, &mut out)?;
    } else {
        let refs: Vec<&_> = datasets.iter().collect();
        let layout = minibatchd::config::mixture::stream_layout(&m.datasets, &refs, &m.streams)
            .map_err(minibatchd::dump::DumpError::Mixture)?;
        mixture::dump(&datasets, &layout, &options, &mut out)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Parses `--restore-before MB:POS`.
fn parse_restore_before(s: &str) -> Result<(u64, u64), String> {
    let (mb, pos) = s.split_once(':').ok_or_else(|| format!("expected MB:POS, found {s:?}"))?;
    let mb = mb.trim().parse::<u64>().map_err(|e| format!("minibatch index {mb:?}: {e}"))?;
    let pos = pos.trim().parse::<u64>().map_err(|e| format!("position {pos:?}: {e}"))?;
    Ok((mb, pos))
}
