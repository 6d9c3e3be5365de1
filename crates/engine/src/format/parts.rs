//! The index pass of one large file on several threads.
//!
//! The file is cut into parts where a sequence starts (the format says where: a line start for
//! formats whose lines are sequences, the first line of a new sequence id for CTF's id mode),
//! each part is scanned by a thread of its own with the format's line pass, and the parts'
//! sequences are put back in file order with whole-file line numbers. The result — sequences,
//! keys, lines, sizes and the content digest (CRC-32 combines) — is exactly what the one-thread
//! pass gives. A part that finds anything wrong (a malformed line, a line too long, its share of
//! the index budget used up) makes the caller run the one-thread pass, whose error names the
//! file, line and offset as it always has: errors are rare, and a second pass is cheap beside a
//! wrong line number.
//!
//! Memory: each of `n` parts may hold `1 / (n + 1)` of the index budget, so the parts and the
//! merged index never hold more than the budget together.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::format::errors::{DataError, Location};
use crate::format::index::{for_each_line, room_for_one_more, Sequences};
use crate::options::IndexLimits;

/// The smallest part worth a thread: below it, a file is scanned by one. (The engine's own
/// tests cut files of a few hundred bytes, to check that parts give the one-thread index.)
pub(crate) const MIN_PART_BYTES: u64 = if cfg!(test) { 64 } else { 32 << 20 };

/// Most bytes read past a cut to find where a sequence starts (CTF's id mode walks to the next
/// sequence id); a cut that finds none within it is dropped, and its neighbours scan more.
pub(crate) const MAX_CUT_WALK: usize = 1 << 20;

/// How many parts `size` bytes are cut into with `threads` threads.
#[must_use]
pub(crate) fn parts_for(size: u64, threads: usize) -> usize {
    usize::try_from(size / MIN_PART_BYTES).unwrap_or(usize::MAX).min(threads).max(1)
}

/// The bytes of a file from `at` to `end` (or to its end when `end` is `None`), read positionally.
pub(crate) struct PartReader<'a> {
    file: &'a File,
    at: u64,
    end: Option<u64>,
}

impl<'a> PartReader<'a> {
    /// The bytes of `file` from `at` to `end` (its end when `None`).
    pub(crate) fn new(file: &'a File, at: u64, end: Option<u64>) -> Self {
        Self { file, at, end }
    }
}

impl std::io::Read for PartReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.end.map_or(u64::MAX, |e| e.saturating_sub(self.at));
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// The CRC-32 and length of `file`'s bytes, read in `parts` equal parts on threads of their own
/// (the calling thread reads the first; `progress` gets its bytes times `parts`, an estimate),
/// the parts' CRCs combined: what one pass over the file gives.
///
/// # Errors
/// I/O errors.
pub(crate) fn digest(
    file: &File,
    size: u64,
    parts: usize,
    block_bytes: usize,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<(u32, u64)> {
    let parts = parts.max(1) as u64;
    let bounds: Vec<(u64, Option<u64>)> =
        (0..parts).map(|i| (size / parts * i, (i + 1 < parts).then(|| size / parts * (i + 1)))).collect();
    let part = |(at, end): (u64, Option<u64>), report: &mut dyn FnMut(u64)| -> std::io::Result<(u32, u64)> {
        let mut reader = PartReader { file, at, end };
        let mut buf = vec![0u8; block_bytes];
        let (mut crc, mut len) = (crc32fast::Hasher::new(), 0u64);
        loop {
            let n = crate::format::index::read_full(&mut reader, &mut buf)?;
            if n == 0 {
                return Ok((crc.finalize(), len));
            }
            crc.update(&buf[..n]);
            len += n as u64;
            report(len);
        }
    };
    let results: Vec<std::io::Result<(u32, u64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = bounds[1..]
            .iter()
            .map(|&b| {
                let part = &part;
                scope.spawn(move || part(b, &mut |_| {}))
            })
            .collect();
        let mut all = vec![part(bounds[0], &mut |n| progress(n * parts))];
        for h in handles {
            all.push(h.join().unwrap_or_else(|_| Err(std::io::Error::other("a digest thread panicked"))));
        }
        all
    });
    let mut crc: Option<crc32fast::Hasher> = None;
    let mut total = 0u64;
    for r in results {
        let (c, len) = r?;
        let h = crc32fast::Hasher::new_with_initial_len(c, len);
        match crc.as_mut() {
            Some(crc) => crc.combine(&h),
            None => crc = Some(h),
        }
        total += len;
    }
    Ok((crc.map_or(0, crc32fast::Hasher::finalize), total))
}

