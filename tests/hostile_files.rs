//! Issue #15, items 1 and the file-permission part of 4/5: what the real binary writes and reads
//! back under `state_dir` when other local users are hostile — a planted copy in a shared
//! temporary directory, sprayed symbolic links, a group-writable state directory under
//! `UMask=0007`, a rewritten decompressed copy, a gzip bomb. Each test is named after the
//! finding and failed on the code before the fix.

mod support;

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use minibatchd_engine::format::index_cache::FileStamp;
use minibatchd_engine::hash::Fnv1a;
use support::{parse_dump, write, BIN};

/// 200 libsvm instances: `label feature:value`.
fn libsvm_text() -> String {
    let mut text = String::new();
    for i in 0..200u32 {
        let _ = writeln!(text, "{} {}:{}.5", i % 2, i % 17, i % 50);
    }
    text
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("compress");
    e.finish().expect("finish")
}

/// A config in `dir` with one libsvm dataset `d` reading `data.gz`, state in `dir/state`.
fn write_config(dir: &Path, daemon_extra: &str) -> PathBuf {
    write(
        dir,
        "minibatchd.toml",
        format!(
            "[daemon]\nsocket = \"mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"state\"\n{daemon_extra}\n\
             [datasets.d]\nformat = \"libsvm\"\nfiles = [\"data.gz\"]\nchunk_size_bytes = 512\n\
             [datasets.d.sampling]\nrandomize = false\n"
        ),
    )
}

/// `minibatchd dump` of dataset `d`, in file order, every instance once; `env` added.
fn dump(config: &Path, env: &[(&str, &Path)]) -> Output {
    let mut c = support::command("dump", config, "d");
    c.args(["--minibatch-size", "50", "--full-sweep"]).env("MINIBATCHD_LOG", "error");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run minibatchd dump")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "dump failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout.clone()).expect("utf-8");
    assert_eq!(parse_dump(&text).expect("dump output").len(), 4, "{text}");
    text
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display())).mode() & 0o7777
}

