//! An opened dataset: files resolved, every source indexed (through the index cache), sources
//! joined by sequence key, chunks built, and the [`Timeline`] the sampler works on.
//!
//! This is the seam between the formats and everything above them. The `dump` command and the
//! daemon's parser threads both call [`Dataset::load_chunk`], which reads a chunk's bytes, decodes
//! them into a [`ParsedChunk`] and charges the malformed places to the dataset's error budget.
//!
//! Several sources (CNTK's bundler, reference §3.6): the first source drives chunking; a sequence
//! of it whose key is missing from another source is dropped; the nominal length of a joined
//! sequence is the `defines_mb_size` source's length if one source has such a stream, else the
//! maximum over the sources. Chunks left empty by dropped sequences are dropped.
//!
//! deepx datasets (`libsvm`, `libsvm_ex`, `uch`) have one source whose every line is a sequence
//! of one sample, chunked by the same CNTK rule; their streams are deepx's tensors
//! ([`crate::format::deepx::schema`]). Their inputs may be gzip files, decompressed once into
//! `state_dir` ([`crate::format::inflate`]); [`Dataset::streams`] describes the streams of every
//! format.
//!
//! Submodules: `open` (inputs resolved, decompressed and indexed; sources assembled), `decode`
//! (a chunk read and decoded), `files` (the `files` expansion), `join` (sources joined by key),
//! `read` (versioned reads of local files).

use std::path::Path;
use std::sync::Arc;

use minibatchd_sys::HugePages;

use crate::format::chunk::{ParsedChunk, StreamSpec};
use crate::format::ctf::CtfDecoder;
use crate::format::deepx::DeepxDecoder;
use crate::format::errors::{DataError, ErrorBudget, Malformed};
use crate::format::index::{build_chunks, ChunkDesc, FileIndex};
use crate::format::parsed_cache::ParsedCache;
use crate::format::registry::RecordFormatDecoder;
use crate::hash::Fnv1a;
use crate::options::{DatasetConfig, FormatKind, IndexLimits, Precision};
use crate::remote::{self, ObjectMeta, Remote};
use crate::sampling::Timeline;

mod ahead;
mod budgets;
mod decode;
mod files;
mod join;
mod open;
mod read;
mod versions;

use crate::Result;
pub use ahead::Reserve;
pub use budgets::charge_chunk;
pub use files::{is_pattern, resolve_files, resolve_inputs, Input};
use join::{join, SeqLoc};
pub use read::MAX_REUSED_READ_BUFFER;
use read::{version_of, FileVersion};

/// The decodes' own version, in every parsed chunk's identity: raised when a decode reads the
/// same bytes otherwise (2: a `tf.Example` feature present with no list set is missing; 3: a CTF
/// negative zero was `+0.0`; 4: it is `-0.0` again, as parsed; 5: a `tf.Example` map entry's
/// value written twice is merged), so that chunks persisted by an earlier build are parsed again,
/// not served.
const PARSE_VERSION: &str = "parse 5";

/// Progress of the index pass, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexProgress {
    /// Bytes scanned so far over all files of the dataset (cached files count as scanned).
    pub bytes_done: u64,
    /// Total bytes of all files.
    pub bytes_total: u64,
}

/// The parser of a source: a closed set of formats.
enum SourceDecoder {
    Ctf(CtfDecoder),
    Deepx(DeepxDecoder),
    /// A record format of `crate::format::registry`.
    Records(RecordFormatDecoder),
}

/// Where a file's bytes are, at the version indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    /// A local file (or a decompressed copy): checked against this version before a read.
    Local(FileVersion),
    /// An object at this ETag, read through the object cache with `If-Match`.
    Remote(ObjectMeta),
}

impl Stored {
    fn of(input: &Input) -> Result<Self> {
        match &input.object {
            Some(o) => Ok(Self::Remote(o.clone())),
            None => version_of(&input.name).map(Self::Local),
        }
    }
}

