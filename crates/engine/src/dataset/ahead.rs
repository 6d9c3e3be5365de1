//! Chunks parsed in the index pass (`IndexLimits::parse_ahead_bytes`): on a cold start, a file
//! whose every line is a sequence is chunked before it is read ([`line_chunks`]), so each chunk's
//! lines can be parsed as the pass counts them — the text read from the page cache once, parsing
//! from the first chunk on instead of after the last one is counted.
//!
//! A chunk is kept only when its parse found nothing to report: no malformed place, no fatal
//! error, every line parsed. Any other chunk is parsed again when a session needs it, as without
//! this, so what reaches the error budgets, the logs and the sessions does not change. The kept
//! chunks stay within the bytes the pass was given (the chunk cache's room when it began); the
//! daemon moves them into its chunk cache once the dataset is open, and a chunk is served only
//! while its file is unchanged since it was indexed, as a parse of its text would be.
//!
//! [`line_chunks`]: crate::format::line_chunks

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::format::chunk::{ParsedChunk, StreamData};
use crate::format::ctf::{CtfDecoder, SeqContext, StreamBuf};
use crate::format::deepx::DeepxElement;
use crate::format::errors::Malformed;
use crate::format::index::SequenceDesc;
use crate::format::line_chunks::LineSink;
use crate::format::record::{RecordAt, RecordDecoder};
use crate::Result;

use super::{Dataset, Persist};

impl Dataset {
    /// Chunk `chunk` as its index pass parsed it ([`crate::options::IndexLimits::parse_ahead_bytes`]), taken
    /// (a later load parses its text), as [`Dataset::parse_chunk`] would return it; `None` when
    /// the pass did not keep it.
    ///
    /// # Errors
    /// The chunk's file changed since it was indexed.
    pub fn take_parsed_in_pass(&self, chunk: usize) -> Result<Option<ParsedChunk>> {
        let Some(parsed) = self.take_parsed_ahead(chunk)? else { return Ok(None) };
        // Kept only without a malformed place.
        let none = vec![Vec::new(); self.sources.len()];
        self.settle(chunk, parsed, &none).map(|(parsed, _)| Some(parsed))
    }

    /// A parsed chunk with the malformed places its parse found (`errors`, by source): charged,
    /// kept with it for a reader that charges its own budget, and its write to the parsed cache
    /// when it has none. Returns it with the places charged for the first time.
    pub(super) fn settle(
        &self,
        chunk: usize,
        mut parsed: ParsedChunk,
        errors: &[Vec<Malformed>],
    ) -> Result<(ParsedChunk, Vec<Malformed>)> {
        let fresh = self.charge(errors)?;
        if self.per_reader {
            parsed.malformed = self.places_kept(errors.iter().map(Vec::as_slice));
        }
        // Only a chunk without malformed places is persisted: one with errors is parsed again
        // each time, so its errors reach the budget and the logs exactly as without the cache.
        if let Some(p) = &self.parsed {
            if errors.iter().all(Vec::is_empty) {
                match p.persist {
                    Persist::OnLoad => p.cache.put(p.identity, &parsed),
                    Persist::Later => {
                        if let Some(flag) = p.pending.get(chunk) {
                            flag.store(true, std::sync::atomic::Ordering::Release);
                        }
                    }
                }
            }
        }
        Ok((parsed, fresh))
    }

    /// Chunk `chunk` as the index pass parsed it ([`crate::options::IndexLimits::parse_ahead_bytes`]), taken:
    /// a later parse reads its text. Served only while its file is unchanged since it was
    /// indexed, as a parse of its text would be.
    ///
    /// # Errors
    /// The chunk's file changed since it was indexed.
    pub(super) fn take_parsed_ahead(&self, chunk: usize) -> Result<Option<ParsedChunk>> {
        let (Some(ahead), Some(desc)) = (&self.ahead, self.chunks.get(chunk)) else { return Ok(None) };
        let Some(mut parsed) = ahead.take(desc.file, desc.start) else { return Ok(None) };
        let sequences = self.timeline.chunk_start.get(chunk + 1).zip(self.timeline.chunk_start.get(chunk));
        if sequences.map(|(end, start)| end - start) != Some(parsed.num_sequences) {
            return Ok(None);
        }
        self.chunk_inputs_unchanged(chunk)?;
        parsed.chunk = chunk;
        Ok(Some(parsed))
    }