/// The files (not directories) below `dir`, recursively.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("ls") {
        let p = e.expect("entry").path();
        if std::fs::symlink_metadata(&p).expect("stat").is_dir() {
            out.extend(files_below(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The decompressed copy in `state/inflated/` (the one file without the sidecar suffix).
fn the_copy(state: &Path) -> PathBuf {
    let copies: Vec<PathBuf> =
        files_below(&state.join("inflated")).into_iter().filter(|p| !p.to_string_lossy().ends_with(".meta")).collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    copies.into_iter().next().expect("a copy")
}

/// The name the code before the fix gave the copy of `source` in
/// `$TMPDIR/minibatchd-inflated/` (what the attacker predicted).
fn predicted_name(source: &Path) -> String {
    let hash_parts = |parts: &[&[u8]]| {
        let mut h = Fnv1a::new();
        for part in parts {
            h.write(part);
            h.write(&[0xff]);
        }
        h.finish()
    };
    let s = FileStamp::of(source).expect("stamp");
    let name = s.path.file_name().expect("name").to_string_lossy().into_owned();
    let path_hash = hash_parts(&[s.path.as_os_str().as_encoded_bytes()]);
    let stamp_hash = {
        let mut h = Fnv1a::new();
        s.hash_version(&mut h);
        h.finish()
    };
    format!("{name}.{path_hash:016x}.{stamp_hash:016x}")
}

/// Finding: with `state_dir/inflated` not writable, the copy went to
/// `$TMPDIR/minibatchd-inflated/` under a predictable name, and another user's planted copy there
/// was served as the dataset.
#[test]
fn gzip_never_uses_a_shared_temp_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = write(dir.path(), "data.gz", gz(libsvm_text().as_bytes()));
    let config = write_config(dir.path(), "");
    // `state/inflated` cannot be a directory (a file is in the way), whoever runs the test (root
    // included, whom permission bits do not stop).
    std::fs::create_dir(dir.path().join("state")).expect("mkdir");
    write(&dir.path().join("state"), "inflated", "");
    let shared = dir.path().join("tmp");
    let planted_dir = shared.join("minibatchd-inflated");
    std::fs::create_dir_all(&planted_dir).expect("mkdir");
    write(&planted_dir, &predicted_name(&data), "1 99:66.5\n".repeat(200));

    let out = dump(&config, &[("TMPDIR", &shared)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "dump served something");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("66.5"), "the planted copy was served");
    for part in ["data.gz", "state/inflated", "state_dir"] {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(&planted_dir).expect("ls").collect();
    assert_eq!(left.len(), 1, "nothing is created in the shared directory");
}

/// Finding: with sprayed symbolic links, the victim's `dump` overwrote a file in the victim's
/// home. Links at the copy's name, its sidecar's name and the index cache directory are never
/// followed: the copy is written beside them, the victim's file is untouched.
#[test]
fn a_planted_symlink_is_never_followed_when_writing_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = write(dir.path(), "data.gz", gz(libsvm_text().as_bytes()));
    let config = write_config(dir.path(), "");
    let expected = ok(&dump(&config, &[]));
    let state = dir.path().join("state");
    let copy = the_copy(&state);
    std::fs::remove_dir_all(&state).expect("rm");

    let victim = write(dir.path(), "victim", "1 3:7.5\n".repeat(200));
    let inflated = state.join("inflated");
    std::fs::create_dir_all(&inflated).expect("mkdir");
    let name = copy.file_name().expect("name").to_string_lossy().into_owned();
    std::os::unix::fs::symlink(&victim, inflated.join(&name)).expect("symlink");
    std::os::unix::fs::symlink(&victim, inflated.join(format!("{name}.meta"))).expect("symlink");
    // The index directory is a link to a directory of the victim.
    let victims_dir = dir.path().join("victims-dir");
    std::fs::create_dir(&victims_dir).expect("mkdir");
    std::os::unix::fs::symlink(&victims_dir, state.join("index")).expect("symlink");

    assert!(ok(&dump(&config, &[])) == expected, "the linked file was served");
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "1 3:7.5\n".repeat(200));
    assert!(std::fs::read_dir(&victims_dir).expect("ls").next().is_none(), "written through the link");
    assert!(std::fs::symlink_metadata(inflated.join(&name)).expect("stat").is_file());
    assert!(data.exists());
}

/// Finding: under the unit's `UMask=0007`, `inflated/` and `index/` were group-writable. Run
/// under `umask 000`: every directory minibatchd creates is 0700 and every file 0600, for `dump`
/// (index cache, decompressed copy, sidecar) and for the daemon (checkpoint, `metrics.addr`).
#[test]
fn state_files_are_private_whatever_the_umask() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "data.gz", gz(libsvm_text().as_bytes()));
    let config = write_config(dir.path(), "");
    let state = dir.path().join("state");
    let umask0 = |args: &[&str]| {
        let mut c = Command::new("sh");
        c.args(["-c", "umask 000 && exec \"$0\" \"$@\"", BIN]).args(args).arg("--config").arg(&config);
        c.env("MINIBATCHD_LOG", "error").env_remove("NOTIFY_SOCKET");
        c
    };
    let out = umask0(&["dump", "--dataset", "d", "--minibatch-size", "50", "--full-sweep"]).output().expect("dump");
    ok(&out);
    for sub in ["index", "inflated", "parsed"] {
        assert_eq!(mode(&state.join(sub)), 0o700, "{sub}/");
    }
    assert_eq!(mode(&state) & 0o022, 0, "state_dir is writable by group or others");
    let files = files_below(&state);
    let parsed = files.iter().filter(|f| f.starts_with(state.join("parsed"))).count();
    assert!(parsed >= 1, "no persisted parsed chunk: {files:?}");
    assert_eq!(files.len() - parsed, 3, "index cache, copy, sidecar, and persisted parsed chunks: {files:?}");
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }

    // A directory an older version left group-writable is made private again.
    std::fs::set_permissions(state.join("inflated"), std::fs::Permissions::from_mode(0o770)).expect("chmod");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    ok(&umask0(&["dump", "--dataset", "d", "--minibatch-size", "50", "--full-sweep"]).output().expect("dump"));
    assert_eq!(mode(&state.join("inflated")), 0o700);
    assert_eq!(mode(&state), 0o755);

    // The daemon: its checkpoint and metrics.addr.
    let mut child = umask0(&["run"]).spawn().expect("run");
    let start = Instant::now();
    let (ckpt, addr) = (state.join("checkpoint.json"), state.join("metrics.addr"));
    while !(ckpt.exists() && addr.exists()) {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("the daemon exited: {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no checkpoint and metrics.addr");
        std::thread::sleep(Duration::from_millis(50));
    }
    let modes = (mode(&ckpt), mode(&addr));
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).expect("pid")).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let status = child.wait().expect("wait");
    assert_eq!(modes, (0o600, 0o600), "checkpoint.json, metrics.addr");
    assert!(status.success(), "{status}");
    for f in files_below(&state) {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
}

