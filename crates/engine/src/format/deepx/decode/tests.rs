//! The example tables of `reference/deepx-instance-formats.md` §7 (each obtained by running
//! deepx's parser), line by line: where deepx and minibatchd agree the tensors must be equal;
//! where they differ on purpose (`docs/differences.md`, section deepx) the case says so.

use std::fmt::Write;

use super::*;
use crate::options::{DeepxOptions, FormatKind};

fn schema(format: FormatKind, label_size: usize, x: usize) -> Schema {
    let o = DeepxOptions {
        label_size,
        w: true,
        uuid: true,
        x_size: (format == FormatKind::LibsvmEx).then_some(x),
        x_hist_item_size: (format == FormatKind::Uch).then_some(x),
        ..DeepxOptions::default()
    };
    Schema::new(format, &o)
}

/// Renders one parsed instance as `X0 | X1 | …; Y=..; W=..; U=..[; H=..]`, each group as
/// `id:value` entries, values as f32 `Display`.
fn render(d: &DeepxDecoder, b: &DeepxBufs<f32>, row: usize) -> String {
    let groups: Vec<String> =
        b.x.iter()
            .map(|x| {
                let (a, e) = (x.sample_offsets[row], x.sample_offsets[row + 1]);
                let ids = x.ids();
                (a..e).map(|i| format!("{}:{}", ids[i], x.values[i])).collect::<Vec<_>>().join(" ")
            })
            .collect();
    let k = d.schema().label_size;
    let list = |v: &[f32]| v[row * k..(row + 1) * k].iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let uuid = String::from_utf8_lossy(&b.uuid_bytes[b.uuid_offsets[row]..b.uuid_offsets[row + 1]]).into_owned();
    let mut s = format!("{}; Y={}; W={}; U={uuid}", groups.join(" | "), list(&b.y), list(&b.w));
    if matches!(d.schema().layout, Layout::Uch { .. }) {
        let _ = write!(s, "; H={}", b.hist_size[row]);
    }
    s
}

