//! An opened dataset: files resolved, every source indexed (through the index cache), sources
//! joined by sequence key, chunks built, and the [`Timeline`] the sampler works on.
//!
//! This is the seam between the formats and everything above them. The `dump` command and the
//! daemon's reader stage both call [`Dataset::load_chunk`], which reads a chunk's bytes, decodes
//! them into a [`ParsedChunk`] and charges the malformed places to the dataset's error budget.
//!
//! Several sources (CNTK's bundler, reference §3.6): the first source drives chunking; a sequence
//! of it whose key is missing from another source is dropped; the nominal length of a joined
//! sequence is the `defines_mb_size` source's length if one source has such a stream, else the
//! maximum over the sources. Chunks left empty by dropped sequences are dropped.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{DatasetConfig, FormatKind, Precision, SourceConfig};
use crate::format::cache::{self, FileStamp, Miss};
use crate::format::chunk::{Indices, ParsedChunk, StreamData, StreamValues, Values};
use crate::format::ctf::{self, CtfDecoder, CtfIndexOptions, Element, SeqContext, StreamBuf};
use crate::format::errors::{DataError, ErrorBudget, Malformed};
use crate::format::index::{build_chunks, ChunkDesc, FileIndex, SequenceDesc};
use crate::sampling::Timeline;

/// Progress of the index pass, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexProgress {
    /// Bytes scanned so far over all files of the dataset (cached files count as scanned).
    pub bytes_done: u64,
    /// Total bytes of all files.
    pub bytes_total: u64,
}

/// A sequence of the joined dataset: where its bytes are in each source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeqLoc {
    file: u32,
    seq: u32,
}

struct OpenSource {
    files: Vec<Arc<Path>>,
    indexes: Vec<FileIndex>,
    decoder: CtfDecoder,
    /// First stream of this source in the dataset's stream order.
    first_stream: usize,
}

/// An opened dataset.
pub struct Dataset {
    config: DatasetConfig,
    sources: Vec<OpenSource>,
    /// Chunks of the primary source that kept at least one sequence.
    chunks: Vec<ChunkDesc>,
    /// Per joined sequence (timeline order), its location in each source: entry
    /// `g * sources.len() + s`. Flat, so the index costs no allocation per sequence.
    locs: Vec<SeqLoc>,
    timeline: Arc<Timeline>,
    budget: ErrorBudget,
    stream_names: Vec<String>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("name", &self.config.name)
            .field("chunks", &self.chunks.len())
            .field("sequences", &self.timeline.num_sequences())
            .finish_non_exhaustive()
    }
}

/// Expands the configured paths (globs allowed) into files, in order.
///
/// # Errors
/// A pattern that matches nothing, or a path that does not exist.
pub fn resolve_files(patterns: &[PathBuf]) -> Result<Vec<PathBuf>, DataError> {
    let mut out = Vec::new();
    for p in patterns {
        let text = p.to_string_lossy();
        if text.contains(['*', '?', '[']) {
            let mut matched: Vec<PathBuf> = glob::glob(&text)
                .map_err(|e| DataError::Dataset(format!("invalid glob '{text}': {e}")))?
                .filter_map(Result::ok)
                .filter(|m| m.is_file())
                .collect();
            matched.sort();
            if matched.is_empty() {
                return Err(DataError::Dataset(format!("no file matches '{text}'")));
            }
            out.extend(matched);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            return Err(DataError::Dataset(format!("{}: no such file", p.display())));
        }
    }
    Ok(out)
}