/// Finding: a trainer rewrote a decompressed copy at the same size, and the daemon served the
/// altered values after a restart.
#[test]
fn a_tampered_inflated_copy_is_not_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "data.gz", gz(libsvm_text().as_bytes()));
    let config = write_config(dir.path(), "");
    let expected = ok(&dump(&config, &[]));
    let copy = the_copy(&dir.path().join("state"));
    let original = std::fs::read(&copy).expect("read");
    // What a group member could do under UMask=0007: rewrite the copy, same size, other values.
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o660)).expect("chmod");
    let altered: Vec<u8> = original.iter().map(|&b| if b == b'5' { b'6' } else { b }).collect();
    assert_ne!(altered, original);
    std::fs::write(&copy, &altered).expect("rewrite");

    assert!(ok(&dump(&config, &[])) == expected, "the altered copy was served");
    assert!(std::fs::read(&copy).expect("read") == original, "not decompressed again");
    assert_eq!(mode(&copy), 0o600);

    // The same rewrite by the owner, keeping the mode: the recorded mtime no longer matches.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&copy, &altered).expect("rewrite");
    assert!(ok(&dump(&config, &[])) == expected, "the altered copy was served");
}

/// Finding: a 3 MB gzip bomb made a 2 GB copy. The ratio stops a bomb with the default config,
/// the absolute cap (`max_inflated_bytes`) any file, and no partial copy is left.
#[test]
fn a_gzip_bomb_stops_at_the_inflation_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 16 MiB of one repeated instance: about 1000× smaller compressed, far beyond the ratio.
    write(dir.path(), "data.gz", gz(&"1 1:1\n".repeat((16 << 20) / 6).into_bytes()));
    let config = write_config(dir.path(), "");
    let out = dump(&config, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bomb was decompressed");
    assert!(stderr.contains("data.gz") && stderr.contains("daemon.max_inflate_ratio"), "{stderr}");
    assert!(files_below(&dir.path().join("state/inflated")).is_empty(), "a partial copy is left");

    write(dir.path(), "data.gz", gz(libsvm_text().as_bytes()));
    let capped = write_config(dir.path(), "max_inflated_bytes = 1000");
    let out = dump(&capped, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "beyond the cap");
    assert!(stderr.contains("data.gz: decompresses to more than daemon.max_inflated_bytes (1000 bytes)"), "{stderr}");
    assert!(files_below(&dir.path().join("state/inflated")).is_empty(), "a partial copy is left");
    ok(&dump(&write_config(dir.path(), "max_inflated_bytes = 1000000"), &[]));
}

/// #15 item 6: a data file rewritten in place at the same size was read with the offsets of its
/// old index and served as the same data. A chunk is now read only from the file as it was
/// indexed; the dataset says it is no longer current (a reload opens it again).
#[test]
fn a_data_file_rewritten_since_it_was_indexed_is_never_read_with_the_old_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = "[datasets.d]\nformat = \"ctf\"\nfiles = [\"d.ctf\"]\ncache_index = false\nchunk_size_bytes = 12\n\
                [datasets.d.streams.a]\ndim = 1\nformat = \"dense\"\n";
    let data = write(dir.path(), "d.ctf", "|a 1\n|a 2\n|a 3\n|a 4\n");
    let state = dir.path().join("state");
    let ds = support::open(toml, "d", dir.path(), &state);
    assert!(ds.is_current());
    ds.load_chunk(0).expect("the file as indexed");
    // Same size, other lines: the old offsets would cut the new lines anywhere.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&data, "|a 10\n|a 2\n|a 3\n|a4\n").expect("rewrite");
    assert!(!ds.is_current(), "a rewritten file is noticed");
    let e = ds.load_chunk(1).expect_err("not read with the old index").to_string();
    assert!(e.contains("d.ctf") && e.contains("rewritten in place (same size"), "{e}");
    // Replaced by another file (rename over it).
    let ds = support::open(toml, "d", dir.path(), &state);
    let other = write(dir.path(), "other.ctf", "|a 5\n|a 6\n|a 7\n|a 8\n");
    std::fs::rename(&other, &data).expect("replace");
    let e = ds.load_chunk(0).expect_err("another file").to_string();
    assert!(e.contains("replaced by another file"), "{e}");
    // Opened again, it reads the new file.
    let ds = support::open(toml, "d", dir.path(), &state);
    assert!(ds.is_current());
    ds.load_chunk(0).expect("the new version");
}

