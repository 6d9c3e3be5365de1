//! One pass over the text on a cold start (issue 38, item 1): a file whose every line is a
//! sequence is parsed chunk by chunk in the index pass that counts its lines. What the pass parsed
//! must be exactly what a later parse of the chunk gives — values, lengths and errors — and it is
//! kept within the bytes it was given, and never served once its file changed.
// Metrics are counts, exact in f64.
#![allow(clippy::float_cmp)]

mod support;

use std::fmt::Write as _;
use std::path::Path;

use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::options::IndexLimits;
use support::write;

/// Dataset `name` of `toml` (paths below `dir`), indexed now (no index cache), keeping up to
/// `ahead` bytes of chunks parsed in its index pass.
fn open(dir: &Path, toml: &str, name: &str, ahead: u64) -> Dataset {
    let config = minibatchd::config::Config::from_toml_str(toml, dir).expect("config");
    let dataset = config.dataset(name).expect("dataset");
    let limits = IndexLimits { parse_ahead_bytes: ahead, ..IndexLimits::UNBOUNDED };
    Dataset::open_within(dataset, &dir.join("state"), limits, &mut |_| {}).expect("open")
}

/// A CTF file in line mode of `lines` lines (dense `x` of 3, sparse `y`), a few lines long enough
/// to cross the index pass's 256 KiB read blocks, one malformed at `bad`, the last without a
/// newline.
fn ctf_text(lines: usize, bad: usize) -> String {
    let mut s = String::new();
    for i in 0..lines {
        let _ = write!(s, "|x {} {}.5 -{}e-3 |y {}:1", i, i % 7, i % 11, i % 5);
        if i % 5_000 == 13 {
            // About 600 KB of sparse entries on one line.
            for k in 0..120_000 {
                let _ = write!(s, " {}:{}", k % 5, k % 3);
            }
        }
        if i == bad {
            s.push_str(" |x 1 oops 3");
        }
        if i + 1 < lines {
            s.push('\n');
        }
    }
    s
}

fn ctf_toml(precision: &str, chunk: u64) -> String {
    format!(
        "[datasets.d]\nformat = \"ctf\"\nfiles = [\"a.ctf\"]\nchunk_size_bytes = {chunk}\ncache_index = false\n\
         max_errors = 1000\nprecision = \"{precision}\"\n[datasets.d.streams.x]\ndim = 3\nformat = \"dense\"\n\
         [datasets.d.streams.y]\ndim = 5\nformat = \"sparse\"\n"
    )
}

/// Every chunk of `ahead` (parsed in its index pass) loads as it does from a dataset that parses
/// each chunk when asked, errors included; the malformed chunk was not kept.
fn same_chunks(plain: &Dataset, ahead: &Dataset, malformed: usize) {
    let n = plain.chunks().len();
    assert_eq!(ahead.chunks().len(), n);
    let kept = ahead.parsed_ahead();
    assert_eq!(kept.len(), n - malformed, "every clean chunk was parsed in the pass: {kept:?} of {n}");
    for c in 0..n {
        let want = plain.load_chunk(c).expect("chunk");
        let got = ahead.load_chunk(c).expect("chunk");
        assert_eq!(got, want, "chunk {c}");
        assert_eq!(kept.contains(&c), want.1.is_empty(), "chunk {c} kept only when clean");
    }
    assert!(ahead.parsed_ahead().is_empty(), "each chunk is taken once");
    assert_eq!(ahead.parsed_ahead_bytes(), 0);
}

#[test]
fn ctf_chunks_parsed_in_the_index_pass_equal_their_parse_errors_included() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    write(p, "a.ctf", ctf_text(20_000, 12_345));
    for precision in ["float32", "float64"] {
        // Chunks of about 300 KB: lines cross the pass's read blocks, long ones several.
        let toml = ctf_toml(precision, 300_000);
        let plain = open(p, &toml, "d", 0);
        assert!(plain.chunks().len() >= 6, "{} chunks", plain.chunks().len());
        assert!(plain.parsed_ahead().is_empty(), "nothing parsed ahead without room");
        same_chunks(&plain, &open(p, &toml, "d", u64::MAX), 1);
    }
}

