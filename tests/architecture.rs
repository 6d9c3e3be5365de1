//! The layering rules the compiler cannot see inside one crate, checked on the source tree:
//!
//! * the daemon's planes import only downward — operations → control → data — and the leaf
//!   modules (`stage`, `pipeline::lifecycle`, `metrics`, `config`) import none of the planes;
//! * `unsafe` appears only in `crates/sys`, and every other crate root forbids it.
//!
//! Crate boundaries themselves are the compiler's: each crate's manifest lists what it may use
//! (`ARCHITECTURE.md`).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The code lines of `path` (comment lines dropped), numbered from 1.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).expect("read");
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_owned()))
        .collect()
}

/// The module paths of the daemon crate `file` (below `src/`) refers to, resolved to
/// `crate::...` form: `crate::x`, and `super::` chains resolved against the file's own module.
fn references(file: &Path) -> Vec<(usize, String)> {
    let rel = file.strip_prefix(root().join("src")).expect("below src");
    let mut module: Vec<String> = rel.with_extension("").iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if module.last().is_some_and(|m| m == "mod" || m == "lib") {
        module.pop();
    }
    let mut out = Vec::new();
    for (n, line) in code_lines(file) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("crate::").into_iter().chain(rest.find("super::")).min() {
            let tail = &rest[at..];
            let (mut base, mut path) =
                if let Some(t) = tail.strip_prefix("crate::") { (Vec::new(), t) } else { (module.clone(), tail) };
            while let Some(t) = path.strip_prefix("super::") {
                base.pop();
                path = t;
            }
            let segs: Vec<&str> =
                path.split("::").map(|s| s.trim_matches(|c: char| !c.is_alphanumeric() && c != '_')).take(2).collect();
            let mut full = base;
            full.extend(segs.iter().filter(|s| !s.is_empty()).map(|s| (*s).to_owned()));
            out.push((n, full.join("::")));
            rest = &rest[at + 7..];
        }
    }
    out
}

/// Files of `area` (a directory or file below `src/`) that refer to one of `forbidden`.
fn violations(area: &str, forbidden: &[&str]) -> Vec<String> {
    let path = root().join("src").join(area);
    let files = if path.is_dir() { rust_files(&path) } else { vec![path] };
    let mut out = Vec::new();
    for f in files {
        for (n, r) in references(&f) {
            if forbidden.iter().any(|bad| r == *bad || r.starts_with(&format!("{bad}::"))) {
                out.push(format!("{}:{n}: refers to {r}", f.display()));
            }
        }
    }
    out
}

#[test]
fn the_planes_import_only_downward() {
    let cases: [(&str, &[&str]); 6] = [
        ("pipeline/data", &["pipeline::control", "pipeline::ops", "pipeline::supervisor"]),
        ("pipeline/control", &["pipeline::ops", "pipeline::supervisor"]),
        ("pipeline/ops", &["pipeline::supervisor"]),
        ("pipeline/lifecycle.rs", &["pipeline::data", "pipeline::control", "pipeline::ops"]),
        ("stage.rs", &["pipeline", "metrics", "config", "dump"]),
        ("metrics.rs", &["pipeline", "config", "dump"]),
    ];
    let mut all = Vec::new();
    for (area, forbidden) in cases {
        all.extend(violations(area, forbidden));
    }
    assert!(all.is_empty(), "wrong-way imports:\n{}", all.join("\n"));
    // The check sees what it must: data refers to the lifecycle leaf, control to data.
    assert!(!violations("pipeline/data", &["pipeline::lifecycle"]).is_empty(), "the reference scan finds nothing");
    assert!(!violations("pipeline/control", &["pipeline::data"]).is_empty(), "the reference scan finds nothing");
}

#[test]
fn config_and_dump_know_nothing_of_the_daemon() {
    let mut all = violations("config", &["pipeline", "metrics"]);
    all.extend(violations("dump.rs", &["pipeline", "metrics"]));
    assert!(all.is_empty(), "wrong-way imports:\n{}", all.join("\n"));
}

#[test]
fn unsafe_code_lives_in_minibatchd_sys_only() {
    let mut found = Vec::new();
    for dir in
        ["src", "crates/shm/src", "crates/engine/src", "crates/client/src", "crates/remote/src", "tests", "benches"]
    {
        for f in rust_files(&root().join(dir)) {
            if f.ends_with("tests/architecture.rs") {
                continue;
            }
            for (n, line) in code_lines(&f) {
                let code = line.split("//").next().unwrap_or("");
                if code.contains("unsafe ") || code.contains("unsafe{") {
                    found.push(format!("{}:{n}: {}", f.display(), line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "unsafe outside crates/sys:\n{}", found.join("\n"));
    let roots = [
        "src/lib.rs",
        "src/main.rs",
        "src/bin/gen.rs",
        "src/bin/parse_rate.rs",
        "crates/shm/src/lib.rs",
        "crates/engine/src/lib.rs",
        "crates/client/src/lib.rs",
        "crates/remote/src/lib.rs",
    ];
    for r in roots {
        let text = std::fs::read_to_string(root().join(r)).expect("crate root");
        assert!(text.contains("#![forbid(unsafe_code)]"), "{r} does not forbid unsafe code");
    }
    let sys = std::fs::read_to_string(root().join("crates/sys/src/lib.rs")).expect("sys");
    assert!(sys.contains("unsafe"), "the scan would not see unsafe code where it is");
}
