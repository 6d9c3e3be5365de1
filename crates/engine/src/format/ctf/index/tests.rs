use super::*;

fn index(text: &[u8], skip_ids: bool, main: Option<&str>) -> Result<FileIndex, DataError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("t.ctf");
    std::fs::write(&p, text).expect("write");
    let opts = CtfIndexOptions { skip_sequence_ids: skip_ids, main_alias: main.map(str::to_owned) };
    index_file(&p, &opts, crate::options::IndexLimits::UNBOUNDED, 1, &mut |_| {})
}

fn shape(text: &str, skip_ids: bool, main: Option<&str>) -> Vec<(u64, u32)> {
    index(text.as_bytes(), skip_ids, main).expect("index").sequences.iter().map(|s| (s.key, s.samples)).collect()
}

fn fatal(text: &[u8]) -> String {
    index(text, false, None).expect_err("fatal").to_string()
}

#[test]
fn first_line_without_id_means_line_mode_and_later_ids_are_ignored() {
    assert_eq!(shape("|a 1\n5 |a 2\n5 |a 3\n", false, None), vec![(0, 1), (1, 1), (2, 1)]);
}

#[test]
fn id_mode_groups_consecutive_equal_ids_and_idless_lines_continue() {
    assert_eq!(shape("0 |a 1\n0 |a 2\n|a 3\n1 |a 4\n0 |a 5\n", false, None), vec![(0, 3), (1, 1), (0, 1)]);
}

#[test]
fn skip_sequence_ids_forces_line_mode() {
    assert_eq!(shape("0 |a 1\n0 |a 2\n", true, None), vec![(0, 1), (1, 1)]);
}

#[test]
fn byte_ranges_cover_the_sequence_up_to_the_next() {
    let idx = index(b"0 |a 1\n|a 2\n1 |a 3", false, None).expect("index");
    let r: Vec<(u64, u32)> = idx.sequences.iter().map(|s| (s.offset, s.size)).collect();
    assert_eq!(r, vec![(0, 12), (12, 6)]);
}

#[test]
fn boms_and_leading_whitespace() {
    assert_eq!(shape("\u{feff}|a 1\n", false, None), vec![(0, 1)]);
    assert!(fatal(b"\xff\xfe|\x00a").contains("UTF-16"));
    // As CNTK 2.7: the bytes of a BOM are skipped as far as they match (found by a probe).
    assert_eq!(shape("\u{feff}0 |a 1\n", false, None), vec![(0, 1)]);
    for head in [&b"\xef"[..], b"\xef\xbb"] {
        let mut text = head.to_vec();
        text.extend_from_slice(b"0 |a 1\n1 |a 2\n");
        let idx = index(&text, false, None).expect("a partial BOM is skipped");
        let r: Vec<(u64, u32)> = idx.sequences.iter().map(|s| (s.offset, s.size)).collect();
        assert_eq!(r, vec![(head.len() as u64, 7), (head.len() as u64 + 7, 7)]);
    }
    assert!(fatal(b"\xef\xbf0 |a 1\n").contains("byte offset 1"));
    assert!(fatal(b"\xef\xbb\xbe0 |a 1\n").contains("byte offset 2"));
    assert!(fatal(b"\x1f\x8b\x08\x00").contains("starts as gzip data does"));
    // Leading blank lines are skipped; line-mode keys still count them.
    assert_eq!(shape("\n\n  |a 1\n|a 2\n", false, None), vec![(2, 1), (3, 1)]);
}

#[test]
fn empty_and_whitespace_only_files_are_fatal() {
    assert!(fatal(b"").contains("empty"));
    assert!(fatal(b" \n\t\r\n").contains("empty"));
}

#[test]
fn a_non_digit_first_id_is_fatal_with_its_location() {
    let e = fatal(b"\nabc |a 1\n");
    assert!(e.contains("expected a sequence id"), "{e}");
    assert!(e.contains(":2: byte offset 1"), "{e}");
}

#[test]
fn id_overflow_is_fatal() {
    assert!(fatal(b"18446744073709551616 |a 1\n").contains("overflow"));
    assert_eq!(shape("18446744073709551615 |a 1\n", false, None), vec![(u64::MAX, 1)]);
}