#[test]
fn deepx_chunks_parsed_in_the_index_pass_equal_their_parse_errors_included() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let mut text = String::new();
    for i in 0..20_000u32 {
        let _ = write!(text, "{} {}:{}.25 {}:1", i % 2, i % 50 + 1, i % 9, i % 30 + 60);
        text.push_str(if i == 7_777 { " 5:x\n" } else { "\n" });
    }
    write(p, "a.svm", &text);
    for precision in ["float32", "float64"] {
        let toml = format!(
            "[datasets.d]\nformat = \"libsvm\"\nfiles = [\"a.svm\"]\nchunk_size_bytes = 20000\ncache_index = false\n\
             max_errors = 1000\nprecision = \"{precision}\"\n"
        );
        let plain = open(p, &toml, "d", 0);
        assert!(plain.chunks().len() >= 10, "{} chunks", plain.chunks().len());
        same_chunks(&plain, &open(p, &toml, "d", u64::MAX), 1);
    }
}

#[test]
fn chunks_parsed_ahead_stay_within_their_room_and_are_not_served_once_the_file_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    write(p, "a.ctf", ctf_text(20_000, usize::MAX));
    let toml = ctf_toml("float32", 300_000);
    let all = open(p, &toml, "d", u64::MAX);
    let n = all.chunks().len();
    let total = all.parsed_ahead_bytes();
    assert_eq!(all.parsed_ahead().len(), n);
    // Room for about a third of them: what is kept fits it, and the rest parse when asked.
    let room = total / 3;
    let some = open(p, &toml, "d", room);
    let kept = some.parsed_ahead();
    assert!(!kept.is_empty() && kept.len() < n, "{} of {n} kept", kept.len());
    assert!(some.parsed_ahead_bytes() <= room, "{} > {room}", some.parsed_ahead_bytes());
    for c in 0..n {
        assert_eq!(some.load_chunk(c).expect("chunk"), all.load_chunk(c).expect("chunk"), "chunk {c}");
    }
    // Dropped: nothing held, every chunk parsed from the text.
    let dropped = open(p, &toml, "d", u64::MAX);
    dropped.drop_parsed_ahead();
    assert!(dropped.parsed_ahead().is_empty());
    assert_eq!(dropped.load_chunk(0).expect("chunk"), open(p, &toml, "d", 0).load_chunk(0).expect("chunk"));
    // The file rewritten after its pass: a chunk parsed in it is not served.
    let stale = open(p, &toml, "d", u64::MAX);
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(p, "a.ctf", ctf_text(20_000, usize::MAX).replace("|x 0 0.5", "|x 9 0.5"));
    let e = stale.load_chunk(0).expect_err("changed").to_string();
    assert!(e.contains("a.ctf") && e.contains("since it was indexed"), "{e}");
}

/// The daemon on a cold state directory, a dataset randomized over a window that spans it (the
/// default): the chunks its index pass parsed reach the chunk cache before any session asks
/// (counted as parsed, once), a session reads exactly what `dump` prints, and the malformed chunk
/// is parsed when needed, its error charged once.
#[test]
fn a_cold_daemon_serves_the_chunks_its_index_pass_parsed() {
    use support::daemon::{options, write_config, Daemon};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let mut text = String::new();
    for i in 0..2_000 {
        let _ = write!(text, "|x {i} {} |y {}:1", i % 7, i % 5);
        text.push_str(if i == 1_234 { " |x 1 oops\n" } else { "\n" });
    }
    write(p, "a.ctf", &text);
    let datasets = format!(
        "[datasets.d]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 4000\nmax_errors = 10\n\
         [datasets.d.streams.x]\ndim = 2\nformat = \"dense\"\n[datasets.d.streams.y]\ndim = 5\nformat = \"sparse\"\n",
        p.join("a.ctf").display()
    );
    write_config(p, "", &datasets);
    let d = Daemon::start(p, &[]);
    let chunks = open(p, &std::fs::read_to_string(p.join("minibatchd.toml")).expect("config"), "d", 0).chunks().len();
    assert!(chunks > 5, "{chunks} chunks");
    let chunks = f64::from(u32::try_from(chunks).expect("a few chunks"));
    // Every clean chunk moves into the cache with no session open.
    let start = std::time::Instant::now();
    while d.metric("minibatchd_chunk_cache_chunks ") < chunks - 1.0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the chunks parsed in the pass did not reach the cache"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(d.metric("minibatchd_chunks_parsed_total{"), chunks - 1.0);
    let opts = minibatchd_client::protocol::SessionOptions { full_sweep: true, ..options(64) };
    let got = d.read_all("d", &opts, &["x", "y"]);
    assert_eq!(got, d.dump("d", &["--minibatch-size", "64", "--full-sweep"]));
    assert_eq!(got.len(), 2_000_usize.div_ceil(64));
    assert_eq!(
        d.metric("minibatchd_chunks_parsed_total{"),
        chunks as f64,
        "the malformed chunk parsed once, on demand"
    );
    assert_eq!(d.metric("minibatchd_parse_errors_total{"), 1.0);
}

/// A dataset whose first minibatch needs a chunk or a few (file order, or a window smaller than
/// the text) is counted first and parsed on demand: a session's first minibatch then waits for
/// the count, not for the parse of every chunk. `preload` parses every chunk anyway: in the pass.
#[test]
fn only_a_dataset_whose_first_minibatch_needs_every_chunk_is_parsed_in_its_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    write(p, "a.ctf", ctf_text(20_000, usize::MAX));
    let base = ctf_toml("float32", 300_000);
    let cases = [
        ("", true),
        ("[datasets.d.sampling]\nrandomize = false\n", false),
        ("[datasets.d.sampling]\nwindow_chunks = 2\n", false),
        ("[datasets.d.sampling]\nwindow_chunks = 1000\n", true),
        ("[datasets.d.sampling]\nwindow_samples = 1000000\n", false),
        ("preload = true\n[datasets.d.sampling]\nrandomize = false\n", true),
    ];
    for (extra, parsed) in cases {
        // `preload` belongs to the dataset's table, before its streams.
        let toml = match extra.strip_prefix("preload = true\n") {
            Some(rest) => base.replacen("cache_index = false\n", "cache_index = false\npreload = true\n", 1) + rest,
            None => base.clone() + extra,
        };
        let ds = open(p, &toml, "d", u64::MAX);
        assert_eq!(ds.parsed_ahead().len() == ds.chunks().len(), parsed, "{extra:?}");
        assert_eq!(ds.parsed_ahead().is_empty(), !parsed, "{extra:?}");
    }
}