struct OpenSource {
    /// The files (paths or object URLs) as configured (named in errors, part of the identity).
    files: Vec<Arc<Path>>,
    /// Where each file's bytes are read: the file itself, or its decompressed copy.
    data: Vec<Arc<Path>>,
    /// The versions of `data` that were indexed (checked before a chunk is read).
    data_versions: Vec<Stored>,
    /// The versions of `files` that were indexed (a reload opens the dataset again when one
    /// changed).
    file_versions: Vec<Stored>,
    indexes: Vec<FileIndex>,
    decoder: SourceDecoder,
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
    /// `g * sources.len() + s`. Flat, so the index costs no allocation per sequence. Empty for a
    /// dataset of one source, whose places follow from the chunks ([`join::place_in_chunk`]).
    locs: Vec<SeqLoc>,
    timeline: Arc<Timeline>,
    /// One error budget per source: CNTK's `maxErrors` is a per-deserializer counter.
    budgets: Vec<ErrorBudget>,
    /// Each reader charges a budget of its own ([`Dataset::charge_per_reader`]).
    per_reader: bool,
    /// With `per_reader`: per chunk that failed with a fatal error, the places left out before
    /// it (the first `max_errors + 1` per source), which a reader charges before it is told the
    /// fatal error ([`Dataset::charge_failed_chunk`]).
    failed_places: std::sync::Mutex<std::collections::HashMap<usize, Vec<Vec<Malformed>>>>,
    streams: Vec<StreamSpec>,
    stream_names: Vec<String>,
    /// The parsed cache, if this dataset uses one.
    parsed: Option<ParsedUse>,
    /// [`IndexLimits::max_parsed_chunk_bytes`] of the open, or of the memory limit a reload set
    /// since ([`Dataset::set_memory_limit`]).
    max_parsed_chunk_bytes: std::sync::atomic::AtomicU64,
    /// The object storage its objects are read from (none for a dataset of local files).
    remote: Option<Arc<Remote>>,
    /// Whether the buffers of the chunks it parses are advised huge pages (`[daemon] huge_pages`).
    huge: HugePages,
    /// [`Dataset::identities`], once computed.
    identities: std::sync::OnceLock<[u64; 2]>,
    /// The chunks its index pass parsed, until taken ([`ahead`]).
    ahead: Option<ahead::Ahead>,
    /// Files it indexed and could not write to the index cache ([`Dataset::uncached_indexes`]).
    uncached_indexes: u64,
}

/// When a dataset writes the chunks it parses to the parsed cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// In [`Dataset::load_chunk`], before it returns (`dump`, `index --parsed`).
    OnLoad,
    /// Later, by whoever calls [`Dataset::persist_later`] (the daemon's low-priority writer, so
    /// that the write stays off the path of the first minibatch).
    Later,
}

/// A dataset's use of the parsed cache.
struct ParsedUse {
    cache: Arc<ParsedCache>,
    /// [`Dataset::parse_identity`].
    identity: u64,
    persist: Persist,
    /// Per chunk: parsed without a malformed place and not written yet ([`Persist::Later`]).
    pending: Vec<std::sync::atomic::AtomicBool>,
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

impl Dataset {
    /// Opens `config`: indexes every file (using and refreshing caches in `state_dir` when
    /// `cache_index` is set) and joins the sources.
    ///
    /// # Errors
    /// Missing files, I/O errors and fatal index errors.
    pub fn open(config: &DatasetConfig, state_dir: &Path, progress: &mut dyn FnMut(IndexProgress)) -> Result<Self> {
        Self::open_within(config, state_dir, IndexLimits::UNBOUNDED, progress)
    }

    /// [`Dataset::open`] within `limits`: the index pass stops with an error naming the file,
    /// line and byte offset at the first sequence past `limits.max_sequences` (over every source
    /// and file) or larger than `limits.max_sequence_bytes`.
    ///
    /// # Errors
    /// As [`Dataset::open`], and a limit exceeded.
    pub fn open_within(
        config: &DatasetConfig,
        state_dir: &Path,
        limits: IndexLimits,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        Self::open_in(config, state_dir, limits, None, progress)
    }

    /// [`Dataset::open_within`] reading its `s3://` inputs from `remote` (an input in object
    /// storage without one is an error naming it); the dataset keeps `remote` for its chunks.
    ///
    /// # Errors
    /// As [`Dataset::open_within`], and what object storage says.
    pub fn open_in(
        config: &DatasetConfig,
        state_dir: &Path,
        limits: IndexLimits,
        remote: Option<Arc<Remote>>,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        Self::open_reserving(config, state_dir, (limits, None), remote, progress)
    }

