//! The index pass of a file whose every line is a sequence, by its chunks alone.
//!
//! A deepx file, or a CTF file of one line a sequence (line mode, no `defines_mb_size` stream),
//! whose lines are all sequences — none blank, none a comment — keeps nothing per sequence once
//! chunked ([`crate::format::Sequences::let_go_of_line_sizes`]): a chunk's sequences are its lines,
//! which its decode finds in its bytes. For such a file the index is its chunks, and CNTK's chunk
//! rule (a sequence joins the chunk while the chunk's span stays within `chunk_size_bytes`, or
//! when the chunk is empty) needs no sequence's size to find them: lines tile the file, so the
//! chunk that starts at `c` ends where the line holding byte `c + chunk_size_bytes` begins — or,
//! when its first line holds that byte, where that line ends. The cuts are found by reading a
//! little around each; then each chunk is read once, on every thread, for its CRC-32 (the
//! file's digest, the parts combined), its line count, and the check that each of its lines
//! starts with what only a sequence starts with. The result is what the one-line-at-a-time pass
//! and [`crate::format::index::build_chunks`] give (a property test compares them), without a
//! step per line beyond finding it — and an index of O(chunks) in memory and in its cache.
//!
//! On a cold start the daemon parses the chunks in the same pass ([`LineSink`]): each line the
//! count finds goes to the chunk's parser while its bytes are still in the core's cache, so the
//! text is read from the page cache once and parsing starts with the first chunk, not after the
//! last one is counted.
//!
//! Anything else — a blank or comment line, a first line that decides CTF's id mode, leading
//! whitespace, a line of 4 GiB, more lines than the index may hold, a file that changed under
//! the pass — returns `None`, and the caller runs the format's own pass, whose index and errors
//! name the file, line and offset as they always have.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::format::errors::DataError;
use crate::format::index::{read_full, FileIndex, LineChunks, Sequences};
use crate::format::parts::{read_window, PartReader};
use crate::options::IndexLimits;

/// Which format's lines, and so which lines are sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// deepx's: every non-blank line (not a `#` comment where those are on).
    Deepx {
        /// svmlight comments are on.
        comments: bool,
    },
    /// CTF's line mode: every non-blank line; decided by a first byte `|`, or by
    /// `skip_sequence_ids`.
    Ctf {
        /// `skip_sequence_ids`.
        skip_ids: bool,
    },
}

/// What an index cache's fingerprint ends with when it holds an index of chunks of `chunk_size`
/// bytes: an index of chunks is of one chunk size, and no other reader of an index can use one.
#[must_use]
pub fn fingerprint_suffix(chunk_size: u64) -> String {
    format!(";line-chunks={chunk_size}")
}

/// Bytes read at a time: within a core's L2, so the line scan reads what the copy just brought.
const BLOCK_BYTES: usize = 256 << 10;
/// Bytes read at a time looking for a cut's line end.
const PROBE_BYTES: u64 = 64 << 10;

/// Whether a line that begins with `b` may be blank, a comment or a CTF continuation: such a
/// file is left to its format's own pass.
fn doubtful(kind: LineKind, b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c) || (kind == LineKind::Deepx { comments: true } && b == b'#')
}

/// What parses one chunk's lines as the pass counts them ([`ParseAhead`]).
pub trait LineSink {
    /// The next line of the chunk (with its `\n`, the file's last without when it has none) at
    /// byte `offset` of the file. `false`: this chunk is not parsed ahead after all (a malformed
    /// line, a chunk past its bound); no more lines come.
    fn line(&mut self, bytes: &[u8], offset: u64) -> bool;

    /// The chunk was counted whole, `lines` lines, each given to [`LineSink::line`].
    fn done(self: Box<Self>, lines: u64);
}

