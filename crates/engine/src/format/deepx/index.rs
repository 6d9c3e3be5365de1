//! The index pass of the deepx formats: every non-blank line is a sequence of nominal length 1.
//!
//! One sequential scan finds line boundaries; nothing is parsed. A sequence's key and `line`
//! are its 0-based line number, its bytes run from the line's first byte to the next line's
//! first byte (the `\n` included), so blank lines between sequences are gaps that CNTK's chunk
//! rule counts in a chunk's span, as for CTF.
//!
//! * A line is blank when it holds only spaces, tabs and `\r`; blank lines are no sequences.
//! * With svmlight comments on, a line whose first non-blank byte is `#` is no sequence either.
//! * A UTF-8 byte-order mark at the start of the file is skipped (deepx rejects that line).
//! * A last line without `\n` is a sequence (deepx drops it).
//! * An empty file has no sequence and is not an error (deepx reads nothing from it); a dataset
//!   without any sequence is refused by [`Dataset::open`](crate::dataset::Dataset::open).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::format::errors::{DataError, Location};
use crate::format::index::{for_each_line, room_for_one_more, FileIndex, SequenceDesc, Sequences};
use crate::format::parts;
use crate::options::IndexLimits;

/// Size of the read buffer of the index pass: within a core's L2, so the bytes a read copies
/// are still cached when the line scan reads them (4 MiB blocks cost six times the system time:
/// the copy went to memory and the scan read it back).
const BLOCK_BYTES: usize = 256 << 10;

/// What shapes the index of a deepx file (and so keys its cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineIndexOptions {
    /// Lines starting with `#` (after blanks) are comments, not sequences.
    pub comments: bool,
}

impl LineIndexOptions {
    /// A stable description, part of the index cache key.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        format!("deepx-lines;v1;comments={}", u8::from(self.comments))
    }
}

/// Whether `b` is blank for the deepx formats: space, tab, or the `\r` of a CRLF line end.
#[inline]
pub(crate) fn is_blank_byte(b: u8) -> bool {
    b == b' ' || b == b'\t' || b == b'\r'
}

/// Indexes the bytes `reader` yields, within `limits` (`max_sequences`: what this file may add):
/// `size` is their total (for the sequence size check), `path` names them in errors and in the
/// result.
///
/// # Errors
/// I/O errors, and a line over `limits.max_sequence_bytes` or past `limits.max_sequences`.
pub fn index_reader(
    reader: impl Read,
    path: Arc<Path>,
    size: u64,
    options: LineIndexOptions,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let name = path.clone();
    let mut ix = LineIndexer { path, options, line_no: 0, sequences: Sequences::default(), limits };
    let max_line = limits.largest_sequence();
    let (consumed, digest) =
        for_each_line(reader, BLOCK_BYTES, &name, max_line, progress, |line, offset| ix.line(line, offset))?;
    let mut sequences = ix.sequences;
    // What the dataset keeps is what its memory accounting counts (`Dataset::index_bytes`).
    sequences.shrink_to_fit();
    Ok(FileIndex { path: ix.path, size: size.max(consumed), digest, sequences })
}

/// Indexes the local file `data` (named `path` in errors and in the result; a gzip input's
/// decompressed copy has another name than its data) on up to `threads` threads: a large file in
/// parts ([`crate::format::parts`]), each line a sequence wherever the file is cut; the index is
/// the one-thread pass's.
///
/// # Errors
/// As [`index_reader`].
pub fn index_file(
    data: &Path,
    path: Arc<Path>,
    options: LineIndexOptions,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let file = minibatchd_sys::files::open_regular(data).map_err(|e| DataError::io(&path, e))?;
    let size = file.metadata().map_err(|e| DataError::io(&path, e))?.len();
    let parts = parts::parts_for(size, threads);
    if parts >= 2 {
        let cuts = parts::cuts(&file, size, parts, |_, at| Ok(Some(at))).map_err(|e| DataError::io(&path, e))?;
        if !cuts.is_empty() {
            let share = parts::part_limits(limits, cuts.len() + 1);
            let passes = (0..=cuts.len())
                .map(|_| LineIndexer {
                    path: path.clone(),
                    options,
                    line_no: 0,
                    sequences: Sequences::default(),
                    limits: share,
                })
                .collect();
            let max_line = limits.largest_sequence();
            let parts =
                parts::Parts { file: &file, path: &path, cuts, block_bytes: BLOCK_BYTES, max_line_bytes: max_line };
            if let Some((scanned, digest)) = parts::scan(&parts, passes, progress, LineIndexer::line) {
                let end = scanned.last().map_or(0, |s| s.end);
                let found = scanned.into_iter().map(|s| (s.pass.sequences, s.lines)).collect();
                let sequences = parts::merge(found, true, &limits, &path)?;
                return Ok(FileIndex { path, size: size.max(end), digest, sequences });
            }
        }
    }
    let reader = std::io::BufReader::with_capacity(1 << 16, file);
    index_reader(reader, path, size, options, limits, progress)
}