#[test]
fn id_with_trailing_letters_keeps_the_digits() {
    assert_eq!(shape("12abc |a 1\n", false, None), vec![(12, 1)]);
}

#[test]
fn blank_lines_are_ignored_everywhere() {
    // Deviation from CNTK: no sequence in line mode, no sample in id mode.
    assert_eq!(shape("|a 1\n\n  \t\r\n|a 2\n\n", false, None), vec![(0, 1), (3, 1)]);
    assert_eq!(shape("0 |a 1\n\n|a 2\n \n", false, None), vec![(0, 2)]);
}

#[test]
fn a_line_with_only_an_id_still_counts() {
    assert_eq!(shape("0 |a 1\n0\n", false, None), vec![(0, 2)]);
}

#[test]
fn defines_mb_size_in_line_mode_drops_lines_without_the_main_stream() {
    assert_eq!(shape("|a 1 |b 1\n|a 2\n|b 3\n", false, Some("b")), vec![(0, 1), (2, 1)]);
}

#[test]
fn defines_mb_size_in_id_mode_counts_main_lines_and_drops_sequences_without_it() {
    assert_eq!(shape("0 |a 1 |b 1\n0 |a 2\n0 |a 3 |b 2\n1 |a 4\n2 |b 5\n", false, Some("b")), vec![(0, 2), (2, 1)]);
}

#[test]
fn main_stream_must_be_a_whole_token() {
    assert_eq!(shape("|a 1 |bb 1\n|b\n|b|a 2\n|b\t3\n|b\r\n", false, Some("b")), vec![(1, 1), (2, 1), (3, 1), (4, 1)]);
    // Inside a comment it still counts (CNTK does not know about comments here).
    assert_eq!(shape("|a 1 |# x |b 2\n", false, Some("b")), vec![(0, 1)]);
}

#[test]
fn a_missing_trailing_newline_ends_the_last_sequence_at_eof() {
    let idx = index(b"|a 1\n|a 2", false, None).expect("index");
    assert_eq!(idx.sequences.iter().last().map(|s| (s.offset, s.size)), Some((5, 4)));
}

#[test]
fn lines_spanning_read_blocks_are_joined() {
    let mut text = Vec::new();
    let long = "1 ".repeat(BLOCK_BYTES / 2 + 7);
    for i in 0..5 {
        text.extend_from_slice(format!("{i} |a {long}\n").as_bytes());
    }
    let idx = index(&text, false, None).expect("index");
    assert_eq!(idx.sequences.iter().map(|s| s.key).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    let total: u64 = idx.sequences.iter().map(|s| u64::from(s.size)).sum();
    assert_eq!(total, text.len() as u64);
}

fn limited(text: &[u8], limits: crate::options::IndexLimits) -> Result<FileIndex, DataError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("t.ctf");
    std::fs::write(&p, text).expect("write");
    index_file(&p, &CtfIndexOptions { skip_sequence_ids: false, main_alias: None }, limits, 1, &mut |_| {})
}

/// #15 item 3: 200 MB of short lines made a 2 GB index; the index pass now stops at the first
/// sequence past what the memory limit allows, naming its place.
#[test]
fn an_index_past_its_sequence_budget_stops_at_the_sequence_that_exceeds_it() {
    let limits = crate::options::IndexLimits {
        max_sequences: 3,
        max_sequence_bytes: 1 << 20,
        ..crate::options::IndexLimits::UNBOUNDED
    };
    assert_eq!(limited(b"|a 1\n|a 2\n|a 3\n", limits).expect("three fit").sequences.len(), 3);
    let e = limited(b"|a 1\n|a 2\n\n|a 3\n|a 4\n", limits).expect_err("four do not").to_string();
    assert!(e.contains(":5: byte offset 16") && e.contains("more than 3 sequences"), "{e}");
    assert!(e.contains("daemon.memory_limit_bytes"), "{e}");
    // Id mode: sequences, not lines, count.
    assert_eq!(limited(b"1 |a 1\n1 |a 2\n2 |a 3\n3 |a 3\n3 |a 3\n", limits).expect("ids").sequences.len(), 3);
}

