//! CSV: lines as `TextLineDataset` yields them, fields as `decode_csv` splits them, numbers as
//! TensorFlow parses them (each case seen on TensorFlow 2.21), and no panic on any line.

use super::number::{fast_decimal, parse_float};
use super::*;
use crate::format::chunk::{StreamValues, Values};
use proptest::prelude::*;

fn name() -> Arc<Path> {
    Arc::from(Path::new("data.csv"))
}

fn index(bytes: &[u8], header: u64) -> Vec<(u64, u64, u32)> {
    let layout = CsvLayout { skip_header_lines: header };
    let idx =
        index_reader(bytes, name(), bytes.len() as u64, layout, IndexLimits::UNBOUNDED, &mut |_| {}).expect("indexed");
    assert_eq!(idx.digest, crc32fast::hash(bytes));
    idx.sequences.iter().map(|s| (s.line, s.offset, s.size)).collect()
}

#[test]
fn every_line_is_a_record_after_the_header_empty_ones_too() {
    assert_eq!(index(b"h\na,1\n\nb,2", 1), vec![(1, 2, 4), (2, 6, 1), (3, 7, 3)]);
    assert_eq!(index(b"a\n", 0), vec![(0, 0, 2)]);
    assert_eq!(index(b"", 0), vec![]);
    assert_eq!(index(b"h1\nh2\n", 5), vec![]);
    assert_eq!(index(b"\n\n", 0), vec![(0, 0, 1), (1, 1, 1)]);
}

/// Found by a probe: a line of many empty fields cost 24 bytes a field, parsed, before it was
/// found malformed (985 MB for a line of 40 MB). The index refuses a line past the largest
/// sequence, and the split stops at the first field past the columns.
#[test]
fn a_line_past_the_largest_sequence_or_the_columns_costs_no_more_than_the_columns() {
    let line = format!("1,2\n{}\n3,4\n", ",".repeat(100));
    let limits = IndexLimits { max_sequence_bytes: 64, ..IndexLimits::UNBOUNDED };
    let e = index_reader(
        line.as_bytes(),
        name(),
        line.len() as u64,
        CsvLayout { skip_header_lines: 0 },
        limits,
        &mut |_| {},
    )
    .expect_err("a line of 101 bytes past 64")
    .to_string();
    assert!(e.contains("data.csv:2: byte offset 4") && e.contains("exceeds the largest allowed, 64 bytes"), "{e}");
    assert_eq!(index(line.as_bytes(), 0).len(), 3, "within the limits: a record");
    let many = ",".repeat(1 << 20);
    assert_eq!(
        split_fields_upto(many.as_bytes(), b',', true, 2).map(|f| f.len()).map_err(|e| e.message),
        Err(format!("expected 2 fields, found {}", (1 << 20) + 1))
    );
    assert_eq!(split_fields_upto(b"1,2", b',', true, 2).map(|f| f.len()).map_err(|e| e.message), Ok(2));
    assert_eq!(split_fields_upto(b"1,", b',', true, 2).map(|f| f.len()).map_err(|e| e.message), Ok(2));
    assert!(split_fields_upto(b"1,2,", b',', true, 2).is_err());
}

fn fields(line: &str) -> Result<Vec<String>, String> {
    split_fields(line.as_bytes(), b',', true)
        .map_err(|e| e.message)
        .map(|v| v.iter().map(|f| String::from_utf8_lossy(f).into_owned()).collect())
}

#[test]
fn fields_split_as_decode_csv_splits_them() {
    assert_eq!(fields(""), Ok(vec![]));
    assert_eq!(fields("1,"), Ok(vec!["1".into(), String::new()]));
    assert_eq!(fields(",2"), Ok(vec![String::new(), "2".into()]));
    assert_eq!(fields(","), Ok(vec![String::new(), String::new()]));
    assert_eq!(fields("\"a,b\",1"), Ok(vec!["a,b".into(), "1".into()]));
    assert_eq!(fields("\"a\"\"b\",1"), Ok(vec!["a\"b".into(), "1".into()]));
    assert_eq!(fields("\"\",2"), Ok(vec![String::new(), "2".into()]));
    assert_eq!(fields("\"1\",2 "), Ok(vec!["1".into(), "2 ".into()]));
    for bad in ["1\"2\",3", "\"1\"x,2", "\"1", "1,\"2", "a\"b,1", "\"1\"\",2", " \"1\",2", "\"1\" ,2"] {
        assert!(fields(bad).is_err(), "{bad:?} is refused by TensorFlow");
    }
    // Without quoting, quotes are characters.
    let plain = split_fields(b"\"1\",2", b',', false).expect("fields");
    assert_eq!(plain[0].as_ref(), b"\"1\"");
}