/// Up to `len` bytes of `file` from `at` (fewer at its end).
pub(crate) fn read_window(file: &File, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = crate::format::index::read_full(&mut PartReader { file, at, end: None }, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// The first line start at or after `at` (0 is one), if one is within [`MAX_CUT_WALK`] bytes.
fn line_start_from(file: &File, at: u64) -> std::io::Result<Option<u64>> {
    if at == 0 {
        return Ok(Some(0));
    }
    let window = read_window(file, at - 1, MAX_CUT_WALK)?;
    Ok(memchr::memchr(b'\n', &window).map(|nl| at + nl as u64))
}

/// Where to cut `size` bytes of `file` into `parts` parts: near each `size × i / parts`, at the
/// first line start there that `sequence_start` moves to a sequence start (`None`: no cut
/// there). Strictly increasing, inside the file; fewer than `parts - 1` when some are dropped.
///
/// # Errors
/// I/O errors.
pub(crate) fn cuts(
    file: &File,
    size: u64,
    parts: usize,
    sequence_start: impl Fn(&File, u64) -> std::io::Result<Option<u64>>,
) -> std::io::Result<Vec<u64>> {
    cuts_where(file, size, parts, |file, target| match line_start_from(file, target)? {
        Some(line) => sequence_start(file, line),
        None => Ok(None),
    })
}

/// Where to cut `size` bytes of `file` into `parts` parts: at what `start` finds from each
/// `size × i / parts` (`None`: no cut there). Strictly increasing, inside the file.
///
/// # Errors
/// I/O errors.
pub(crate) fn cuts_where(
    file: &File,
    size: u64,
    parts: usize,
    start: impl Fn(&File, u64) -> std::io::Result<Option<u64>>,
) -> std::io::Result<Vec<u64>> {
    let mut cuts: Vec<u64> = Vec::with_capacity(parts.saturating_sub(1));
    for i in 1..parts as u64 {
        let target = size / parts as u64 * i;
        let Some(cut) = start(file, target)? else { continue };
        if cut < size && cuts.last().is_none_or(|&last| cut > last) && cut > 0 {
            cuts.push(cut);
        }
    }
    Ok(cuts)
}

/// For CTF's id mode: the start of the first line at or after the line start `at` whose sequence
/// id differs from the id of the line with an id before it, reading from `at` on — the start of
/// a sequence whatever came before `at` (lines without an id continue the open sequence). Only
/// newline-terminated lines count, so a file's last line is never a cut.
///
/// # Errors
/// I/O errors.
pub(crate) fn next_id_change(file: &File, at: u64) -> std::io::Result<Option<u64>> {
    let window = read_window(file, at, MAX_CUT_WALK)?;
    let mut seen: Option<u64> = None;
    let mut pos = 0usize;
    while let Some(nl) = memchr::memchr(b'\n', &window[pos..]) {
        let line = &window[pos..pos + nl];
        let digits = line.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 {
            let mut id: u64 = 0;
            for &b in &line[..digits] {
                let Some(next) = id.checked_mul(10).and_then(|v| v.checked_add(u64::from(b - b'0'))) else {
                    // An id that overflows is the pass's error to report.
                    return Ok(None);
                };
                id = next;
            }
            match seen {
                Some(open) if open != id => return Ok(Some(at + pos as u64)),
                _ => seen = Some(id),
            }
        }
        pos += nl + 1;
    }
    Ok(None)
}

/// What one part's scan gave.
pub(crate) struct Scanned<T> {
    /// The format's line pass after the part's last line.
    pub pass: T,
    /// Lines the part held (each newline-terminated but perhaps a file's last).
    pub lines: u64,
    /// The file offset after the part's last byte read.
    pub end: u64,
    /// CRC-32 of the part's bytes.
    crc: u32,
    /// Bytes the CRC covers.
    len: u64,
}

/// A file cut into parts, and how to read them.
pub(crate) struct Parts<'a> {
    /// The file, read positionally by every part.
    pub file: &'a File,
    /// Its name in errors.
    pub path: &'a Path,
    /// Where parts after the first begin ([`cuts`]).
    pub cuts: Vec<u64>,
    /// Bytes each part's thread reads at a time.
    pub block_bytes: usize,
    /// The longest line the pass accepts.
    pub max_line_bytes: u64,
}

/// Scans the parts on threads of their own, `passes[i]` taking part `i`'s lines (bytes and
/// file offset) through `line`. Part `i` runs from the cut before it (0 first) to the cut after
/// it; the last to the end of the file as it reads then. `progress` gets the bytes scanned over
/// all parts, from the calling thread, which scans the first part.
///
/// Returns every part's pass in file order and the whole content's CRC-32, or `None` when a part
/// failed (the caller then runs the one-thread pass, which reports the first error).
pub(crate) fn scan<T: Send>(
    parts: &Parts<'_>,
    passes: Vec<T>,
    progress: &mut dyn FnMut(u64),
    line: impl Fn(&mut T, &[u8], u64) -> Result<(), DataError> + Sync,
) -> Option<(Vec<Scanned<T>>, u32)> {
    let Parts { file, path, ref cuts, block_bytes, max_line_bytes } = *parts;
    debug_assert_eq!(passes.len(), cuts.len() + 1);
    let done: Vec<AtomicU64> = passes.iter().map(|_| AtomicU64::new(0)).collect();
    let bounds: Vec<(u64, Option<u64>)> = std::iter::once(0)
        .chain(cuts.iter().copied())
        .zip(cuts.iter().copied().map(Some).chain(std::iter::once(None)))
        .collect();
    let run = |i: usize, mut pass: T, report: &mut dyn FnMut(u64)| -> Option<Scanned<T>> {
        let (start, end) = bounds[i];
        let mut lines = 0u64;
        let (len, crc) = for_each_line(
            PartReader { file, at: start, end },
            block_bytes,
            path,
            max_line_bytes,
            &mut |b| {
                done[i].store(b, Ordering::Relaxed);
                report(b);
            },
            |bytes, offset| {
                lines += 1;
                line(&mut pass, bytes, start + offset)
            },
        )
        .ok()?;
        Some(Scanned { pass, lines, end: start + len, crc, len })
    };
    let scanned: Vec<Option<Scanned<T>>> = std::thread::scope(|scope| {
        let mut passes = passes.into_iter();
        let first = passes.next()?;
        let handles: Vec<_> = passes
            .enumerate()
            .map(|(k, pass)| {
                let run = &run;
                scope.spawn(move || run(k + 1, pass, &mut |_| {}))
            })
            .collect();
        let total = || done.iter().map(|d| d.load(Ordering::Relaxed)).sum::<u64>();
        let head = run(0, first, &mut |_| progress(total()));
        let mut all = vec![head];
        for h in handles {
            all.push(h.join().ok().flatten());
        }
        progress(total());
        Some(all)
    })?;
    let scanned: Vec<Scanned<T>> = scanned.into_iter().collect::<Option<_>>()?;
    let mut crc = crc32fast::Hasher::new_with_initial_len(scanned[0].crc, scanned[0].len);
    for s in &scanned[1..] {
        crc.combine(&crc32fast::Hasher::new_with_initial_len(s.crc, s.len));
    }
    Some((scanned, crc.finalize()))
}

/// The limits of one of `parts` parts: `1 / (parts + 1)` of the index budget each (so the parts
/// and the merged index fit it together); the other limits as they are.
#[must_use]
pub(crate) fn part_limits(limits: IndexLimits, parts: usize) -> IndexLimits {
    IndexLimits { max_index_bytes: limits.max_index_bytes / (parts as u64 + 1), ..limits }
}

/// The parts' sequences (each with its part's line count) as one file's, in file order: lines
/// (and keys, where `key_is_line`) made whole-file, every sequence checked against `limits` as
/// the one-thread pass checks it (the same error at the same sequence).
///
/// # Errors
/// The index budget or sequence count of `limits` exceeded.
pub(crate) fn merge(
    parts: Vec<(Sequences, u64)>,
    key_is_line: bool,
    limits: &IndexLimits,
    path: &std::sync::Arc<Path>,
) -> Result<Sequences, DataError> {
    let mut parts = parts.into_iter();
    let Some((mut merged, mut lines_before)) = parts.next() else { return Ok(Sequences::default()) };
    for (part, lines) in parts {
        for mut s in part.iter() {
            s.line += lines_before;
            if key_is_line {
                s.key += lines_before;
            }
            room_for_one_more(&merged, &s, limits, || Location {
                file: path.clone(),
                line: s.line + 1,
                offset: s.offset,
            })?;
            merged.push(s);
        }
        lines_before += lines;
    }
    merged.shrink_to_fit();
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file_of(text: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut f = tempfile::NamedTempFile::new().expect("temp");
        f.write_all(text).expect("write");
        let file = File::open(f.path()).expect("open");
        (f, file)
    }

    #[test]
    fn a_cut_lands_on_a_line_start() {
        let (_f, file) = file_of(b"aaaa\nbbbb\ncccc\n");
        assert_eq!(line_start_from(&file, 0).expect("read"), Some(0));
        assert_eq!(line_start_from(&file, 5).expect("read"), Some(5));
        assert_eq!(line_start_from(&file, 6).expect("read"), Some(10));
        let c = cuts(&file, 15, 3, |_, at| Ok(Some(at))).expect("cuts");
        assert_eq!(c, vec![5, 10]);
    }

    #[test]
    fn an_id_mode_cut_lands_where_the_id_changes() {
        // Lines without an id continue the open sequence; so does a repeated id.
        let text = b"1 |a 1\n |a 2\n1 |a 3\n2 |a 4\n";
        let (_f, file) = file_of(text);
        assert_eq!(next_id_change(&file, 0).expect("read"), Some(20));
        // From the second line on: the id-less line is skipped, 1 is the open id, 2 changes it.
        assert_eq!(next_id_change(&file, 7).expect("read"), Some(20));
        // A last line without a newline is no cut.
        let (_g, file) = file_of(b"1 |a 1\n2 |a 2");
        assert_eq!(next_id_change(&file, 0).expect("read"), None);
    }

    #[test]
    fn the_parts_crc_is_the_whole_files() {
        let text: Vec<u8> = (0..5000).flat_map(|i| format!("{i} line\n").into_bytes()).collect();
        let (_f, file) = file_of(&text);
        let cut = cuts(&file, text.len() as u64, 3, |_, at| Ok(Some(at))).expect("cuts");
        assert_eq!(cut.len(), 2);
        let parts = Parts { file: &file, path: Path::new("t"), cuts: cut, block_bytes: 4096, max_line_bytes: 1 << 20 };
        let (scanned, crc) = scan(&parts, vec![0u64; 3], &mut |_| {}, |n, _, _| {
            *n += 1;
            Ok(())
        })
        .expect("scan");
        assert_eq!(crc, crc32fast::hash(&text));
        assert_eq!(scanned.iter().map(|s| s.pass).sum::<u64>(), 5000);
        assert_eq!(scanned.iter().map(|s| s.lines).sum::<u64>(), 5000);
        assert_eq!(scanned.last().map(|s| s.end), Some(text.len() as u64));
    }
}