/// Found by a hostile probe: a chunk served from the parsed cache skipped the version check a
/// read of the file makes, so after a rewrite (no SIGHUP) new sessions got the old data without a
/// word while a chunk parsed again failed; and a `.gz` input replaced was not noticed at all (its
/// decompressed copy was what was checked). Now the parsed cache's entries are served only while
/// the files are as indexed, and a new session on a dataset whose files changed is refused at
/// `open` with `data_error` naming the file.
#[test]
fn a_changed_file_is_served_neither_from_the_parsed_cache_nor_to_new_sessions() {
    use minibatchd_client::protocol::{ErrorCode, SessionOptions};
    use minibatchd_client::ClientError;
    use minibatchd_engine::dataset::Persist;
    use minibatchd_engine::format::parsed_cache::ParsedCache;
    use std::sync::Arc;
    use support::daemon::{options, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = "[datasets.d]\nformat = \"ctf\"\nfiles = [\"d.ctf\"]\ncache_index = false\nchunk_size_bytes = 12\n\
                [datasets.d.streams.a]\ndim = 1\nformat = \"dense\"\n";
    let data = write(dir.path(), "d.ctf", "|a 1\n|a 2\n|a 3\n|a 4\n");
    let state = dir.path().join("state");
    let cache = Arc::new(ParsedCache::open(&dir.path().join("parsed"), 1 << 20).expect("cache"));
    let mut first = support::open(toml, "d", dir.path(), &state);
    first.use_parsed_cache(cache.clone(), Persist::OnLoad);
    let chunks = first.chunks().len();
    (0..chunks).for_each(|c| drop(first.load_chunk(c).expect("parsed and persisted")));
    let mut ds = support::open(toml, "d", dir.path(), &state);
    ds.use_parsed_cache(cache.clone(), Persist::OnLoad);
    ds.load_chunk(0).expect("a hit");
    assert_eq!(cache.stats().hits, 1);
    ds.files_unchanged().expect("as indexed");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&data, "|a 9\n|a 8\n|a 7\n|a 6\n").expect("rewrite at the same size");
    for c in 0..chunks {
        let e = ds.load_chunk(c).expect_err("not served as the file no longer is").to_string();
        assert!(e.contains("d.ctf") && e.contains("since it was indexed"), "{e}");
    }
    assert_eq!(cache.stats().hits, 1 + chunks as u64, "found, and refused");
    let e = ds.files_unchanged().expect_err("changed").to_string();
    assert!(e.contains("d.ctf") && e.contains("rewritten in place"), "{e}");

    // A `.gz` input replaced under a running daemon: the next session is refused, and after a
    // reload it reads the new content.
    let p = dir.path();
    let gz_path = write(p, "data.gz", gz(b"1 1:1\n0 2:1\n1 3:1\n"));
    support::daemon::write_config(
        p,
        "ring_slots = 2\nslot_size_bytes = 65536\n",
        &format!(
            "[datasets.g]\nformat = \"libsvm\"\nfiles = [\"{}\"]\n[datasets.g.sampling]\nrandomize = false\n",
            gz_path.display()
        ),
    );
    let daemon = Daemon::start(p, &[]);
    let opts = SessionOptions { full_sweep: true, ..options(1) };
    let before = daemon.read_all("g", &opts, &["__instX"]);
    let other = write(p, "other.gz", gz(b"0 7:1\n1 8:1\n0 9:1\n"));
    std::fs::rename(&other, &gz_path).expect("replace");
    match daemon.client().open("g", &opts) {
        Err(ClientError::Daemon { code, message, .. }) => {
            assert_eq!(code, ErrorCode::DataError);
            assert!(message.contains("data.gz") && message.contains("since it was indexed"), "{message}");
        }
        other => panic!("a session on a replaced .gz input: {:?}", other.map(|_| ())),
    }
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    assert_ne!(daemon.read_all("g", &opts, &["__instX"]), before, "the new content after a reload");
    drop(daemon);

    // A `.gz` input's decompressed copy rewritten (its `.gz` as it was): no new session on it,
    // and the dataset is not current, so a reload opens it again.
    let gtoml = format!("[datasets.g]\nformat = \"libsvm\"\nfiles = [\"{}\"]\n", gz_path.display());
    let copies = dir.path().join("copies");
    let g = support::open(&gtoml, "g", dir.path(), &copies);
    g.files_unchanged().expect("as indexed");
    assert!(g.is_current());
    let copy = the_copy(&copies);
    std::thread::sleep(Duration::from_millis(20));
    let text = std::fs::read(&copy).expect("the copy");
    std::fs::write(&copy, text).expect("rewrite the copy");
    assert!(!g.is_current(), "a reload must open it again");
    assert!(g.files_unchanged().is_err());
}