    /// [`Dataset::open_in`] where the chunks its index pass keeps
    /// ([`IndexLimits::parse_ahead_bytes`]) are each also counted by `reserve` (the daemon's
    /// chunk cache), and kept only while it has room for them.
    ///
    /// # Errors
    /// As [`Dataset::open_in`].
    pub fn open_reserving(
        config: &DatasetConfig,
        state_dir: &Path,
        (limits, reserve): (IndexLimits, Option<Reserve>),
        remote: Option<Arc<Remote>>,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        let r = remote.as_deref();
        let mut ds = match config.format {
            FormatKind::Ctf => Self::open_ctf(config, state_dir, (limits, reserve), r, progress),
            FormatKind::Libsvm | FormatKind::LibsvmEx | FormatKind::Uch => {
                Self::open_deepx(config, state_dir, (limits, reserve), r, progress)
            }
            // Every other format is a record format of `format::registry`, opened from its options.
            _ if config.records.is_some() => Self::open_records(config, state_dir, limits, r, progress),
            other => {
                Err(DataError::Dataset(format!("dataset '{}': a {other:?} dataset without its options", config.name)))
            }
        }?;
        *ds.max_parsed_chunk_bytes.get_mut() = limits.max_parsed_chunk_bytes;
        ds.remote = remote;
        Ok(ds)
    }

    /// Chunks (unless the first source's files were chunked as they were indexed: `chunked`),
    /// joins and builds the timeline of opened sources.
    fn assemble(
        config: &DatasetConfig,
        sources: Vec<OpenSource>,
        chunked: Option<Vec<ChunkDesc>>,
        main_source: Option<usize>,
        streams: Vec<StreamSpec>,
    ) -> Result<Self> {
        let primary_chunks = chunked.unwrap_or_else(|| build_chunks(&sources[0].indexes, config.chunk_size_bytes));
        let (chunks, locs, timeline) = join(&sources, &primary_chunks, main_source)?;
        let budgets = sources.iter().map(|_| ErrorBudget::new(config.max_errors)).collect();
        Ok(Self {
            config: config.clone(),
            sources,
            chunks,
            locs,
            timeline: Arc::new(timeline),
            budgets,
            per_reader: false,
            failed_places: std::sync::Mutex::default(),
            stream_names: streams.iter().map(|s| s.name.clone()).collect(),
            streams,
            parsed: None,
            max_parsed_chunk_bytes: std::sync::atomic::AtomicU64::new(u64::MAX),
            remote: None,
            huge: HugePages::default(),
            identities: std::sync::OnceLock::new(),
            ahead: None,
            uncached_indexes: 0,
        })
    }

    /// Serves chunks from, and persists parsed chunks into, `cache` (the parsed cache,
    /// [`ParsedCache`]) under this dataset's [`Dataset::parse_identity`].
    /// Chunks parsed without a malformed place are written when `persist` says.
    pub fn use_parsed_cache(&mut self, cache: Arc<ParsedCache>, persist: Persist) {
        let pending = (0..self.chunks.len()).map(|_| std::sync::atomic::AtomicBool::new(false)).collect();
        self.parsed = Some(ParsedUse { cache, identity: self.parse_identity(), persist, pending });
    }

    /// Follows `huge` (shared with whoever opened the dataset, who may change it) for the buffers
    /// of the chunks it parses from now on; on by default.
    pub fn set_huge_pages(&mut self, huge: HugePages) {
        self.huge = huge;
    }

    /// The parsed cache this dataset uses, if any.
    #[must_use]
    pub fn parsed_cache(&self) -> Option<&Arc<ParsedCache>> {
        self.parsed.as_ref().map(|p| &p.cache)
    }

    /// With [`Persist::Later`]: writes `chunk` (as [`Dataset::load_chunk`] returned it) to the
    /// parsed cache if it was parsed without a malformed place and has not been written since.
    /// Returns whether it wrote it.
    #[must_use = "false: nothing was written (persisted already, a chunk with errors, or no cache)"]
    pub fn persist_later(&self, chunk: &ParsedChunk) -> bool {
        use std::sync::atomic::Ordering;
        let Some(p) = &self.parsed else { return false };
        let Some(flag) = p.pending.get(chunk.chunk) else { return false };
        if !flag.swap(false, Ordering::AcqRel) {
            return false;
        }
        p.cache.put(p.identity, chunk);
        true
    }