    /// The chunks its index pass parsed and still holds, in file order: what the daemon moves
    /// into its chunk cache once the dataset is open.
    #[must_use]
    pub fn parsed_ahead(&self) -> Vec<usize> {
        let Some(ahead) = &self.ahead else { return Vec::new() };
        (0..self.chunks.len()).filter(|&c| ahead.holds(self.chunks[c].file, self.chunks[c].start)).collect()
    }

    /// Bytes of the chunks its index pass parsed and still holds.
    #[must_use]
    pub fn parsed_ahead_bytes(&self) -> u64 {
        self.ahead.as_ref().map_or(0, Ahead::bytes)
    }

    /// Lets go of the chunks its index pass parsed and nobody took.
    pub fn drop_parsed_ahead(&self) {
        if let Some(ahead) = &self.ahead {
            ahead.clear();
        }
    }
}

/// What counts the chunks an index pass keeps against the process's memory bound, beyond the pass's
/// own cap (the daemon's chunk cache, whose room moves while sessions on other datasets run): a
/// guard that holds `bytes` until dropped, or `None` when there is no room for them now.
pub type Reserve = Box<dyn Fn(u64) -> Option<Box<dyn std::any::Any + Send + Sync>> + Send + Sync>;

/// What holds bytes against the process's memory bound until dropped ([`Reserve`]).
type Guard = Box<dyn std::any::Any + Send + Sync>;

/// A kept chunk, with what holds its bytes against the memory bound until it is taken.
type Kept = (ParsedChunk, Guard);

/// What a chunk being parsed in the pass may cost, per byte of its text, held against the memory
/// bound before it is parsed: a parse that passes it is given up (the chunk is parsed when a
/// session needs it). Dense CTF costs about 2 bytes a byte of text, libsvm's shortest lines
/// (`1 1:1`) about 5.
const EXPANSION: u64 = 8;

/// Lines between two looks at what a chunk being parsed costs so far.
const LOOK_EVERY: u64 = 256;

/// The chunks one dataset's index pass parsed, until the daemon takes them.
#[derive(Default)]
pub(super) struct Ahead {
    /// Bytes the kept chunks may still take.
    room: AtomicU64,
    /// Counts each kept chunk against the process's memory bound.
    reserve: Option<Reserve>,
    /// A chunk did not fit: the rest are only counted.
    full: AtomicBool,
    /// The kept chunks, by their file and first byte.
    chunks: Mutex<HashMap<(usize, u64), Kept>>,
}