/// #15 item 3: one endless line (a gzip bomb of digits) was carried whole into memory.
#[test]
fn a_line_or_sequence_longer_than_the_largest_allowed_is_refused_with_its_place() {
    let limits = crate::options::IndexLimits {
        max_sequences: u64::MAX,
        max_sequence_bytes: 16,
        ..crate::options::IndexLimits::UNBOUNDED
    };
    let e = limited(b"|a 1\n|a 1 2 3 4 5 6 7 8 9\n", limits).expect_err("long line").to_string();
    assert!(e.contains(":2: byte offset 5") && e.contains("more than 16 bytes"), "{e}");
    // Many short lines of one id make one long sequence.
    let e = limited(b"7 |a 1\n7 |a 2\n7 |a 3\n7 |a 4\n8 |a 5\n", limits).expect_err("long sequence").to_string();
    assert!(e.contains(":1: byte offset 0") && e.contains("exceeds the largest allowed, 16 bytes"), "{e}");
    // A line longer than the index pass's read block is bounded too.
    let long = format!("|a {}\n", "1 ".repeat(300_000));
    let e = limited(long.as_bytes(), limits).expect_err("longer than a block").to_string();
    assert!(e.contains(":1: byte offset 0"), "{e}");
}

/// A file that grows during the index pass yields more bytes than the size taken before it: the
/// open id-mode sequence ends where the bytes did (its length was `size - offset`, which wrapped
/// below zero for a sequence that started past `size`).
#[test]
fn a_file_that_grew_during_the_pass_ends_its_last_sequence_where_the_bytes_did() {
    let text = b"0 |a 1\n1 |a 2\n";
    let opts = CtfIndexOptions { skip_sequence_ids: false, main_alias: None };
    let path: Arc<Path> = Arc::from(Path::new("grown.ctf"));
    let idx =
        index_reader(&text[..], &path, 7, &opts, crate::options::IndexLimits::UNBOUNDED, &mut |_| {}).expect("indexed");
    let r: Vec<(u64, u32)> = idx.sequences.iter().map(|s| (s.offset, s.size)).collect();
    assert_eq!(r, vec![(0, 7), (7, 7)]);
}

#[test]
fn digits_the_file_ends_in_are_no_id() {
    // CNTK 2.7 reads an id up to the byte after it: a last line of bare digits without a newline
    // stays in the open sequence's bytes and adds nothing to its length.
    for text in ["0 |a 1\n1", "0 |a 1\n0", "0 |a 1\n\n12345"] {
        let idx = index(text.as_bytes(), false, None).expect("index");
        let r: Vec<(u64, u32, u64, u32)> = idx.sequences.iter().map(|s| (s.key, s.samples, s.offset, s.size)).collect();
        assert_eq!(r, vec![(0, 1, 0, u32::try_from(text.len()).expect("short"))], "{text:?}");
    }
    assert_eq!(shape("0 |a 1\n1 |a 2\n12", false, None), vec![(0, 1), (1, 1)]);
    // With a newline, or anything after the digits, it is an id.
    assert_eq!(shape("0 |a 1\n1\n", false, None), vec![(0, 1), (1, 1)]);
    assert_eq!(shape("0 |a 1\n1 ", false, None), vec![(0, 1), (1, 1)]);
    assert_eq!(shape("0 |a 1\n0 ", false, None), vec![(0, 2)]);
    // Line mode has no ids: the line is a sequence.
    assert_eq!(shape("|a 1\n5", false, None), vec![(0, 1), (1, 1)]);
    // The file's only line: no id at all.
    let e = fatal(b"\n5");
    assert!(e.contains("expected a sequence id") && e.contains(":2: byte offset 1"), "{e}");
}

/// `text` indexed on `threads` threads within `limits`, as one comparable value.
fn index_on(
    text: &[u8],
    opts: &CtfIndexOptions,
    limits: crate::options::IndexLimits,
    threads: usize,
) -> Result<(Vec<SequenceDesc>, u32, u64), String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("t.ctf");
    std::fs::write(&p, text).expect("write");
    let mut last = 0;
    let idx = index_file(&p, opts, limits, threads, &mut |b| last = b)
        .map_err(|e| e.to_string().replace(&*dir.path().to_string_lossy(), "DIR"))?;
    assert_eq!(last, text.len() as u64, "progress ends at the file's size");
    Ok((idx.sequences.iter().collect(), idx.digest, idx.size))
}