/// Found by a hostile probe: a file added to a directory dataset was left out of every new
/// session's sweep until a reload, without a word (a file removed or replaced was refused). Now
/// the directory's and the glob's matches are listed at `open`: a new file refuses new sessions,
/// naming it, until a reload indexes it; a reload then serves it.
#[test]
fn a_file_added_to_a_directory_dataset_refuses_new_sessions_until_a_reload() {
    use minibatchd_client::protocol::{ErrorCode, SessionOptions};
    use minibatchd_client::ClientError;
    use support::daemon::{options, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let parts = p.join("parts");
    std::fs::create_dir(&parts).expect("mkdir");
    write(&parts, "a.svm", "1 1:1\n0 2:1\n");
    write(&parts, "b.svm", "1 3:1\n");
    write(p, "c.svm", "0 4:1\n");
    let toml = "[datasets.dir]\nformat = \"libsvm\"\nfiles = [\"parts\"]\n\
                [datasets.glob]\nformat = \"libsvm\"\nfiles = [\"*.svm\"]\n";
    let state = p.join("state");
    let by_dir = support::open(toml, "dir", p, &state);
    let by_glob = support::open(toml, "glob", p, &state);
    by_dir.files_unchanged().expect("as indexed");
    by_glob.files_unchanged().expect("as indexed");
    write(&parts, "new.svm", "1 5:1\n");
    write(p, "d.svm", "1 6:1\n");
    let e = by_dir.files_unchanged().expect_err("a file more in the directory").to_string();
    assert!(e.contains("new.svm is new") && e.contains("3 files now, 2 when indexed"), "{e}");
    let e = by_glob.files_unchanged().expect_err("a file more matches the glob").to_string();
    assert!(e.contains("d.svm is new"), "{e}");
    std::fs::remove_file(parts.join("new.svm")).expect("rm");
    by_dir.files_unchanged().expect("the same files again");

    // With the daemon: refused with data_error, then served after a reload.
    support::daemon::write_config(
        p,
        "ring_slots = 2\nslot_size_bytes = 65536\n",
        &format!(
            "[datasets.dir]\nformat = \"libsvm\"\nfiles = [\"{}\"]\n[datasets.dir.sampling]\nrandomize = false\n",
            parts.display()
        ),
    );
    let daemon = Daemon::start(p, &[]);
    let opts = SessionOptions { full_sweep: true, ..options(1) };
    assert_eq!(daemon.read_all("dir", &opts, &["__instX"]).len(), 3);
    write(&parts, "new.svm", "1 5:1\n");
    match daemon.client().open("dir", &opts) {
        Err(ClientError::Daemon { code, message, .. }) => {
            assert_eq!(code, ErrorCode::DataError);
            assert!(message.contains("new.svm is new"), "{message}");
        }
        other => panic!("a session on a directory with a file more: {:?}", other.map(|_| ())),
    }
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    assert_eq!(daemon.read_all("dir", &opts, &["__instX"]).len(), 4, "the new file after a reload");
}

/// #15 item 6, with the daemon: after a data file is rewritten, SIGHUP opens the dataset again
/// (its configuration did not change, its files did), and new sessions read the new file —
/// never its bytes through the old index, nor the old chunks from the cache.
#[test]
fn a_reload_indexes_again_a_dataset_whose_file_changed() {
    use support::daemon::{options, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let data = write(p, "d.ctf", "|a 1\n|a 2\n|a 3\n|a 4\n");
    let d = p.display();
    write(
        p,
        "minibatchd.toml",
        format!(
            "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
             ring_slots = 2\nslot_size_bytes = 65536\n[datasets.d]\nformat = \"ctf\"\nfiles = [\"{}\"]\n\
             chunk_size_bytes = 12\n[datasets.d.streams.a]\ndim = 1\nformat = \"dense\"\n",
            data.display()
        ),
    );
    let daemon = Daemon::start(p, &[]);
    let opts = minibatchd_client::protocol::SessionOptions { full_sweep: true, randomize: Some(false), ..options(1) };
    let read_all = || daemon.read_all("d", &opts, &["a"]);
    let before = read_all();
    assert_eq!(before, daemon.dump("d", &["--minibatch-size", "1", "--full-sweep", "--randomize", "false"]));
    // The first version's chunks persisted (in the background, once no session waits).
    let parsed = p.join("state/parsed");
    let entries = || -> Vec<String> {
        std::fs::read_dir(&parsed)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    // Every chunk of it (two), so that no write of the first version is still under way.
    let start = Instant::now();
    while entries().len() < 2 {
        assert!(start.elapsed() < support::daemon::DEADLINE, "not every chunk persisted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let first_version = entries();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&data, "|a 7\n|a 8\n|a 9\n|a 5\n").expect("rewrite at the same size");
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    let after = read_all();
    assert_eq!(after, daemon.dump("d", &["--minibatch-size", "1", "--full-sweep", "--randomize", "false"]));
    assert_ne!(after, before, "the new file's values");
    // Found by a probe: the replaced version's entries stayed until the cache's bound pushed
    // them out (294 MB after 573 rewrites of a 760 KB file). They go with the reload.
    let now = entries();
    assert!(first_version.iter().all(|e| !now.contains(e)), "{first_version:?} still in {now:?}");
}

/// Found by a hostile probe: after a reload failed to index a changed file (emptied), every
/// `open` was refused with the file's change and told to send SIGHUP — the reload that had just
/// failed — without why. The refusal now says why the last reload could not index it.
#[test]
fn a_session_refused_after_a_failed_reload_is_told_why_it_failed() {
    use minibatchd_client::protocol::{ErrorCode, SessionOptions};
    use minibatchd_client::ClientError;
    use support::daemon::{options, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let data = write(p, "d.svm", libsvm_text());
    support::daemon::write_config(
        p,
        "ring_slots = 2\nslot_size_bytes = 65536\n",
        &format!("[datasets.d]\nformat = \"libsvm\"\nfiles = [\"{}\"]\n", data.display()),
    );
    let daemon = Daemon::start(p, &[]);
    let opts = SessionOptions { full_sweep: true, ..options(8) };
    assert!(!daemon.read_all("d", &opts, &["__instX"]).is_empty());
    std::fs::write(&data, "").expect("empty the file");
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    match daemon.client().open("d", &opts) {
        Err(ClientError::Daemon { code, message, .. }) => {
            assert_eq!(code, ErrorCode::DataError);
            assert!(
                message.contains("the last reload could not index it again") && message.contains("no sequence"),
                "{message}"
            );
        }
        other => panic!("a session on an emptied file: {:?}", other.map(|_| ())),
    }
    // Found by a probe: such a reload was counted a success, and the gauge said 1.
    let (_, metrics) = support::daemon::http_get(&p.join("state"), "/metrics").expect("/metrics");
    assert!(metrics.contains("minibatchd_config_reloads_total{result=\"partial\"} 1"), "{metrics}");
    assert!(metrics.contains("minibatchd_config_last_reload_successful 0"), "{metrics}");
}

/// Found by a probe: a reload whose changed configuration of a dataset failed to open (its files
/// unchanged: the old version serves on) gave new sessions the old version, told nothing. They
/// are now warned, until a reload puts a configuration that opens in force.
#[test]
fn a_session_on_the_version_before_a_failed_reload_is_warned() {
    use support::daemon::{options, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // An empty CTF file is fatal to its dataset's index pass.
    let data = write(p, "d.ctf", support::daemon::train_ctf());
    write(p, "empty.ctf", "");
    let table = |files: &str| {
        format!(
            "[datasets.d]\nformat = \"ctf\"\nfiles = [{files}]\n{}",
            support::daemon::TRAIN_STREAMS_TOML.replace("datasets.train", "datasets.d")
        )
    };
    let good = table(&format!("\"{}\"", data.display()));
    support::daemon::write_config(p, "ring_slots = 2\nslot_size_bytes = 65536\n", &good);
    let daemon = Daemon::start(p, &[]);
    let told = |s: &minibatchd_client::Session| {
        s.warnings.iter().any(|w| w.contains("could not be opened at the last reload"))
    };
    assert!(!told(&daemon.client().open("d", &options(8)).expect("open")));
    let bad = table(&format!("\"{}\", \"{}\"", data.display(), p.join("empty.ctf").display()));
    support::daemon::write_config(p, "ring_slots = 2\nslot_size_bytes = 65536\n", &bad);
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    let s = daemon.client().open("d", &options(8)).expect("the old version opens");
    assert!(told(&s), "{:?}", s.warnings);
    drop(s);
    support::daemon::write_config(p, "ring_slots = 2\nslot_size_bytes = 65536\n", &good);
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(2);
    assert!(!told(&daemon.client().open("d", &options(8)).expect("open")), "its configuration is in force again");
}

/// Puts `bytes` at `path` as another file (a new inode, renamed over it) with `path`'s size and
/// modification time, as a build that normalises mtimes (`cp -p`, `rsync -t`, `tar --mtime`,
/// `SOURCE_DATE_EPOCH`) does.
fn replace_keeping_size_and_mtime(path: &Path, bytes: &[u8]) {
    let before = std::fs::metadata(path).expect("stat");
    assert_eq!(before.len(), bytes.len() as u64, "the replacement has the same size");
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).expect("write");
    let f = std::fs::File::options().write(true).open(&tmp).expect("open");
    f.set_modified(before.modified().expect("mtime")).expect("set mtime");
    drop(f);
    std::fs::rename(&tmp, path).expect("rename over");
    let after = std::fs::metadata(path).expect("stat");
    assert_eq!((after.len(), after.mtime(), after.mtime_nsec()), (before.len(), before.mtime(), before.mtime_nsec()));
    assert_ne!(after.ino(), before.ino());
}

/// Rewrites `path` in place (the same inode) with `bytes` of its size, then sets its
/// modification time back.
fn rewrite_keeping_mtime(path: &Path, bytes: &[u8]) {
    let before = std::fs::metadata(path).expect("stat");
    assert_eq!(before.len(), bytes.len() as u64);
    std::thread::sleep(Duration::from_millis(20));
    let mut f = std::fs::File::options().write(true).open(path).expect("open");
    f.write_all(bytes).expect("rewrite");
    f.set_modified(before.modified().expect("mtime")).expect("set mtime");
    drop(f);
    let after = std::fs::metadata(path).expect("stat");
    assert_eq!((after.ino(), after.mtime(), after.mtime_nsec()), (before.ino(), before.mtime(), before.mtime_nsec()));
}

/// The state of a session of `d` with `opts` after its first minibatch.
fn state_after_one(
    daemon: &support::daemon::Daemon,
    opts: &minibatchd_client::protocol::SessionOptions,
) -> minibatchd_client::protocol::SessionState {
    let mut s = daemon.client().open("d", opts).expect("open");
    s.next_owned().expect("next").expect("a minibatch");
    s.state().expect("state")
}

/// Issue 36, finding 1: a data file replaced by another with the same size and modification time
/// (a new inode), then SIGHUP: the reload reused the index cache (keyed on path, size and mtime),
/// so new sessions got the new bytes cut at the old sequence boundaries; and a file rewritten in
/// place with its mtime set back was not even indexed again (old values served). Now the new
/// file is indexed and served as `dump` reads it, and a state taken on the old file is refused
/// — also when the new file has exactly the old one's sequence lengths (its content differs).
#[test]
fn a_file_replaced_or_rewritten_with_its_size_and_mtime_kept_is_indexed_again_and_old_states_refused() {
    use minibatchd_client::protocol::{ErrorCode, SessionOptions};
    use minibatchd_client::{Client, ClientError};
    use support::daemon::{options, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let data = write(p, "d.ctf", "|a 1\n|a 2\n|a 3\n|a 4\n");
    support::daemon::write_config(
        p,
        "ring_slots = 2\nslot_size_bytes = 65536\n",
        &format!(
            "[datasets.d]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 12\n\
             [datasets.d.streams.a]\ndim = 1\nformat = \"dense\"\n",
            data.display()
        ),
    );
    let daemon = Daemon::start(p, &[]);
    let opts = SessionOptions { full_sweep: true, randomize: Some(false), ..options(1) };
    let read_all = || daemon.read_all("d", &opts, &["a"]);
    let dump = || daemon.dump("d", &["--minibatch-size", "1", "--full-sweep", "--randomize", "false"]);
    let first = read_all();
    let old_state = state_after_one(&daemon, &opts);
    let refused = |what: &str| {
        let resumed = SessionOptions { resume: Some(old_state.clone()), ..opts.clone() };
        match Client::connect(&daemon.socket).expect("connect").open("d", &resumed) {
            Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
                assert!(message.contains("other data"), "{what}: {message}");
            }
            Ok(_) => panic!("{what}: a state of the old file resumed onto the new one"),
            Err(e) => panic!("{what}: expected resume_mismatch, got {e}"),
        }
    };

    // Another file, other sequence boundaries, the same size and mtime.
    replace_keeping_size_and_mtime(&data, b"|a 100\n|a 200\n|a 30\n");
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    let replaced = read_all();
    assert_eq!(replaced, dump(), "the new file, read through its own index");
    assert_eq!(replaced.len(), 3);
    refused("replaced");

    // The same inode rewritten with the old boundaries and mtime: only its content (and ctime)
    // tells it apart.
    std::fs::write(&data, "|a 1\n|a 2\n|a 3\n|a 4\n").expect("the first content again");
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(2);
    assert_eq!(read_all(), first);
    let old_state_again = state_after_one(&daemon, &opts);
    rewrite_keeping_mtime(&data, b"|a 5\n|a 6\n|a 7\n|a 8\n");
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(3);
    let rewritten = read_all();
    assert_eq!(rewritten, dump());
    assert_ne!(rewritten, first, "the new values, not the old chunks");
    let resumed = SessionOptions { resume: Some(old_state_again), ..opts.clone() };
    assert!(
        matches!(
            Client::connect(&daemon.socket).expect("connect").open("d", &resumed),
            Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, .. })
        ),
        "a state of the old content resumed onto the same boundaries with other values"
    );
}

/// Issue 36, finding 1, for a `.gz` input: replaced by another of the same size and mtime, its
/// decompressed copy's sidecar (keyed on size and mtime) kept serving the old content, after a
/// reload and after a restart, with the same data identity. Now the new content is decompressed
/// and served, and a state of the old one is refused.
#[test]
fn a_gz_input_replaced_with_its_size_and_mtime_kept_is_decompressed_again() {
    use minibatchd_client::protocol::{ErrorCode, SessionOptions};
    use minibatchd_client::{Client, ClientError};
    use support::daemon::{options, Daemon};
    // Stored deflate blocks: the compressed size depends only on the data's.
    let stored = |text: &str| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
        e.write_all(text.as_bytes()).expect("compress");
        e.finish().expect("finish")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let gz_path = write(p, "data.gz", stored("1 1:1\n0 2:1\n1 3:1\n"));
    support::daemon::write_config(
        p,
        "ring_slots = 2\nslot_size_bytes = 65536\n",
        &format!(
            "[datasets.d]\nformat = \"libsvm\"\nfiles = [\"{}\"]\n[datasets.d.sampling]\nrandomize = false\n",
            gz_path.display()
        ),
    );
    let mut daemon = Daemon::start(p, &[]);
    let opts = SessionOptions { full_sweep: true, ..options(1) };
    let read_all = |daemon: &Daemon| daemon.read_all("d", &opts, &["__instX", "__instY"]);
    let before = read_all(&daemon);
    let old_state = state_after_one(&daemon, &opts);
    replace_keeping_size_and_mtime(&gz_path, &stored("0 7:1\n1 8:1\n0 9:1\n"));
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    let dump = || daemon.dump("d", &["--minibatch-size", "1", "--full-sweep"]);
    let after = read_all(&daemon);
    assert_ne!(after, before, "the new content, not the old copy");
    assert_eq!(after, dump());
    let resume = |daemon: &Daemon| {
        let resumed = SessionOptions { resume: Some(old_state.clone()), ..opts.clone() };
        Client::connect(&daemon.socket).expect("connect").open("d", &resumed).map(|_| ())
    };
    assert!(matches!(resume(&daemon), Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, .. })));
    // And after a restart.
    assert_eq!(daemon.stop().code(), Some(0));
    let daemon = Daemon::start(p, &[]);
    assert_eq!(read_all(&daemon), after);
    assert!(matches!(resume(&daemon), Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, .. })));
}

