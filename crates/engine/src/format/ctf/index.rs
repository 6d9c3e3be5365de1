//! The CTF index pass (CNTK's `TextInputIndexBuilder`, reference §1.3, §1.4).
//!
//! One sequential scan per file finds sequence boundaries, keys and nominal lengths; it parses
//! nothing but sequence ids. Decisions, all CNTK's unless marked:
//! * a UTF-16 BOM is fatal, a UTF-8 BOM is skipped; an empty or whitespace-only file is fatal;
//!   leading whitespace (newlines included) is skipped;
//! * the mode is decided once, from the first non-blank byte: `|` (or `skip_sequence_ids`) →
//!   line mode (every line a sequence, key = 0-based line number); a digit → id mode (consecutive
//!   lines with the same leading id, or with none, form one sequence); anything else is fatal;
//! * with a `defines_mb_size` stream, only lines containing `|alias` count towards the nominal
//!   length, and a line (line mode) or sequence (id mode) without one is dropped;
//! * in id mode, a last line without a newline that holds nothing but digits is no id (CNTK reads
//!   an id up to the byte after it): it stays in the open sequence's bytes and adds nothing to its
//!   length; as the file's only line it is the fatal missing first id;
//! * **deviation**: blank (whitespace-only) lines are ignored everywhere — no sequence, no part of
//!   a nominal length. CNTK makes them sequences (line mode, then fatal) or counts them (id mode,
//!   then 2 errors). The decoder skips them too, so both passes agree.

use std::path::Path;
use std::sync::Arc;

use memchr::memmem;

use crate::format::errors::{DataError, Location};
use crate::format::index::{for_each_line, room_for_one_more, FileIndex, SequenceDesc, Sequences};
use crate::format::parts;
use crate::options::IndexLimits;

/// Size of the read buffer of the index pass.
const BLOCK_BYTES: usize = 256 << 10;

/// What shapes the index of a CTF file (and so keys its cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtfIndexOptions {
    /// Line mode regardless of ids.
    pub skip_sequence_ids: bool,
    /// Alias of the `defines_mb_size` stream, if any.
    pub main_alias: Option<String>,
}

impl CtfIndexOptions {
    /// A stable description, part of the index cache key.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        format!("ctf;skip_ids={};main={}", u8::from(self.skip_sequence_ids), self.main_alias.as_deref().unwrap_or("_"))
    }
}

/// Whitespace as C's `isspace`: what makes a line blank.
#[inline]
pub(crate) fn is_blank_byte(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | 0x0b | 0x0c)
}

#[inline]
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|&b| is_blank_byte(b))
}

/// Finds `|alias` followed by whitespace, `|`, a control or non-ASCII byte, or the line end.
struct MainStreamFinder {
    finder: memmem::Finder<'static>,
}

impl MainStreamFinder {
    fn new(alias: &str) -> Self {
        let mut pat = Vec::with_capacity(alias.len() + 1);
        pat.push(b'|');
        pat.extend_from_slice(alias.as_bytes());
        Self { finder: memmem::Finder::new(&pat).into_owned() }
    }

    fn contains(&self, line: &[u8]) -> bool {
        let n = self.finder.needle().len();
        self.finder.find_iter(line).any(|at| match line.get(at + n) {
            None => true,
            Some(&c) => c.is_ascii_whitespace() || c == 0x0b || c == b'|' || !(b' '..0x80).contains(&c),
        })
    }
}

/// Reads `path` and indexes it, within `limits` (`max_sequences`: what this file may add), on up
/// to `threads` threads (a large file in parts, [`crate::format::parts`]; the index is the same).
/// `progress` receives the number of bytes scanned so far.
///
/// # Errors
/// I/O errors, CNTK's fatal index errors, and a limit exceeded, with file, line and byte offset.
pub fn index_file(
    path: &Path,
    options: &CtfIndexOptions,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let file = minibatchd_sys::files::open_regular(path).map_err(|e| DataError::io(path, e))?;
    let size = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    let name: Arc<Path> = Arc::from(path);
    if let Some(index) = index_in_parts(&file, &name, size, options, limits, threads, progress)? {
        return Ok(index);
    }
    index_reader(file, &name, size, options, limits, progress)
}