fn float(s: &str) -> Option<f64> {
    match parse_field(s.as_bytes(), CsvType::F32) {
        Some(CsvValue::Float(f)) => Some(f),
        _ => None,
    }
}

#[test]
fn numbers_parse_as_tensorflow_parses_them() {
    for (text, want) in [
        (" 1", 1.0),
        ("1 ", 1.0),
        ("+1", 1.0),
        ("1e3", 1000.0),
        (".5", 0.5),
        ("5.", 5.0),
        ("0x10", 16.0),
        ("0x1p3", 8.0),
        ("-0x1.8p1", -3.0),
        ("1e-50", 0.0),
        ("\t2", 2.0),
    ] {
        assert_eq!(float(text).map(f64::to_bits), Some(f64::to_bits(want)), "{text:?}");
    }
    assert_eq!(float("1.5e400"), Some(f64::INFINITY));
    assert_eq!(float("-inf"), Some(f64::NEG_INFINITY));
    assert_eq!(float("infinity"), Some(f64::INFINITY));
    assert!(float("nAn").is_some_and(f64::is_nan));
    for bad in ["--1", "1_0", "1d", "1e", ".", "1.0f", "  ", "a", "0x", "\u{661}"] {
        assert_eq!(float(bad), None, "{bad:?} is no float for TensorFlow");
    }
    // float32 rounds once, to nearest.
    assert_eq!(float("0.1").map(f64::to_bits), Some(f64::from(0.1f32).to_bits()));
    // A hexadecimal float its type cannot hold exactly is refused (deliberate).
    assert_eq!(float("0x1000001"), None);
    assert!(parse_field(b"0x1000001", CsvType::F64).is_some());
    // One that it holds, whatever its zeros: 24 significant bits with a zero bit below them
    // (float32's largest, its largest subnormal — refused once, by counting bits from bit 0),
    // leading and trailing zeros, more zeros than a u64 holds.
    for (text, want) in [
        ("0x1.fffffep127", f64::from(f32::MAX)),
        ("0x1.fffffep0", f64::from(f32::from_bits(0x3fff_ffff))),
        ("0x1.fffffcp-127", f64::from(f32::from_bits(0x007f_ffff))),
        ("0xffffff.0p0", 16_777_215.0),
        ("0x1fffffe", 33_554_430.0),
        ("0x0001.80000000000000000000p0", 1.5),
        ("0x100000000000000000000", 2f64.powi(80)),
        ("0x0", 0.0),
        ("0x.8", 0.5),
    ] {
        assert_eq!(float(text).map(f64::to_bits), Some(want.to_bits()), "{text:?}");
    }
    for bad in ["0x1.000001p0", "0x1fffffff", "0x1.0000000000000000001", "0x1g", "0x1.fffffep128"] {
        assert_eq!(float(bad), None, "{bad:?} is not held exactly by a float32");
    }
    let double = |s: &str| match parse_field(s.as_bytes(), CsvType::F64) {
        Some(CsvValue::Float(f)) => Some(f),
        _ => None,
    };
    assert_eq!(double("0x1.fffffffffffffp1023"), Some(f64::MAX));
    assert_eq!(double("0x1.ffffffffffffe0p0").map(f64::to_bits), Some(f64::from_bits(0x3fff_ffff_ffff_fffe).to_bits()));
    assert_eq!(double("0x1.00000000000008p0"), None);
    let int = |s: &str, t| parse_field(s.as_bytes(), t);
    assert_eq!(int(" 7 ", CsvType::I32), Some(CsvValue::Int(7)));
    assert_eq!(int("007", CsvType::I32), Some(CsvValue::Int(7)));
    assert_eq!(int("-0", CsvType::I32), Some(CsvValue::Int(0)));
    assert_eq!(int("2147483648", CsvType::I32), None);
    assert_eq!(int("2147483648", CsvType::I64), Some(CsvValue::Int(2_147_483_648)));
    assert_eq!(int("9223372036854775808", CsvType::I64), None);
    for bad in ["1.0", "0x10", "1e2", ""] {
        assert_eq!(int(bad, CsvType::I64), None, "{bad:?}");
    }
}