    /// The identity under which this dataset's parsed chunks are persisted: everything that shapes
    /// a chunk's parse — the format and its options, the sources' streams, the precision, the
    /// chunk size, minibatchd's version — and every input file's path and version as indexed
    /// (size, modification time and inode of a local file, ETag of an object), and the chunking
    /// and sequence lengths ([`Dataset::identity`]). Not the dataset's name, sampling defaults
    /// or error budget, which do not change what a chunk parses to.
    #[must_use]
    pub fn parse_identity(&self) -> u64 {
        let c = &self.config;
        let mut h = Fnv1a::new();
        h.field(b"minibatchd parsed chunk");
        h.field(env!("CARGO_PKG_VERSION").as_bytes());
        h.field(PARSE_VERSION.as_bytes());
        h.field(format!("{:?}|{:?}|{:?}|{:?}", c.format, c.sources, c.precision, c.deepx).as_bytes());
        // A record format's options: another decode of the same bytes.
        if let Some(r) = &c.records {
            h.field(format!("{r:?}").as_bytes());
        }
        h.u64(c.chunk_size_bytes);
        for s in &self.sources {
            for (f, v) in s.files.iter().zip(&s.file_versions) {
                h.field(f.as_os_str().as_encoded_bytes());
                match v {
                    Stored::Local(v) => v.hash_version(&mut h),
                    Stored::Remote(o) => {
                        h.field(o.etag.as_bytes());
                        h.u64(o.size);
                    }
                }
            }
        }
        h.u64(self.identity());
        h.finish()
    }

    /// A digest of how this dataset's bytes are decoded into values: the format, each source's
    /// streams and sequence-id mode, the precision and the format's options — not its files,
    /// chunking or sampling (which [`Dataset::identity`] and the options hash cover). A session's
    /// state carries it, so a resume after a reload that decodes the same positions otherwise
    /// (streams swapped, a dimension or default changed) is told so.
    #[must_use]
    pub fn decode_digest(&self) -> u64 {
        let c = &self.config;
        let mut h = Fnv1a::new();
        // deepx's `batch` only suggests a minibatch size: not how values decode.
        let deepx = c.deepx.clone().map(|d| crate::options::DeepxOptions { batch: None, ..d });
        h.field(format!("{:?}|{:?}|{:?}|{:?}", c.format, c.precision, deepx, c.records).as_bytes());
        for s in &c.sources {
            h.field(format!("{}|{:?}", s.skip_sequence_ids, s.streams).as_bytes());
        }
        h.finish()
    }

    /// Bytes its index holds in memory: every source's sequence descriptors, the joined
    /// sequences' places and nominal lengths, and the chunks (what `daemon.memory_limit_bytes`
    /// counts for an open dataset).
    #[must_use]
    pub fn index_bytes(&self) -> u64 {
        use std::mem::size_of;
        let descriptors: usize = self.sources.iter().flat_map(|s| &s.indexes).map(|i| i.sequences.heap_bytes()).sum();
        let bytes = descriptors
            + self.locs.capacity() * size_of::<SeqLoc>()
            + self.timeline.seq_len.heap_bytes()
            + self.timeline.chunk_start.capacity() * size_of::<usize>()
            + self.chunks.capacity() * size_of::<ChunkDesc>();
        bytes as u64
    }

    /// Every file it reads, of every source: paths and object URLs as listed, and where their
    /// bytes are read (a gzip input's decompressed copy).
    pub fn inputs(&self) -> impl Iterator<Item = &Path> {
        self.sources.iter().flat_map(|s| s.files.iter().chain(&s.data).map(|f| &**f))
    }

    /// The configuration it was opened with.
    #[must_use]
    pub fn config(&self) -> &DatasetConfig {
        &self.config
    }

