//! Golden fixtures: `tests/fixtures/<case>/` holds the data, a `config.toml`, a `case.toml`
//! (`args` for `minibatchd dump`, the expected `exit` status and `stderr_contains` fragments)
//! and, for successful cases, `expected.jsonl`: the exact dump output.
//!
//! The cases cover the edge cases of `reference/cntk-ctf-semantics.md` §6 that need no
//! randomization. Each expected file was produced by the binary and then checked by hand against
//! the reference (regenerate with `MINIBATCHD_BLESS=1 cargo test --test golden`, then review the
//! diff: a changed golden file is a changed behaviour).

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
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

fn run_case(dir: &Path) -> Result<(), String> {
    let case = read_case(dir);
    let out = Command::new(env!("CARGO_BIN_EXE_minibatchd"))
        .arg("dump")
        .arg("--config")
        .arg(dir.join("config.toml"))
        .args(["--dataset", "d"])
        .args(&case.args)
        .env("MINIBATCHD_LOG", "warn")
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
    } else if !stdout.is_empty() && case.stderr_contains.iter().all(|f| !f.contains("non-frame")) {
        return Err(format!("a failing dump printed minibatches:\n{stdout}"));
    }
    Ok(())
}

#[test]
fn golden_fixtures() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("case.toml").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 40, "fixtures missing: found {}", dirs.len());
    let failures: Vec<String> = dirs
        .iter()
        .filter_map(|d| {
            run_case(d).err().map(|e| {
                format!("== {}: {e}", d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
            })
        })
        .collect();
    println!("{} golden fixtures, {} failed", dirs.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