fn decoder(columns: usize, streams: Vec<CsvStream>) -> CsvDecoder {
    CsvDecoder::new(CsvOptions { columns, field_delim: b',', use_quote_delim: true, na_value: b"NA".to_vec() }, streams)
}

fn stream(name: &str, dtype: CsvType, columns: &[usize], default: Option<CsvValue>) -> CsvStream {
    CsvStream { name: name.into(), dtype, columns: columns.to_vec(), default }
}

fn decode(d: &CsvDecoder, lines: &[&str]) -> (Vec<Vec<f64>>, Vec<Malformed>, Vec<Vec<usize>>) {
    let mut out = d.buffers::<f32>(lines.len());
    let mut errors = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let file = name();
        let at = RecordAt { file: &file, line: i as u64, offset: 0 };
        d.decode_record(l.as_bytes(), &at, &mut out, &mut errors);
    }
    let offsets = out.iter().map(|b| b.seq_offsets.clone()).collect();
    let values = d
        .chunk_streams(out)
        .into_iter()
        .map(|sd| match sd.data {
            StreamValues::Dense { values: Values::F32(v), .. } => v.iter().map(|&x| f64::from(x)).collect(),
            other => panic!("dense float32, not {other:?}"),
        })
        .collect();
    (values, errors, offsets)
}

#[test]
fn records_fill_streams_with_defaults_required_columns_and_crs_dropped() {
    let d = decoder(
        3,
        vec![stream("y", CsvType::I64, &[0], None), stream("x", CsvType::F32, &[2, 1], Some(CsvValue::Float(-1.0)))],
    );
    let (v, errors, offsets) =
        decode(&d, &["1,2,3\n", "4,,NA\r\n", ",5,6\n", "7,8\n", "9,1\r0,11", "12,\"13\",\"1\"\"\"\n", "1<<30,1,1"]);
    assert_eq!(v[0], vec![1.0, 4.0, 9.0]);
    assert_eq!(v[1], vec![3.0, 2.0, -1.0, -1.0, 11.0, 10.0]);
    assert_eq!(offsets[0], vec![0, 1, 2, 2, 2, 3, 3, 3]);
    let messages: Vec<(u64, &str)> = errors.iter().map(|e| (e.at.line, e.message.as_str())).collect();
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert!(messages[0].1.contains("field 0 (stream 'y') is required but missing"), "{messages:?}");
    assert!(messages[1].1.contains("expected 3 fields, found 2"), "{messages:?}");
    assert!(messages[2].1.contains("is not a valid float32: 1\""), "{messages:?}");
    assert!(messages[3].1.contains("is not a valid int64: 1<<30"), "{messages:?}");
    assert_eq!(errors[0].kind, ErrorKind::BadLine);
}

/// Found by a hostile probe: a field with a NUL or a BOM was echoed raw into the message (and
/// so to a terminal or a log).
#[test]
fn messages_escape_the_control_bytes_of_a_field() {
    let d = decoder(1, vec![stream("x", CsvType::F32, &[0], None)]);
    let (_, errors, _) = decode(&d, &["1\u{0}2\n", "\u{feff}3\n", "\u{1b}[2J\n"]);
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert!(messages[0].ends_with("is not a valid float32: 1\\02"), "{messages:?}");
    assert!(messages[1].ends_with("is not a valid float32: \\u{feff}3"), "{messages:?}");
    assert!(messages[2].ends_with("is not a valid float32: \\u{1b}[2J"), "{messages:?}");
    assert!(messages.iter().all(|m| !m.chars().any(char::is_control)), "{messages:?}");
}

#[test]
fn a_chunk_of_empty_lines_with_wide_rows_reserves_a_bounded_buffer() {
    // 33 million records of a 65,536-column stream would be 2^41 values reserved up front.
    let columns: Vec<usize> = (0..65_536).collect();
    let d = decoder(65_536, vec![stream("wide", CsvType::F32, &columns, None)]);
    let out = StreamBufDecoder::buffers::<f32>(&d, 33_554_432);
    assert!(out[0].values.capacity() <= crate::format::stream_buf::MAX_RESERVED_VALUES);
}