impl Ahead {
    /// Room for `bytes` of parsed chunks, each also counted by `reserve` when given.
    pub(super) fn new(bytes: u64, reserve: Option<Reserve>) -> Self {
        Self { room: AtomicU64::new(bytes), reserve, ..Self::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, u64), Kept>> {
        self.chunks.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a chunk should still be parsed in the pass.
    pub(super) fn wanted(&self) -> bool {
        !self.full.load(Ordering::Relaxed) && self.room.load(Ordering::Relaxed) > 0
    }

    /// `bytes` held against the process's memory bound (by `reserve`, when given) until the guard
    /// is dropped; `None` when there is no room for them (and no chunk is parsed in the pass from
    /// then on).
    fn hold(&self, bytes: u64) -> Option<Guard> {
        let held = match &self.reserve {
            // Nothing to hold them against: a guard of nothing.
            None => Some(Box::new(()) as Guard),
            Some(reserve) => reserve(bytes),
        };
        if held.is_none() {
            self.full.store(true, Ordering::Relaxed);
        }
        held
    }

    /// Keeps `chunk`, the one of file `file` that begins at byte `start`, if it fits: in the
    /// pass's cap, and in what `reserve` has room for now.
    fn keep(&self, file: usize, start: u64, chunk: ParsedChunk) {
        let size = chunk.size_bytes() as u64;
        if self.room.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |room| room.checked_sub(size)).is_err() {
            self.full.store(true, Ordering::Relaxed);
            return;
        }
        if let Some(guard) = self.hold(size) {
            self.lock().insert((file, start), (chunk, guard));
        }
    }

    /// The chunk of file `file` that begins at byte `start`, taken (each is taken once; what held
    /// its bytes lets go, the taker counts them).
    pub(super) fn take(&self, file: usize, start: u64) -> Option<ParsedChunk> {
        self.lock().remove(&(file, start)).map(|(chunk, _)| chunk)
    }

    /// Whether it holds the chunk of file `file` that begins at byte `start`.
    pub(super) fn holds(&self, file: usize, start: u64) -> bool {
        self.lock().contains_key(&(file, start))
    }

    /// Bytes of the chunks it holds.
    pub(super) fn bytes(&self) -> u64 {
        self.lock().values().map(|(c, _)| c.size_bytes() as u64).sum()
    }

    /// Lets go of every chunk not taken, and of what counts its bytes.
    pub(super) fn clear(&self) {
        let dropped = std::mem::take(&mut *self.lock());
        drop(dropped);
    }

    /// Whether it holds none.
    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// Lines per chunk expected from its size and its first line's: buffers reserved once, so they
/// are not copied as they grow, with a quarter more for shorter lines.
fn expected_lines(chunk_bytes: u64, first_line: usize) -> usize {
    let n = chunk_bytes / (first_line.max(1) as u64);
    usize::try_from(n.saturating_add(n / 4).saturating_add(1)).unwrap_or(usize::MAX)
}

/// Where a chunk's parse goes: the dataset's [`Ahead`], its place, and its bounds.
pub(super) struct Target<'a> {
    pub ahead: &'a Ahead,
    /// The file's index in its source.
    pub file: usize,
    /// The file as configured (named in messages, which a kept chunk never has).
    pub path: &'a Arc<Path>,
    /// The chunk's first byte and size.
    pub start: u64,
    pub bytes: u64,
    /// Most dense values the chunk may hold (its share of the memory limit).
    pub max_values: usize,
    /// Buffers advised huge pages.
    pub huge: bool,
    /// Most bytes its buffers may hold while it is parsed ([`EXPANSION`]), and what holds them
    /// against the memory bound meanwhile (let go before the parsed chunk is kept).
    pub most: (u64, Guard),
}

impl Target<'_> {
    /// Whether a chunk at line `lines` whose buffers hold `bytes` may go on: looked at every
    /// [`LOOK_EVERY`] lines.
    fn within(&self, lines: u64, bytes: impl FnOnce() -> usize) -> bool {
        !lines.is_multiple_of(LOOK_EVERY) || bytes() as u64 <= self.most.0
    }
}

/// A CTF chunk's parse (a dataset of one source, in line mode), as `Dataset::decode_chunk` parses
/// a primary source's chunk.
pub(super) struct CtfLines<'a, T> {
    pub target: Target<'a>,
    pub decoder: &'a CtfDecoder,
    /// Per stream: its dimension and whether it is sparse.
    pub shapes: &'a [(usize, bool)],
    pub bufs: Vec<StreamBuf<T>>,
    pub errors: Vec<Malformed>,
    /// Lines parsed.
    pub lines: u64,
}