/// What the pass keeps is also counted by the caller's reserve (the daemon's chunk cache, whose
/// room moves while sessions on other datasets run: found by a probe, a reload's pass kept a
/// whole room beside a full cache): kept only while the reserve has room, and held until taken
/// or let go.
#[test]
fn chunks_parsed_ahead_are_held_by_the_reserve_until_taken_or_let_go() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    struct Held(Arc<AtomicU64>, u64);
    impl Drop for Held {
        fn drop(&mut self) {
            self.0.fetch_sub(self.1, Ordering::SeqCst);
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    write(p, "a.ctf", ctf_text(20_000, usize::MAX));
    let toml = ctf_toml("float32", 300_000);
    let config = minibatchd::config::Config::from_toml_str(&toml, p).expect("config");
    let all = open(p, &toml, "d", u64::MAX);
    let (n, total) = (all.chunks().len(), all.parsed_ahead_bytes());
    // Each chunk's parse holds 8 bytes a byte of its text (and 1 MiB) until it is kept: room for
    // all of them, then for fewer.
    let text = std::fs::metadata(p.join("a.ctf")).expect("size").len();
    for cap in [0, total / 3, total + 2 * (8 * text + (1 << 20))] {
        let held = Arc::new(AtomicU64::new(0));
        let h = held.clone();
        let reserve: minibatchd_engine::dataset::Reserve = Box::new(move |bytes| {
            let now = h.load(Ordering::SeqCst);
            (now + bytes <= cap).then(|| {
                h.fetch_add(bytes, Ordering::SeqCst);
                Box::new(Held(h.clone(), bytes)) as Box<dyn std::any::Any + Send + Sync>
            })
        });
        let limits = IndexLimits { parse_ahead_bytes: u64::MAX, ..IndexLimits::UNBOUNDED };
        let ds = Dataset::open_reserving(
            config.dataset("d").expect("d"),
            &p.join("state"),
            (limits, Some(reserve)),
            None,
            &mut |_| {},
        )
        .expect("open");
        let kept = ds.parsed_ahead();
        assert_eq!(held.load(Ordering::SeqCst), ds.parsed_ahead_bytes(), "cap {cap}: every kept byte is held");
        assert!(ds.parsed_ahead_bytes() <= cap, "cap {cap}");
        assert_eq!(kept.len() == n, cap > total, "cap {cap}: {} of {n}", kept.len());
        if let Some(&first) = kept.first() {
            assert_eq!(ds.load_chunk(first).expect("chunk"), all.load_chunk(first).expect("chunk"));
        }
        ds.drop_parsed_ahead();
        assert_eq!(held.load(Ordering::SeqCst), 0, "cap {cap}: all let go");
    }
}