/// One CTF line of the generated files: an id (or none), samples of `|a` and `|b`, or a blank.
fn generated_line(kind: u8, id: u64, k: usize) -> String {
    match kind % 8 {
        0 => "\n".into(),
        1 => "  \t\n".into(),
        2 => format!(" |a {k} {k}.5\n"),
        3 => format!("{id}\t|b {k}:1\n"),
        _ => format!("{id} |a {k} 1 |b 2:{k}\n"),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..proptest::prelude::ProptestConfig::default() })]

    /// A file cut into parts on several threads indexes exactly as on one: sequences, keys,
    /// lines, sizes, the digest — and the same error, at the same place, where there is one.
    #[test]
    fn an_index_in_parts_is_the_one_thread_index(
        lines in proptest::collection::vec((0u8..8, 0u64..4), 1..300),
        line_mode in proptest::prelude::any::<bool>(),
        main in proptest::prelude::any::<bool>(),
        newline_at_end in proptest::prelude::any::<bool>(),
        bom in proptest::prelude::any::<bool>(),
        bad_at in proptest::option::of(0usize..300),
        max_sequences in proptest::option::of(1u64..200),
        threads in 2usize..6,
    ) {
        let mut text = String::new();
        if bom {
            text.push('\u{feff}');
        }
        // Ids grow in runs; ids repeat only in consecutive lines, as a sequence's do.
        let mut id = 0;
        for (k, &(kind, step)) in lines.iter().enumerate() {
            id += step / 3;
            let line = generated_line(kind, id, k);
            let line = if line_mode { line.trim_start_matches(|c: char| c.is_ascii_digit()).to_owned() } else { line };
            text.push_str(&line);
            if bad_at == Some(k) {
                text.push_str("x |a 1e999999999999999999999\n");
            }
        }
        if !newline_at_end {
            text.pop();
        }
        let opts = CtfIndexOptions { skip_sequence_ids: false, main_alias: main.then(|| "a".to_owned()) };
        let limits = crate::options::IndexLimits {
            max_sequences: max_sequences.unwrap_or(u64::MAX),
            ..crate::options::IndexLimits::UNBOUNDED
        };
        let one = index_on(text.as_bytes(), &opts, limits, 1);
        let many = index_on(text.as_bytes(), &opts, limits, threads);
        proptest::prop_assert_eq!(one, many);
    }
}

/// The cuts of an id-mode file fall between sequences, never inside one: a sequence of many
/// lines across the middle of the file stays whole.
#[test]
fn a_long_sequence_across_a_cut_stays_whole() {
    let text: String = (0..40).map(|i| format!("{} |a {i}\n", i / 20)).collect::<Vec<_>>().concat();
    let opts = CtfIndexOptions { skip_sequence_ids: false, main_alias: None };
    let one = index_on(text.as_bytes(), &opts, crate::options::IndexLimits::UNBOUNDED, 1).expect("one thread");
    let four = index_on(text.as_bytes(), &opts, crate::options::IndexLimits::UNBOUNDED, 4).expect("four threads");
    assert_eq!(one.0.iter().map(|s| s.samples).collect::<Vec<_>>(), vec![20, 20]);
    assert_eq!(one, four);
}

/// The pass in parts runs (it is not the one-thread pass under another name) for both modes.
#[test]
fn a_file_of_many_parts_is_indexed_in_parts_in_both_modes() {
    for text in ["|a 1\n".repeat(200), (0..200).map(|i| format!("{} |a {i}\n", i / 3)).collect::<Vec<_>>().concat()] {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.ctf");
        std::fs::write(&p, &text).expect("write");
        let file = std::fs::File::open(&p).expect("open");
        let opts = CtfIndexOptions { skip_sequence_ids: false, main_alias: None };
        let limits = crate::options::IndexLimits::UNBOUNDED;
        let name: Arc<Path> = Arc::from(p.as_path());
        let parts = index_in_parts(&file, &name, text.len() as u64, &opts, limits, 4, &mut |_| {})
            .expect("no error")
            .expect("indexed in parts");
        let one = index_file(&p, &opts, limits, 1, &mut |_| {}).expect("one thread");
        assert_eq!(parts, one);
    }
}
