//! Property tests of the CTF engine: the decoded samples are the ones written, whatever the
//! chunk size, the spacing (spaces, tabs, several of them), the line endings (LF or CRLF), the id
//! style (ids or line mode), and whether the last line ends with a newline — except where CNTK 2.7
//! refuses a last line without one: its empty sparse sample there, with no sparse entry in the
//! last sequence.

mod support;

use std::fmt::Write as _;
use std::path::Path;

use minibatchd::dump::for_each_minibatch;
use minibatchd_engine::minibatch::MbData;
use minibatchd_engine::sampling::{EpochLimit, Window};
use proptest::prelude::*;
use support::{dump_options, in_file_order, randomized, write};

/// A sample: 3 dense values and up to 3 sparse entries, all exactly representable.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    dense: Vec<f32>,
    sparse: Vec<(i32, f32)>,
}

#[derive(Debug, Clone)]
struct Style {
    sep: &'static str,
    crlf: bool,
    ids: bool,
    final_newline: bool,
    chunk_size: u64,
}

fn value() -> impl Strategy<Value = f32> {
    (-400i16..400).prop_map(|q| f32::from(q) / 4.0)
}

fn sample() -> impl Strategy<Value = Sample> {
    (prop::collection::vec(value(), 0..=3), prop::collection::vec((0i32..7, value()), 0..=3)).prop_map(
        |(mut dense, sparse)| {
            dense.resize(3, 0.0); // short dense samples are zero-padded
            Sample { dense, sparse }
        },
    )
}

fn style() -> impl Strategy<Value = Style> {
    (prop::sample::select(vec![" ", "\t", "  ", " \t "]), any::<bool>(), any::<bool>(), any::<bool>(), 1u64..400)
        .prop_map(|(sep, crlf, ids, final_newline, chunk_size)| Style { sep, crlf, ids, final_newline, chunk_size })
}

fn fmt(v: f32) -> String {
    format!("{v}")
}

/// Renders sequences; with `ids: false` every sequence must have one sample (line mode).
fn render(seqs: &[Vec<Sample>], s: &Style) -> String {
    let nl = if s.crlf { "\r\n" } else { "\n" };
    let mut out = String::new();
    for (i, seq) in seqs.iter().enumerate() {
        for smp in seq {
            if s.ids {
                write!(out, "{i}{}", s.sep).expect("writing to a String");
            }
            let dense: Vec<String> = smp.dense.iter().map(|&v| fmt(v)).collect();
            let sparse: Vec<String> = smp.sparse.iter().map(|&(k, v)| format!("{k}:{}", fmt(v))).collect();
            write!(out, "|d{}{}{}|s{}{}{}", s.sep, dense.join(s.sep), s.sep, s.sep, sparse.join(s.sep), s.sep)
                .expect("writing to a String");
            out.push_str(nl);
        }
    }
    if !s.final_newline {
        out.truncate(out.len() - nl.len());
    }
    out
}

/// A minibatch offset (`i64`, as CNTK has it) as an index.
fn offset(o: i64) -> usize {
    usize::try_from(o).expect("offsets are non-negative")
}