    /// The most bytes one parsed chunk may hold ([`IndexLimits::max_parsed_chunk_bytes`] of the
    /// open, or as set since): a chunk whose dense values would pass it fails as it is parsed.
    #[must_use]
    pub fn max_parsed_chunk_bytes(&self) -> u64 {
        self.max_parsed_chunk_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Raises [`Dataset::max_parsed_chunk_bytes`] to the bound of the memory limit
    /// `memory_limit` (a reload raised it: found by a probe, the open dataset kept the bound of
    /// the limit it was opened under, so a chunk refused for the old limit stayed refused after
    /// the limit was raised, as its error advised). Never lowers it: a session admitted under the
    /// larger bound would then fail at a chunk it was admitted for (found by a probe of the first
    /// version of this, which lowered it); a lower limit bounds the versions opened after it.
    pub fn set_memory_limit(&self, memory_limit: u64) {
        let bytes = IndexLimits::within(memory_limit, 0, 1).max_parsed_chunk_bytes;
        self.max_parsed_chunk_bytes.fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
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
    /// readahead by the daemon's readahead stage); for a gzip input, its decompressed copy.
    #[must_use]
    pub fn chunk_byte_range(&self, chunk: usize) -> Option<(&Path, u64, u64)> {
        let c = self.chunks.get(chunk)?;
        let src = self.sources.first()?;
        match src.data_versions.get(c.file)? {
            Stored::Local(_) => Some((src.data.get(c.file)?, c.start, c.end)),
            Stored::Remote(_) => None,
        }
    }

    /// Stream names, in the order of [`ParsedChunk::streams`].
    #[must_use]
    pub fn stream_names(&self) -> &[String] {
        &self.stream_names
    }

    /// Every stream's name, storage and dimension, in the order of [`ParsedChunk::streams`]: the
    /// configured streams of a CTF dataset, deepx's tensors of a deepx one. Consumers that need a
    /// stream's kind or `dim` use this rather than `config().streams()`, which lists CTF streams
    /// only.
    #[must_use]
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }

    /// What each stream of this dataset's minibatches looks like (kind, dimension, precision).
    #[must_use]
    pub fn stream_shapes(&self) -> Vec<crate::minibatch::StreamShape> {
        crate::minibatch::StreamShape::of(self.streams(), self.config.precision == crate::options::Precision::Float64)
    }

    /// A stable identity of the data and the options that shape the timeline: the files' paths,
    /// sizes and contents (a local file's [`FileIndex::digest`], an object's ETag), the
    /// per-sequence nominal lengths and the chunking. Used to refuse a resume against other data
    /// — a file replaced or rewritten since, whatever its size and times say — while a copy of
    /// the same bytes elsewhere (another node, a file downloaded again) keeps the identity: it
    /// does not depend on devices, inodes or times.
    #[must_use]
    pub fn identity(&self) -> u64 {
        self.identities()[0]
    }

    /// The identity as minibatchd computed it before local files' contents were part of it
    /// (paths, sizes, lengths and chunking only): a state written then carries it, and is accepted
    /// against the same data. Equal to [`Dataset::identity`] for a dataset of objects only.
    #[must_use]
    pub fn legacy_identity(&self) -> u64 {
        self.identities()[1]
    }

    /// [`Dataset::identity`] and [`Dataset::legacy_identity`], computed once (they walk every
    /// sequence's length, unless every one is 1: [`Fnv1a::ones`]) and in one walk: the two
    /// hashes' steps are independent, so the core runs them side by side.
    fn identities(&self) -> [u64; 2] {
        *self.identities.get_or_init(|| {
            let (mut h, mut legacy) = (Fnv1a::new(), Fnv1a::new());
            for s in &self.sources {
                for ((f, idx), v) in s.files.iter().zip(&s.indexes).zip(&s.file_versions) {
                    for each in [&mut h, &mut legacy] {
                        each.field(f.as_os_str().as_encoded_bytes());
                        each.u64(idx.size);
                        // An object's version is part of its identity (a rewrite at the same
                        // size is other data).
                        if let Stored::Remote(o) = v {
                            each.field(o.etag.as_bytes());
                        }
                    }
                    // A local file's contents only in the current identity.
                    if let Stored::Local(_) = v {
                        h.u64(u64::from(idx.digest));
                    }
                }
            }
            if self.timeline.seq_len.all_ones() {
                // One sample each: the same hash as one field of 1 a sequence, without the walk.
                let n = self.timeline.seq_len.len() as u64;
                h.ones(n);
                legacy.ones(n);
            } else {
                for l in self.timeline.seq_len.iter() {
                    h.u64(u64::from(l));
                    legacy.u64(u64::from(l));
                }
            }
            for &c in &self.timeline.chunk_start {
                h.u64(c as u64);
                legacy.u64(c as u64);
            }
            [h.finish(), legacy.finish()]
        })
    }

    /// Reads and decodes chunk `chunk`, charging its malformed places to their source's budget.
    ///
    /// Returns the chunk and the errors charged for the first time (for logs and metrics).
    ///
    /// # Errors
    /// I/O errors, fatal data errors, and [`DataError::TooManyErrors`] once a source's budget is
    /// spent.
    pub fn load_chunk(&self, chunk: usize) -> Result<(ParsedChunk, Vec<Malformed>)> {
        match self.cached_chunk(chunk)? {
            Some(parsed) => Ok((parsed, Vec::new())),
            None => self.parse_chunk(chunk),
        }
    }

    /// Chunk `chunk` read back from the parsed cache, if it holds it (no text read or parsed).
    ///
    /// # Errors
    /// A file of the chunk that changed since it was indexed.
    pub fn cached_chunk(&self, chunk: usize) -> Result<Option<ParsedChunk>> {
        let Some(p) = &self.parsed else { return Ok(None) };
        let sequences = self.timeline.chunk_start.get(chunk + 1).zip(self.timeline.chunk_start.get(chunk));
        let Some((end, start)) = sequences else { return Ok(None) };
        let Some(parsed) = p.cache.get(p.identity, chunk, end - start, &self.streams, self.config.precision) else {
            return Ok(None);
        };
        // An entry holds the bytes as indexed: served only while the files still are, as a read
        // of them would be (a file rewritten since fails the chunk).
        self.chunk_inputs_unchanged(chunk)?;
        Ok(Some(parsed))
    }

    /// Chunk `chunk` parsed from its text, whatever the parsed cache holds (which it then fills),
    /// with the malformed places charged to the error budget for the first time.
    ///
    /// # Errors
    /// As [`Self::load_chunk`].
    pub fn parse_chunk(&self, chunk: usize) -> Result<(ParsedChunk, Vec<Malformed>)> {
        if let Some(parsed) = self.take_parsed_in_pass(chunk)? {
            return Ok((parsed, Vec::new()));
        }
        let (parsed, errors) = match self.config.precision {
            Precision::Float32 => self.decode_chunk::<f32>(chunk)?,
            Precision::Float64 => self.decode_chunk::<f64>(chunk)?,
        };
        self.settle(chunk, parsed, &errors)
    }

    /// Whether chunk `chunk`'s bytes are in object storage and not in the object cache.
    #[must_use]
    pub fn object_range_missing(&self, chunk: usize) -> bool {
        let Some(c) = self.chunks.get(chunk) else { return false };
        let Some(src) = self.sources.first() else { return false };
        let Some(Stored::Remote(object)) = src.data_versions.get(c.file) else { return false };
        self.remote.as_deref().is_some_and(|r| !r.chunks.contains(object, c.start, c.end))
    }

    /// For a chunk whose bytes are in object storage: fetches them into the object cache
    /// now (the daemon's readahead stage does this ahead of the parsers, several at a time), and
    /// says whether they were fetched now (`false`: already there, or no room in the cache now,
    /// when the chunk's parser reads them itself). `None` for a chunk of a local file.
    #[must_use]
    pub fn fetch_object_range(&self, chunk: usize) -> Option<Result<bool>> {
        let c = self.chunks.get(chunk)?;
        let src = self.sources.first()?;
        let Stored::Remote(object) = src.data_versions.get(c.file)? else { return None };
        let name = &src.files[c.file];
        Some(remote::require(self.remote.as_deref(), name).and_then(|r| {
            // A range the cache cannot keep is read by its parser, into memory: fetched here, it
            // would be downloaded twice (a review).
            if r.chunks.contains(object, c.start, c.end) || !r.chunks.keeps(c.end - c.start) {
                return Ok(false);
            }
            r.chunks.fetch_ahead(r.store.as_ref(), object, c.start, c.end)
        }))
    }
}
