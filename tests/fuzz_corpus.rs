//! Replays the committed fuzz corpus (`tests/fuzz_corpus/<target>/`) on stable, without
//! libFuzzer: every input goes through the same function as its fuzz target (`fuzz/src/lib.rs`,
//! included here), which must not panic. See `docs/fuzzing.md`.

use std::path::Path;

#[allow(dead_code)] // `scratch_dir` is the fuzzer's; the replay passes its own temp dir
#[path = "../fuzz/src/lib.rs"]
mod harness;

/// Runs every file of `tests/fuzz_corpus/<target>/` through `body`; returns how many.
fn replay(target: &str, body: fn(&[u8], &Path)) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus").join(target);
    let scratch = tempfile::tempdir().expect("a temp dir");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    files.sort();
    for f in &files {
        let data = std::fs::read(f).expect("a corpus file");
        let outcome = std::panic::catch_unwind(|| body(&data, scratch.path()));
        assert!(outcome.is_ok(), "{target}: {} panicked", f.display());
    }
    assert!(!files.is_empty(), "{target}: empty corpus");
    files.len()
}

#[test]
fn ctf_index_corpus() {
    replay("ctf_index", harness::ctf_index);
}

#[test]
fn ctf_decode_corpus() {
    replay("ctf_decode", harness::ctf_decode);
}

#[test]
fn deepx_decode_corpus() {
    replay("deepx_decode", harness::deepx_decode);
}

#[test]
fn config_load_corpus() {
    replay("config_load", harness::config_load);
}

#[test]
fn protocol_corpus() {
    replay("protocol", harness::protocol);
}

#[test]
fn index_cache_corpus() {
    replay("index_cache", harness::index_cache);
}

#[test]
fn parsed_cache_corpus() {
    replay("parsed_cache", harness::parsed_cache);
}

#[test]
fn tfrecord_corpus() {
    replay("tfrecord", harness::tfrecord);
}

#[test]
fn tabular_corpus() {
    replay("tabular", harness::tabular);
}
