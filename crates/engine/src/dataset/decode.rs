//! Loading a chunk: its bytes read a window at a time (a local file checked against the version
//! indexed, or an object's range through the object cache), decoded source by source — CTF
//! sources joined by sequence key, every other format through its record decoder — into one
//! [`ParsedChunk`].

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use super::join::{place_in_chunk, SeqLoc};
use super::read::{read_range, ReadWindow};
use super::{Dataset, OpenSource, SourceDecoder, Stored};
use crate::format::chunk::{ParsedChunk, StreamData};
use crate::format::ctf::{SeqContext, StreamBuf};
use crate::format::deepx::DeepxElement;
use crate::format::errors::{DataError, Malformed};
use crate::format::index::{ChunkDesc, SequenceDesc};
use crate::format::record::{RecordAt, RecordDecoder};
use crate::format::registry::DecoderVisitor;
use crate::options::{SourceConfig, StreamFormat};
use crate::remote::{self, Remote};
use crate::Result;

/// A record format's chunk decode, run with its decoder's own type
/// ([`crate::format::registry::RecordFormatDecoder::visit`]).
struct DecodeChunk<'a, T> {
    dataset: &'a Dataset,
    chunk: usize,
    source: usize,
    errors: &'a mut Vec<Malformed>,
    element: PhantomData<T>,
}

impl<T: DeepxElement> DecoderVisitor for DecodeChunk<'_, T> {
    type Out = Result<Vec<StreamData>>;

    fn visit<D: RecordDecoder>(self, d: &D) -> Self::Out {
        self.dataset.decode_records::<D, T>(self.chunk, self.source, d, self.errors)
    }
}

impl Dataset {
    /// Where sequence `g` of the timeline begins in its file (its first line, 1-based, and byte
    /// offset): in the source of stream `stream` (of the dataset's stream order), else the first;
    /// `None` past the timeline, or in a file indexed by its chunks alone (whose sequences are
    /// lines of one sample each).
    #[must_use]
    pub fn sequence_location(&self, g: u64, stream: Option<usize>) -> Option<crate::format::Location> {
        let g = usize::try_from(g).ok()?;
        let starts = &self.timeline.chunk_start;
        let chunk = starts.partition_point(|&s| s <= g).checked_sub(1)?;
        if chunk + 1 >= starts.len() {
            return None;
        }
        // The source holding the stream: the last whose first stream is at or before it.
        let si = stream.map_or(0, |k| self.sources.iter().rposition(|s| s.first_stream <= k).unwrap_or(0));
        let src = &self.sources[si];
        let file = self.chunks.get(chunk)?.file;
        if si == 0 && src.indexes.get(file)?.sequences.sizes_follow_lines() {
            return None;
        }
        let (loc, seq) = self.chunk_sequences(chunk, si).nth(g - starts[chunk])?;
        let path = src.files.get(loc.file as usize)?;
        Some(crate::format::Location { file: path.clone(), line: seq.line + 1, offset: seq.offset })
    }

    /// `e` with the place of the sequence it is about, where this dataset knows it
    /// ([`DataError::locate_sequence`], [`Dataset::sequence_location`]); any other error as is.
    #[must_use]
    pub fn locate(&self, e: DataError) -> DataError {
        e.locate_sequence(|g, stream| self.sequence_location(g, stream))
    }