impl Dataset {
    /// Opens `config`: indexes every file (using and refreshing caches in `state_dir` when
    /// `cache_index` is set) and joins the sources.
    ///
    /// # Errors
    /// Missing files, I/O errors and fatal index errors.
    pub fn open(config: &DatasetConfig, state_dir: &Path, progress: &mut dyn FnMut(IndexProgress)) -> Result<Self, DataError> {
        if config.format != FormatKind::Ctf {
            return Err(DataError::Dataset(format!("dataset '{}': format {:?} is not implemented yet", config.name, config.format)));
        }
        let main_source = config.sources.iter().position(|s| s.streams.iter().any(|st| st.defines_mb_size));
        let resolved: Vec<Vec<PathBuf>> = config.sources.iter().map(|s| resolve_files(&s.files)).collect::<Result<_, _>>()?;
        let bytes_total: u64 = resolved.iter().flatten().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
        let mut done = 0u64;
        let mut sources = Vec::new();
        let mut first_stream = 0;
        for (src, files) in config.sources.iter().zip(resolved) {
            let options = CtfIndexOptions {
                skip_sequence_ids: src.skip_sequence_ids,
                main_alias: src.streams.iter().find(|s| s.defines_mb_size).map(|s| s.alias.clone()),
            };
            let mut indexes = Vec::new();
            let mut paths = Vec::new();
            for f in files {
                let base = done;
                let mut report = |b: u64| progress(IndexProgress { bytes_done: base + b, bytes_total });
                let idx = index_with_cache(&f, &options, config.cache_index, state_dir, &mut report)?;
                done += idx.size;
                paths.push(idx.path.clone());
                indexes.push(idx);
            }
            sources.push(OpenSource { files: paths, indexes, decoder: CtfDecoder::new(&src.streams), first_stream });
            first_stream += src.streams.len();
        }
        let primary_chunks = build_chunks(&sources[0].indexes, config.chunk_size_bytes);
        let (chunks, locs, timeline) = join(&sources, &primary_chunks, main_source)?;
        Ok(Self {
            config: config.clone(),
            sources,
            chunks,
            locs,
            timeline: Arc::new(timeline),
            budget: ErrorBudget::new(config.max_errors),
            stream_names: config.streams().map(|s| s.name.clone()).collect(),
        })
    }

    /// The configuration it was opened with.
    #[must_use]
    pub fn config(&self) -> &DatasetConfig {
        &self.config
    }

    /// What the sampler works on.
    #[must_use]
    pub fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    /// The chunks (of the primary source).
    #[must_use]
    pub fn chunks(&self) -> &[ChunkDesc] {
        &self.chunks
    }

    /// The file and byte range `start..end` of chunk `chunk` in the primary source (for
    /// readahead by the daemon's reader stage).
    #[must_use]
    pub fn chunk_byte_range(&self, chunk: usize) -> Option<(&Path, u64, u64)> {
        let c = self.chunks.get(chunk)?;
        Some((self.sources.first()?.files.get(c.file)?, c.start, c.end))
    }

    /// Stream names, in the order of [`ParsedChunk::streams`].
    #[must_use]
    pub fn stream_names(&self) -> &[String] {
        &self.stream_names
    }

    /// The error budget (shared by every reader of this dataset).
    #[must_use]
    pub fn budget(&self) -> &ErrorBudget {
        &self.budget
    }

    /// A stable identity of the data and the options that shape the timeline: the files' paths,
    /// sizes and the per-sequence nominal lengths and chunking. Used to refuse a resume against
    /// other data.
    #[must_use]
    pub fn identity(&self) -> u64 {
        let mut h = Fnv::new();
        for s in &self.sources {
            for (f, idx) in s.files.iter().zip(&s.indexes) {
                h.bytes(f.as_os_str().as_encoded_bytes());
                h.u64(idx.size);
            }
        }
        for &l in &self.timeline.seq_len {
            h.u64(u64::from(l));
        }
        for &c in &self.timeline.chunk_start {
            h.u64(c as u64);
        }
        h.finish()
    }