impl<'a, T: crate::format::ctf::Element> CtfLines<'a, T> {
    pub(super) fn new(target: Target<'a>, decoder: &'a CtfDecoder, shapes: &'a [(usize, bool)]) -> Self {
        let bufs = (0..decoder.num_streams()).map(|_| StreamBuf::new()).collect();
        Self { target, decoder, shapes, bufs, errors: Vec::new(), lines: 0 }
    }

    fn reserve(&mut self, first_line: usize) {
        let n = expected_lines(self.target.bytes, first_line);
        for (i, buf) in self.bufs.iter_mut().enumerate() {
            buf.seq_offsets.reserve(n);
            if let Some(dim) = self.decoder.dense_dim(i) {
                buf.values.reserve(n.saturating_mul(dim).min(self.target.max_values));
                minibatchd_sys::advise_huge_pages(&buf.values, self.target.huge);
            }
        }
        self.decoder.dense_room(&mut self.bufs, self.target.max_values);
    }
}

impl<T: crate::format::ctf::Element> LineSink for CtfLines<'_, T> {
    fn line(&mut self, bytes: &[u8], offset: u64) -> bool {
        if self.lines == 0 {
            self.reserve(bytes.len());
        }
        let Ok(size) = u32::try_from(bytes.len()) else { return false };
        let seq = SequenceDesc { key: self.lines, offset, line: self.lines, size, samples: 1 };
        let ctx = SeqContext { file: self.target.path, seq: &seq };
        if self.decoder.decode_sequence(bytes, &ctx, &mut self.bufs, &mut self.errors).is_err()
            || !self.errors.is_empty()
        {
            return false;
        }
        let dense = (0..self.bufs.len()).any(|i| self.decoder.dense_dim(i).is_some());
        if dense && !self.decoder.dense_room(&mut self.bufs, self.target.max_values) {
            return false;
        }
        self.lines += 1;
        self.target.within(self.lines, || self.bufs.iter().map(StreamBuf::heap_bytes).sum())
    }

    fn done(self: Box<Self>, lines: u64) {
        if lines != self.lines {
            return;
        }
        let streams = self
            .bufs
            .into_iter()
            .zip(self.shapes)
            .map(|(buf, &(dim, sparse))| buf.into_stream_data(dim, sparse))
            .collect();
        keep(self.target, streams, lines);
    }
}

/// A deepx chunk's parse, as `Dataset::decode_records` parses a chunk of lines.
pub(super) struct RecordLines<'a, D: RecordDecoder, T: DeepxElement> {
    pub target: Target<'a>,
    pub decoder: &'a D,
    pub out: Option<D::Buffers<T>>,
    pub errors: Vec<Malformed>,
    pub lines: u64,
}

impl<D: RecordDecoder, T: DeepxElement> LineSink for RecordLines<'_, D, T> {
    fn line(&mut self, bytes: &[u8], offset: u64) -> bool {
        let (target, d) = (&self.target, self.decoder);
        let out = self.out.get_or_insert_with(|| {
            let chunk_bytes = usize::try_from(target.bytes).unwrap_or(usize::MAX);
            d.buffers::<T>(chunk_bytes, expected_lines(target.bytes, bytes.len()), target.huge)
        });
        let at = RecordAt { file: target.path, line: self.lines, offset };
        d.decode(bytes, &at, out, &mut self.errors);
        if !self.errors.is_empty() || d.dense_values(out) > target.max_values {
            return false;
        }
        self.lines += 1;
        let out = &*out;
        target.within(self.lines, || d.buffer_bytes(out))
    }

    fn done(self: Box<Self>, lines: u64) {
        let Some(out) = self.out.filter(|_| lines == self.lines) else { return };
        keep(self.target, self.decoder.finish(out), lines);
    }
}