fn decode(text: &str, chunk_size: u64) -> Result<Vec<Vec<Sample>>, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "p.ctf", text);
    let cfg = format!(
        "[datasets.p]\nformat = \"ctf\"\nfiles = [\"p.ctf\"]\ncache_index = false\nchunk_size_bytes = {chunk_size}\n\
         [datasets.p.streams.d]\ndim = 3\nformat = \"dense\"\n[datasets.p.streams.s]\ndim = 7\nformat = \"sparse\"\n"
    );
    let ds = support::open(&cfg, "p", dir.path(), Path::new("/nonexistent"));
    let options = dump_options(in_file_order(EpochLimit::FullSweep), 5, false);
    let mut seqs = Vec::new();
    for_each_minibatch(&ds, &options, &mut |mb| {
        let (d, s) = (&mb.streams[0], &mb.streams[1]);
        for q in 0..d.num_sequences() {
            let mut seq = Vec::new();
            for j in offset(d.sequence_offsets[q])..offset(d.sequence_offsets[q + 1]) {
                let (MbData::Dense { values, .. }, MbData::Sparse { sample_offsets, indices, values: sv, .. }) =
                    (&d.data, &s.data)
                else {
                    panic!("stream kinds")
                };
                let (
                    minibatchd_engine::minibatch::MbValues::F32(dv),
                    minibatchd_engine::minibatch::MbIndices::I32(ix),
                    minibatchd_engine::minibatch::MbValues::F32(svv),
                ) = (values, indices, sv)
                else {
                    panic!("float32 CTF")
                };
                let (e0, e1) = (offset(sample_offsets[j]), offset(sample_offsets[j + 1]));
                seq.push(Sample {
                    dense: dv[j * 3..j * 3 + 3].to_vec(),
                    sparse: (e0..e1).map(|e| (ix[e], svv[e])).collect(),
                });
            }
            seqs.push(seq);
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok(seqs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn samples_survive_any_chunking_spacing_and_line_endings(
        seqs in prop::collection::vec(prop::collection::vec(sample(), 1..4), 1..12),
        style in style(),
    ) {
        // Line mode makes every line a sequence: flatten the expectation.
        let expected: Vec<Vec<Sample>> = if style.ids {
            seqs.clone()
        } else {
            seqs.iter().flatten().map(|s| vec![s.clone()]).collect()
        };
        let text = render(&seqs, &style);
        // Without a final newline the file ends in the last sample's `|s` entries: empty, and
        // with no entry of `s` in the last sequence, CNTK 2.7 charges an error there (and the
        // default max_errors = 0 stops).
        let refused = !style.final_newline && expected.last().is_some_and(|q| q.iter().all(|s| s.sparse.is_empty()));
        if refused {
            let e = decode(&text, style.chunk_size).expect_err("refused");
            prop_assert!(e.contains("found the end of the sequence"), "{}\ntext:\n{}", e, text);
        } else {
            prop_assert_eq!(decode(&text, style.chunk_size), Ok(expected), "text:\n{}", text);
        }
    }

    #[test]
    fn chunk_size_never_changes_the_data(
        seqs in prop::collection::vec(prop::collection::vec(sample(), 1..3), 1..10),
        a in 1u64..300, b in 1u64..300,
    ) {
        let style = Style { sep: " ", crlf: false, ids: true, final_newline: true, chunk_size: 0 };
        let text = render(&seqs, &style);
        prop_assert_eq!(decode(&text, a), decode(&text, b));
    }
}

/// Tokens that make up hostile CTF-like input.
fn soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop::sample::select(vec![
        &b"|d"[..],
        b"|s",
        b"|",
        b"||",
        b"|#",
        b" ",
        b"\t",
        b"\n",
        b"\r\n",
        b"\r",
        b"0",
        b"12",
        b"-",
        b"+",
        b".",
        b"e",
        b"E",
        b":",
        b"3:",
        b"9:",
        b"1.5",
        b"1e400",
        b"99999999999999999999",
        b"abc",
        b"\xef\xbb\xbf",
        b"\xff\xfe",
        b"\x00",
        b"\xc3\xa9",
    ]);
    prop::collection::vec(token, 0..60).prop_map(|v| v.concat())
}

fn dump_soup(bytes: &[u8], chunk_size: u64, max_errors: u64, skip_ids: bool) -> Result<u64, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "p.ctf", bytes);
    let cfg = format!(
        "[datasets.p]\nformat = \"ctf\"\nfiles = [\"p.ctf\"]\ncache_index = false\nchunk_size_bytes = {chunk_size}\n\
         max_errors = {max_errors}\nskip_sequence_ids = {skip_ids}\n\
         [datasets.p.streams.d]\nalias = \"d\"\ndim = 3\nformat = \"dense\"\n[datasets.p.streams.s]\ndim = 7\nformat = \"sparse\"\n"
    );
    let ds = support::try_open(&cfg, "p", dir.path(), Path::new("/nonexistent"))?;
    let options = dump_options(randomized(Window::Chunks(2), 1, EpochLimit::Sweeps(2)), 3, false);
    let mut n = 0;
    for_each_minibatch(&ds, &options, &mut |_| {
        n += 1;
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok(n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No input can make the engine panic: it decodes or reports an error.
    #[test]
    fn hostile_input_never_panics(bytes in soup(), chunk_size in 1u64..64, max_errors in 0u64..1000, skip_ids in any::<bool>()) {
        match dump_soup(&bytes, chunk_size, max_errors, skip_ids) {
            Ok(_) => {}
            Err(e) => prop_assert!(!e.is_empty()),
        }
    }
}