    /// Reads and decodes chunk `chunk`, charging its malformed places to the budget.
    ///
    /// Returns the chunk and the errors charged for the first time (for logs and metrics).
    ///
    /// # Errors
    /// I/O errors, fatal data errors, and [`DataError::TooManyErrors`] once the budget is spent.
    pub fn load_chunk(&self, chunk: usize) -> Result<(ParsedChunk, Vec<Malformed>), DataError> {
        let (parsed, errors) = match self.config.precision {
            Precision::Float32 => self.decode_chunk::<f32>(chunk)?,
            Precision::Float64 => self.decode_chunk::<f64>(chunk)?,
        };
        let fresh = self.budget.charge(&errors)?;
        Ok((parsed, fresh))
    }

    /// CNTK charges each error as it occurs, so an error that exhausts the budget is reported
    /// before a fatal condition later in the same sequence: charge what was found first.
    fn fatal_after(&self, fatal: DataError, errors: &[Malformed]) -> DataError {
        match self.budget.charge(errors) {
            Ok(_) => fatal,
            Err(too_many) => too_many,
        }
    }

    fn decode_chunk<T: Element + IntoValues>(&self, chunk: usize) -> Result<(ParsedChunk, Vec<Malformed>), DataError> {
        let desc = self.chunks.get(chunk).ok_or_else(|| DataError::Dataset(format!("no chunk {chunk}")))?;
        let seqs = self.timeline.chunk_start[chunk]..self.timeline.chunk_start[chunk + 1];
        let mut errors = Vec::new();
        let mut streams = Vec::new();
        for (si, src) in self.sources.iter().enumerate() {
            let mut bufs: Vec<StreamBuf<T>> = (0..src.decoder.num_streams()).map(|_| StreamBuf::new()).collect();
            if si == 0 {
                // The primary source: one read for the whole chunk.
                let path = &src.files[desc.file];
                let bytes = read_range(path, desc.start, desc.end)?;
                for g in seqs.clone() {
                    let loc = self.locs[g * self.sources.len()];
                    let seq = &src.indexes[loc.file as usize].sequences[loc.seq as usize];
                    let from = usize::try_from(seq.offset - desc.start).map_err(|_| DataError::Dataset("offset".into()))?;
                    let slice = &bytes[from..from + seq.size as usize];
                    src.decoder
                        .decode_sequence(slice, &SeqContext { file: path, seq }, &mut bufs, &mut errors)
                        .map_err(|e| self.fatal_after(e, &errors))?;
                }
            } else {
                for g in seqs.clone() {
                    let loc = self.locs[g * self.sources.len() + si];
                    let path = &src.files[loc.file as usize];
                    let seq = &src.indexes[loc.file as usize].sequences[loc.seq as usize];
                    let bytes = read_range(path, seq.offset, seq.offset + u64::from(seq.size))?;
                    src.decoder
                        .decode_sequence(&bytes, &SeqContext { file: path, seq }, &mut bufs, &mut errors)
                        .map_err(|e| self.fatal_after(e, &errors))?;
                }
            }
            let cfg: &SourceConfig = &self.config.sources[si];
            debug_assert_eq!(streams.len(), src.first_stream);
            for (buf, sc) in bufs.into_iter().zip(&cfg.streams) {
                streams.push(into_stream_data(buf, sc.dim, sc.format == crate::config::StreamFormat::Sparse));
            }
        }
        Ok((ParsedChunk { chunk, num_sequences: seqs.len(), streams }, errors))
    }
}

/// Wraps a typed vector into [`Values`].
pub trait IntoValues: Sized {
    /// The wrapped vector.
    fn into_values(v: Vec<Self>) -> Values;
}

impl IntoValues for f32 {
    fn into_values(v: Vec<Self>) -> Values {
        Values::F32(v)
    }
}

impl IntoValues for f64 {
    fn into_values(v: Vec<Self>) -> Values {
        Values::F64(v)
    }
}

fn into_stream_data<T: IntoValues>(buf: StreamBuf<T>, dim: usize, sparse: bool) -> StreamData {
    let data = if sparse {
        StreamValues::Sparse {
            sample_offsets: buf.sample_offsets,
            indices: Indices::I32(buf.indices),
            values: T::into_values(buf.values),
        }
    } else {
        StreamValues::Dense { dim, values: T::into_values(buf.values) }
    };
    StreamData { seq_offsets: buf.seq_offsets, data }
}

