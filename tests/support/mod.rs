//! What the integration tests share, written once: paths in the repository and in
//! `../shared/conformance`, the `minibatchd` command lines, temp files, datasets opened from an
//! inline config, dump options, and (in the submodules) the golden-case runner, the daemon under
//! test and its sessions, and the deepx instances of a minibatch.
//!
//! Each test file includes it with `mod support;`; Cargo compiles `tests/support/` only as part
//! of those files, never as a test of its own.

// Every test binary compiles the whole module but uses only its part of it.
#![allow(dead_code)]

pub mod daemon;
pub mod deepx;
pub mod disk;
pub mod golden;
pub mod s3;

use std::path::{Path, PathBuf};
use std::process::Command;

use minibatchd::dump::DumpOptions;
use minibatchd::Config;
use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::sampling::{EpochLimit, SamplingOptions, Window};

/// The daemon binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_minibatchd");

/// The root of the `minibatchd` package (where `tests/`, `conf/` and `clients/` are).
pub fn package_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/conformance/<sub>`, the third-party test data (present in CI); when it is absent,
/// reports that `what` is skipped ([`skipped`]) and returns `None`, and the caller passes without
/// checking.
pub fn shared_conformance(sub: &str, what: &str) -> Option<PathBuf> {
    let p = package_root().join("../shared/conformance").join(sub);
    if p.is_dir() {
        Some(p)
    } else {
        skipped(&format!("../shared/conformance/{sub} not found; {what} not checked"));
        None
    }
}

/// The unit the dashboard draws `target` of `panel` in: an override of its query (by `refId`),
/// else the panel's default (`short` when it names none).
pub fn dashboard_unit(panel: &serde_json::Value, target: &serde_json::Value) -> String {
    let default_unit = panel["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("short");
    panel["fieldConfig"]["overrides"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["matcher"]["id"] == "byFrameRefID" && o["matcher"]["options"] == target["refId"])
        .flat_map(|o| o["properties"].as_array().cloned().unwrap_or_default())
        .find(|p| p["id"] == "unit")
        .and_then(|p| p["value"].as_str().map(str::to_owned))
        .unwrap_or_else(|| default_unit.to_owned())
}

/// A test that passes without checking what it is for, because this machine lacks something:
/// says so on its output (shown with `--nocapture`) and, where `$MINIBATCHD_SKIPPED` names a file
/// (`scripts/test.sh` sets it), adds a line to it, so that the run's summary counts the skips
/// instead of letting them pass as checked.
pub fn skipped(why: &str) {
    println!("SKIPPED: {why}");
    if let Some(path) = std::env::var_os("MINIBATCHD_SKIPPED") {
        use std::io::Write;
        let line = format!("{}: {why}\n", std::thread::current().name().unwrap_or("a test"));
        // One write of one line in append mode: lines of parallel tests do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(path) {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// `minibatchd <subcommand> --config <config> --dataset <dataset>`, to be given more arguments.
/// The log level is the caller's: `MINIBATCHD_LOG` is inherited unless it sets it.
pub fn command(subcommand: &str, config: &Path, dataset: &str) -> Command {
    let mut c = Command::new(BIN);
    c.arg(subcommand).arg("--config").arg(config).args(["--dataset", dataset]);
    c
}

/// The cases of a recorded oracle corpus (`tests/fixtures_*`): each directory under `corpus`, in
/// name order — at least `at_least` of them, else the corpus is not there.
pub fn oracle_cases(corpus: &str, at_least: usize) -> Vec<PathBuf> {
    let root = package_root().join(corpus);
    let mut cases: Vec<PathBuf> =
        std::fs::read_dir(&root).expect("the recorded corpus").map(|e| e.expect("entry").path()).collect();
    cases.sort();
    assert!(cases.len() >= at_least, "{} cases in {corpus}", cases.len());
    cases
}

/// Writes `dir/name` and returns its path.
pub fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

/// Opens dataset `name` of the inline config `toml`: its relative paths are below `base`, its
/// index caches (when `cache_index` is on) go to `state`. Errors as their messages.
pub fn try_open(toml: &str, name: &str, base: &Path, state: &Path) -> Result<Dataset, String> {
    let config = Config::from_toml_str(toml, base).map_err(|e| e.to_string())?;
    let dataset = config.dataset(name).map_err(|e| e.to_string())?;
    Dataset::open(dataset, state, &mut |_| {}).map_err(|e| e.to_string())
}

/// [`try_open`] that must succeed.
pub fn open(toml: &str, name: &str, base: &Path, state: &Path) -> Dataset {
    try_open(toml, name, base, state).unwrap_or_else(|e| panic!("open dataset {name}: {e}"))
}

/// Sampling in file order (no randomization, one-chunk window), one worker.
pub fn in_file_order(limit: EpochLimit) -> SamplingOptions {
    SamplingOptions { randomize: false, window: Window::Chunks(1), seed: 0, limit, num_workers: 1, rank: 0 }
}

/// Randomized sampling with `window` and `seed`, one worker.
pub fn randomized(window: Window, seed: u64, limit: EpochLimit) -> SamplingOptions {
    SamplingOptions { randomize: true, window, seed, limit, num_workers: 1, rank: 0 }
}

/// Dump options with one minibatch size: no minibatch cap, no restore, no equal steps.
pub fn dump_options(sampling: SamplingOptions, minibatch_size: usize, frame_mode: bool) -> DumpOptions {
    DumpOptions {
        sampling,
        minibatch_sizes: vec![minibatch_size],
        num_minibatches: None,
        restore: None,
        restore_before: Vec::new(),
        equal_steps: false,
        tail: minibatchd_engine::sampling::Tail::Drop,
        frame_mode,
    }
}

/// The minibatches of `minibatchd dump` output, one JSON object per line.
/// A strings sample of `dump` (`docs/dump.md`: a JSON string of UTF-8 bytes, else
/// `{"hex": "…"}`) as its bytes.
///
/// # Panics
/// On anything else.
#[must_use]
pub fn dump_bytes(v: &serde_json::Value) -> Vec<u8> {
    if let Some(s) = v.as_str() {
        return s.as_bytes().to_vec();
    }
    let hex = v["hex"].as_str().expect("a strings sample: a string or {\"hex\": …}");
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digits")).collect()
}

/// `bytes` as lowercase hex digits, as the oracle scripts record byte strings.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut h, b| {
        let _ = write!(h, "{b:02x}");
        h
    })
}

pub fn parse_dump(text: &str) -> Result<Vec<serde_json::Value>, String> {
    text.lines().map(|l| serde_json::from_str(l).map_err(|e| format!("dump printed {l:?}: {e}"))).collect()
}