/// Makes the [`LineSink`] of chunk `k` of the file, bytes `start..end`; `None`: that chunk is
/// only counted.
pub type ParseAhead<'a> = &'a (dyn Fn(usize, u64, u64) -> Option<Box<dyn LineSink + 'a>> + Sync);

/// Indexes `data` (named `name`) by its chunks of `chunk_size` bytes, on up to `threads` threads;
/// `None` when the file is not one this pass reads (above). `progress` gets the bytes read. With
/// `parse`, each chunk's lines also go to the sink it makes for the chunk, as they are counted.
///
/// # Errors
/// I/O errors.
#[allow(clippy::too_many_arguments)] // the file, its names, the chunking, and its two consumers
pub fn index_file(
    data: &Path,
    name: &Arc<Path>,
    kind: LineKind,
    chunk_size: u64,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
    parse: Option<ParseAhead<'_>>,
) -> Result<Option<FileIndex>, DataError> {
    let io = |e| DataError::io(name, e);
    let file = minibatchd_sys::files::open_regular(data).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let Some(first) = first_line(&file, kind).map_err(io)? else { return Ok(None) };
    // Each chunk holds a line at least, and costs 16 bytes: no more of them than the budget has
    // room for (the one-line pass then stops where it passes it).
    let most = limits.max_sequences.min(limits.max_index_bytes / 16);
    let Some(cuts) = cut(&file, first, size, chunk_size.max(1), most).map_err(io)? else { return Ok(None) };
    // A line may be no longer than a sequence may (a chunk only longer than that is looked at
    // line by line).
    let max_line = limits.max_sequence_bytes.min(u64::from(u32::MAX));
    let Some(counted) = count_chunks(&file, &cuts, (size, kind, max_line), threads, progress, parse).map_err(io)?
    else {
        return Ok(None);
    };
    if counted.iter().map(|c| c.lines).sum::<u64>() > limits.max_sequences {
        // The line past the count, named as the one-line pass would name it (found by a probe:
        // left to that pass, such a file was refused at another line, for the bytes its index
        // would hold, where an index of chunks holds a few KB).
        let at = first_past(&file, &cuts, &counted, limits.max_sequences).map_err(io)?;
        return Err(crate::format::index::too_many_sequences(
            crate::format::errors::Location { file: name.clone(), line: limits.max_sequences + 1, offset: at },
            limits.max_sequences,
        ));
    }
    // The digest of every byte: the ones before the first line (a byte-order mark), then each
    // chunk's, combined in order.
    let mut digest = crc32fast::Hasher::new();
    digest.update(&read_window(&file, 0, usize::try_from(first).unwrap_or(0)).map_err(io)?);
    for c in &counted {
        digest.combine(&crc32fast::Hasher::new_with_initial_len(c.crc, c.len));
    }
    let chunks = cuts.iter().zip(&counted).map(|(&(_, end), c)| (end, c.lines)).collect();
    let sequences = Sequences::of_line_chunks(LineChunks { chunk_size, first_offset: first, chunks });
    Ok(Some(FileIndex { path: name.clone(), size, digest: digest.finalize(), sequences }))
}

/// Where line `past + 1` (1-based) begins: the first line past a count of `past`, in the chunk
/// that holds it (read up to it).
fn first_past(file: &File, cuts: &[(u64, u64)], counted: &[Counted], past: u64) -> std::io::Result<u64> {
    let mut before = 0u64;
    for (&(start, end), c) in cuts.iter().zip(counted) {
        if before + c.lines <= past {
            before += c.lines;
            continue;
        }
        // Lines of this chunk before the one sought, each ended by a newline.
        let mut left = past - before;
        let mut at = start;
        while left > 0 && at < end {
            let w = read_window(file, at, usize::try_from((end - at).min(PROBE_BYTES)).unwrap_or(0))?;
            if w.is_empty() {
                break;
            }
            for nl in memchr::memchr_iter(b'\n', &w) {
                left -= 1;
                if left == 0 {
                    return Ok(at + nl as u64 + 1);
                }
            }
            at += w.len() as u64;
        }
        return Ok(start);
    }
    Ok(cuts.last().map_or(0, |&(_, end)| end))
}

/// Where the first sequence begins (after a UTF-8 byte-order mark), if the file's first line is
/// one this pass takes.
fn first_line(file: &File, kind: LineKind) -> std::io::Result<Option<u64>> {
    let head = read_window(file, 0, 4)?;
    if head.starts_with(&[0xFF, 0xFE]) {
        return Ok(None); // UTF-16: CTF's pass refuses it, saying so
    }
    let at = match kind {
        LineKind::Ctf { .. } => super::ctf::bom_prefix(&head),
        LineKind::Deepx { .. } => {
            if head.starts_with(&[0xEF, 0xBB, 0xBF]) {
                3
            } else {
                0
            }
        }
    };
    let Some(&b) = head.get(at) else { return Ok(None) };
    let taken = match kind {
        LineKind::Ctf { skip_ids: false } => b == b'|',
        _ => !doubtful(kind, b),
    };
    Ok(taken.then_some(at as u64))
}

/// The chunks of the file's bytes `first..size`, as `(start, end)`, by CNTK's rule over lines
/// that tile them; `None` past `most` of them.
fn cut(file: &File, first: u64, size: u64, chunk_size: u64, most: u64) -> std::io::Result<Option<Vec<(u64, u64)>>> {
    let mut cuts = Vec::new();
    let mut c = first;
    while c < size {
        if cuts.len() as u64 >= most {
            return Ok(None);
        }
        let p = c.saturating_add(chunk_size);
        if p >= size {
            cuts.push((c, size));
            break;
        }
        // The line holding byte `p` begins after the last newline before it; when that is before
        // `c`, the chunk's first line holds `p`, and the chunk is that line.
        let end = match last_newline(file, c, p)? {
            Some(nl) => nl + 1,
            None => next_newline(file, p, size)?.map_or(size, |nl| nl + 1),
        };
        cuts.push((c, end));
        c = end;
    }
    Ok(Some(cuts))
}

/// The last newline in bytes `lo..hi`.
fn last_newline(file: &File, lo: u64, hi: u64) -> std::io::Result<Option<u64>> {
    let mut hi = hi;
    while hi > lo {
        let from = hi.saturating_sub(PROBE_BYTES).max(lo);
        let w = read_window(file, from, usize::try_from(hi - from).unwrap_or(0))?;
        if let Some(i) = memchr::memrchr(b'\n', &w) {
            return Ok(Some(from + i as u64));
        }
        if w.len() as u64 != hi - from {
            return Ok(None); // shorter than it was: the caller's checks find out
        }
        hi = from;
    }
    Ok(None)
}

/// The first newline in bytes `from..size`.
fn next_newline(file: &File, from: u64, size: u64) -> std::io::Result<Option<u64>> {
    let mut at = from;
    while at < size {
        let w = read_window(file, at, usize::try_from(PROBE_BYTES.min(size - at)).unwrap_or(0))?;
        if let Some(i) = memchr::memchr(b'\n', &w) {
            return Ok(Some(at + i as u64));
        }
        if w.is_empty() {
            return Ok(None);
        }
        at += w.len() as u64;
    }
    Ok(None)
}

/// What reading one chunk found.
#[derive(Debug, Clone, Copy)]
struct Counted {
    crc: u32,
    len: u64,
    lines: u64,
}

/// Reads every chunk once, on up to `threads` threads (the calling thread reports `progress`),
/// its lines to the sink `parse` makes for it; `None` as soon as one holds a line this pass does
/// not take.
fn count_chunks(
    file: &File,
    cuts: &[(u64, u64)],
    (size, kind, max_line): (u64, LineKind, u64),
    threads: usize,
    progress: &mut dyn FnMut(u64),
    parse: Option<ParseAhead<'_>>,
) -> std::io::Result<Option<Vec<Counted>>> {
    let next = AtomicUsize::new(0);
    let (read, stop) = (AtomicU64::new(0), AtomicBool::new(false));
    let results: Mutex<Vec<Option<Counted>>> = Mutex::new(vec![None; cuts.len()]);
    let work = |report: &mut dyn FnMut()| -> std::io::Result<()> {
        let mut buf = vec![0u8; BLOCK_BYTES];
        while !stop.load(Ordering::Relaxed) {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(start, end)) = cuts.get(k) else { return Ok(()) };
            // A line's length counts a byte-order mark before it, as the one-line pass does.
            let from = if k == 0 { 0 } else { start };
            let lines = Lines { kind, last: end == size, from, max: (end - from >= max_line).then_some(max_line) };
            let mut sink = parse.and_then(|make| make(k, start, end));
            let counted = count(file, start, end, lines, &mut buf, &mut sink, &mut |n| {
                read.fetch_add(n, Ordering::Relaxed);
                report();
            })?;
            match counted {
                Some(c) => {
                    if let Some(sink) = sink {
                        sink.done(c.lines);
                    }
                    results.lock().unwrap_or_else(std::sync::PoisonError::into_inner)[k] = Some(c);
                }
                None => stop.store(true, Ordering::Relaxed),
            }
        }
        Ok(())
    };
    let outcome: std::io::Result<()> = std::thread::scope(|scope| {
        let others: Vec<_> =
            (1..threads.clamp(1, cuts.len().max(1))).map(|_| scope.spawn(|| work(&mut || {}))).collect();
        let mut first = work(&mut || progress(read.load(Ordering::Relaxed)));
        for h in others {
            let r = h.join().unwrap_or_else(|_| Err(std::io::Error::other("an index thread panicked")));
            first = first.and(r);
        }
        first
    });
    outcome?;
    if stop.load(Ordering::Relaxed) {
        return Ok(None);
    }
    Ok(results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner).into_iter().collect())
}