/// Keeps a chunk of `lines` sequences parsed into `streams`, if it fits: what its parse held is
/// let go, and what it holds now is held instead.
fn keep(target: Target<'_>, mut streams: Vec<StreamData>, lines: u64) {
    let Ok(num_sequences) = usize::try_from(lines) else { return };
    for s in &mut streams {
        s.shrink_to_fit();
    }
    // The dataset's chunk number is set when it is taken.
    let chunk = ParsedChunk { chunk: 0, num_sequences, streams, malformed: Vec::new() };
    let Target { ahead, file, start, most, .. } = target;
    drop(most);
    ahead.keep(file, start, chunk);
}

/// What the pass over one file of a dataset of one source needs to parse its chunks ahead.
pub(super) struct FileAhead<'a> {
    /// Where kept chunks go; `None`: nothing is parsed in this pass.
    ahead: Option<&'a Ahead>,
    /// The file's index in its source.
    file: usize,
    /// The file as configured.
    path: &'a Arc<Path>,
    /// Most bytes of one chunk's dense values.
    max_chunk_bytes: u64,
    huge: bool,
    /// Values are `f64` (else `f32`).
    f64: bool,
}

impl<'a> FileAhead<'a> {
    /// File `file` (named `path`) of a dataset of `precision` opened within `limits`, its kept
    /// chunks to `ahead`.
    pub(super) fn new(
        ahead: Option<&'a Ahead>,
        file: usize,
        path: &'a Arc<Path>,
        limits: &crate::options::IndexLimits,
        precision: crate::options::Precision,
    ) -> Self {
        Self {
            ahead,
            file,
            path,
            max_chunk_bytes: limits.max_parsed_chunk_bytes,
            huge: limits.parse_ahead_huge_pages,
            f64: precision == crate::options::Precision::Float64,
        }
    }

    /// Whether this pass parses anything.
    pub(super) fn active(&self) -> bool {
        self.ahead.is_some()
    }

    fn target<T>(&self, start: u64, end: u64) -> Option<Target<'a>> {
        let ahead = self.ahead.filter(|a| a.wanted())?;
        let bytes = end.saturating_sub(start);
        // What its parse may cost, held before it starts (found by a probe: two chunks of 15
        // million short lines parsed at once passed a 64 MiB limit fourfold, though no session
        // could ever have them).
        let most = bytes.saturating_mul(EXPANSION).saturating_add(1 << 20);
        let held = ahead.hold(most)?;
        Some(Target {
            ahead,
            file: self.file,
            path: self.path,
            start,
            bytes,
            max_values: usize::try_from(self.max_chunk_bytes / std::mem::size_of::<T>() as u64).unwrap_or(usize::MAX),
            huge: self.huge,
            most: (most, held),
        })
    }

    /// The sink of a CTF chunk `start..end`.
    pub(super) fn ctf(
        &self,
        decoder: &'a CtfDecoder,
        shapes: &'a [(usize, bool)],
        start: u64,
        end: u64,
    ) -> Option<Box<dyn LineSink + 'a>> {
        if self.f64 {
            let target = self.target::<f64>(start, end)?;
            Some(Box::new(CtfLines::<f64>::new(target, decoder, shapes)))
        } else {
            let target = self.target::<f32>(start, end)?;
            Some(Box::new(CtfLines::<f32>::new(target, decoder, shapes)))
        }
    }

    /// The sink of a chunk `start..end` of records of `decoder`.
    pub(super) fn records<D: RecordDecoder>(
        &self,
        decoder: &'a D,
        start: u64,
        end: u64,
    ) -> Option<Box<dyn LineSink + 'a>> {
        fn sink<'a, D: RecordDecoder, T: DeepxElement>(target: Target<'a>, decoder: &'a D) -> Box<dyn LineSink + 'a> {
            Box::new(RecordLines::<D, T> { target, decoder, out: None, errors: Vec::new(), lines: 0 })
        }
        if self.f64 {
            Some(sink::<D, f64>(self.target::<f64>(start, end)?, decoder))
        } else {
            Some(sink::<D, f32>(self.target::<f32>(start, end)?, decoder))
        }
    }
}