/// Normalises an expected string: every `id:value` value and every list element through f32.
fn normalise(expected: &str) -> String {
    let f = |t: &str| t.parse::<f32>().map_or_else(|_| t.to_owned(), |v| v.to_string());
    expected
        .split("; ")
        .map(|part| {
            if let Some((key, list)) = part.split_once('=') {
                if key == "U" {
                    return part.to_owned();
                }
                format!("{key}={}", list.split(',').map(f).collect::<Vec<_>>().join(","))
            } else {
                part.split(" | ")
                    .map(|g| {
                        g.split(' ')
                            .filter(|e| !e.is_empty())
                            .map(|e| e.split_once(':').map_or_else(|| e.to_owned(), |(i, v)| format!("{i}:{}", f(v))))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .collect::<Vec<_>>()
                    .join(" | ")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn decode(s: &Schema, line: &str) -> Result<String, Malformed> {
    let d = DeepxDecoder::new(s.clone());
    let mut b = d.buffers::<f32>();
    let mut errors = Vec::new();
    let file: Arc<Path> = Arc::from(Path::new("t.txt"));
    d.decode_line(line.as_bytes(), &LineContext { file: &file, line: 4, offset: 100 }, &mut b, &mut errors);
    match errors.pop() {
        Some(e) => {
            assert_eq!(b.samples, 0);
            assert_eq!(b.seq_offsets, vec![0, 0]);
            assert!(
                b.x.iter().all(|x| x.is_empty() && x.sample_offsets == vec![0]) && b.y.is_empty() && b.w.is_empty()
            );
            Err(e)
        }
        None => Ok(render(&d, &b, 0)),
    }
}

#[track_caller]
fn ok(s: &Schema, line: &str, expected: &str) {
    match decode(s, line) {
        Ok(got) => assert_eq!(got, normalise(expected), "line {line:?}"),
        Err(e) => panic!("line {line:?} rejected: {e}"),
    }
}

/// Rejected; `needle` must occur in the message.
#[track_caller]
fn err(s: &Schema, line: &str, needle: &str) {
    match decode(s, line) {
        Ok(got) => panic!("line {line:?} accepted as {got}"),
        Err(e) => assert!(e.message.contains(needle), "line {line:?}: {e}"),
    }
}

#[test]
fn libsvm_label_size_1_where_deepx_agrees() {
    let s = schema(FormatKind::Libsvm, 1, 0);
    ok(&s, "1 10000 20000 30000", "10000:1 20000:1 30000:1; Y=1; W=1; U=");
    ok(&s, "-1 uuid:abcde 10000:0.75 20000:0.5 30000:0.25", "10000:0.75 20000:0.5 30000:0.25; Y=-1; W=1; U=abcde");
    ok(&s, "1:0.5 10000", "10000:1; Y=1; W=0.5; U=");
    ok(&s, "1", "; Y=1; W=1; U=");
    ok(&s, "0 1:0.708333 2:1 3:1 4:-0.320755", "1:0.708333015 2:1 3:1 4:-0.320755005; Y=0; W=1; U=");
    ok(&s, "1:16 uuid:10001 1:-0.25 2:1 13:-1", "1:-0.25 2:1 13:-1; Y=1; W=16; U=10001");
    ok(&s, "\t1\t0:1\t1:1\t2\t3\t", "0:1 1:1 2:1 3:1; Y=1; W=1; U=");
    ok(&s, "1  2   3", "2:1 3:1; Y=1; W=1; U=");
    ok(&s, "1 3 1 2", "3:1 1:1 2:1; Y=1; W=1; U=");
    ok(&s, "1 2 2 2:0.5", "2:1 2:1 2:0.5; Y=1; W=1; U=");
    ok(&s, "1 281474976710657:0.5", "281474976710657:0.5; Y=1; W=1; U=");
    ok(&s, "1 18446744073709551615", "18446744073709551615:1; Y=1; W=1; U=");
    ok(&s, "+1 2 3", "2:1 3:1; Y=1; W=1; U=");
    ok(&s, "1e2 2", "2:1; Y=100; W=1; U=");
    ok(&s, "1 3:1e-2", "3:0.00999999978; Y=1; W=1; U=");
    ok(&s, "1 uuid:abc:def 1", "1:1; Y=1; W=1; U=abc:def");
    ok(&s, "1 uuid:a|b 1 2", "1:1 2:1; Y=1; W=1; U=a|b");
    ok(&s, "1 2:0.5\r", "2:0.5; Y=1; W=1; U=");
    ok(&s, "2:2 4:2 5:2 6 7", "4:2 5:2 6:1 7:1; Y=2; W=2; U=");
    ok(&s, "3 uuid:10000 8:1 9:1 10 11", "8:1 9:1 10:1 11:1; Y=3; W=1; U=10000");
    ok(&s, "4:4 uuid:10001 12:2 13:2 14 15", "12:2 13:2 14:1 15:1; Y=4; W=4; U=10001");
    ok(&s, "1 uuid:abc  5", "5:1; Y=1; W=1; U=abc");
    ok(&s, "1 0 5:1", "0:1 5:1; Y=1; W=1; U=");
}

#[test]
fn libsvm_rejections_shared_with_deepx() {
    let s = schema(FormatKind::Libsvm, 1, 0);
    err(&s, "1:0.5 -1 7", "invalid feature id");
    err(&s, "", "missing label");
    err(&s, " ", "missing label");
    err(&s, "a", "invalid label");
    err(&s, "10001", "out of range");
    err(&s, "-10001", "out of range");
    err(&s, "1~", "unexpected '~' after label");
    err(&s, "1:a", "invalid weight");
    err(&s, "1:-1", "out of range (0, 10000]");
    err(&s, "1:10001", "out of range (0, 10000]");
    err(&s, "1:0 2", "out of range (0, 10000]");
    err(&s, "1 uuid:", "empty uuid");
    err(&s, "1 uuid=10000", "invalid feature id");
    err(&s, "1 uuid:10000 a:1", "invalid feature id");
    err(&s, "1 uuid:10000 1~1", "unexpected '~'");
    err(&s, "1 uuid:10000 1:a", "invalid value of feature 1");
    err(&s, "1 uuid:10000 1:101", "out of range [-100, 100]");
    err(&s, "1 uuid:10000 1:-101", "out of range [-100, 100]");
    err(&s, "1 # comment", "invalid feature id");
    err(&s, "# comment", "invalid label");
    err(&s, "1 qid:3 1:1", "invalid feature id");
    err(&s, "1 -3:1", "invalid feature id");
    err(&s, "1 +3:1", "invalid feature id");
    err(&s, "1 0x10:1", "unexpected 'x'");
    err(&s, "1 2|3", "one feature group");
    err(&s, "1 2,3", "unexpected ','");
    err(&s, "1 3:", "invalid value of feature 3");
    err(&s, "uuid:abc 1 2", "invalid label");
    err(&s, "1 1 2 uuid:abc", "invalid feature id");
    err(&s, "nan 2", "invalid label");
    err(&s, "inf 2", "invalid label");
    err(&s, "1e5 2", "out of range");
}

/// deepx accepts these (§7.1 rows 13, 15, 18, 21, 22, 24–27, 31, 52, 53); minibatchd does not
/// reproduce its bugs.
#[test]
fn libsvm_deliberate_differences() {
    let s = schema(FormatKind::Libsvm, 1, 0);
    // Trailing blanks add no spurious feature 0.
    ok(&s, "1 2 3  ", "2:1 3:1; Y=1; W=1; U=");
    ok(&s, "1 2:0.5  ", "2:0.5; Y=1; W=1; U=");
    ok(&s, "1 uuid:abc ", "; Y=1; W=1; U=abc");
    // CRLF: the '\r' is dropped whatever the last token.
    ok(&s, "1 2 3\r", "2:1 3:1; Y=1; W=1; U=");
    ok(&s, "1\r", "; Y=1; W=1; U=");
    // Overflow and deepx's lenient numbers are errors.
    err(&s, "1 18446744073709551616", "overflows 64 bits");
    err(&s, "- 2 3", "invalid label");
    err(&s, "1 3:-", "invalid value of feature 3");
    err(&s, "1 3:.", "invalid value of feature 3");
    err(&s, "1 3:1.2.3", "unexpected '.' after feature '3:1.2'");
    err(&s, "1 3:0.5,4:1", "unexpected ','");
    err(&s, "1 2:3:4", "unexpected ':'");
    err(&s, "1:0.5x 3", "unexpected 'x' after label");
    err(&s, "1 3:1e", "digits after the exponent");
}

#[test]
fn libsvm_label_size_2_is_positional() {
    let s = schema(FormatKind::Libsvm, 2, 0);
    ok(&s, "1 -1", "; Y=1,-1; W=1,1; U=");
    ok(&s, "1:0.5 -1", "; Y=1,-1; W=0.5,1; U=");
    ok(&s, "1:0.5 -1:0.5", "; Y=1,-1; W=0.5,0.5; U=");
    ok(
        &s,
        "1 -1 uuid:abcde 10000:0.75 20000:0.5 30000:0.25",
        "10000:0.75 20000:0.5 30000:0.25; Y=1,-1; W=1,1; U=abcde",
    );
    ok(&s, "\t1\t10\t0:1\t1:1\t2\t3\t", "0:1 1:1 2:1 3:1; Y=1,10; W=1,1; U=");
    ok(&s, "2:2 20:20 4:2 5:2 6 7", "4:2 5:2 6:1 7:1; Y=2,20; W=2,20; U=");
    ok(&s, "3 30 uuid:10000 8:1 9:1 10 11", "8:1 9:1 10:1 11:1; Y=3,30; W=1,1; U=10000");
    ok(&s, "4:4 40:40 uuid:10001 12:2 13:2 14 15", "12:2 13:2 14:1 15:1; Y=4,40; W=4,40; U=10001");
    ok(&s, "1 5:1 6:1", "6:1; Y=1,5; W=1,1; U=");
    ok(&s, "1 5:0.5 6:1", "6:1; Y=1,5; W=1,0.5; U=");
    err(&s, "1 uuid:abc 5", "invalid label");
    err(&s, "1", "missing label 2 of label_size = 2");
}

#[test]
fn libsvm_ex_x_size_2() {
    let s = schema(FormatKind::LibsvmEx, 1, 2);
    ok(&s, "1 10000 20000 30000|40000 50000", "10000:1 20000:1 30000:1 | 40000:1 50000:1; Y=1; W=1; U=");
    ok(&s, "\t1\t0:1\t1:1|2\t3\t", "0:1 1:1 | 2:1 3:1; Y=1; W=1; U=");
    ok(&s, "2:2 4:2 5:2|6 7", "4:2 5:2 | 6:1 7:1; Y=2; W=2; U=");
    ok(&s, "3 uuid:10000 8:1 9:1|10 11", "8:1 9:1 | 10:1 11:1; Y=3; W=1; U=10000");
    ok(&s, "1 1 2 | 3 4", "1:1 2:1 | 3:1 4:1; Y=1; W=1; U=");
    ok(&s, "1 1 2|  3 4  ", "1:1 2:1 | 3:1 4:1; Y=1; W=1; U=");
    ok(&s, "1 1\t|\t2", "1:1 | 2:1; Y=1; W=1; U=");
    ok(&s, "1 1:0.5|2", "1:0.5 | 2:1; Y=1; W=1; U=");
    ok(&s, "1 uuid:a|b 1|2", "1:1 | 2:1; Y=1; W=1; U=a|b");
    ok(&s, "1 1 2|3:0.5\r", "1:1 2:1 | 3:0.5; Y=1; W=1; U=");
    ok(
        &s,
        "0:30 uuid:10015 1:-0.333333 2:-1 3:-0.333333 4:-0.660377 5:-0.844749 6:-1 7:-1|8:0.0229008 9:-1 10:-1 12:-1 13:-1",
        "1:-0.333332986 2:-1 3:-0.333332986 4:-0.660377026 5:-0.844748974 6:-1 7:-1 | 8:0.0229007993 9:-1 10:-1 12:-1 13:-1; Y=0; W=30; U=10015",
    );
    // A trailing '|' (deepx accepts it too), and empty groups after the last one.
    ok(&s, "1 1|2|", "1:1 | 2:1; Y=1; W=1; U=");
    ok(&s, "1 1|2||", "1:1 | 2:1; Y=1; W=1; U=");
    ok(&s, "1 1|2 |  |", "1:1 | 2:1; Y=1; W=1; U=");
    err(&s, "1 1|2||3", "more than x_size = 2");
    err(&s, "1 1 2|", "empty feature group 1");
    err(&s, "1 1 2||3", "empty feature group 1");
    err(&s, "1 |3", "missing feature group 0");
    err(&s, "1 1 2", "has 1 feature group(s), but x_size = 2");
    err(&s, "1|2 3", "unexpected '|' after label");
    err(&s, "1 1 2 # c|3", "invalid feature id");
    err(&s, "1 uuid:10000 1:1|a:1", "invalid feature id");
    err(&s, "1 uuid:10000 1:1|1~1", "unexpected '~'");
    err(&s, "1 uuid:10000 1:1|1:a", "invalid value");
    err(&s, "1 uuid:10000 1:1|1:101", "out of range");
    // Differences: deepx ignores a third group and the junk after a value, and drops CRLF lines
    // that end with a bare id.
    err(&s, "1 1|2|3", "more than x_size = 2");
    err(&s, "1 1:0.5x|2", "unexpected 'x'");
    ok(&s, "1 1 2|3 4\r", "1:1 2:1 | 3:1 4:1; Y=1; W=1; U=");
}

#[test]
fn uch_x_hist_item_size_3() {
    let s = schema(FormatKind::Uch, 1, 3);
    ok(
        &s,
        "1 uuid:abcde 10000:0.75 20000:0.5 30000:0.25|40000:0.75 50000:0.5|60000 70000|80000 90000",
        "10000:0.75 20000:0.5 30000:0.25 | 40000:0.75 50000:0.5 | 60000:1 70000:1 | 80000:1 90000:1 | ; Y=1; W=1; U=abcde; H=2",
    );
    ok(&s, "1 0|1|2|3|4", "0:1 | 1:1 | 2:1 | 3:1 | 4:1; Y=1; W=1; U=; H=3");
    ok(&s, "2 10|11", "10:1 | 11:1 |  |  | ; Y=2; W=1; U=; H=0");
    ok(&s, "3 20|21|22", "20:1 | 21:1 | 22:1 |  | ; Y=3; W=1; U=; H=1");
    ok(&s, "6 50|51|52|53|54|55", "50:1 | 51:1 | 52:1 | 53:1 | 54:1; Y=6; W=1; U=; H=3");
    ok(
        &s,
        "1 1:0.125 2:1 3:0.333333 |4:-0.320755 5:-0.406393 6:1| 7:1 |8:0.0839695 |9:1 10:-0.806452 12:-0.333333 13:0.5",
        "1:0.125 2:1 3:0.333332986 | 4:-0.320755005 5:-0.406392992 6:1 | 7:1 | 8:0.0839695036 | 9:1 10:-0.806451976 12:-0.333332986 13:0.5; Y=1; W=1; U=; H=3",
    );
    ok(&s, "1:0.5 uuid:u7 1|2|3", "1:1 | 2:1 | 3:1 |  | ; Y=1; W=0.5; U=u7; H=1");
    ok(&s, "1 1 2|3|", "1:1 2:1 | 3:1 |  |  | ; Y=1; W=1; U=; H=0");
    ok(&s, "1 1 2|3|  ", "1:1 2:1 | 3:1 |  |  | ; Y=1; W=1; U=; H=0");
    ok(&s, "1 1 2|3|4:1\r", "1:1 2:1 | 3:1 | 4:1 |  | ; Y=1; W=1; U=; H=1");
    err(&s, "1 1 2", "missing candidate");
    err(&s, "1 1 2|", "missing candidate");
    err(&s, "1 |2", "missing user");
    err(&s, "1 uuid:10000 1:1|a:1", "invalid feature id");
    err(&s, "1 uuid:10000 1:1|1:101", "out of range");
    // Differences: deepx truncates the history at a malformed item and keeps the line (leaking
    // the item's features), ignores surplus items unparsed, and drops a CRLF line's last bare id.
    err(&s, "1 1 2|3||5", "history item 0 is empty");
    err(&s, "1 1 2|3|4 a|5", "invalid feature id");
    err(&s, "1 1 2|3|4|5 a", "invalid feature id");
    err(&s, "1 1|2|3:101|4", "out of range");
    err(&s, "1 1 2|3|4|5|6|7|junk!!", "invalid feature id");
    ok(&s, "1 1 2|3|4\r", "1:1 2:1 | 3:1 | 4:1 |  | ; Y=1; W=1; U=; H=1");
}

#[test]
fn errors_name_the_line_and_the_byte_offset() {
    let s = schema(FormatKind::Libsvm, 1, 0);
    let e = decode(&s, "1 2 3:x").expect_err("bad");
    assert_eq!((e.at.line, e.at.offset, e.kind), (5, 100 + 6, ErrorKind::BadLine));
    assert_eq!(e.at.file.as_ref(), Path::new("t.txt"));
}

/// A token of 2 MB in a bad line is quoted by its first characters and its length: the reason
/// stays in the message (a hostile probe's 2 MB value was quoted whole, and a client, told 8 KiB
/// of it, never learnt it was out of range).
#[test]
fn a_long_token_is_quoted_short_and_the_reason_kept() {
    let s = schema(FormatKind::Libsvm, 1, 0);
    let long = "1".repeat(2_000_000);
    for (line, reason) in [
        (format!("1 2:{long}"), "of feature 2 is out of range [-100, 100]"),
        (format!("1 {long}:1"), "overflows 64 bits"),
        (format!("1 2:0.5{long}x"), "unexpected 'x' after feature"),
    ] {
        let e = decode(&s, &line).expect_err("bad");
        assert!(e.message.contains(reason), "{}", &e.message[..e.message.len().min(300)]);
        assert!(e.message.len() < 300, "{} bytes: {}", e.message.len(), &e.message[..300]);
    }
}

/// Decodes `lines` in turn into one chunk's buffers.
fn decode_lines(s: Schema, lines: &[&str]) -> (DeepxDecoder, DeepxBufs<f32>, Vec<Malformed>) {
    let d = DeepxDecoder::new(s);
    let mut b = d.buffers::<f32>();
    let mut errors = Vec::new();
    let file: Arc<Path> = Arc::from(Path::new("t"));
    let ctx = LineContext { file: &file, line: 0, offset: 0 };
    for line in lines {
        d.decode_line(line.as_bytes(), &ctx, &mut b, &mut errors);
    }
    (d, b, errors)
}

#[test]
fn a_malformed_line_is_rolled_back_and_the_next_one_is_whole() {
    let (d, b, errors) =
        decode_lines(schema(FormatKind::Uch, 2, 2), &["1:2 3 uuid:q 1 2|3|4|5", "1 2 uuid:r 1|2|3 x", "0 1 7|8\n"]);
    assert_eq!(errors.len(), 1);
    assert_eq!(b.samples, 2);
    assert_eq!(b.seq_offsets, vec![0, 1, 1, 2]);
    assert_eq!(b.y, vec![1.0, 3.0, 0.0, 1.0]);
    assert_eq!(b.w, vec![2.0, 1.0, 1.0, 1.0]);
    assert_eq!(b.uuid_offsets, vec![0, 1, 1]);
    assert_eq!(b.hist_size, vec![2.0, 0.0]);
    assert_eq!(render(&d, &b, 1), normalise("7:1 | 8:1 |  | ; Y=0,1; W=1,1; U=; H=0"));
}

#[test]
fn svmlight_options() {
    let o = DeepxOptions { comments: true, qid: true, feature_index_base: 1, ..DeepxOptions::default() };
    let s = Schema::new(FormatKind::Libsvm, &o);
    let d = DeepxDecoder::new(s.clone());
    let mut b = d.buffers::<f32>();
    let mut errors = Vec::new();
    let file: Arc<Path> = Arc::from(Path::new("t"));
    let ctx = LineContext { file: &file, line: 0, offset: 0 };
    for line in
        ["1 qid:3 1:0.5 4 # a comment", "-1 qid:3#x 2", "0 qid:4 uuid:u 1", "0 1", "1 qid:1 0:1", "0 qid:99999999 1"]
    {
        d.decode_line(line.as_bytes(), &ctx, &mut b, &mut errors);
    }
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert!(messages[0].contains("unexpected '#' after qid"), "{messages:?}");
    assert!(messages[1].contains("missing 'qid:N'"), "{messages:?}");
    assert!(messages[2].contains("feature id 0 in a file with 1-based ids"), "{messages:?}");
    assert!(messages[3].contains("cannot be stored exactly"), "{messages:?}");
    assert_eq!(b.qid, vec![3.0, 4.0]);
    assert_eq!(b.x[0].ids(), vec![0, 3, 0]);
    assert_eq!(b.x[0].values, vec![0.5, 1.0, 1.0]);
}

#[test]
fn float64_keeps_deepx_doubles() {
    let s = schema(FormatKind::Libsvm, 1, 0);
    let d = DeepxDecoder::new(s);
    let mut b = d.buffers::<f64>();
    let file: Arc<Path> = Arc::from(Path::new("t"));
    d.decode_line(b"1 1:0.708333", &LineContext { file: &file, line: 0, offset: 0 }, &mut b, &mut Vec::new());
    assert_eq!(b.x[0].values, vec![708_333.0 * 1e-6]);
}

/// Long lines: every feature is kept in order, and a malformed feature far into a line rolls the
/// whole line back.
#[test]
fn long_lines_keep_every_feature_and_roll_back_whole() {
    let features = |n: u64| {
        let mut out = String::new();
        for i in 0..n {
            let _ = std::fmt::Write::write_fmt(&mut out, format_args!(" {}:{}.5", i * 7 + 1, i % 10));
        }
        out
    };
    let good = format!("1{}", features(70));
    let bad = format!("0{} 9:x{}", features(40), features(5));
    let (_, b, errors) = decode_lines(schema(FormatKind::Libsvm, 1, 0), &[&good, &bad, &good]);
    assert_eq!(errors.len(), 1);
    assert_eq!(b.samples, 2);
    let x = &b.x[0];
    assert_eq!(x.sample_offsets, vec![0, 70, 140]);
    let ids: Vec<u64> = (0..70).map(|i| i * 7 + 1).collect();
    assert_eq!(x.ids(), [ids.clone(), ids].concat());
    #[allow(clippy::cast_precision_loss)]
    let values: Vec<f32> = (0..70u64).map(|i| (i % 10) as f32 + 0.5).collect();
    assert_eq!(x.values, [values.clone(), values].concat());
}

/// Feature ids stay 32 bits wide while every one fits; the first wider id widens those before it,
/// a line rolled back after it leaves the others intact, and the chunk's streams carry the ids
/// stored as parsed: `U32` for a chunk of narrow ids, `U64` once one was wider.
#[test]
fn feature_ids_are_kept_narrow_until_one_needs_64_bits() {
    use crate::format::chunk::{Indices, StreamValues};
    let max32 = u64::from(u32::MAX);
    let narrow = [format!("1 0:1 {max32}:0.5 7"), "0 3:2".to_owned()];
    let (d, b, errors) = decode_lines(schema(FormatKind::Libsvm, 1, 0), &[&narrow[0], &narrow[1]]);
    assert!(errors.is_empty());
    assert!(b.x[0].narrow());
    assert_eq!(b.x[0].ids(), vec![0, max32, 7, 3]);
    let streams = d.into_streams(b);
    assert!(
        matches!(&streams[0].data, StreamValues::Sparse { indices: Indices::U32(v), .. } if **v == [0, u32::MAX, 7, 3])
    );

    let wide = max32 + 1;
    let lines =
        [format!("1 5:1 {max32}"), format!("0 {wide}:2 9 x"), format!("1 {wide} 1:0.25"), format!("0 {}:1", u64::MAX)];
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (d, b, errors) = decode_lines(schema(FormatKind::Libsvm, 1, 0), &refs);
    assert_eq!(errors.len(), 1, "the second line is malformed");
    assert!(!b.x[0].narrow());
    assert_eq!(b.x[0].ids(), vec![5, max32, wide, 1, u64::MAX]);
    assert_eq!(b.x[0].values, vec![1.0, 1.0, 1.0, 0.25, 1.0]);
    assert_eq!(b.x[0].sample_offsets, vec![0, 2, 4, 5]);
    let streams = d.into_streams(b);
    assert!(
        matches!(&streams[0].data, StreamValues::Sparse { indices: Indices::U64(v), .. } if **v == [5, max32, wide, 1, u64::MAX])
    );
}

/// A line rolled back after widening the ids (every id before it fit) narrows them back, once
/// per chunk; a second such line leaves them wide. The ids are right either way.
#[test]
fn a_rolled_back_wide_id_narrows_the_ids_back_once() {
    let wide = u64::from(u32::MAX) + 1;
    let lines = [
        "1 3:1 7".to_owned(),
        format!("0 4:1 {wide}:0.5 x"),
        "1 5".to_owned(),
        format!("0 {wide} 9:y"),
        "1 6:2".to_owned(),
    ];
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (_, b, errors) = decode_lines(schema(FormatKind::Libsvm, 1, 0), &refs[..3]);
    assert_eq!(errors.len(), 1);
    assert!(b.x[0].narrow(), "the widening line was rolled back");
    assert_eq!(b.x[0].ids(), vec![3, 7, 5]);
    let (_, b, errors) = decode_lines(schema(FormatKind::Libsvm, 1, 0), &refs);
    assert_eq!(errors.len(), 2);
    assert!(!b.x[0].narrow(), "narrowed back once per chunk only");
    assert_eq!(b.x[0].ids(), vec![3, 7, 5, 6]);
    assert_eq!(b.x[0].values, vec![1.0, 1.0, 1.0, 2.0]);
    assert_eq!(b.x[0].sample_offsets, vec![0, 2, 3, 4]);
}

/// The plain-feature fast path ([`plain_feature`], taken where 24 bytes of the line are left)
/// changes nothing: long random lines of every format — plain features, other shapes (signs,
/// exponents, long ids, values without ids), blanks and tabs, `|`, malformed tokens — decode to
/// the same buffers and the same errors with it and with the general readers only.
#[test]
#[allow(clippy::cast_possible_truncation)] // indices below 10
fn the_plain_feature_fast_path_decodes_as_the_general_readers_do() {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let formats = [
        (FormatKind::Libsvm, DeepxOptions::default()),
        (FormatKind::Libsvm, DeepxOptions { feature_index_base: 1, ..DeepxOptions::default() }),
        (FormatKind::Libsvm, DeepxOptions { qid: true, comments: true, ..DeepxOptions::default() }),
        (FormatKind::LibsvmEx, DeepxOptions { x_size: Some(2), ..DeepxOptions::default() }),
        (FormatKind::Uch, DeepxOptions { x_hist_item_size: Some(2), ..DeepxOptions::default() }),
    ];
    let mut features = 0;
    for (format, options) in formats {
        let fast = DeepxDecoder::new(Schema::new(format, &options));
        let general = fast.clone().general_only();
        let mut text = String::new();
        for _ in 0..600 {
            let _ = write!(text, "{}", next(2));
            if options.qid {
                let _ = write!(text, " qid:{}", next(100));
            }
            for f in 0..next(40) {
                let blank = [" ", " ", " ", "\t", "  "][next(5) as usize];
                let text_of = match next(21) {
                    0..=7 => format!("{}:1", next(20_000_000)),
                    8..=13 => format!("{}:{}.{:0w$}", next(1000), next(10), next(10_000_000), w = 1 + next(7) as usize),
                    14 => format!("{}:-{}.{}", next(100), next(10), next(1000)),
                    15 => format!("{}:{}e-{}", next(100), next(10), next(3)),
                    16 => format!("{}:1", next(u64::MAX)),
                    17 => format!("{}", next(1000)),
                    18 => ["|", "0:1", "1:0.5x", "3:1,4:1", "1:1.5.5", "#c", "7:12.25"][next(7) as usize].to_owned(),
                    // Tokens longer than 64 bytes, far past the fast path's 24-byte window.
                    19 => match next(3) {
                        0 => format!("{}:0.{}5", next(100), "0".repeat(50 + next(80) as usize)),
                        1 => format!("|{}", "1|".repeat(30 + next(20) as usize)),
                        _ => format!("{}:1{}", next(100), "x".repeat(60 + next(10) as usize)),
                    },
                    _ => format!("{}:{}.{}", next(100_000_000), next(10), next(100_000_000)),
                };
                let _ = write!(text, "{blank}{text_of}");
                if f == 5 && format != FormatKind::Libsvm {
                    text.push_str(" | ");
                }
            }
            text.push_str(["\n", " \n", "\r\n", "\t\n"][next(4) as usize]);
        }
        let bytes = text.as_bytes();
        let path: Arc<Path> = Arc::from(Path::new("t.svm"));
        let (mut a, mut b) = (fast.buffers::<f32>(), general.buffers::<f32>());
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        let (mut at, mut line) = (0usize, 0u64);
        for l in text.split_inclusive('\n') {
            let ctx = LineContext { file: &path, line, offset: at as u64 };
            fast.decode_line(&bytes[at..at + l.len()], &ctx, &mut a, &mut ea);
            general.decode_line(&bytes[at..at + l.len()], &ctx, &mut b, &mut eb);
            at += l.len();
            line += 1;
        }
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "{format:?} {options:?}");
        assert_eq!(format!("{ea:?}"), format!("{eb:?}"), "{format:?} {options:?}");
        assert!(a.samples > 50 && !ea.is_empty(), "{format:?}: {} samples, {} errors", a.samples, ea.len());
        features += a.x.iter().map(SparseBuf::len).sum::<usize>();
    }
    assert!(features > 10_000, "{features} features");
}
