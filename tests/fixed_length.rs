//! Fixed-length records through the real binary (issue 39): `validate` refuses a layout or a
//! stream that cannot be read, naming the key; `dump` serves each record once per sweep over
//! several files, randomized and split over workers; a file that is not whole records is refused
//! naming it; a file that begins with gzip's magic bytes is read as it is.

mod support;

use std::path::Path;
use std::process::Command;

use support::{parse_dump, write, BIN};

/// Record `i` of file `f`: a header byte, `i` as a little-endian u32, `f` as a big-endian i16,
/// and `-i / 4` as a float32.
fn record(f: u16, i: u32) -> Vec<u8> {
    let mut r = vec![0xAB];
    r.extend(i.to_le_bytes());
    r.extend(i16::try_from(f).expect("small").to_be_bytes());
    #[allow(clippy::cast_precision_loss)]
    r.extend((-(i as f32) / 4.0).to_le_bytes());
    r
}

const STREAMS: &str = "[datasets.f.streams.index]\ndtype = \"uint32\"\noffset = 1\ndim = 1\n\
    [datasets.f.streams.file]\ndtype = \"int16\"\noffset = 5\nlittle_endian = false\ndim = 1\n\
    [datasets.f.streams.value]\ndtype = \"float32\"\noffset = 7\n";

fn config(dir: &Path, files: &str, layout: &str) -> std::path::PathBuf {
    write(
        dir,
        "c.toml",
        format!(
            "[daemon]\nstate_dir = \"state\"\n[datasets.f]\nformat = \"fixed_length\"\nfiles = [{files}]\nchunk_size_bytes = 100\n{layout}\n{STREAMS}"
        ),
    )
}

fn dump(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("dump")
        .arg("--config")
        .arg(config)
        .args(["--dataset", "f"])
        .args(args)
        .output()
        .expect("run minibatchd")
}

#[test]
fn every_record_of_every_file_once_per_sweep_randomized_and_over_workers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut a = b"HEAD".to_vec();
    (0..40).for_each(|i| a.extend(record(0, i)));
    a.extend(b"TAIL!");
    let mut b = b"HEAD".to_vec();
    (0..25).for_each(|i| b.extend(record(1, i)));
    b.extend(b"TAIL!");
    write(dir.path(), "a.bin", a);
    write(dir.path(), "b.bin", b);
    let c = config(dir.path(), "\"a.bin\", \"b.bin\"", "record_bytes = 11\nheader_bytes = 4\nfooter_bytes = 5");
    let mut seen = std::collections::HashMap::new();
    for rank in ["0", "1"] {
        let out = dump(&c, &["--minibatch-size", "7", "--full-sweep", "--workers", "2", "--rank", rank]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for mb in parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("JSON") {
            let s = &mb["streams"];
            for k in 0..s["index"]["sequences"].as_array().expect("sequences").len() {
                let i = s["index"]["sequences"][k][0][0].as_f64().expect("index");
                let f = s["file"]["sequences"][k][0][0].as_f64().expect("file");
                let v = s["value"]["sequences"][k][0][0].as_f64().expect("value");
                assert_eq!(v.to_bits(), (-i / 4.0).to_bits(), "record {i} of file {f}: its own value");
                *seen.entry((f.to_string(), i.to_string())).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(seen.len(), 65);
    assert!(seen.values().all(|&n| n == 1), "each record once over the workers");
}

#[test]
fn a_file_that_is_not_whole_records_is_refused_naming_it_and_gzip_magic_is_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cut: Vec<u8> = (0..3).flat_map(|i| record(0, i)).collect();
    cut.truncate(30);
    write(dir.path(), "cut.bin", &cut);
    let c = config(dir.path(), "\"cut.bin\"", "record_bytes = 11");
    let out = dump(&c, &["--minibatch-size", "4", "--full-sweep"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cut.bin") && stderr.contains("body of 30 bytes") && stderr.contains("8 bytes are left"),
        "{stderr}"
    );

    // A record whose first bytes are gzip's magic: read as data, not decompressed.
    let mut gz = vec![0x1f, 0x8b, 0x08, 0x00];
    gz.extend(record(3, 9).into_iter().skip(4));
    gz.extend(record(3, 10));
    write(dir.path(), "gz.bin", &gz);
    let c = config(dir.path(), "\"gz.bin\"", "record_bytes = 11");
    let out = dump(&c, &["--minibatch-size", "4", "--full-sweep", "--randomize", "false"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mb = &parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("JSON")[0];
    assert_eq!(mb["streams"]["index"]["sequences"][1][0][0], 10.0);
    assert_eq!(mb["streams"]["file"]["sequences"][1][0][0], 3.0);
}

#[test]
fn layouts_and_streams_that_cannot_be_read_are_refused_naming_the_key() {
    let cases = [
        ("", "datasets.f.record_bytes", "missing"),
        ("record_bytes = 0", "datasets.f.record_bytes", "out of range"),
        ("record_bytes = 4", "datasets.f.streams.index", "reads bytes 1..5 of a record of 4 bytes"),
        (
            "record_bytes = 10",
            "datasets.f.streams.value",
            "the 3 bytes of the record from offset 7 are not whole float32 values",
        ),
    ];
    for (layout, key, message) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        write(dir.path(), "a.bin", record(0, 1));
        let c = config(dir.path(), "\"a.bin\"", layout);
        let out = Command::new(BIN).arg("validate").arg("--config").arg(&c).output().expect("run minibatchd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(key) && stderr.contains(message), "{layout}: {stderr}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    write(dir.path(), "a.bin", record(0, 1));
    let c = write(
        dir.path(),
        "c.toml",
        "[daemon]\nstate_dir = \"state\"\n[datasets.f]\nformat = \"fixed_length\"\nfiles = [\"a.bin\"]\nrecord_bytes = 11\n\
         [datasets.f.streams.x]\ndtype = \"complex64\"\n",
    );
    let out = Command::new(BIN).arg("validate").arg("--config").arg(&c).output().expect("run minibatchd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("datasets.f.streams.x.dtype") && stderr.contains("unknown dtype 'complex64'"), "{stderr}");
}