    /// The sequences of chunk `chunk` in source `si`, in timeline order, with their places: in
    /// a dataset of one source, read from its index in order (each in constant time).
    pub(super) fn chunk_sequences(
        &self,
        chunk: usize,
        si: usize,
    ) -> Box<dyn Iterator<Item = (SeqLoc, SequenceDesc)> + '_> {
        let seqs = self.timeline.chunk_start[chunk]..self.timeline.chunk_start[chunk + 1];
        let src = &self.sources[si];
        if self.locs.is_empty() {
            let desc = &self.chunks[chunk];
            let start = seqs.start;
            let sequences = src.indexes[desc.file].sequences.range(desc.first_seq, seqs.len());
            Box::new(seqs.zip(sequences).map(move |(g, seq)| (place_in_chunk(desc, start, g), seq)))
        } else {
            let n = self.sources.len();
            Box::new(seqs.map(move |g| {
                let loc = self.locs[g * n + si];
                (loc, src.indexes[loc.file as usize].sequences.get(loc.seq as usize))
            }))
        }
    }

    /// Decodes chunk `chunk` of source `si` — a source of one record format, deepx's or
    /// TFRecord's — with `d`, its malformed places into `errors`: record by record at the places
    /// its index gives, or, where a line index let go of their sizes, as its lines. The dense
    /// values stay within the chunk's share of the memory limit (a short record may cost many:
    /// a default of `dim` values, a deepx label).
    pub(super) fn decode_records<D: RecordDecoder, T: DeepxElement>(
        &self,
        chunk: usize,
        si: usize,
        d: &D,
        errors: &mut Vec<Malformed>,
    ) -> Result<Vec<StreamData>> {
        let src = &self.sources[si];
        let desc = &self.chunks[chunk];
        let count = self.timeline.chunk_start[chunk + 1] - self.timeline.chunk_start[chunk];
        let chunk_bytes =
            usize::try_from(desc.end - desc.start).map_err(|_| DataError::Dataset("chunk too large".into()))?;
        let max_values =
            usize::try_from(self.max_parsed_chunk_bytes() / std::mem::size_of::<T>() as u64).unwrap_or(usize::MAX);
        let within = |out: &D::Buffers<T>, at: &RecordAt<'_>| {
            if d.dense_values(out) <= max_values {
                return Ok(());
            }
            Err(DataError::Fatal {
                at: crate::format::Location { file: at.file.clone(), line: at.line + 1, offset: at.offset },
                message: format!(
                    "the chunk's decoded data (values, strings and offsets) pass {} bytes, its share of the memory \
                     limit (daemon.memory_limit_bytes); lower chunk_size_bytes or raise the limit",
                    self.max_parsed_chunk_bytes()
                ),
            })
        };
        let mut out = d.buffers::<T>(chunk_bytes, count, self.huge.enabled());
        let mut window = Self::window(src, self.remote.as_deref(), desc.file, desc.start, desc.end)?;
        if !src.indexes[desc.file].sequences.sizes_follow_lines() {
            for (loc, seq) in self.chunk_sequences(chunk, si) {
                let at = RecordAt { file: &src.files[loc.file as usize], line: seq.line, offset: seq.offset };
                d.decode(window.bytes(seq.offset, seq.size)?, &at, &mut out, errors);
                within(&out, &at)?;
            }
            window.unchanged()?;
            return Ok(d.finish(out));
        }
        // Its sequences are the chunk's lines, in order, one each: sequence `i` of the file is
        // its line `i`.
        let file = &src.files[desc.file];
        chunk_lines(chunk, desc, count, false, file, &mut window, |bytes, line, offset| {
            let at = RecordAt { file, line, offset };
            d.decode(bytes, &at, &mut out, errors);
            within(&out, &at)
        })?;
        window.unchanged()?;
        Ok(d.finish(out))
    }

    /// Decodes chunk `chunk`; the errors come back by source (`[s]`: source `s`'s, in order).
    pub(super) fn decode_chunk<T: DeepxElement>(&self, chunk: usize) -> Result<(ParsedChunk, Vec<Vec<Malformed>>)> {
        let desc = self.chunks.get(chunk).ok_or_else(|| DataError::Dataset(format!("no chunk {chunk}")))?;
        let seqs = self.timeline.chunk_start[chunk]..self.timeline.chunk_start[chunk + 1];
        let mut by_source: Vec<Vec<Malformed>> = Vec::with_capacity(self.sources.len());
        let mut streams = Vec::new();
        let huge = self.huge.enabled();
        for (si, src) in self.sources.iter().enumerate() {
            let mut errors = Vec::new();
            let decoder = match &src.decoder {
                SourceDecoder::Ctf(d) => d,
                // A deepx or TFRecord dataset has a single source, read a window at a time like
                // CTF's primary source (below).
                SourceDecoder::Deepx(d) => {
                    streams.extend(self.decode_records::<_, T>(chunk, si, d, &mut errors)?);
                    by_source.push(errors);
                    continue;
                }
                SourceDecoder::Records(d) => {
                    let visit = DecodeChunk::<T> {
                        dataset: self,
                        chunk,
                        source: si,
                        errors: &mut errors,
                        element: PhantomData,
                    };
                    streams.extend(d.visit(visit)?);
                    by_source.push(errors);
                    continue;
                }
            };
            let mut bufs: Vec<StreamBuf<T>> = (0..decoder.num_streams()).map(|_| StreamBuf::new()).collect();
            // Dense streams hold `dim` values per sample, and most sequences are one sample: reserve
            // that much at once (no regrowth copies) and let it be backed by huge pages.
            // A chunk's dense values (all its dense streams of this source) stay within its share
            // of the memory limit, however many empty samples its bytes hold.
            let max_values =
                usize::try_from(self.max_parsed_chunk_bytes() / std::mem::size_of::<T>() as u64).unwrap_or(usize::MAX);
            for (i, buf) in bufs.iter_mut().enumerate() {
                buf.seq_offsets.reserve(seqs.len());
                if let Some(dim) = decoder.dense_dim(i) {
                    buf.values.reserve(seqs.len().saturating_mul(dim).min(max_values));
                    minibatchd_sys::advise_huge_pages(&buf.values, huge);
                }
            }
            decoder.dense_room(&mut bufs, max_values);
            let dense = (0..bufs.len()).any(|i| decoder.dense_dim(i).is_some());
            let within = |bufs: &mut [StreamBuf<T>], path: &Arc<Path>, seq: &crate::format::SequenceDesc| {
                if !dense || decoder.dense_room(bufs, max_values) {
                    return Ok(());
                }
                let at = crate::format::Location { file: path.clone(), line: seq.line + 1, offset: seq.offset };
                Err(decoder.dense_over_limit::<T>(at, max_values))
            };
            if si == 0 {
                // The primary source: the chunk's bytes in file order, a cache-sized window at a
                // time, so the parser reads what was just copied from the page cache while it is
                // still in the core's cache (one pass over memory instead of three).
                let path = &src.files[desc.file];
                let mut window = Self::window(src, self.remote.as_deref(), desc.file, desc.start, desc.end)?;
                let mut each = |bytes: &[u8], seq: &SequenceDesc| {
                    decoder
                        .decode_sequence(bytes, &SeqContext { file: path, seq }, &mut bufs, &mut errors)
                        .and_then(|()| within(&mut bufs, path, seq))
                        .map_err(|e| self.fatal_after(chunk, e, &by_source, &errors))
                };
                if src.indexes[desc.file].sequences.sizes_follow_lines() {
                    // The file's last sequence runs to its end: blank lines after it are its.
                    let last = desc.end == src.indexes[desc.file].size;
                    chunk_lines(chunk, desc, seqs.len(), last, path, &mut window, |bytes, line, offset| {
                        let size =
                            u32::try_from(bytes.len()).map_err(|_| DataError::Dataset("sequence too large".into()))?;
                        each(bytes, &SequenceDesc { key: line, offset, line, size, samples: 1 })
                    })?;
                } else {
                    for (_, seq) in self.chunk_sequences(chunk, 0) {
                        each(window.bytes(seq.offset, seq.size)?, &seq)?;
                    }
                }
                window.unchanged()?;
            } else {
                for (loc, seq) in self.chunk_sequences(chunk, si) {
                    let path = &src.files[loc.file as usize];
                    let seq = &seq;
                    let bytes = Self::read_stored(
                        src,
                        self.remote.as_deref(),
                        loc.file as usize,
                        seq.offset,
                        seq.offset + u64::from(seq.size),
                    )?;
                    decoder
                        .decode_sequence(&bytes, &SeqContext { file: path, seq }, &mut bufs, &mut errors)
                        .and_then(|()| within(&mut bufs, path, seq))
                        .map_err(|e| self.fatal_after(chunk, e, &by_source, &errors))?;
                }
            }
            let cfg: &SourceConfig = &self.config.sources[si];
            debug_assert_eq!(streams.len(), src.first_stream);
            for (buf, sc) in bufs.into_iter().zip(&cfg.streams) {
                streams.push(buf.into_stream_data(sc.dim, sc.format == StreamFormat::Sparse));
            }
            by_source.push(errors);
        }
        for s in &mut streams {
            s.shrink_to_fit();
        }
        Ok((ParsedChunk { chunk, num_sequences: seqs.len(), streams, malformed: Vec::new() }, by_source))
    }

    /// Windows over bytes `start..end` of `src`'s file `file`: the file (checked against the
    /// version indexed), or the object's range from the object cache (fetched if needed).
    pub(super) fn window<'a>(
        src: &'a OpenSource,
        remote: Option<&Remote>,
        file: usize,
        start: u64,
        end: u64,
    ) -> Result<ReadWindow<'a>> {
        match &src.data_versions[file] {
            Stored::Local(v) => ReadWindow::new(&src.data[file], end, v),
            Stored::Remote(object) => {
                let name = &src.files[file];
                let r = remote::require(remote, name)?;
                let cached = r.chunks.fetch_or_read(r.store.as_ref(), object, start, end)?;
                Ok(ReadWindow::over(name, cached.file, cached.base, end))
            }
        }
    }

    /// Bytes `start..end` of `src`'s file `file` (a joined source's sequence). From an object,
    /// through the cache of the whole object when the cache can hold it (a joined source is read
    /// in its key order, not in chunks), else the sequence's own range from the store.
    pub(super) fn read_stored(
        src: &OpenSource,
        remote: Option<&Remote>,
        file: usize,
        start: u64,
        end: u64,
    ) -> Result<Vec<u8>> {
        match &src.data_versions[file] {
            Stored::Local(v) => read_range(&src.data[file], start, end, v),
            Stored::Remote(object) => {
                use std::os::unix::fs::FileExt as _;
                let name = &src.files[file];
                let r = remote::require(remote, name)?;
                let len = usize::try_from(end - start).map_err(|_| DataError::Dataset("sequence too large".into()))?;
                // The whole object once, when the cache can hold it (a joined source is read in
                // its key order, sequences from all over it); else only this sequence's bytes,
                // straight from the store: the cache never holds more than its bound, nor a file
                // per sequence.
                if !r.chunks.keeps(object.size) {
                    let mut buf = Vec::with_capacity(len);
                    r.store.read_range(object, start, end, &mut buf).map_err(remote::RemoteError::into_data)?;
                    if buf.len() != len {
                        return Err(DataError::io(name, std::io::Error::other("a short range from object storage")));
                    }
                    return Ok(buf);
                }
                let cached = r.chunks.fetch(r.store.as_ref(), object, 0, object.size)?;
                let mut buf = vec![0u8; len];
                cached.file.read_exact_at(&mut buf, start - cached.base).map_err(|e| DataError::io(name, e))?;
                Ok(buf)
            }
        }
    }
}

