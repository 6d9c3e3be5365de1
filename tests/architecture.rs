//! The layering rules the compiler cannot see inside one crate, checked on the source tree:
//!
//! * the daemon's planes import only downward — operations → control → data — and the leaf
//!   modules (`stage`, `pipeline::lifecycle`, `metrics`, `config`) import none of the planes;
//! * `unsafe` appears only in `crates/sys`, and every other crate root forbids it;
//! * in no crate do sibling modules refer to each other in a circle (`a` naming something of
//!   `b` and `b`, through any others, something of `a`), test code aside;
//! * no process-wide mutable state (a `static` atomic, lock or once-cell) outside the few places
//!   listed here with the reason it cannot be passed instead;
//! * no source file holds more than [`MAX_FILE_LINES`] lines before its tests, unless listed here
//!   with the reason it stays whole.
//!
//! Crate boundaries themselves are the compiler's: each crate's manifest lists what it may use
//! (`ARCHITECTURE.md`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The source directory of every crate of the workspace.
const CRATE_SOURCES: [&str; 7] = [
    "src",
    "crates/sys/src",
    "crates/shm/src",
    "crates/engine/src",
    "crates/client/src",
    "crates/remote/src",
    "crates/bench-tools/src",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file of the crates' sources, with its path from `root` (as the lists name it).
fn crate_files(root: &Path) -> Vec<(PathBuf, String)> {
    CRATE_SOURCES
        .iter()
        .flat_map(|src| rust_files(&root.join(src)))
        .map(|file| {
            let rel = file.strip_prefix(root).expect("below the root").to_string_lossy().into_owned();
            (file, rel)
        })
        .collect()
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
    let outside_sys = CRATE_SOURCES.iter().filter(|d| **d != "crates/sys/src");
    for dir in outside_sys.chain(&["tests", "benches"]) {
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
        "crates/bench-tools/src/bin/gen.rs",
        "crates/bench-tools/src/bin/parse_rate.rs",
        "crates/bench-tools/src/bin/bench_s3.rs",
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

/// The module of crate file `file` below `src` (`["format", "ctf", "scan"]`; `mod.rs` and the
/// crate roots name their directory).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("below the crate's src");
    let mut module: Vec<String> = rel.with_extension("").iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if module.last().is_some_and(|m| m == "mod" || m == "lib" || m == "main") {
        module.pop();
    }
    module
}

/// The module paths `line` names through `crate::`, `super::` or `self::`, resolved against
/// `module`, each with its first component after a `{` group expanded (`super::{a::X, b}` names
/// `super::a` and `super::b`).
fn named_paths(module: &[String], line: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut at = 0;
    while at < line.len() {
        let rest = &line[at..];
        let start = ["crate::", "super::", "self::"].iter().filter_map(|p| rest.find(p)).min();
        let Some(found) = start else { break };
        let begin = at + found;
        if begin > 0 && (ident(bytes[begin - 1] as char) || bytes[begin - 1] == b':') {
            at = begin + 1; // part of a longer path (`foo::super::`) or a name (`my_crate::`)
            continue;
        }
        let mut base: Vec<String> = if line[begin..].starts_with("crate::") { Vec::new() } else { module.to_vec() };
        let mut path = &line[begin..];
        if let Some(p) = path.strip_prefix("crate::") {
            path = p;
        } else if let Some(p) = path.strip_prefix("self::") {
            path = p;
        }
        while let Some(p) = path.strip_prefix("super::") {
            base.pop();
            path = p;
        }
        let mut full = base;
        loop {
            let name: String = path.chars().take_while(|&c| ident(c)).collect();
            if name.is_empty() {
                if let Some(group) = path.strip_prefix('{') {
                    // Each member of the group, as far as its first name.
                    let end = group.find('}').unwrap_or(group.len());
                    for member in group[..end].split(',') {
                        let first: String = member.trim().chars().take_while(|&c| ident(c)).collect();
                        if !first.is_empty() && first != "self" {
                            let mut p = full.clone();
                            p.push(first);
                            out.push(p);
                        }
                    }
                }
                break;
            }
            path = &path[name.len()..];
            full.push(name);
            match path.strip_prefix("::") {
                Some(p) => path = p,
                None => break,
            }
        }
        out.push(full);
        at = begin + 1;
    }
    out
}

/// The child modules of each module of the crate at `src`, from its files (`x.rs`, `x/mod.rs`).
fn child_modules(src: &Path) -> std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<String>> {
    let mut out = std::collections::BTreeMap::<Vec<String>, std::collections::BTreeSet<String>>::new();
    for f in rust_files(src) {
        let mut m = module_of(src, &f);
        if let Some(last) = m.pop() {
            out.entry(m).or_default().insert(last);
        }
    }
    out
}

/// Cycles between sibling modules of the crate at `src`: for each module, the edges "child `a`
/// refers to child `b`" (any file inside `a` naming anything inside `b`), and every set of
/// children that refer to each other in a circle (a strongly connected component of two or more),
/// with one line that makes each edge.
fn sibling_cycles(src: &Path) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let children = child_modules(src);
    // parent -> (from, to) -> an example "file:line"
    let mut edges: BTreeMap<Vec<String>, BTreeMap<(String, String), String>> = BTreeMap::new();
    for f in rust_files(src) {
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        if name == "tests" || name.ends_with("_tests") {
            continue; // tests may reach anywhere: they are no module's dependency
        }
        let module = module_of(src, &f);
        for (n, line) in code_lines(&f).into_iter().take_while(|(_, l)| l.trim_end() != "#[cfg(test)]") {
            let code = line.split("//").next().unwrap_or("");
            for target in named_paths(&module, code) {
                let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common >= module.len() || common >= target.len() {
                    continue; // a module and its own ancestors or descendants
                }
                let parent = module[..common].to_vec();
                let (from, to) = (&module[common], &target[common]);
                if children.get(&parent).is_some_and(|c| c.contains(to)) {
                    edges
                        .entry(parent)
                        .or_default()
                        .entry((from.clone(), to.clone()))
                        .or_insert_with(|| format!("{}:{n}", f.display()));
                }
            }
        }
    }
    let mut out = Vec::new();
    for (parent, e) in &edges {
        let nodes: BTreeSet<&String> = e.keys().flat_map(|(a, b)| [a, b]).collect();
        // Reachability by repeated relaxation (the graphs are small).
        let reach = |from: &String| -> BTreeSet<&String> {
            let mut seen: BTreeSet<&String> = BTreeSet::new();
            let mut stack = vec![from];
            while let Some(x) = stack.pop() {
                for (a, b) in e.keys() {
                    if a == x && seen.insert(b) {
                        stack.push(b);
                    }
                }
            }
            seen
        };
        let mut done: BTreeSet<&String> = BTreeSet::new();
        for &x in &nodes {
            if done.contains(x) {
                continue;
            }
            let from_x = reach(x);
            let component: BTreeSet<&String> = nodes
                .iter()
                .copied()
                .filter(|&y| y == x && from_x.contains(x) || from_x.contains(y) && reach(y).contains(x))
                .collect();
            done.extend(component.iter().copied());
            if component.len() > 1 {
                let at = if parent.is_empty() { "the crate root".to_owned() } else { parent.join("::") };
                let names: Vec<&str> = component.iter().map(|s| s.as_str()).collect();
                let mut text = format!("in {at}: {}", names.join(" <-> "));
                for ((a, b), place) in e {
                    if component.contains(a) && component.contains(b) {
                        let _ = write!(text, "\n    {a} -> {b} ({place})");
                    }
                }
                out.push(text);
            }
        }
    }
    out
}

#[test]
fn the_cycle_check_finds_a_cycle_through_a_use_group_and_ignores_tests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").expect("write");
    std::fs::write(src.join("a/mod.rs"), "mod inner;\n").expect("write");
    std::fs::write(src.join("a/inner.rs"), "use super::super::{b::B, c};\n").expect("write");
    std::fs::write(src.join("b.rs"), "pub struct B;\n#[cfg(test)]\nmod tests { use crate::c::C; }\n").expect("write");
    std::fs::write(src.join("c.rs"), "pub struct C(crate::a::X);\n").expect("write");
    let found = sibling_cycles(src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("in the crate root: a <-> c"), "{found:?}");
    assert!(!found[0].contains("b ->"), "test code is no dependency: {found:?}");
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut all = Vec::new();
    for src in CRATE_SOURCES {
        all.extend(sibling_cycles(&root().join(src)));
    }
    assert!(all.is_empty(), "modules that refer to each other in a circle:\n{}", all.join("\n"));
}