/// What a chunk's lines must be.
#[derive(Debug, Clone, Copy)]
struct Lines {
    kind: LineKind,
    /// The chunk ends the file (its last line may lack a newline).
    last: bool,
    /// Where its first line's length is counted from.
    from: u64,
    /// Each line shorter than this, where the chunk is not.
    max: Option<u64>,
}

/// A chunk's lines on their way to its [`LineSink`]: those cut by a block's end are put together.
struct Feed<'s, 'a> {
    sink: &'s mut Option<Box<dyn LineSink + 'a>>,
    /// The start of the line cut by the last block's end.
    carry: Vec<u8>,
    /// The file offset of the current block's first byte.
    at: u64,
    /// Where the current line begins in the current block (`carry` holds any bytes before it).
    from: usize,
}

impl Feed<'_, '_> {
    /// The line that ends at `b[nl]` (a newline, or the block's last byte at the file's end).
    fn line(&mut self, b: &[u8], nl: usize) {
        let Some(sink) = self.sink.as_mut() else { return };
        let kept = if self.carry.is_empty() {
            sink.line(&b[self.from..=nl], self.at + self.from as u64)
        } else {
            self.carry.extend_from_slice(&b[..=nl]);
            let offset = self.at - (self.carry.len() - nl - 1) as u64;
            let kept = sink.line(&self.carry, offset);
            self.carry.clear();
            kept
        };
        self.from = nl + 1;
        if !kept {
            *self.sink = None;
        }
    }

