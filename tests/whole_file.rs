//! Whole files (issue 39: TensorFlow's `WholeFileReader`, `tf.io.read_file`) through the real
//! binary: every file of a dataset is one record whose `contents` are its bytes exactly —
//! binary, empty, larger than a chunk — and whose `path` names it; a randomized sweep gives every
//! file once, at every worker count; a file rewritten after its index was cached is served as it
//! is now; a file of 4 GiB or more, or past a sixteenth of `memory_limit_bytes`, is refused at its
//! index pass. (A file that changes while the
//! daemon serves it is an error naming it, for every format: `tests/hostile_files.rs`.)

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use support::{parse_dump, write};

/// Writes `n` files of varied contents (a JPEG's first bytes, text, empty, random) into
/// `dir/img`; returns their paths and bytes.
#[allow(clippy::cast_possible_truncation)] // bytes of patterns, reduced below 256
fn files(dir: &Path, n: usize) -> BTreeMap<String, Vec<u8>> {
    std::fs::create_dir_all(dir.join("img")).expect("mkdir");
    let mut out = BTreeMap::new();
    for i in 0..n {
        let bytes: Vec<u8> = match i % 4 {
            0 => [0xff, 0xd8, 0xff].iter().copied().chain((0..i * 37).map(|k| (k * 131 % 251) as u8)).collect(),
            1 => format!("text file {i}\n").into_bytes(),
            2 => Vec::new(),
            _ => (0..700 + i).map(|k| ((k * 7 + i) % 256) as u8).collect(),
        };
        let p = write(&dir.join("img"), &format!("f{i:03}.bin"), &bytes);
        out.insert(p.display().to_string(), bytes);
    }
    out
}

fn config(dir: &Path, extra: &str) -> std::path::PathBuf {
    write(
        dir,
        "c.toml",
        format!(
            "[daemon]\nstate_dir = \"{}\"\n[datasets.w]\nformat = \"whole_file\"\nfiles = [\"img/*.bin\"]\n{extra}\n",
            dir.join("state").display()
        ),
    )
}

/// (path, contents) of every record of `dump`'s minibatches, in order.
fn records(mbs: &[Value]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for m in mbs {
        let paths = m["streams"]["path"]["sequences"].as_array().expect("sequences");
        let contents = m["streams"]["contents"]["sequences"].as_array().expect("sequences");
        for (p, c) in paths.iter().zip(contents) {
            let (p, c) = (p.as_array().expect("samples"), c.as_array().expect("samples"));
            assert_eq!((p.len(), c.len()), (1, 1), "a file is one sample of each stream");
            out.push((String::from_utf8(support::dump_bytes(&p[0])).expect("utf-8 path"), support::dump_bytes(&c[0])));
        }
    }
    out
}

fn dump(config: &Path, args: &[&str]) -> Result<Vec<Value>, String> {
    let out = support::command("dump", config, "w").args(["--minibatch-size", "5"]).args(args).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(stderr);
    }
    parse_dump(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn every_file_is_one_record_of_its_exact_bytes_once_per_sweep_at_every_worker_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let want = files(dir.path(), 23);
    // Chunks of files, a window in samples: the shuffle spans the whole dataset.
    let c = config(dir.path(), "[datasets.w.sampling]\nwindow_samples = 100\n");
    let in_order = records(&dump(&c, &["--full-sweep", "--randomize", "false"]).expect("dump"));
    assert_eq!(in_order, want.clone().into_iter().collect::<Vec<_>>(), "file order, each file's bytes");
    for workers in 1..=3u32 {
        let mut seen = Vec::new();
        for w in 0..workers {
            let args =
                ["--max-sweeps", "1", "--seed", "9", "--workers", &workers.to_string(), "--rank", &w.to_string()];
            seen.extend(records(&dump(&c, &args).expect("dump")));
        }
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(sorted, want.clone().into_iter().collect::<Vec<_>>(), "{workers} workers: every file once");
        if workers == 1 {
            assert_ne!(seen, in_order, "randomized");
        }
    }
}

/// A file rewritten with other bytes of the same size after its index was cached: the next run
/// does not trust the cached index and serves the new bytes, never the old.
#[test]
fn a_file_rewritten_after_its_index_was_cached_is_served_as_it_is_now() {
    let dir = tempfile::tempdir().expect("tempdir");
    files(dir.path(), 4);
    let c = config(dir.path(), "");
    dump(&c, &["--full-sweep"]).expect("indexed and read");
    let p = dir.path().join("img/f003.bin");
    let mut bytes = std::fs::read(&p).expect("read");
    bytes[10] ^= 0xff;
    std::fs::write(&p, &bytes).expect("write");
    let got = records(&dump(&c, &["--full-sweep", "--randomize", "false"]).expect("dump"));
    assert_eq!(got[3], (p.display().to_string(), bytes));
}

#[test]
fn a_file_of_four_gib_or_more_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    files(dir.path(), 2);
    // A sparse file: no disk is used, and the size is refused before a byte is read.
    let f = std::fs::File::create(dir.path().join("img/huge.bin")).expect("create");
    f.set_len(4 << 30).expect("set_len");
    let err = dump(&config(dir.path(), ""), &["--full-sweep"]).expect_err("refused");
    assert!(
        err.contains("huge.bin") && err.contains("4 GiB at most") && err.contains("this one has 4294967296"),
        "{err}"
    );
}

/// A file larger than a sequence may be (a sixteenth of `memory_limit_bytes`) is refused at its
/// index pass, naming it and the limit, before it is read into memory.
#[test]
fn a_file_past_a_sixteenth_of_the_memory_limit_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    files(dir.path(), 2);
    write(&dir.path().join("img"), "big.bin", vec![7u8; 70_000]);
    let c = config(dir.path(), "");
    let text = std::fs::read_to_string(&c).expect("config");
    let c = write(dir.path(), "c.toml", text.replace("[datasets.w]", "memory_limit_bytes = 1048576\n[datasets.w]"));
    let err = dump(&c, &["--full-sweep"]).expect_err("refused");
    assert!(err.contains("big.bin") && err.contains("daemon.memory_limit_bytes / 16"), "{err}");
}

/// A `streams` table or `skip_sequence_ids` on a whole-file dataset is refused, naming the
/// format.
#[test]
fn streams_and_sequence_ids_are_refused_naming_the_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = write(
        dir.path(),
        "c.toml",
        "[datasets.w]\nformat = \"whole_file\"\nfiles = [\"img/*\"]\nskip_sequence_ids = true\n[datasets.w.streams]\n",
    );
    let out = std::process::Command::new(support::BIN).args(["validate", "--config"]).arg(&c).output().expect("run");
    let err = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("datasets.w.streams") && err.contains("streams are fixed (contents and path)"), "{err}");
    assert!(err.contains("datasets.w.skip_sequence_ids") && err.contains("whole_file has no sequence ids"), "{err}");
}