/// The non-test lines of `path`: those before its first `#[cfg(test)]`; none for a file of tests.
fn non_test_lines(path: &Path) -> Vec<String> {
    let is_test_file = path.file_name().is_some_and(|n| n == "tests.rs" || n == "proptests.rs")
        || path.components().any(|c| c.as_os_str() == "tests");
    if is_test_file {
        return Vec::new();
    }
    let text = std::fs::read_to_string(path).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    // Up to the inline test module; a `#[cfg(test)]` that declares a test file (`mod tests;`) is
    // skipped, not taken for the end (found in review: a file declaring its tests at the top
    // counted 36 of its 881 lines).
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.starts_with("#[cfg(test)]") {
            let next = lines.get(i + 1).map_or("", |n| n.trim());
            if next.starts_with("mod ") && next.ends_with(';') {
                i += 2;
                continue;
            }
            break;
        }
        out.push(l.to_owned());
        i += 1;
    }
    out
}

/// Process-wide mutable state that stays, each with why it cannot be passed: (file, static).
const ALLOWED_STATICS: [(&str, &str, &str); 11] = [
    ("crates/sys/src/memory.rs", "FREED", "bytes freed into the allocator's heaps, which are the process's"),
    ("crates/sys/src/lease.rs", "WAKE", "the SIGIO handler's pipe: a signal handler reaches only statics"),
    ("crates/sys/src/lease.rs", "SETUP", "the one SIGIO handler of the process"),
    ("crates/sys/src/lease.rs", "GUARDED", "the mappings a lease break (a process-wide signal) may concern"),
    ("crates/sys/src/lease.rs", "REVOKED", "counted by the lease thread, which serves the whole process"),
    ("crates/sys/src/lease.rs", "HELD", "leases held by the process, bounded by its descriptor limit"),
    ("crates/sys/src/lease.rs", "MAX", "the process's descriptor limit, read once"),
    ("crates/sys/src/simd.rs", "HAS", "whether this CPU has the instructions: a fact of the machine, detected once"),
    ("crates/sys/src/crc32c.rs", "HAS", "whether this CPU has SSE 4.2: a fact of the machine, detected once"),
    ("src/pipeline/data/producer.rs", "NEXT_PRODUCER", "ids unique in the process, so none is reused"),
    (
        "crates/sys/src/files.rs",
        "HAS",
        "whether the kernel has multigrain timestamps: a fact of the machine, read once",
    ),
];

