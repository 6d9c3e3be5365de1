//! TFRecord files of `tf.train.Example` records through the real binary (issue 39): `dump` reads
//! fixed-length features as dense streams and var-length ones as sparse streams, in file order
//! and randomized (every record once per sweep); damaged files are refused naming the record and
//! its byte offset; a record whose data fails its CRC, or whose Example does not fit the streams,
//! is charged to `max_errors`; and the daemon serves such a dataset to a client.

mod support;

use std::path::Path;

use minibatchd_engine::format::tfrecord::example::write::{example, Value};
use minibatchd_engine::format::tfrecord::frame;
use support::{parse_dump, write};

/// The Example of record `i`: `x` two floats, `label` an int64, `toks` `i % 4` int64s.
fn record(i: u16) -> Vec<u8> {
    let x = [f32::from(i), f32::from(i) + 0.5];
    let toks: Vec<i64> = (0..i64::from(i % 4)).map(|t| t * 10 - 5).collect();
    example(&[("x", Value::Floats(&x)), ("label", Value::Ints(&[i64::from(i % 3)])), ("toks", Value::Ints(&toks))])
}

fn file_of(records: &[Vec<u8>]) -> Vec<u8> {
    records.iter().flat_map(|r| frame(r)).collect()
}

fn config(dir: &Path, files: &str, extra: &str) -> std::path::PathBuf {
    write(
        dir,
        "c.toml",
        format!(
            r#"[daemon]
state_dir = "{state}"
[datasets.t]
format = "tfrecord"
files = [{files}]
chunk_size_bytes = 200
{extra}
[datasets.t.streams.x]
format = "dense"
dim = 2
[datasets.t.streams.y]
feature = "label"
dtype = "int64"
format = "dense"
dim = 1
[datasets.t.streams.toks]
dtype = "int64"
format = "sparse"
dim = 8
"#,
            state = dir.join("state").display()
        ),
    )
}

fn dump(config: &Path, args: &[&str]) -> (Vec<serde_json::Value>, String, i32) {
    let out = support::command("dump", config, "t").args(["--minibatch-size", "3"]).args(args).output().expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap_or(-1);
    (if code == 0 { parse_dump(&stdout).expect("dump output") } else { Vec::new() }, stderr, code)
}

/// Every `x` of the dump's minibatches, in order, as its first value (a record left out for an
/// error is an empty sequence, as a bad line of the other formats is: it has none).
fn xs(mbs: &[serde_json::Value]) -> Vec<f64> {
    mbs.iter()
        .flat_map(|m| m["streams"]["x"]["sequences"].as_array().expect("sequences").clone())
        .filter_map(|s| s[0][0].as_f64())
        .collect()
}

