//! CSV through the real binary (issue 39): `validate` refuses columns and options that cannot be
//! read, naming the key; `dump` serves every line of several files once per sweep, randomized and
//! over workers, each file's header skipped, a `.gz` file read from its copy; a malformed line is
//! reported with its file, line and byte offset and left out (charged to `max_errors`).

mod support;

use std::io::Write as _;
use std::path::Path;
use std::process::Command;

use support::{parse_dump, write, BIN};

fn config(dir: &Path, extra: &str) -> std::path::PathBuf {
    write(
        dir,
        "c.toml",
        format!(
            "[daemon]\nstate_dir = \"state\"\n[datasets.c]\nformat = \"csv\"\nfiles = [\"a.csv\", \"b.csv.gz\"]\ncolumns = 3\n\
             skip_header_lines = 1\nchunk_size_bytes = 64\n{extra}\n\
             [datasets.c.streams.id]\ncolumns = [0]\ndtype = \"int64\"\n\
             [datasets.c.streams.x]\ncolumns = [2, 1]\ndefault = -1.5\n"
        ),
    )
}

fn data(dir: &Path) {
    let a: String =
        std::iter::once("id,a,b\n".to_owned()).chain((0..30).map(|i| format!("{i},{}.5,\"{i}\"\n", i * 2))).collect();
    write(dir, "a.csv", a);
    let b: String = std::iter::once("id;a;b\n".to_owned()).chain((100..120).map(|i| format!("{i},,{i}\r\n"))).collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b.as_bytes()).expect("gzip");
    write(dir, "b.csv.gz", gz.finish().expect("gzip"));
}