#[test]
fn an_integer_the_precision_cannot_hold_is_malformed() {
    let d = decoder(1, vec![stream("id", CsvType::I64, &[0], None)]);
    let (v, errors, _) = decode(&d, &["16777216", "16777217", "1099511627776"]);
    assert_eq!(v[0], vec![16_777_216.0, 1_099_511_627_776.0]);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].message.contains("16777217") && errors[0].message.contains("float64"));
}

proptest! {
    #[test]
    fn the_fast_path_gives_the_general_parsers_bits(
        sign in prop::sample::select(vec!["", "-", "+"]),
        int in "[0-9]{0,12}",
        frac in prop::option::of("[0-9]{0,12}"),
    ) {
        let text = format!("{sign}{int}{}", frac.map(|f| format!(".{f}")).unwrap_or_default());
        for single in [true, false] {
            let general = if single { text.parse::<f32>().ok().map(f64::from) } else { text.parse::<f64>().ok() };
            if let Some(fast) = fast_decimal(text.as_bytes(), single) {
                prop_assert_eq!(Some(fast.to_bits()), general.map(f64::to_bits), "{} (single {})", text, single);
            }
            let parsed = parse_float(&text, single).map(|v| match v { CsvValue::Float(f) => f.to_bits(), CsvValue::Int(_) | CsvValue::Text(_) => 0 });
            prop_assert_eq!(parsed, general.map(f64::to_bits), "{}", text);
        }
    }

    #[test]
    fn no_line_panics_and_every_line_is_one_sequence(lines in prop::collection::vec("[0-9a-z,\"\\r .+-]{0,16}", 1..10)) {
        let d = decoder(2, vec![stream("a", CsvType::F32, &[0], Some(CsvValue::Float(0.0))), stream("b", CsvType::I32, &[1], None)]);
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (v, errors, offsets) = decode(&d, &refs);
        prop_assert_eq!(offsets[0].len(), lines.len() + 1);
        let samples = offsets[0].last().copied().unwrap_or(0);
        prop_assert_eq!(v[0].len(), samples);
        prop_assert_eq!(samples + errors.len(), lines.len());
    }

    #[test]
    fn any_bytes_index_into_their_lines(bytes in prop::collection::vec(prop_oneof![Just(b'\n'), Just(b'a'), Just(b',')], 0..60), header in 0u64..3) {
        let got = index(&bytes, header);
        let lines = bytes.split_inclusive(|&b| b == b'\n').count() as u64;
        prop_assert_eq!(got.len() as u64, lines.saturating_sub(header));
        let covered: u64 = got.iter().map(|&(_, _, s)| u64::from(s)).sum();
        prop_assert_eq!(got.first().map_or(bytes.len() as u64, |&(_, o, _)| o) + covered, bytes.len() as u64);
    }
}

/// `string` columns: a strings stream of one sample per column, each field's bytes as they are
/// (unquoted, spaces kept, any bytes); a missing one takes the default string or fails the line,
/// and a failed line keeps nothing of its strings.
#[test]
fn string_columns_are_strings_samples_a_column_each() {
    let d = decoder(
        3,
        vec![
            stream("w", CsvType::String, &[2, 0], Some(CsvValue::Text(b"?".to_vec()))),
            stream("t", CsvType::String, &[1], None),
        ],
    );
    let mut out = d.buffers::<f32>(4);
    let mut errors = Vec::new();
    let lines: [&[u8]; 4] = [b"a, b ,\"c\"\"d\"\n", b",x,NA\n", b"p,,q\n", b"\xff,\xfe,\n"];
    for (i, l) in lines.iter().enumerate() {
        let file = name();
        let at = RecordAt { file: &file, line: i as u64, offset: 0 };
        d.decode_record(l, &at, &mut out, &mut errors);
    }
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].message.contains("field 1 (stream 't') is required"), "{errors:?}");
    let streams = d.chunk_streams(out);
    let strings = |k: usize| match &streams[k].data {
        StreamValues::Strings { offsets, bytes } => {
            offsets.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect::<Vec<Vec<u8>>>()
        }
        other => panic!("strings, not {other:?}"),
    };
    let w: Vec<&[u8]> = vec![b"c\"d", b"a", b"?", b"?", b"?", b"\xff"];
    assert_eq!(strings(0), w);
    assert_eq!(strings(1), vec![b" b ".to_vec(), b"x".to_vec(), b"\xfe".to_vec()]);
    assert_eq!(streams[0].seq_offsets, vec![0, 2, 4, 4, 6]);
    assert_eq!(streams[1].seq_offsets, vec![0, 1, 2, 2, 3]);
}