#[test]
fn fixed_and_var_length_features_are_read_in_file_order_and_each_record_once_randomized() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records: Vec<Vec<u8>> = (0..40).map(record).collect();
    write(dir.path(), "a.tfrecord", file_of(&records[..25]));
    write(dir.path(), "b.tfrecord", file_of(&records[25..]));
    let c = config(dir.path(), r#""a.tfrecord", "b.tfrecord""#, "");
    let (mbs, err, code) = dump(&c, &["--full-sweep", "--randomize", "false"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(xs(&mbs), (0..40).map(f64::from).collect::<Vec<_>>());
    let first = &mbs[0]["streams"];
    assert_eq!(first["x"]["sequences"][1], serde_json::json!([[1.0, 1.5]]));
    assert_eq!(first["y"]["sequences"][2], serde_json::json!([[2.0]]));
    assert_eq!(first["toks"]["sequences"][0], serde_json::json!([{"indices": [], "values": []}]));
    assert_eq!(first["toks"]["sequences"][2], serde_json::json!([{"indices": [0, 1], "values": [-5.0, 5.0]}]));
    // Randomized (several chunks of 200 bytes): every record once per sweep, in another order.
    let (mbs, err, code) = dump(&c, &["--max-sweeps", "2", "--seed", "7"]);
    assert_eq!(code, 0, "{err}");
    let all = xs(&mbs);
    assert_eq!(all.len(), 80);
    for sweep in all.chunks(40) {
        let mut sorted = sweep.to_vec();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(sorted, (0..40).map(f64::from).collect::<Vec<_>>());
    }
    assert_ne!(all[..40], (0..40).map(f64::from).collect::<Vec<_>>()[..]);
}

#[test]
fn a_damaged_length_or_a_cut_file_is_refused_naming_the_record_and_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records: Vec<Vec<u8>> = (0..5).map(record).collect();
    let bytes = file_of(&records);
    let second = frame(&records[0]).len();
    let mut flipped = bytes.clone();
    flipped[second + 3] ^= 0x10;
    write(dir.path(), "a.tfrecord", &flipped);
    let c = config(dir.path(), r#""a.tfrecord""#, "");
    let (_, err, code) = dump(&c, &["--full-sweep"]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("a.tfrecord:2: byte offset {second}")) && err.contains("corrupted record 2"),
        "{err}"
    );
    write(dir.path(), "a.tfrecord", &bytes[..bytes.len() - 3]);
    let (_, err, code) = dump(&c, &["--full-sweep"]);
    assert_ne!(code, 0);
    assert!(err.contains("a.tfrecord:5: byte offset") && err.contains("ends inside record 5"), "{err}");
}

#[test]
fn bad_records_are_charged_to_max_errors_and_left_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut records: Vec<Vec<u8>> = (0..6).map(record).collect();
    // Record 3 (from 1): x of three values; record 5: its data CRC fails (flipped below).
    records[2] = example(&[("x", Value::Floats(&[1.0, 2.0, 3.0])), ("label", Value::Ints(&[1]))]);
    let mut bytes = file_of(&records);
    let fifth: usize = records[..4].iter().map(|r| frame(r).len()).sum();
    bytes[fifth + 14] ^= 0x01;
    write(dir.path(), "a.tfrecord", &bytes);
    let c = config(dir.path(), r#""a.tfrecord""#, "");
    let (_, err, code) = dump(&c, &["--full-sweep", "--randomize", "false"]);
    assert_ne!(code, 0, "max_errors = 0 refuses the first bad record");
    assert!(err.contains("a.tfrecord:3:") && err.contains("has 3 float values"), "{err}");
    let c = config(dir.path(), r#""a.tfrecord""#, "max_errors = 2");
    let (mbs, err, code) = dump(&c, &["--full-sweep", "--randomize", "false"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(xs(&mbs), vec![0.0, 1.0, 3.0, 5.0], "records 3 and 5 are left out");
    assert!(err.contains("corrupted record 5"), "{err}");
}

#[test]
fn config_errors_name_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = write(
        dir.path(),
        "c.toml",
        r#"[datasets.t]
format = "tfrecord"
files = ["a.tfrecord"]
[datasets.t.streams.x]
format = "dense"
dim = 2
dtype = "text"
default = [1, 2, 3]
[datasets.t.streams.s]
format = "sparse"
dim = 2
default = 0
[datasets.t.streams.b]
dtype = "bytes"
format = "sparse"
dim = 4
[datasets.t.streams.q]
dtype = "bytes"
format = "sequence"
dim = 3
[datasets.t.streams.r]
format = "sequence"
default = 1
[datasets.t.streams.d]
dtype = "bytes"
format = "dense"
dim = 2
default = [1, 2]
"#,
    );
    let out = std::process::Command::new(support::BIN).args(["validate", "--config"]).arg(&c).output().expect("run");
    let err = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for want in [
        "datasets.t.streams.x.dtype",
        "unknown dtype 'text'",
        "datasets.t.streams.s.default",
        "has a default",
        "datasets.t.streams.b.format",
        "read a tf.io.VarLenFeature(tf.string) as format = \"sequence\"",
        "datasets.t.streams.q.dim",
        "one byte string a sample",
        "datasets.t.streams.r.default",
        "datasets.t.streams.d.default",
        "expected strings",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

/// Bytes features (`tf.string`) as strings streams, one sample per byte string — exactly `dim`
/// a record with a default, or any number as a sequence — and numeric sequences
/// (`FixedLenSequenceFeature`), `dim` values a sample. `minibatch_size` counts records; bytes
/// that are not UTF-8 come out of `dump` as hex, unchanged; a sequence whose values are no
/// multiple of `dim` is a malformed record.
#[test]
fn bytes_and_sequence_features_are_served_a_sample_per_string_or_per_dim_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpeg: &[u8] = &[0xff, 0xd8, 0xff, 0x00, 0x80];
    let rec = |i: i64, tags: &[&[u8]], steps: &[f32], image: Option<&[u8]>| {
        let image = image.map(|im| [im]);
        let mut f: Vec<(&str, Value)> = vec![("id", Value::Ints(std::slice::from_ref(&i)))];
        f.push(("tags", Value::Bytes(tags)));
        f.push(("steps", Value::Floats(steps)));
        if let Some(im) = &image {
            f.push(("image", Value::Bytes(im)));
        }
        example(&f)
    };
    let records = vec![
        rec(0, &[b"a", b"bc"], &[1.0, 2.0, 3.0, 4.0], Some(jpeg)),
        rec(1, &[], &[], None),
        rec(2, &[b""], &[5.0, 6.0], Some(b"plain")),
        rec(3, &[b"x"], &[7.0, 8.0, 9.0], Some(b"odd")),
        rec(4, &[b"y", b"z", b"w"], &[0.5, 0.25], Some(b"last")),
    ];
    write(dir.path(), "a.tfrecord", file_of(&records));
    let c = write(
        dir.path(),
        "c.toml",
        format!(
            r#"[daemon]
state_dir = "{state}"
[datasets.t]
format = "tfrecord"
files = ["a.tfrecord"]
max_errors = 1
[datasets.t.streams.id]
dtype = "int64"
format = "dense"
dim = 1
[datasets.t.streams.tags]
dtype = "bytes"
format = "sequence"
[datasets.t.streams.steps]
format = "sequence"
dim = 2
[datasets.t.streams.image]
dtype = "bytes"
format = "dense"
dim = 1
default = "none"
"#,
            state = dir.path().join("state").display()
        ),
    );
    let (mbs, err, code) = dump(&c, &["--full-sweep", "--randomize", "false"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("a.tfrecord:4:") && err.contains("not a multiple of the stream 'steps''s dim 2"), "{err}");
    // Three records a minibatch, whatever their sequences' lengths.
    let per: Vec<u64> = mbs.iter().map(|m| m["streams"]["id"]["num_sequences"].as_u64().expect("n")).collect();
    assert_eq!(per, vec![3, 2]);
    let seqs = |name: &str| -> Vec<serde_json::Value> {
        mbs.iter().flat_map(|m| m["streams"][name]["sequences"].as_array().expect("sequences").clone()).collect()
    };
    let j = |s: &str| serde_json::from_str::<serde_json::Value>(s).expect("json");
    assert_eq!(seqs("tags"), vec![j(r#"["a", "bc"]"#), j("[]"), j(r#"[""]"#), j("[]"), j(r#"["y", "z", "w"]"#)]);
    assert_eq!(
        seqs("image"),
        vec![j(r#"[{"hex": "ffd8ff0080"}]"#), j(r#"["none"]"#), j(r#"["plain"]"#), j("[]"), j(r#"["last"]"#)]
    );
    assert_eq!(
        seqs("steps"),
        vec![j("[[1.0, 2.0], [3.0, 4.0]]"), j("[]"), j("[[5.0, 6.0]]"), j("[]"), j("[[0.5, 0.25]]")]
    );
    assert_eq!(seqs("id"), vec![j("[[0.0]]"), j("[[1.0]]"), j("[[2.0]]"), j("[]"), j("[[4.0]]")]);
    let samples: Vec<u64> = mbs.iter().map(|m| m["streams"]["tags"]["num_samples"].as_u64().expect("n")).collect();
    assert_eq!(samples, vec![3, 3], "a byte string a sample");
}

/// A GZIP TFRecord file (TensorFlow's `compression_type="GZIP"`) reads as the plain one, from a
/// copy decompressed once into the state directory; workers split the records exactly once.
#[test]
fn a_gzip_file_reads_as_the_plain_one_and_workers_split_its_records_exactly_once() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let records: Vec<Vec<u8>> = (0..60).map(record).collect();
    let plain = file_of(&records);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain).expect("gzip");
    write(dir.path(), "a.tfrecord.gz", gz.finish().expect("gzip"));
    let c = config(dir.path(), r#""a.tfrecord.gz""#, "");
    let (mbs, err, code) = dump(&c, &["--full-sweep", "--randomize", "false"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(xs(&mbs), (0..60).map(f64::from).collect::<Vec<_>>());
    assert!(dir.path().join("state").join("inflated").is_dir(), "the copy lives in the state directory");
    // Three workers of a randomized sweep: every record once over them, none twice.
    let mut all = Vec::new();
    for rank in 0..3 {
        let rank = rank.to_string();
        let (mbs, err, code) = dump(&c, &["--full-sweep", "--seed", "5", "--workers", "3", "--rank", &rank]);
        assert_eq!(code, 0, "{err}");
        all.extend(xs(&mbs));
    }
    all.sort_by(f64::total_cmp);
    assert_eq!(all, (0..60).map(f64::from).collect::<Vec<_>>());
}

/// Resume holds for TFRecord as for every format: restoring at the position after any minibatch
/// of a randomized two-sweep run continues with exactly the samples the run went on with; and
/// with equal steps every worker gets as many minibatches.
#[test]
fn a_restore_at_any_minibatch_continues_the_run_exactly_and_equal_steps_hold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records: Vec<Vec<u8>> = (0..37).map(record).collect();
    write(dir.path(), "a.tfrecord", file_of(&records));
    let c = config(dir.path(), r#""a.tfrecord""#, "");
    let (mbs, err, code) = dump(&c, &["--max-sweeps", "2", "--seed", "9"]);
    assert_eq!(code, 0, "{err}");
    let all = xs(&mbs);
    assert_eq!(all.len(), 74);
    let mut seen = 0;
    for m in &mbs[..mbs.len() - 1] {
        seen += usize::try_from(m["streams"]["x"]["num_samples"].as_u64().expect("samples")).expect("usize");
        let position = m["position"].as_u64().expect("position").to_string();
        let (rest, err, code) = dump(&c, &["--max-sweeps", "2", "--seed", "9", "--restore", &position]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(xs(&rest), all[seen..], "restored at {position}");
    }
    let steps: Vec<usize> = (0..3)
        .map(|rank| {
            let rank = rank.to_string();
            let args = ["--full-sweep", "--seed", "9", "--workers", "3", "--rank", &rank, "--equal-steps"];
            let (mbs, err, code) = dump(&c, &args);
            assert_eq!(code, 0, "{err}");
            mbs.len()
        })
        .collect();
    assert!(steps.iter().all(|&s| s == steps[0]), "equal steps: {steps:?}");
}

/// A plain TFRecord file whose first record is 35,615 bytes long starts with gzip's magic bytes
/// (`1f 8b`): its header's CRC says it is TFRecord, so it is read as it is, not refused as bad
/// gzip data; with `compression = "gzip"` it is refused as not gzip.
#[test]
fn a_tfrecord_file_that_begins_with_gzips_magic_is_read_as_tfrecord() {
    let dir = tempfile::tempdir().expect("temp dir");
    // An Example whose serialized size is 0x8b1f: one float feature padded by an unused bytes one.
    let base = example(&[("x", Value::Floats(&[1.0, 2.0])), ("label", Value::Ints(&[1]))]);
    // The padding feature's size that makes the whole Example 35,615 bytes (its length prefixes
    // grow with it, so it is found by trying).
    let big = (0..0x8b1f)
        .map(|n| example_with_padding(&base, n))
        .find(|e| e.len() == 0x8b1f)
        .expect("an Example of 35,615 bytes");
    let bytes = file_of(&[big, record(1), record(2)]);
    assert_eq!(&bytes[..2], &[0x1f, 0x8b]);
    write(dir.path(), "magic.tfrecord", &bytes);
    let c = config(dir.path(), "\"magic.tfrecord\"", "max_errors = 10");
    let (mbs, stderr, code) = dump(&c, &["--full-sweep", "--randomize", "false"]);
    assert_eq!(code, 0, "{stderr}");
    let ys: Vec<serde_json::Value> =
        mbs.iter().flat_map(|m| m["streams"]["y"]["sequences"].as_array().expect("ys").clone()).collect();
    assert_eq!(ys, vec![serde_json::json!([[1.0]]), serde_json::json!([[1.0]]), serde_json::json!([[2.0]])]);
    let c = config(dir.path(), "\"magic.tfrecord\"", "compression = \"gzip\"");
    let (_, stderr, code) = dump(&c, &["--full-sweep"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("not gzip data"), "{stderr}");
    // Found by a probe: with its length's CRC damaged, the file was taken for gzip (its first two
    // bytes) and refused as a bad gzip header; gzip's method byte (08) is not there, so it is read
    // as TFRecord and its damage named.
    let mut damaged = bytes.clone();
    damaged[8] ^= 0xff;
    write(dir.path(), "damaged.tfrecord", &damaged);
    let c = config(dir.path(), "\"damaged.tfrecord\"", "");
    let (_, stderr, code) = dump(&c, &["--full-sweep"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("corrupted record 1") && stderr.contains("CRC of its length"), "{stderr}");
}

/// `base` (a serialized Example) with one more feature, `pad`, holding `n` bytes.
fn example_with_padding(base: &[u8], n: usize) -> Vec<u8> {
    fn varint(mut v: usize, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push(u8::try_from(v & 0x7f).expect("7 bits") | 0x80);
            v >>= 7;
        }
        out.push(u8::try_from(v).expect("7 bits"));
    }
    fn field(number: usize, payload: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(payload.len(), out);
        out.extend_from_slice(payload);
    }
    // Example { features (1) { feature (1) map entry { key (1) "pad", value (2) Feature { bytes_list (1) { value (1) n bytes } } } } }
    let mut bytes_list = Vec::new();
    field(1, &vec![0u8; n], &mut bytes_list);
    let mut feature = Vec::new();
    field(1, &bytes_list, &mut feature);
    let mut entry = Vec::new();
    field(1, b"pad", &mut entry);
    field(2, &feature, &mut entry);
    let mut features = Vec::new();
    field(1, &entry, &mut features);
    let mut extra = Vec::new();
    field(1, &features, &mut extra);
    // Concatenated messages merge: `features` is a message field, so its entries add up.
    let mut out = base.to_vec();
    out.extend(extra);
    out
}

/// A record of many empty byte strings costs 8 bytes of offsets for each 2 bytes of file: its
/// chunk is refused for its share of `memory_limit_bytes`, naming the record, instead of
/// growing past it.
#[test]
fn many_empty_byte_strings_stay_within_the_chunks_memory_share() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Each record within the largest one allowed (memory_limit_bytes / 16), together past the
    // chunk's share (a half).
    let empties: Vec<&[u8]> = vec![b""; 60_000];
    let records = vec![example(&[("w", Value::Bytes(&empties))]); 4];
    write(dir.path(), "a.tfrecord", file_of(&records));
    let c = write(
        dir.path(),
        "c.toml",
        format!(
            "[daemon]\nstate_dir = \"{}\"\nmemory_limit_bytes = 2097152\n[datasets.t]\nformat = \"tfrecord\"\n\
             files = [\"a.tfrecord\"]\n[datasets.t.streams.w]\ndtype = \"bytes\"\nformat = \"sequence\"\n",
            dir.path().join("state").display()
        ),
    );
    let (_, err, code) = dump(&c, &["--full-sweep"]);
    assert_ne!(code, 0, "refused");
    assert!(err.contains("a.tfrecord:") && err.contains("share of the memory limit"), "{err}");
}

/// Empty Examples under many sequence streams hold nothing but a sequence offset per stream:
/// those count against the chunk's share of `memory_limit_bytes` too, so the chunk is refused
/// instead of growing past it.
#[test]
fn sequence_offsets_of_many_streams_count_against_the_chunks_memory_share() {
    use std::fmt::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let records = vec![Vec::new(); 4096];
    write(dir.path(), "a.tfrecord", file_of(&records));
    let mut toml = format!(
        "[daemon]\nstate_dir = \"{}\"\nmemory_limit_bytes = 2097152\n[datasets.t]\nformat = \"tfrecord\"\n\
         files = [\"a.tfrecord\"]\n",
        dir.path().join("state").display()
    );
    for k in 0..64 {
        writeln!(toml, "[datasets.t.streams.s{k}]\nformat = \"sequence\"").expect("write");
    }
    let c = write(dir.path(), "c.toml", toml);
    let (_, err, code) = dump(&c, &["--full-sweep"]);
    assert_ne!(code, 0, "refused");
    assert!(err.contains("a.tfrecord:") && err.contains("share of the memory limit"), "{err}");
}