/// The mode of the file as its first non-blank byte decides it (the one-thread pass's rule),
/// when that byte is in the first 64 KiB; `None` when it is not, or when it makes the file fatal
/// (the one-thread pass then says so).
fn first_mode(file: &std::fs::File, options: &CtfIndexOptions) -> std::io::Result<Option<Mode>> {
    use std::os::unix::fs::FileExt;
    let mut head = vec![0u8; 64 << 10];
    let n = file.read_at(&mut head, 0)?;
    let head = &head[..n];
    if head.starts_with(&[0xFF, 0xFE]) {
        return Ok(None);
    }
    let head = &head[super::bom_prefix(head)..];
    Ok(head.iter().find(|&&b| !(b.is_ascii_whitespace() || b == 0x0b)).and_then(|&first| {
        if options.skip_sequence_ids || first == b'|' {
            Some(Mode::Lines)
        } else if first.is_ascii_digit() {
            Some(Mode::Ids)
        } else {
            None
        }
    }))
}

/// [`index_file`]'s pass in parts on `threads` threads: `None` when the file is too small for
/// parts, or when a part found something wrong (the one-thread pass then reports it).
///
/// # Errors
/// I/O errors finding the cuts, and a limit the merged index exceeds.
fn index_in_parts(
    file: &std::fs::File,
    path: &Arc<Path>,
    size: u64,
    options: &CtfIndexOptions,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<Option<FileIndex>, DataError> {
    let parts = parts::parts_for(size, threads);
    if parts < 2 {
        return Ok(None);
    }
    let io = |e| DataError::io(path, e);
    let Some(mode) = first_mode(file, options).map_err(io)? else { return Ok(None) };
    let cuts = match mode {
        Mode::Lines => parts::cuts(file, size, parts, |_, at| Ok(Some(at))),
        _ => parts::cuts(file, size, parts, parts::next_id_change),
    }
    .map_err(io)?;
    if cuts.is_empty() {
        return Ok(None);
    }
    let share = parts::part_limits(limits, cuts.len() + 1);
    let passes = (0..=cuts.len())
        .map(|i| {
            let mut ix = Indexer::new(path.clone(), options, size, share);
            if i > 0 {
                ix.mode = mode;
            }
            ix
        })
        .collect();
    let parts = parts::Parts { file, path, cuts, block_bytes: BLOCK_BYTES, max_line_bytes: limits.largest_sequence() };
    let Some((scanned, digest)) = parts::scan(&parts, passes, progress, Indexer::line) else {
        return Ok(None);
    };
    let last = scanned.len() - 1;
    let mut found = Vec::with_capacity(scanned.len());
    for (i, part) in scanned.into_iter().enumerate() {
        let mut ix = part.pass;
        // A part ends where the next one's first sequence starts; the last where the bytes did.
        let end = if i == last { size.max(part.end) } else { part.end };
        if ix.mode != mode || ix.close(end).is_err() {
            return Ok(None);
        }
        found.push((ix.sequences, part.lines));
    }
    let sequences = parts::merge(found, mode == Mode::Lines, &limits, path)?;
    Ok(Some(FileIndex { path: path.clone(), size, digest, sequences }))
}

/// Indexes the `size` bytes `reader` yields (a file, or an object streamed from object storage),
/// naming `path` in errors; as [`index_file`].
///
/// # Errors
/// As [`index_file`].
pub fn index_reader(
    reader: impl std::io::Read,
    path: &Arc<Path>,
    size: u64,
    options: &CtfIndexOptions,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let mut indexer = Indexer::new(path.clone(), options, size, limits);
    let (consumed, digest) =
        for_each_line(reader, BLOCK_BYTES, path, limits.largest_sequence(), progress, |line, offset| {
            indexer.line(line, offset)
        })?;
    // A file that grew during the pass yields more than `size` bytes: the open sequence ends
    // where the bytes did (the read that follows refuses the changed file).
    let mut index = indexer.finish(consumed)?;
    index.digest = digest;
    Ok(index)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Still skipping the BOM and leading whitespace.
    Start,
    Lines,
    Ids,
}

/// Open sequence in id mode.
struct Open {
    key: u64,
    offset: u64,
    line: u64,
    samples: u64,
}

struct Indexer {
    path: Arc<Path>,
    size: u64,
    skip_ids: bool,
    main: Option<MainStreamFinder>,
    mode: Mode,
    line_no: u64,
    sequences: Sequences,
    open: Option<Open>,
    limits: IndexLimits,
}

impl Indexer {
    fn new(path: Arc<Path>, options: &CtfIndexOptions, size: u64, limits: IndexLimits) -> Self {
        Self {
            path,
            size,
            skip_ids: options.skip_sequence_ids,
            main: options.main_alias.as_deref().map(MainStreamFinder::new),
            mode: Mode::Start,
            line_no: 0,
            sequences: Sequences::default(),
            open: None,
            limits,
        }
    }

    fn at(&self, offset: u64) -> Location {
        Location { file: self.path.clone(), line: self.line_no + 1, offset }
    }

    fn fatal(&self, offset: u64, message: impl Into<String>) -> DataError {
        DataError::Fatal { at: self.at(offset), message: message.into() }
    }

    /// One line, `\n` included when present; `offset` is its first byte in the file.
    fn line(&mut self, mut line: &[u8], mut offset: u64) -> Result<(), DataError> {
        if self.mode == Mode::Start {
            if offset == 0 {
                if line.starts_with(&[0xFF, 0xFE]) {
                    return Err(self.fatal(
                        0,
                        "found a UTF-16 BOM at the beginning of the input file; UTF-16 encoding is not supported",
                    ));
                }
                let bom = super::bom_prefix(line);
                line = &line[bom..];
                offset += bom as u64;
            }
            let skip = line.iter().take_while(|&&b| b.is_ascii_whitespace() || b == 0x0b).count();
            if skip == line.len() {
                self.line_no += u64::from(line.last() == Some(&b'\n'));
                return Ok(());
            }
            line = &line[skip..];
            offset += skip as u64;
            let first = line[0];
            self.mode = if self.skip_ids || first == b'|' {
                Mode::Lines
            } else if first.is_ascii_digit() {
                Mode::Ids
            } else {
                // A compressed file's magic bytes: say so (found by a probe: a gzipped CTF file was
                // told only that 0x1f is not a digit).
                let hint = if line.starts_with(&[0x1f, 0x8b]) {
                    " (the file starts as gzip data does: CTF inputs are read as text, not decompressed; decompress it first)"
                } else {
                    ""
                };
                return Err(self.fatal(
                    offset,
                    format!(
                        "expected a sequence id (a decimal number) at the start of the first line, found {}{hint}",
                        show_byte(first)
                    ),
                ));
            };
        }
        let next = offset + line.len() as u64;
        let content = line.strip_suffix(b"\n").unwrap_or(line);
        let result = match self.mode {
            Mode::Lines => self.line_mode(content, offset, next),
            Mode::Ids => self.id_mode(content, offset, content.len() < line.len()),
            Mode::Start => Ok(()),
        };
        self.line_no += u64::from(content.len() < line.len());
        result
    }

    fn counts(&self, content: &[u8]) -> bool {
        !is_blank(content) && self.main.as_ref().is_none_or(|m| m.contains(content))
    }

    fn line_mode(&mut self, content: &[u8], offset: u64, next: u64) -> Result<(), DataError> {
        if !self.counts(content) {
            return Ok(());
        }
        let size = self.seq_size(offset, next)?;
        self.push(SequenceDesc { key: self.line_no, offset, line: self.line_no, size, samples: 1 })
    }

    /// One line in id mode; `terminated`: it ends with a newline.
    fn id_mode(&mut self, content: &[u8], offset: u64, terminated: bool) -> Result<(), DataError> {
        let digits = content.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 && digits == content.len() && !terminated {
            // Digits the file ends in: CNTK's indexer finds no id there (it needs the byte after
            // one), so the line joins the open sequence uncounted (the decoder reads nothing from
            // it, at no cost).
            if self.open.is_none() {
                return Err(self.fatal(
                    offset,
                    "expected a sequence id (a decimal number) and samples on the first line, found only digits and the end of the file",
                ));
            }
            return Ok(());
        }
        if digits > 0 {
            let mut id: u64 = 0;
            for &b in &content[..digits] {
                id = id.checked_mul(10).and_then(|v| v.checked_add(u64::from(b - b'0'))).ok_or_else(|| {
                    self.fatal(offset, "overflow while reading a numeric sequence id (more than 64 bits)")
                })?;
            }
            if let Some(o) = self.open.as_ref().filter(|o| o.key == id) {
                // A sequence grows line by line: bound it before it is whole.
                if offset - o.offset > self.limits.largest_sequence() {
                    return Err(self.too_large(o.line, o.offset, offset - o.offset));
                }
            }
            if self.open.as_ref().is_none_or(|o| o.key != id) {
                self.close(offset)?;
                self.open = Some(Open { key: id, offset, line: self.line_no, samples: 0 });
            }
        }
        if self.counts(content) {
            if let Some(o) = self.open.as_mut() {
                o.samples += 1;
            }
        }
        Ok(())
    }

    fn seq_size(&self, offset: u64, end: u64) -> Result<u32, DataError> {
        match u32::try_from(end - offset) {
            Ok(size) if u64::from(size) <= self.limits.largest_sequence() => Ok(size),
            _ => Err(self.too_large(self.line_no, offset, end - offset)),
        }
    }

    /// A sequence (from 0-based line `line`, byte `offset`) of more than the largest size.
    fn too_large(&self, line: u64, offset: u64, bytes: u64) -> DataError {
        DataError::Fatal {
            at: Location { file: self.path.clone(), line: line + 1, offset },
            message: format!(
                "a sequence of {bytes} bytes or more exceeds the largest allowed, {} bytes ({})",
                self.limits.largest_sequence(),
                crate::options::largest_sequence_why()
            ),
        }
    }

    /// Adds a sequence within `limits.max_sequences`.
    fn push(&mut self, seq: SequenceDesc) -> Result<(), DataError> {
        room_for_one_more(&self.sequences, &seq, &self.limits, || Location {
            file: self.path.clone(),
            line: seq.line + 1,
            offset: seq.offset,
        })?;
        self.sequences.push(seq);
        Ok(())
    }

    /// Ends the open id-mode sequence at `end`; a sequence without counted lines is dropped.
    fn close(&mut self, end: u64) -> Result<(), DataError> {
        let Some(o) = self.open.take() else { return Ok(()) };
        if o.samples == 0 {
            return Ok(());
        }
        let size = match u32::try_from(end - o.offset) {
            Ok(size) if u64::from(size) <= self.limits.largest_sequence() => size,
            _ => return Err(self.too_large(o.line, o.offset, end - o.offset)),
        };
        let samples = u32::try_from(o.samples).map_err(|_| DataError::Fatal {
            at: Location { file: self.path.clone(), line: o.line + 1, offset: o.offset },
            message: "a sequence of more than 2^32-1 samples".into(),
        })?;
        self.push(SequenceDesc { key: o.key, offset: o.offset, line: o.line, size, samples })
    }

    fn finish(mut self, consumed: u64) -> Result<FileIndex, DataError> {
        if self.mode == Mode::Start {
            return Err(DataError::Fatal {
                at: Location { file: self.path.clone(), line: 1, offset: 0 },
                message: "input file is empty (no data after whitespace)".into(),
            });
        }
        self.close(self.size.max(consumed))?;
        // What the dataset keeps is what its memory accounting counts (`Dataset::index_bytes`).
        self.sequences.shrink_to_fit();
        Ok(FileIndex { path: self.path, size: self.size, digest: 0, sequences: self.sequences })
    }
}

/// A byte for messages: printable ASCII as itself, anything else as hex.
pub(crate) fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

#[cfg(test)]
mod tests;