/// Reads chunk `chunk` (`desc`, `count` sequences) of a file whose sequences are its lines (its
/// sizes let go): `each` gets every line's bytes, line number and offset — with `last`, the
/// chunk's last sequence runs to the chunk's end (a CTF file's last sequence holds the blank
/// lines after it). An error unless the lines end where the chunk does.
fn chunk_lines(
    chunk: usize,
    desc: &ChunkDesc,
    count: usize,
    last: bool,
    file: &Path,
    window: &mut ReadWindow<'_>,
    mut each: impl FnMut(&[u8], u64, u64) -> Result<()>,
) -> Result<()> {
    let mut offset = desc.start;
    for (k, line) in (desc.first_seq as u64..).take(count).enumerate() {
        let to_end = if k + 1 == count && last {
            desc.end.checked_sub(offset).and_then(|n| u32::try_from(n).ok())
        } else {
            None
        };
        let bytes = match to_end {
            Some(size) => window.bytes(offset, size)?,
            None => window.line(offset)?,
        };
        each(bytes, line, offset)?;
        offset += bytes.len() as u64;
    }
    if offset == desc.end {
        return Ok(());
    }
    let what = format!(
        "chunk {chunk}'s {count} lines end at byte {offset}, the chunk at {}: the file holds other lines than its \
         index says (changed since it was indexed?)",
        desc.end
    );
    Err(DataError::io(file, std::io::Error::new(std::io::ErrorKind::InvalidData, what)))
}