struct LineIndexer {
    path: Arc<Path>,
    options: LineIndexOptions,
    line_no: u64,
    sequences: Sequences,
    limits: IndexLimits,
}

impl LineIndexer {
    /// One line (its `\n` included when present) starting at file offset `offset`.
    fn line(&mut self, line: &[u8], offset: u64) -> Result<(), DataError> {
        let line_no = self.line_no;
        self.line_no += 1;
        let (mut start, mut offset) = (0usize, offset);
        if offset == 0 && line.starts_with(&[0xEF, 0xBB, 0xBF]) {
            start = 3;
            offset = 3;
        }
        let first = line[start..].iter().position(|&b| !is_blank_byte(b)).map(|i| line[start + i]);
        match first {
            None | Some(b'\n') => return Ok(()),
            Some(b'#') if self.options.comments => return Ok(()),
            Some(_) => {}
        }
        let size = u32::try_from(line.len() - start).map_err(|_| DataError::Fatal {
            at: Location { file: self.path.clone(), line: line_no + 1, offset },
            message: format!("a line of {} bytes exceeds the limit of 4 GiB", line.len() - start),
        })?;
        let seq = SequenceDesc { key: line_no, offset, line: line_no, size, samples: 1 };
        room_for_one_more(&self.sequences, &seq, &self.limits, || Location {
            file: self.path.clone(),
            line: line_no + 1,
            offset,
        })?;
        self.sequences.push(seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` indexed as file `t` within `limits`.
    fn index_text(text: &[u8], limits: IndexLimits) -> Result<FileIndex, DataError> {
        index_reader(
            text,
            Arc::from(Path::new("t")),
            text.len() as u64,
            LineIndexOptions { comments: false },
            limits,
            &mut |_| {},
        )
    }

    /// #15 item 3: 200 MB of short libsvm lines made a 2 GB index in the daemon.
    #[test]
    fn an_index_past_its_sequence_budget_stops_at_the_line_that_exceeds_it() {
        let limits = IndexLimits { max_sequences: 2, max_sequence_bytes: 1 << 20, ..IndexLimits::UNBOUNDED };
        let run = |text: &[u8]| index_text(text, limits);
        assert_eq!(run(b"1 1:1\n\n0 2:1\n").expect("two fit").sequences.len(), 2);
        let e = run(b"1 1:1\n0 2:1\n1 3:1\n").expect_err("three do not").to_string();
        assert!(e.contains("t:3: byte offset 12") && e.contains("more than 2 sequences"), "{e}");
        let long = IndexLimits { max_sequences: 10, max_sequence_bytes: 8, ..IndexLimits::UNBOUNDED };
        let e = index_reader(
            &b"1 1:1\n1 1:1 2:1 3:1\n"[..],
            Arc::from(Path::new("t")),
            20,
            LineIndexOptions { comments: false },
            long,
            &mut |_| {},
        )
        .expect_err("long line")
        .to_string();
        assert!(e.contains("t:2: byte offset 6") && e.contains("more than 8 bytes"), "{e}");
    }

    /// Issue 37: the budget counts what the index holds. Lines without gaps cost their size, a
    /// byte under 128 (one sample each: the timeline keeps no length); with a blank line between
    /// each, also their offset and line, 17.
    #[test]
    fn an_index_past_its_byte_budget_stops_at_the_line_that_exceeds_it_and_gaps_cost_more() {
        // A byte a sequence, and a mark and an offset of 8 each every 64: 320 sequences fit in
        // 400 bytes (320 + 5 × 16), not 321 (321 + 6 × 16).
        let limits = IndexLimits { max_index_bytes: 400, ..IndexLimits::UNBOUNDED };
        let run = |text: &[u8]| index_text(text, limits);
        let dense = "1 1:1\n".repeat(40);
        let idx = run(dense.as_bytes()).expect("40 lines of a byte fit in 400");
        assert_eq!(crate::format::index::index_cost(&idx.sequences, &limits), 40 + 8 + 8);
        run("1 1:1\n".repeat(320).as_bytes()).expect("320 fit");
        let e = run("1 1:1\n".repeat(400).as_bytes()).expect_err("400 do not").to_string();
        assert!(e.contains("more than 400 bytes with 321 sequences") && e.contains("t:321: byte offset 1920"), "{e}");
        let gaps = "1 1:1\n\n".repeat(40);
        let e = run(gaps.as_bytes()).expect_err("gaps cost offsets and lines").to_string();
        assert!(e.contains("more than 400 bytes with"), "{e}");
    }

    fn index(text: &[u8], comments: bool) -> Vec<(u64, u64, u32)> {
        let idx = index_reader(
            text,
            Arc::from(Path::new("t")),
            text.len() as u64,
            LineIndexOptions { comments },
            IndexLimits::UNBOUNDED,
            &mut |_| {},
        )
        .expect("index");
        idx.sequences.iter().map(|s| (s.line, s.offset, s.size)).collect()
    }

    /// `text` indexed from a file on `threads` threads, as one comparable value.
    fn index_on(
        text: &[u8],
        comments: bool,
        limits: IndexLimits,
        threads: usize,
    ) -> Result<(Vec<SequenceDesc>, u32, u64), String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.svm");
        std::fs::write(&p, text).expect("write");
        let idx =
            index_file(&p, Arc::from(Path::new("t")), LineIndexOptions { comments }, limits, threads, &mut |_| {})
                .map_err(|e| e.to_string())?;
        Ok((idx.sequences.iter().collect(), idx.digest, idx.size))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..proptest::prelude::ProptestConfig::default() })]

        /// A file cut into parts on several threads indexes exactly as on one (and fails alike).
        #[test]
        fn an_index_in_parts_is_the_one_thread_index(
            lines in proptest::collection::vec(0u8..7, 1..300),
            comments in proptest::prelude::any::<bool>(),
            newline_at_end in proptest::prelude::any::<bool>(),
            bom in proptest::prelude::any::<bool>(),
            max_sequences in proptest::option::of(1u64..200),
            max_sequence_bytes in proptest::option::of(8u64..40),
            threads in 2usize..6,
        ) {
            let mut text = if bom { "\u{feff}".to_owned() } else { String::new() };
            for (k, kind) in lines.iter().enumerate() {
                let line = match kind {
                    0 => "\n".to_owned(),
                    1 => " \t\r\n".to_owned(),
                    2 => "# a comment\n".to_owned(),
                    3 => format!("1 {k}:1 7:0.5\r\n"),
                    _ => format!("{} {k}:1\n", k % 2),
                };
                text.push_str(&line);
            }
            if !newline_at_end {
                text.pop();
            }
            let limits = IndexLimits {
                max_sequences: max_sequences.unwrap_or(u64::MAX),
                max_sequence_bytes: max_sequence_bytes.unwrap_or(1 << 20),
                ..IndexLimits::UNBOUNDED
            };
            let one = index_on(text.as_bytes(), comments, limits, 1);
            proptest::prop_assert_eq!(one, index_on(text.as_bytes(), comments, limits, threads));
        }
    }

    #[test]
    fn every_non_blank_line_is_a_sequence() {
        assert_eq!(index(b"1 2\n\n \t\r\n0 3\n", false), vec![(0, 0, 4), (3, 9, 4)]);
    }

    #[test]
    fn a_last_line_without_newline_is_kept() {
        assert_eq!(index(b"1 2\n0 3", false), vec![(0, 0, 4), (1, 4, 3)]);
    }

    #[test]
    fn crlf_blank_lines_and_a_bom_are_skipped() {
        assert_eq!(index(b"\xEF\xBB\xBF1 2\r\n\r\n0\r\n", false), vec![(0, 3, 5), (2, 10, 3)]);
    }

    #[test]
    fn comment_lines_are_sequences_only_without_the_option() {
        assert_eq!(index(b"# c\n1\n  # d\n", true), vec![(1, 4, 2)]);
        assert_eq!(index(b"# c\n1\n", false).len(), 2);
    }

    #[test]
    fn an_empty_input_has_no_sequence() {
        assert!(index(b"", false).is_empty());
    }

    #[test]
    fn lines_across_block_boundaries_are_whole() {
        let mut text = Vec::new();
        let long = "7 ".repeat(BLOCK_BYTES / 3);
        for _ in 0..3 {
            text.extend_from_slice(long.as_bytes());
            text.push(b'\n');
        }
        let seqs = index(&text, false);
        assert_eq!(seqs.len(), 3);
        assert!(seqs.iter().all(|s| s.2 as usize == long.len() + 1));
    }
}