fn read_range(path: &Path, start: u64, end: u64) -> Result<Vec<u8>, DataError> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let len = usize::try_from(end - start).map_err(|_| DataError::Dataset("chunk too large".into()))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, start).map_err(|e| DataError::io(path, e))?;
    Ok(buf)
}

fn index_with_cache(
    path: &Path,
    options: &CtfIndexOptions,
    use_cache: bool,
    state_dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let stamp = FileStamp::of(path).map_err(|e| DataError::io(path, e))?;
    let shared: Arc<Path> = Arc::from(path);
    let fingerprint = options.fingerprint();
    if use_cache {
        match cache::load(state_dir, &stamp, &fingerprint, &shared) {
            Ok(idx) => {
                progress(stamp.size);
                return Ok(idx);
            }
            Err(Miss::Absent) => {}
            Err(Miss::Stale(why)) => tracing::info!(file = %path.display(), why, "index cache is stale; rebuilding"),
        }
    }
    let idx = ctf::index_file(path, options, progress)?;
    if use_cache {
        if let Err(e) = cache::store(state_dir, &stamp, &fingerprint, &idx) {
            tracing::warn!(file = %path.display(), state_dir = %state_dir.display(), error = %e, "cannot write the index cache; going on without it");
        }
    }
    Ok(idx)
}

type Joined = (Vec<ChunkDesc>, Vec<SeqLoc>, Timeline);

/// Joins the sources by key and builds the timeline over the primary chunks.
fn join(sources: &[OpenSource], primary_chunks: &[ChunkDesc], main_source: Option<usize>) -> Result<Joined, DataError> {
    // Key → location maps of the secondary sources; the first occurrence of a key wins.
    let maps: Vec<HashMap<u64, SeqLoc>> = sources[1..]
        .iter()
        .map(|s| {
            let mut m = HashMap::new();
            for (fi, idx) in s.indexes.iter().enumerate() {
                for (qi, q) in idx.sequences.iter().enumerate() {
                    m.entry(q.key).or_insert(SeqLoc { file: fi as u32, seq: qi as u32 });
                }
            }
            m
        })
        .collect();
    let mut chunks = Vec::new();
    let mut locs = Vec::new();
    let mut seq_len = Vec::new();
    let mut chunk_start = vec![0usize];
    let (mut loc, mut lens) = (Vec::new(), Vec::new());
    for c in primary_chunks {
        let idx = &sources[0].indexes[c.file];
        let mut kept = 0usize;
        let mut samples = 0u64;
        'seqs: for qi in c.first_seq..c.first_seq + c.num_seqs {
            let q: &SequenceDesc = &idx.sequences[qi];
            loc.clear();
            lens.clear();
            loc.push(SeqLoc { file: c.file as u32, seq: qi as u32 });
            lens.push(q.samples);
            for (m, s) in maps.iter().zip(&sources[1..]) {
                let Some(&l) = m.get(&q.key) else { continue 'seqs };
                lens.push(s.indexes[l.file as usize].sequences[l.seq as usize].samples);
                loc.push(l);
            }
            let len = match main_source {
                Some(m) => lens[m],
                None => lens.iter().copied().max().unwrap_or(0),
            };
            kept += 1;
            samples += u64::from(len);
            seq_len.push(len);
            locs.extend_from_slice(&loc);
        }
        if kept > 0 {
            chunks.push(ChunkDesc { num_seqs: kept, num_samples: samples, ..*c });
            chunk_start.push(seq_len.len());
        }
    }
    if seq_len.is_empty() {
        return Err(DataError::Dataset("the dataset has no sequence (after joining its sources by key)".into()));
    }
    Ok((chunks, locs, Timeline { seq_len, chunk_start }))
}

/// FNV-1a, for identities that must be stable across runs and builds.
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 ^= 0xff; // field separator
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}