/// Statics of mutable process state (atomics, locks, once-cells) in `path`'s non-test lines.
fn mutable_statics(path: &Path) -> Vec<String> {
    const KINDS: [&str; 6] = ["Atomic", "Mutex", "RwLock", "OnceLock", "LazyLock", "OnceCell"];
    non_test_lines(path)
        .iter()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix("pub ").unwrap_or(l.trim_start());
            let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
            let (name, ty) = rest.strip_prefix("static ")?.split_once(':')?;
            KINDS.iter().any(|k| ty.contains(k)).then(|| name.trim().to_owned())
        })
        .collect()
}

#[test]
fn no_process_wide_mutable_state_but_what_is_listed() {
    let root = root();
    let mut found = Vec::new();
    for (file, rel) in crate_files(&root) {
        for name in mutable_statics(&file) {
            if !ALLOWED_STATICS.iter().any(|(f, n, _)| *f == rel && *n == name) {
                found.push(format!("{rel}: static {name}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "process-wide mutable state: pass it instead (or list it in ALLOWED_STATICS with why it cannot be):\n{}",
        found.join("\n")
    );
    // The check sees what it looks for: every listed static is found where it is listed.
    for (file, name, _) in ALLOWED_STATICS {
        assert!(mutable_statics(&root.join(file)).iter().any(|n| n == name), "{file}: {name} no longer there");
    }
}

/// The most lines a source file holds before its tests.
const MAX_FILE_LINES: usize = 600;

/// Files that stay whole past [`MAX_FILE_LINES`], with why.
const LONG_FILES: [(&str, &str); 1] =
    [("crates/client/src/protocol.rs", "the wire contract, every message and its framing, read in one place")];

#[test]
fn no_source_file_is_longer_than_the_limit_but_those_listed() {
    let root = root();
    let mut long = Vec::new();
    for (file, rel) in crate_files(&root) {
        let n = non_test_lines(&file).len();
        if n > MAX_FILE_LINES && !LONG_FILES.iter().any(|(f, _)| *f == rel) {
            long.push(format!("{rel}: {n} lines before its tests"));
        }
    }
    assert!(
        long.is_empty(),
        "split these by what they do (or list them with why they stay whole):\n{}",
        long.join("\n")
    );
    for (file, _) in LONG_FILES {
        assert!(non_test_lines(&root.join(file)).len() > MAX_FILE_LINES, "{file} is short now: unlist it");
    }
}