#[test]
fn every_line_of_every_file_once_per_sweep_randomized_and_over_workers() {
    let dir = tempfile::tempdir().expect("temp dir");
    data(dir.path());
    let c = config(dir.path(), "");
    let mut seen = std::collections::HashMap::new();
    for rank in ["0", "1", "2"] {
        let out = Command::new(BIN)
            .arg("dump")
            .arg("--config")
            .arg(&c)
            .args(["--dataset", "c", "--minibatch-size", "5", "--full-sweep", "--workers", "3", "--rank", rank])
            .output()
            .expect("run minibatchd");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for mb in parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("JSON") {
            let ids = mb["streams"]["id"]["sequences"].as_array().expect("ids").clone();
            let xs = mb["streams"]["x"]["sequences"].as_array().expect("xs").clone();
            for (id, x) in ids.iter().zip(&xs) {
                let id = id[0][0].as_f64().expect("id");
                let (b, a) = (x[0][0].as_f64().expect("b"), x[0][1].as_f64().expect("a"));
                assert_eq!(b.to_bits(), id.to_bits(), "column 2 first: {x}");
                let want = if id >= 100.0 { -1.5 } else { id * 2.0 + 0.5 };
                assert_eq!(a.to_bits(), f64::to_bits(want), "line {id}: {x}");
                *seen.entry(id.to_string()).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(seen.len(), 50, "30 + 20 lines, the headers skipped");
    assert!(seen.values().all(|&n| n == 1));
}

#[test]
fn a_malformed_line_is_reported_with_its_place_and_left_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    data(dir.path());
    write(dir.path(), "a.csv", "id,a,b\n1,2,3\n2,x,3\n3,4\n4,5,6\n");
    let c = config(dir.path(), "max_errors = 2");
    let out = Command::new(BIN)
        .arg("dump")
        .arg("--config")
        .arg(&c)
        .args(["--dataset", "c", "--minibatch-size", "100", "--full-sweep", "--randomize", "false"])
        .output()
        .expect("run minibatchd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The field's first byte, not the line's (found by a probe).
    assert!(stderr.contains("a.csv:3: byte offset 15: field 1 (stream 'x') is not a valid float32: x"), "{stderr}");
    assert!(stderr.contains("a.csv:4: byte offset 19: expected 3 fields, found 2"), "{stderr}");
    let mb = &parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("JSON")[0];
    let ids = mb["streams"]["id"]["sequences"].as_array().expect("ids");
    assert_eq!(ids[1], serde_json::json!([]), "the malformed line is a sequence of 0 samples");
    // One error more than the budget: the read stops, naming the place.
    let c = config(dir.path(), "max_errors = 1");
    let out = Command::new(BIN)
        .arg("dump")
        .arg("--config")
        .arg(&c)
        .args(["--dataset", "c", "--minibatch-size", "100", "--full-sweep", "--randomize", "false"])
        .output()
        .expect("run minibatchd");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a.csv:4"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn columns_and_options_that_cannot_be_read_are_refused_naming_the_key() {
    let cases = [
        ("columns = 0", "datasets.c.columns", "out of range"),
        ("field_delim = \"ab\"", "datasets.c.field_delim", "one ASCII character"),
        ("field_delim = \"\\\"\"", "datasets.c.field_delim", "other than a quote"),
        ("[datasets.c.streams.y]\ncolumns = [3]", "datasets.c.streams.y.columns[0]", "column 3 of records of 3 fields"),
        ("[datasets.c.streams.y]\ncolumns = []", "datasets.c.streams.y.columns", "at least one column"),
        (
            "[datasets.c.streams.y]\ncolumns = [1]\ndtype = \"text\"",
            "datasets.c.streams.y.dtype",
            "unknown dtype 'text': expected float32, float64, int32, int64 or string",
        ),
        (
            "[datasets.c.streams.y]\ncolumns = [1]\ndtype = \"string\"\ndefault = 0",
            "datasets.c.streams.y.default",
            "expected a string value",
        ),
        (
            "[datasets.c.streams.y]\ncolumns = [1]\ndtype = \"int32\"\ndefault = 1.5",
            "datasets.c.streams.y.default",
            "expected a int32 value",
        ),
    ];
    for (extra, key, message) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        data(dir.path());
        let body = std::fs::read_to_string(config(dir.path(), "")).expect("config");
        // Table-level keys go before the streams; stream tables at the end.
        let text = if extra.starts_with('[') {
            format!("{body}\n{extra}\n")
        } else {
            body.replacen("columns = 3\n", &format!("{extra}\n"), 1)
        };
        let c = write(dir.path(), "c.toml", text);
        let out = Command::new(BIN).arg("validate").arg("--config").arg(&c).output().expect("run minibatchd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(key) && stderr.contains(message), "{extra}: {stderr}");
    }
}

#[test]
fn a_zlib_file_is_read_when_the_dataset_says_so_and_a_wrong_compression_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    data(dir.path());
    let text = "id,a,b\n1,2,3\n4,5,6\n";
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(text.as_bytes()).expect("zlib");
    write(dir.path(), "z.csv.z", z.finish().expect("zlib"));
    write(dir.path(), "plain.csv", text);
    let one = |file: &str, compression: &str| {
        let body = std::fs::read_to_string(config(dir.path(), compression)).expect("config");
        let c = write(
            dir.path(),
            "one.toml",
            body.replace("files = [\"a.csv\", \"b.csv.gz\"]", &format!("files = [\"{file}\"]")),
        );
        Command::new(BIN)
            .arg("dump")
            .arg("--config")
            .arg(&c)
            .args(["--dataset", "c", "--minibatch-size", "10", "--full-sweep", "--randomize", "false"])
            .output()
            .expect("run minibatchd")
    };
    let plain = one("plain.csv", "");
    let zlib = one("z.csv.z", "compression = \"zlib\"");
    assert!(plain.status.success() && zlib.status.success(), "{}", String::from_utf8_lossy(&zlib.stderr));
    assert_eq!(plain.stdout, zlib.stdout);
    let wrong = one("plain.csv", "compression = \"gzip\"");
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("not gzip data"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    let broken = one("plain.csv", "compression = \"zlib\"");
    assert_eq!(broken.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&broken.stderr).contains("invalid zlib data"),
        "{}",
        String::from_utf8_lossy(&broken.stderr)
    );
    let c = config(dir.path(), "compression = \"brotli\"");
    let out = Command::new(BIN).arg("validate").arg("--config").arg(&c).output().expect("run minibatchd");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown compression 'brotli'"));
}