/// Found by a probe: a sequence of several samples in frame mode failed the session with
/// "sequence 1 of the timeline, in chunk 0", which names no file; with several files or joined
/// sources the user could not find it. The session's error names the file, line and byte offset
/// where that sequence begins, in its message and its detail.
#[test]
fn a_frame_mode_violation_names_the_sequences_place() {
    use minibatchd_client::protocol::{ErrorCode, SessionOptions};
    use minibatchd_client::ClientError;
    use support::daemon::{options, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    write(p, "a.ctf", "0 |a 1\n1 |a 2\n");
    let b = write(p, "b.ctf", "7 |a 3\n8 |a 4\n8 |a 5\n9 |a 6\n");
    support::daemon::write_config(
        p,
        "ring_slots = 2\nslot_size_bytes = 65536\n",
        &format!(
            "[datasets.d]\nformat = \"ctf\"\nfiles = [\"{}\", \"{}\"]\n[datasets.d.sampling]\nrandomize = false\n\
             [datasets.d.streams.a]\ndim = 1\nformat = \"dense\"\n",
            p.join("a.ctf").display(),
            b.display()
        ),
    );
    let daemon = Daemon::start(p, &[]);
    let opts = SessionOptions { frame_mode: true, full_sweep: true, ..options(1) };
    let mut s = daemon.client().open("d", &opts).expect("open");
    let err = loop {
        match s.next_minibatch() {
            Ok(Some(mb)) => s.release(mb),
            Ok(None) => panic!("the sweep ended without the frame-mode error"),
            Err(e) => break e,
        }
    };
    let ClientError::Daemon { code, message, detail } = err else { panic!("a daemon error, got {err}") };
    assert_eq!(code, ErrorCode::DataError, "{message}");
    assert!(
        message.contains(&format!("{}:2: byte offset 7: detected a non-frame sequence of size 2", b.display())),
        "{message}"
    );
    let detail = detail.expect("a detail");
    assert_eq!(
        (detail.file.as_deref(), detail.line, detail.offset),
        (Some(b.to_str().expect("utf-8")), Some(2), Some(7))
    );
}