/// Values (as bits), sequence offsets and errors (line, message) of a decode.
type Decoded = (Vec<Vec<u64>>, Vec<Vec<usize>>, Vec<(u64, String)>);

fn decode_bits<T: DeepxElement>(dec: &CsvDecoder, lines: &[String], bits: fn(T) -> u64) -> Decoded {
    let mut errors = Vec::new();
    let mut out = dec.buffers::<T>(lines.len());
    for (i, l) in lines.iter().enumerate() {
        dec.decode_record(l.as_bytes(), &RecordAt { file: &name(), line: i as u64, offset: 0 }, &mut out, &mut errors);
    }
    let values = out.iter().map(|b| b.values.iter().map(|&x| bits(x)).collect()).collect();
    let offsets = out.iter().map(|b| b.seq_offsets.clone()).collect();
    (values, offsets, errors.iter().map(|e| (e.at.line, e.message.clone())).collect())
}

/// One field of a line the fast path may or may not take: plain numbers mostly, and what sends
/// a line to the general path (spaces, quotes, exponents, long mantissas, empty fields, `\r`,
/// `na_value`, a wrong type, an integer past the precision or `i32`).
fn fast_or_not_field() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (-99_999i64..99_999, 0u32..6).prop_map(|(m, scale)| {
            let s = format!("{}", m.abs());
            let sign = if m < 0 { "-" } else if m % 7 == 0 { "+" } else { "" };
            if scale == 0 || scale as usize >= s.len() { format!("{sign}{s}") } else {
                let (a, b) = s.split_at(s.len() - scale as usize);
                format!("{sign}{a}.{b}")
            }
        }),
        2 => (-(1i64 << 40)..(1i64 << 40)).prop_map(|i| i.to_string()),
        1 => prop::sample::select(vec![
            "", " 1", "1 ", "\"2\"", "1e3", "NA", "0.123456789012345678", "-", "+", ".", "1.", ".5", "1\r",
            "16777217", "-9223372036854775808", "9223372036854775808", "2147483648", "x", "1.2.3", "+-1",
        ]).prop_map(str::to_owned),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The fast path reads every line exactly as the general path does: the same values, bit for
    /// bit, the same sequences and the same errors — in either precision, for float and integer
    /// streams and unread columns.
    #[test]
    fn the_fast_path_reads_every_line_as_the_general_path(
        rows in prop::collection::vec((prop::collection::vec(fast_or_not_field(), 1..6), any::<bool>()), 1..20),
        types in prop::collection::vec(0u8..5, 5),
        f64_precision in any::<bool>(),
    ) {
        let columns = 4;
        let pick = |k: u8| match k { 0 => CsvType::F32, 1 => CsvType::F64, 2 => CsvType::I32, _ => CsvType::I64 };
        // Column 3 unread; columns 0-2 in two streams of their own types.
        let streams = vec![
            stream("a", pick(types[0]), &[0, 2], None),
            stream("b", pick(types[1]), &[1], (types[2] == 4).then_some(CsvValue::Int(5))),
        ];
        let d = CsvDecoder::new(
            CsvOptions { columns, field_delim: b',', use_quote_delim: true, na_value: b"NA".to_vec() },
            streams,
        );
        prop_assume!(d.has_fast_path());
        let general = d.clone().without_fast_path();
        let lines: Vec<String> = rows.iter().map(|(f, nl)| f.join(",") + if *nl { "\n" } else { "" }).collect();
        let run = |dec: &CsvDecoder| {
            if f64_precision {
                decode_bits::<f64>(dec, &lines, f64::to_bits)
            } else {
                decode_bits::<f32>(dec, &lines, |x| u64::from(x.to_bits()))
            }
        };
        prop_assert_eq!(run(&d), run(&general));
    }
}