    /// The block `b` ends: its unfinished line waits for the next.
    fn block_end(&mut self, b: &[u8]) {
        if self.sink.is_some() {
            self.carry.extend_from_slice(&b[self.from..]);
        }
        self.at += b.len() as u64;
        self.from = 0;
    }
}

/// Reads bytes `start..end`: their CRC-32, length and lines, or `None` when a line begins with
/// what may not begin a sequence, is too long, or runs past `end`, or the bytes are not all there.
/// Each line goes to `sink` while there is one.
fn count<'a>(
    file: &File,
    start: u64,
    end: u64,
    Lines { kind, last, from, max }: Lines,
    buf: &mut [u8],
    sink: &mut Option<Box<dyn LineSink + 'a>>,
    report: &mut dyn FnMut(u64),
) -> std::io::Result<Option<Counted>> {
    let mut reader = PartReader::new(file, start, Some(end));
    let mut crc = crc32fast::Hasher::new();
    let (mut len, mut lines, mut line_start) = (0u64, 0u64, true);
    // Where the current line began (looked at only with `max`).
    let mut line_from = from;
    let mut feed = Feed { sink, carry: Vec::new(), at: start, from: 0 };
    loop {
        let n = read_full(&mut reader, buf)?;
        if n == 0 {
            break;
        }
        let b = &buf[..n];
        crc.update(b);
        if line_start && doubtful(kind, b[0]) {
            return Ok(None);
        }
        for nl in memchr::memchr_iter(b'\n', b) {
            feed.line(b, nl);
            lines += 1;
            if b.get(nl + 1).is_some_and(|&c| doubtful(kind, c)) {
                return Ok(None);
            }
            if let Some(max) = max {
                let next = start + len + nl as u64 + 1;
                if next - line_from >= max {
                    return Ok(None);
                }
                line_from = next;
            }
        }
        line_start = b[n - 1] == b'\n';
        feed.block_end(b);
        len += n as u64;
        report(n as u64);
    }
    if len != end - start {
        return Ok(None);
    }
    if !line_start {
        // A last line without a newline: a sequence at the file's end, a change anywhere else.
        if !last || max.is_some_and(|max| end - line_from >= max) {
            return Ok(None);
        }
        if let Some(sink) = feed.sink.as_mut() {
            let offset = feed.at - feed.carry.len() as u64;
            if !sink.line(&feed.carry, offset) {
                *feed.sink = None;
            }
        }
        lines += 1;
    }
    Ok(Some(Counted { crc: crc.finalize(), len, lines }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::{index_file, LineKind};
    use crate::format::ctf::CtfIndexOptions;
    use crate::format::deepx::LineIndexOptions;
    use crate::format::index::{build_chunks, ChunkDesc, Columns, FileIndex};
    use crate::options::IndexLimits;

    /// The line of kind `k` (0..9) and length class `len`: sequences of several lengths (some
    /// longer than a small chunk), and — for `k` 7 and 8 — a blank line (empty, or of spaces) and a
    /// comment.
    fn line(k: u8, len: u8, ctf: bool, crlf: bool) -> String {
        let body = match k {
            7 => " ".repeat(usize::from(len % 3)),
            8 => "# a comment".to_owned(),
            _ if ctf => format!("|a {} |b {}:1", "7 ".repeat(usize::from(len) * 3 + 1).trim_end(), k),
            _ => format!("{k} {}", "3:0.5 ".repeat(usize::from(len) * 3 + 1).trim_end()),
        };
        format!("{body}{}", if crlf { "\r\n" } else { "\n" })
    }

    /// The chunks of the one-line-at-a-time pass's index, as `build_chunks` makes them.
    fn classic(
        path: &Path,
        kind: LineKind,
        chunk_size: u64,
        limits: IndexLimits,
    ) -> Option<(FileIndex, Vec<ChunkDesc>)> {
        let name: Arc<Path> = Arc::from(path);
        let idx = match kind {
            LineKind::Deepx { comments } => {
                crate::format::deepx::index_file(path, name, LineIndexOptions { comments }, limits, 1, &mut |_| {})
            }
            LineKind::Ctf { skip_ids } => crate::format::ctf::index_file(
                path,
                &CtfIndexOptions { skip_sequence_ids: skip_ids, main_alias: None },
                limits,
                1,
                &mut |_| {},
            ),
        }
        .ok()?;
        let chunks = build_chunks(std::slice::from_ref(&idx), chunk_size);
        Some((idx, chunks))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 400, ..proptest::prelude::ProptestConfig::default() })]

        /// Indexed by its chunks alone, a file has the chunks, sequence count and digest of the
        /// one-line-at-a-time pass and CNTK's chunk rule, on any number of threads; a file with a
        /// line that may not be a sequence (blank, a comment) is left to that pass.
        #[test]
        fn chunks_alone_are_the_chunks_of_the_one_line_pass(
            lines in proptest::collection::vec((0u8..9, 0u8..40), 1..120),
            ctf in proptest::prelude::any::<bool>(),
            comments in proptest::prelude::any::<bool>(),
            crlf in proptest::prelude::any::<bool>(),
            bom in proptest::prelude::any::<bool>(),
            newline_at_end in proptest::prelude::any::<bool>(),
            chunk_size in 1u64..400,
            threads in 1usize..4,
            clean in proptest::prelude::any::<bool>(),
            max_line in proptest::option::of(8u64..300),
        ) {
            // Half the files without a blank line or a comment: those must be indexed by their
            // chunks (below), so half the cases compare the two passes.
            let lines: Vec<(u8, u8)> =
                lines.into_iter().map(|(k, len)| if clean && k >= 7 { (k - 7, len) } else { (k, len) }).collect();
            let mut text = String::new();
            if bom {
                text.push('\u{feff}');
            }
            for &(k, len) in &lines {
                text.push_str(&line(k, len, ctf, crlf));
            }
            if !newline_at_end {
                text.pop();
                if crlf {
                    text.pop();
                }
            }
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("f");
            std::fs::write(&path, &text).expect("write");
            let kind = if ctf { LineKind::Ctf { skip_ids: false } } else { LineKind::Deepx { comments } };
            let name: Arc<Path> = Arc::from(path.as_path());
            let limits = IndexLimits { max_sequence_bytes: max_line.unwrap_or(u64::MAX), ..IndexLimits::UNBOUNDED };
            let fast = index_file(&path, &name, kind, chunk_size, limits, threads, &mut |_| {}, None).expect("read");
            // A line as long as the longest a sequence may be is left to the one-line pass.
            let longest = text.split_inclusive('\n').map(str::len).max().unwrap_or(0) as u64;
            let too_long = max_line.is_some_and(|max| longest >= max);
            // A blank line is no sequence; a comment is none in deepx with comments on (in CTF's
            // line mode it is a sequence, which its decode finds malformed).
            // (An empty last line whose newline was taken off is not in the file at all.)
            let gone = !newline_at_end && lines.last().is_some_and(|&(k, len)| k == 7 && len % 3 == 0);
            let in_file = &lines[..lines.len() - usize::from(gone)];
            let doubtful = in_file.iter().any(|&(k, _)| k == 7 || (k == 8 && comments && !ctf));
            // CTF's mode is decided by its first line: `|` is line mode, anything else not.
            let other_mode = ctf && lines[0].0 == 8;
            let Some(fast) = fast else {
                let empty = in_file.is_empty();
                proptest::prop_assert!(doubtful || other_mode || too_long || empty, "a file of sequence lines only is indexed by its chunks");
                return Ok(());
            };
            proptest::prop_assert!(!doubtful, "a blank line or a comment is left to the one-line pass");
            let (idx, want) = classic(&path, kind, chunk_size, limits).expect("the one-line pass takes it too");
            proptest::prop_assert_eq!(idx.sequences.columns(), Columns::default());
            proptest::prop_assert_eq!(fast.sequences.len(), idx.sequences.len());
            proptest::prop_assert_eq!((fast.digest, fast.size), (idx.digest, idx.size));
            let lc = fast.sequences.line_chunks().expect("chunks");
            let (mut start, mut first_seq) = (lc.first_offset, 0usize);
            let mut got = Vec::new();
            for &(end, n) in &lc.chunks {
                let n = usize::try_from(n).expect("lines");
                got.push(ChunkDesc { file: 0, start, end, first_seq, num_seqs: n, num_samples: n as u64 });
                (start, first_seq) = (end, first_seq + n);
            }
            proptest::prop_assert_eq!(got, want);
        }
    }

    /// More lines than the index may count: refused at the first line past the count, as the
    /// one-line pass refuses it (found by a probe: left to that pass, a file of one-line
    /// sequences was refused at another line, for bytes an index of chunks never holds).
    #[test]
    fn too_many_lines_are_refused_at_the_first_past_the_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, "1 1:1\n".repeat(10)).expect("write");
        let name: Arc<Path> = Arc::from(path.as_path());
        let kind = LineKind::Deepx { comments: false };
        // (Fewer chunks than the count: more chunks than it are more lines than it, left to the
        // one-line pass before a line is counted.)
        for (max, chunk) in [(9u64, 16u64), (5, 16), (6, 32), (7, 1000)] {
            let limits = IndexLimits { max_sequences: max, ..IndexLimits::UNBOUNDED };
            let e = index_file(&path, &name, kind, chunk, limits, 2, &mut |_| {}, None).expect_err("past the count");
            let at = e.place().expect("a place");
            assert_eq!((at.line, at.offset), (max + 1, 6 * max), "{e}");
            assert!(e.to_string().contains(&format!("more than {max} sequences")), "{e}");
            let classic = crate::format::deepx::index_file(
                &path,
                name.clone(),
                LineIndexOptions { comments: false },
                limits,
                1,
                &mut |_| {},
            )
            .expect_err("the one-line pass too");
            assert_eq!(classic.to_string(), e.to_string());
        }
        let limits = IndexLimits { max_sequences: 10, ..IndexLimits::UNBOUNDED };
        assert!(index_file(&path, &name, kind, 16, limits, 2, &mut |_| {}, None).expect("read").is_some());
    }
}
