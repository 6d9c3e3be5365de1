//! Golden cases run through `minibatchd dump`: each case is a directory with the data, a
//! `config.toml` (dataset `d`), a `case.toml` (`args` for dump, the expected `exit` status and
//! `stderr_contains` fragments) and, for a successful case, `expected.jsonl`: the exact output.
//! A failing case must print no minibatch. `MINIBATCHD_BLESS=1` rewrites the expected files from
//! the output (review the diff: a changed golden file is a changed behaviour).

use std::path::{Path, PathBuf};

use super::{command, package_root};

/// A directory of golden cases.
pub struct Suite {
    /// The cases' directory, below the package root (`tests/fixtures`).
    pub dir: &'static str,
    /// Fewer cases than this means some went missing.
    pub min_cases: usize,
    /// What the summary line calls the cases ("golden fixtures").
    pub what: &'static str,
}

struct Case {
    args: Vec<String>,
    exit: i32,
    stderr_contains: Vec<String>,
}

fn read_case(dir: &Path) -> Case {
    let text = std::fs::read_to_string(dir.join("case.toml")).expect("case.toml");
    let mut case = Case { args: Vec::new(), exit: 0, stderr_contains: Vec::new() };
    for line in text.lines() {
        let Some((k, v)) = line.split_once(" = ") else { continue };
        match k {
            "args" => case.args = serde_json::from_str(v).expect("args"),
            "exit" => case.exit = v.parse().expect("exit"),
            "stderr_contains" => case.stderr_contains = serde_json::from_str(v).expect("stderr_contains"),
            other => panic!("unknown case key {other}"),
        }
    }
    case
}

impl Suite {
    /// Runs every case (a directory with a `case.toml`) in name order and fails with all the
    /// differences at once.
    pub fn run(&self) {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(package_root().join(self.dir))
            .expect(self.dir)
            .map(|e| e.expect("entry").path())
            .filter(|p| p.join("case.toml").is_file())
            .collect();
        dirs.sort();
        assert!(dirs.len() >= self.min_cases, "fixtures missing: found {}", dirs.len());
        let mut failures = Vec::new();
        let mut served_from_cache = 0;
        for d in &dirs {
            let name = d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            // Twice on one state directory: the first run parses the text and persists the parsed
            // chunks, the second reads them back (`parsed_cache`); both must print the golden
            // output, and a case with persisted chunks must have been served from them.
            let state = match tempfile::tempdir() {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("== {name}: {e}"));
                    continue;
                }
            };
            for pass in ["cold", "from the persisted parsed chunks"] {
                if let Err(e) = run_case(d, state.path()) {
                    failures.push(format!("== {name} ({pass}): {e}"));
                }
            }
            if persisted_entries(state.path()) > 0 {
                served_from_cache += 1;
            }
        }
        println!(
            "{} {}, each run twice ({served_from_cache} with persisted parsed chunks on the second run), {} failed",
            dirs.len(),
            self.what,
            failures.len()
        );
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        assert!(served_from_cache * 3 >= dirs.len(), "only {served_from_cache} cases persisted parsed chunks");
    }
}

/// Entries in `state/parsed` (the default `parsed_cache_dir`).
fn persisted_entries(state: &Path) -> usize {
    std::fs::read_dir(state.join("parsed"))
        .map_or(0, |d| d.filter_map(Result::ok).filter(|e| e.path().extension().is_some_and(|x| x == "mbp")).count())
}

/// Runs one case on state directory `state`: the exit status, the stderr fragments, then the
/// exact output.
fn run_case(dir: &Path, state: &Path) -> Result<(), String> {
    let case = read_case(dir);
    let out = command("dump", &dir.join("config.toml"), "d")
        .args(&case.args)
        .env("MINIBATCHD_LOG", "warn")
        // Decompressed copies and index caches go to a fresh directory, not the source tree.
        .env("MINIBATCHD__DAEMON__STATE_DIR", state)
        .output()
        .map_err(|e| format!("cannot run minibatchd: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().unwrap_or(-1);
    if code != case.exit {
        return Err(format!("exit {code}, expected {}\nstderr:\n{stderr}", case.exit));
    }
    for frag in &case.stderr_contains {
        if !stderr.contains(frag.as_str()) {
            return Err(format!("stderr lacks {frag:?}:\n{stderr}"));
        }
    }
    let expected_path = dir.join("expected.jsonl");
    if case.exit == 0 {
        if std::env::var_os("MINIBATCHD_BLESS").is_some() {
            std::fs::write(&expected_path, stdout.as_bytes()).map_err(|e| e.to_string())?;
        }
        let expected =
            std::fs::read_to_string(&expected_path).map_err(|e| format!("{}: {e}", expected_path.display()))?;
        if expected != stdout {
            return Err(format!(
                "output differs from {}\n--- expected\n{expected}\n--- got\n{stdout}",
                expected_path.display()
            ));
        }
    } else if !stdout.is_empty() {
        return Err(format!("a failing dump printed minibatches:\n{stdout}"));
    }
    Ok(())
}
