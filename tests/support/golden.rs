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
        let failures: Vec<String> = dirs
            .iter()
            .filter_map(|d| {
                run_case(d).err().map(|e| {
                    format!("== {}: {e}", d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
                })
            })
            .collect();
        println!("{} {}, {} failed", dirs.len(), self.what, failures.len());
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }
}

/// Runs one case: the exit status, the stderr fragments, then the exact output.
fn run_case(dir: &Path) -> Result<(), String> {
    let case = read_case(dir);
    let state = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = command("dump", &dir.join("config.toml"), "d")
        .args(&case.args)
        .env("MINIBATCHD_LOG", "warn")
        // Decompressed copies and index caches go to a fresh directory, not the source tree.
        .env("MINIBATCHD__DAEMON__STATE_DIR", state.path())
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