/// `text` indexed from a file on `threads` threads: its records, digest and size, or the error.
fn index_on(
    text: &[u8],
    header: u64,
    limits: IndexLimits,
    threads: usize,
) -> Result<(Vec<crate::format::SequenceDesc>, u32, u64), String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("t.csv");
    std::fs::write(&p, text).expect("write");
    let layout = CsvLayout { skip_header_lines: header };
    let idx = index_file(&p, name(), layout, limits, threads, &mut |_| {}).map_err(|e| e.to_string())?;
    Ok((idx.sequences.iter().collect(), idx.digest, idx.size))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A file indexed in parts on several threads gives the one-thread index — every line a
    /// record, empty ones too, after the header lines (more of them than a part holds too) — and
    /// fails alike.
    #[test]
    fn an_index_in_parts_is_the_one_thread_index(
        lines in prop::collection::vec(0u8..5, 1..300),
        header in prop_oneof![3 => 0u64..3, 1 => 0u64..400],
        newline_at_end in any::<bool>(),
        max_sequences in prop::option::of(1u64..200),
        max_sequence_bytes in prop::option::of(4u64..40),
        threads in 2usize..6,
    ) {
        let mut text = String::new();
        for (k, kind) in lines.iter().enumerate() {
            use std::fmt::Write as _;
            let _ = match kind {
                0 => writeln!(text),
                1 => write!(text, "a,\"b\nc\",d\r\n"),
                2 => writeln!(text, "{k},{}.5,x", k * 3),
                _ => writeln!(text, "{k}"),
            };
        }
        if !newline_at_end {
            text.pop();
        }
        let limits = IndexLimits {
            max_sequences: max_sequences.unwrap_or(u64::MAX),
            max_sequence_bytes: max_sequence_bytes.unwrap_or(1 << 20),
            ..IndexLimits::UNBOUNDED
        };
        let one = index_on(text.as_bytes(), header, limits, 1);
        prop_assert_eq!(one, index_on(text.as_bytes(), header, limits, threads));
    }
}

/// A file of many parts is indexed in parts (the digest and every record as the one-thread pass).
#[test]
fn a_large_file_is_indexed_in_parts_as_on_one_thread() {
    let text: String = std::iter::once("h\n".to_owned()).chain((0..5000).map(|i| format!("{i},{}\n", i * 2))).collect();
    let one = index_on(text.as_bytes(), 1, IndexLimits::UNBOUNDED, 1).expect("one thread");
    assert_eq!(one.0.len(), 5000);
    assert_eq!(index_on(text.as_bytes(), 1, IndexLimits::UNBOUNDED, 4).expect("parts"), one);
}

/// Found by a hostile probe: every error named the line's first byte as its offset; it names
/// the first byte of the field it is about (quoted fields with the delimiter inside skipped
/// whole, `\r`s counted), and a line of too many fields says how many.
#[test]
fn an_error_names_the_byte_where_its_field_begins() {
    let d = decoder(3, vec![stream("x", CsvType::F32, &[0, 2], None), stream("s", CsvType::String, &[1], None)]);
    let lines = ["1,2\0,3\n", "1,\"a,b\",zz\n", "1,\"a\"x,2\n", "1,b,2,3\n", "1\r,b,q\n", "1,b\n"];
    let mut out = d.buffers::<f32>(lines.len());
    let mut errors = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let file = name();
        d.decode_record(l.as_bytes(), &RecordAt { file: &file, line: i as u64, offset: 1000 }, &mut out, &mut errors);
    }
    // Lines 1-based.
    let got: Vec<(u64, u64, &str)> = errors.iter().map(|e| (e.at.line, e.at.offset, e.message.as_str())).collect();
    assert_eq!(got.len(), 5, "{got:?}");
    assert_eq!((got[0].0, got[0].1), (2, 1008), "{got:?}"); // zz after `1,"a,b",`
    assert_eq!((got[1].0, got[1].1), (3, 1002), "{got:?}"); // the quoted field 1
    assert_eq!((got[2].0, got[2].1, got[2].2), (4, 1006, "expected 3 fields, found 4"), "{got:?}");
    assert_eq!((got[3].0, got[3].1), (5, 1005), "{got:?}"); // q after `1\r,b,`
    assert_eq!((got[4].0, got[4].1, got[4].2), (6, 1000, "expected 3 fields, found 2"), "{got:?}");
}
