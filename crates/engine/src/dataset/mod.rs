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
//!
//! deepx datasets (`libsvm`, `libsvm_ex`, `uch`) have one source whose every line is a sequence
//! of one sample, chunked by the same CNTK rule; their streams are deepx's tensors
//! ([`crate::format::deepx::schema`]). Their inputs may be gzip files, decompressed once into
//! `state_dir` ([`crate::format::inflate`]); [`Dataset::streams`] describes the streams of every
//! format.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::chunk::{ParsedChunk, StreamData, StreamKind, StreamSpec};
use crate::format::ctf::{CtfDecoder, CtfIndexOptions, SeqContext, StreamBuf};
use crate::format::deepx::{DeepxDecoder, DeepxElement, LineIndexOptions, Schema};
use crate::format::errors::{DataError, ErrorBudget, Malformed};
use crate::format::index::{build_chunks, index_cost, ChunkDesc, FileIndex, SequenceDesc};
use crate::format::inflate;
use crate::format::inflate::Compression;
use crate::format::parsed_cache::ParsedCache;
use crate::format::record::{CtfReader, LineReader, RecordAt, RecordDecoder, RecordReader};
use crate::format::registry::{self, DecoderVisitor, RecordFormat, RecordFormatDecoder};
use crate::hash::Fnv1a;
use crate::options::{
    DatasetConfig, FormatKind, IndexLimits, Precision, SourceConfig, StreamFormat, INDEX_SHARE_OF_MEMORY_LIMIT,
};
use crate::remote::{self, ObjectMeta, Remote};
use crate::sampling::Timeline;

mod files;
mod join;
mod read;

use crate::Result;
use files::index_with_cache;
pub use files::{resolve_files, resolve_inputs, Input};
use join::{join, place_in_chunk, SeqLoc};
pub use read::MAX_REUSED_READ_BUFFER;
use read::{read_range, version_of, FileVersion, ReadWindow};

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

/// A record format's chunk decode, run with its decoder's own type
/// ([`RecordFormatDecoder::visit`]).
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

/// Where a file's bytes are, at the version indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    /// A local file (or a decompressed copy): checked against this version before a read.
    Local(FileVersion),
    /// An object at this ETag, read through the chunk-range cache with `If-Match`.
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
    /// dataset of one source, whose places follow from the chunks ([`Dataset::place`]).
    locs: Vec<SeqLoc>,
    timeline: Arc<Timeline>,
    /// One error budget per source: CNTK's `maxErrors` is a per-deserializer counter.
    budgets: Vec<ErrorBudget>,
    streams: Vec<StreamSpec>,
    stream_names: Vec<String>,
    /// The persisted parsed-chunk cache, if this dataset uses one.
    parsed: Option<ParsedUse>,
    /// [`IndexLimits::max_parsed_chunk_bytes`] of the open.
    max_parsed_chunk_bytes: u64,
    /// The object storage its objects are read from (none for a dataset of local files).
    remote: Option<Arc<Remote>>,
}

/// When a dataset writes the chunks it parses to the persisted parsed-chunk cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// In [`Dataset::load_chunk`], before it returns (`dump`, `index --parsed`).
    OnLoad,
    /// Later, by whoever calls [`Dataset::persist_later`] (the daemon's low-priority writer, so
    /// that the write stays off the path of the first minibatch).
    Later,
}

/// A dataset's use of the persisted parsed-chunk cache.
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
        let r = remote.as_deref();
        let mut ds = match config.format {
            FormatKind::Ctf => Self::open_ctf(config, state_dir, limits, r, progress),
            FormatKind::Libsvm | FormatKind::LibsvmEx | FormatKind::Uch => {
                Self::open_deepx(config, state_dir, limits, r, progress)
            }
            _ if config.records.is_some() => Self::open_records(config, state_dir, limits, r, progress),
            FormatKind::TfRecord | FormatKind::FixedLength | FormatKind::Csv | FormatKind::WholeFile => {
                Err(DataError::Dataset(format!(
                    "dataset '{}': a {:?} dataset without its options",
                    config.name, config.format
                )))
            }
        }?;
        ds.max_parsed_chunk_bytes = limits.max_parsed_chunk_bytes;
        ds.remote = remote;
        Ok(ds)
    }

    fn open_ctf(
        config: &DatasetConfig,
        state_dir: &Path,
        limits: IndexLimits,
        remote: Option<&Remote>,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        let main_source = config.sources.iter().position(|s| s.streams.iter().any(|st| st.defines_mb_size));
        let resolved: Vec<Vec<Input>> =
            config.sources.iter().map(|s| resolve_inputs(&s.files, remote)).collect::<Result<_, _>>()?;
        let bytes_total: u64 = resolved.iter().flatten().map(input_size).sum();
        let mut done = 0u64;
        let (mut sequences, mut index_bytes) = (0u64, 0u64);
        // A file of the dataset keeps a samples column, so the timeline keeps every length.
        let mut lengths_kept = false;
        let mut sources = Vec::new();
        let mut first_stream = 0;
        for (src, files) in config.sources.iter().zip(resolved) {
            let reader = CtfReader(CtfIndexOptions {
                skip_sequence_ids: src.skip_sequence_ids,
                main_alias: src.streams.iter().find(|s| s.defines_mb_size).map(|s| s.alias.clone()),
            });
            let mut indexes = Vec::new();
            let mut paths = Vec::new();
            let mut versions = Vec::new();
            for input in files {
                let f = &input.name;
                // An object's ETag, or the file's version as the index pass (or its cache) saw it.
                let mut stored = Stored::of(&input)?;
                let base = done;
                let mut report = |b: u64| progress(IndexProgress { bytes_done: base + b, bytes_total });
                let left = limits.left_after(sequences, index_bytes, lengths_kept);
                let cache = config.cache_index.then_some(state_dir);
                let idx = index_input(
                    &reader,
                    &input,
                    f,
                    &mut stored,
                    cache,
                    remote,
                    left,
                    config.index_threads,
                    &mut report,
                )?;
                versions.push(stored);
                index_bytes += within_index_budget(&idx, &left)?;
                done += idx.size;
                sequences += idx.sequences.len() as u64;
                lengths_kept |= idx.sequences.columns().samples;
                paths.push(idx.path.clone());
                indexes.push(idx);
            }
            sources.push(OpenSource {
                files: paths.clone(),
                data: paths,
                data_versions: versions.clone(),
                file_versions: versions,
                indexes,
                decoder: SourceDecoder::Ctf(CtfDecoder::new(&src.streams)),
                first_stream,
            });
            first_stream += src.streams.len();
        }
        let streams = config
            .streams()
            .map(|s| StreamSpec {
                name: s.name.clone(),
                kind: match s.format {
                    StreamFormat::Dense => StreamKind::Dense,
                    StreamFormat::Sparse => StreamKind::SparseI32,
                },
                dim: s.dim,
            })
            .collect();
        Self::assemble(config, sources, None, main_source, streams)
    }

    /// A deepx dataset: one source, every line a sequence of one sample.
    fn open_deepx(
        config: &DatasetConfig,
        state_dir: &Path,
        limits: IndexLimits,
        remote: Option<&Remote>,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        let schema = Schema::new(config.format, &config.deepx.clone().unwrap_or_default());
        let patterns = config.sources.first().map(|s| s.files.as_slice()).unwrap_or_default();
        let inputs = resolve_inputs(patterns, remote)?;
        let reader = LineReader(LineIndexOptions { comments: schema.comments });
        let (data, mut data_versions) = readable_inputs(&inputs, config, &reader, state_dir, remote)?;
        let bytes_total = readable_bytes(&data, &data_versions);
        let mut done = 0u64;
        let (mut sequences, mut index_bytes) = (0u64, 0u64);
        // A file of the dataset keeps a samples column, so the timeline keeps every length.
        let mut lengths_kept = false;
        let mut indexes: Vec<FileIndex> = Vec::new();
        let mut chunks = Vec::new();
        let mut file_versions = Vec::new();
        for ((input, d), stored) in inputs.iter().zip(&data).zip(data_versions.iter_mut()) {
            file_versions.push(Stored::of(input)?);
            let base = done;
            let mut report = |b: u64| progress(IndexProgress { bytes_done: base + b, bytes_total });
            let left = limits.left_after(sequences, index_bytes, lengths_kept);
            let cache = config.cache_index.then_some(state_dir);
            let idx = index_input(&reader, input, d, stored, cache, remote, left, config.index_threads, &mut report)?;
            // The file's index whole must fit beside what the earlier files keep (its sizes are
            // held until it is chunked)...
            within_index_budget(&idx, &left)?;
            // ... and once chunked (chunks never cross files), a file whose sequences are its
            // lines keeps an offset every 64 of them: the next file's pass does not find every
            // earlier file's sizes still held.
            let mut idx = idx;
            let file = indexes.len();
            chunks.extend(
                build_chunks(std::slice::from_ref(&idx), config.chunk_size_bytes)
                    .into_iter()
                    .map(|c| ChunkDesc { file, ..c }),
            );
            idx.sequences.let_go_of_line_sizes();
            idx.sequences.shrink_to_fit();
            index_bytes += index_cost(&idx.sequences, &left);
            done += idx.size;
            sequences += idx.sequences.len() as u64;
            lengths_kept |= idx.sequences.columns().samples;
            indexes.push(idx);
        }
        let streams = schema.specs();
        let source = OpenSource {
            files: inputs.iter().map(|f| Arc::from(f.name.as_path())).collect(),
            data: data.iter().map(|d| Arc::from(d.as_path())).collect(),
            data_versions,
            file_versions,
            indexes,
            decoder: SourceDecoder::Deepx(DeepxDecoder::new(schema)),
            first_stream: 0,
        };
        Self::assemble(config, vec![source], Some(chunks), None, streams)
    }

    /// A dataset of one source whose files its format's reader splits into records that its
    /// decoder decodes ([`Dataset::record_format`]; compressed inputs read from their copies).
    fn open_records(
        config: &DatasetConfig,
        state_dir: &Path,
        limits: IndexLimits,
        remote: Option<&Remote>,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        let options = config.records.as_ref().ok_or_else(|| {
            DataError::Dataset(format!("dataset '{}': {:?} is not a record format", config.name, config.format))
        })?;
        let RecordFormat { reader, decoder, streams } = registry::open(options);
        let patterns = config.sources.first().map(|s| s.files.as_slice()).unwrap_or_default();
        let inputs = resolve_inputs(patterns, remote)?;
        let (data, mut data_versions) = readable_inputs(&inputs, config, &*reader, state_dir, remote)?;
        let bytes_total = readable_bytes(&data, &data_versions);
        let (mut done, mut sequences, mut index_bytes) = (0u64, 0u64, 0u64);
        let mut lengths_kept = false;
        let (mut indexes, mut file_versions) = (Vec::new(), Vec::new());
        for ((input, d), stored) in inputs.iter().zip(&data).zip(data_versions.iter_mut()) {
            file_versions.push(Stored::of(input)?);
            let base = done;
            let mut report = |b: u64| progress(IndexProgress { bytes_done: base + b, bytes_total });
            let left = limits.left_after(sequences, index_bytes, lengths_kept);
            let cache = config.cache_index.then_some(state_dir);
            let idx = index_input(&*reader, input, d, stored, cache, remote, left, config.index_threads, &mut report)?;
            index_bytes += within_index_budget(&idx, &left)?;
            done += idx.size;
            sequences += idx.sequences.len() as u64;
            lengths_kept |= idx.sequences.columns().samples;
            indexes.push(idx);
        }
        let source = OpenSource {
            files: inputs.iter().map(|f| Arc::from(f.name.as_path())).collect(),
            data: data.iter().map(|d| Arc::from(d.as_path())).collect(),
            data_versions,
            file_versions,
            indexes,
            decoder: SourceDecoder::Records(decoder),
            first_stream: 0,
        };
        Self::assemble(config, vec![source], None, None, streams)
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
            stream_names: streams.iter().map(|s| s.name.clone()).collect(),
            streams,
            parsed: None,
            max_parsed_chunk_bytes: u64::MAX,
            remote: None,
        })
    }

    /// Serves chunks from, and persists parsed chunks into, `cache` (the persisted parsed-chunk
    /// cache, [`ParsedCache`]) under this dataset's [`Dataset::parse_identity`].
    /// Chunks parsed without a malformed place are written when `persist` says.
    pub fn use_parsed_cache(&mut self, cache: Arc<ParsedCache>, persist: Persist) {
        let pending = (0..self.chunks.len()).map(|_| std::sync::atomic::AtomicBool::new(false)).collect();
        self.parsed = Some(ParsedUse { cache, identity: self.parse_identity(), persist, pending });
    }

    /// The persisted parsed-chunk cache this dataset uses, if any.
    #[must_use]
    pub fn parsed_cache(&self) -> Option<&Arc<ParsedCache>> {
        self.parsed.as_ref().map(|p| &p.cache)
    }

    /// With [`Persist::Later`]: writes `chunk` (as [`Dataset::load_chunk`] returned it) to the
    /// persisted cache if it was parsed without a malformed place and has not been written since.
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

    /// Whether the dataset's files are still those it indexed: the patterns match the same
    /// files, and none was rewritten or replaced since. A reload opens a dataset that is not
    /// current again, even if its configuration did not change.
    #[must_use]
    pub fn is_current(&self) -> bool {
        self.config.sources.iter().zip(&self.sources).all(|(cfg, src)| {
            let Ok(now) = resolve_inputs(&cfg.files, self.remote.as_deref()) else { return false };
            now.len() == src.files.len()
                && now.iter().zip(src.files.iter().zip(&src.file_versions)).all(|(input, (f, v))| {
                    input.name == **f
                        && match v {
                            Stored::Local(v) => version_of(f).is_ok_and(|now| now.same_version(v)),
                            Stored::Remote(o) => input.object.as_ref() == Some(o),
                        }
                })
        })
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
    /// readahead by the daemon's reader stage); for a gzip input, its decompressed copy.
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

    /// The error budgets, one per source (each source is one CNTK deserializer, and
    /// `max_errors` is counted per deserializer), shared by every reader of this dataset.
    #[must_use]
    pub fn budgets(&self) -> &[ErrorBudget] {
        &self.budgets
    }

    /// A stable identity of the data and the options that shape the timeline: the files' paths,
    /// sizes and contents (a local file's [`FileIndex::digest`], an object's ETag), the
    /// per-sequence nominal lengths and the chunking. Used to refuse a resume against other data
    /// — a file replaced or rewritten since, whatever its size and times say — while a copy of
    /// the same bytes elsewhere (another node, a file downloaded again) keeps the identity: it
    /// does not depend on devices, inodes or times.
    #[must_use]
    pub fn identity(&self) -> u64 {
        self.identity_with(true)
    }

    /// The identity as minibatchd computed it before local files' contents were part of it
    /// (paths, sizes, lengths and chunking only): a state written then carries it, and is accepted
    /// against the same data. Equal to [`Dataset::identity`] for a dataset of objects only.
    #[must_use]
    pub fn legacy_identity(&self) -> u64 {
        self.identity_with(false)
    }

    fn identity_with(&self, contents: bool) -> u64 {
        let mut h = Fnv1a::new();
        for s in &self.sources {
            for ((f, idx), v) in s.files.iter().zip(&s.indexes).zip(&s.file_versions) {
                h.field(f.as_os_str().as_encoded_bytes());
                h.u64(idx.size);
                match v {
                    // An object's version is part of its identity (a rewrite at the same size is
                    // other data).
                    Stored::Remote(o) => h.field(o.etag.as_bytes()),
                    Stored::Local(_) if contents => h.u64(u64::from(idx.digest)),
                    Stored::Local(_) => {}
                }
            }
        }
        for l in self.timeline.seq_len.iter() {
            h.u64(u64::from(l));
        }
        for &c in &self.timeline.chunk_start {
            h.u64(c as u64);
        }
        h.finish()
    }

    /// Reads and decodes chunk `chunk`, charging its malformed places to their source's budget.
    ///
    /// Returns the chunk and the errors charged for the first time (for logs and metrics).
    ///
    /// # Errors
    /// I/O errors, fatal data errors, and [`DataError::TooManyErrors`] once a source's budget is
    /// spent.
    pub fn load_chunk(&self, chunk: usize) -> Result<(ParsedChunk, Vec<Malformed>)> {
        if let Some(p) = &self.parsed {
            let sequences = self.timeline.chunk_start.get(chunk + 1).zip(self.timeline.chunk_start.get(chunk));
            if let Some((end, start)) = sequences {
                let hit = p.cache.get(p.identity, chunk, end - start, &self.streams, self.config.precision);
                if let Some(parsed) = hit {
                    return Ok((parsed, Vec::new()));
                }
            }
        }
        let (parsed, errors) = match self.config.precision {
            Precision::Float32 => self.decode_chunk::<f32>(chunk)?,
            Precision::Float64 => self.decode_chunk::<f64>(chunk)?,
        };
        let fresh = self.charge(&errors)?;
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

    /// Charges each source's errors (`by_source[s]`, in the order they were found) to source
    /// `s`'s budget; returns the newly charged ones.
    fn charge(&self, by_source: &[Vec<Malformed>]) -> Result<Vec<Malformed>> {
        let mut fresh = Vec::new();
        for (budget, errors) in self.budgets.iter().zip(by_source) {
            fresh.extend(budget.charge(errors)?);
        }
        Ok(fresh)
    }

    /// CNTK charges each error as it occurs, so an error that exhausts a budget is reported
    /// before a fatal condition found later: charge what was found first (`by_source`: the
    /// sources decoded so far, then the current one's errors up to the fatal condition).
    fn fatal_after(&self, fatal: DataError, by_source: &[Vec<Malformed>], current: &[Malformed]) -> DataError {
        let result = self
            .charge(by_source)
            .and_then(|_| self.budgets.get(by_source.len()).map_or(Ok(Vec::new()), |b| b.charge(current)));
        match result {
            Ok(_) => fatal,
            Err(too_many) => too_many,
        }
    }

    /// Windows over bytes `start..end` of `src`'s file `file`: the file (checked against the
    /// version indexed), or the object's range from the chunk-range cache (fetched if needed).
    fn window<'a>(
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
                let cached = r.chunks.fetch(r.store.as_ref(), object, start, end)?;
                Ok(ReadWindow::over(name, cached.file, cached.base, end))
            }
        }
    }

    /// Bytes `start..end` of `src`'s file `file` (a joined source's sequence). From an object,
    /// through the cache of the whole object when the cache can hold it (a joined source is read
    /// in its key order, not in chunks), else the sequence's own range from the store.
    fn read_stored(src: &OpenSource, remote: Option<&Remote>, file: usize, start: u64, end: u64) -> Result<Vec<u8>> {
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
                if object.size > r.chunks.max_bytes() {
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

    /// Whether chunk `chunk`'s bytes are in object storage and not in the chunk-range cache.
    #[must_use]
    pub fn object_range_missing(&self, chunk: usize) -> bool {
        let Some(c) = self.chunks.get(chunk) else { return false };
        let Some(src) = self.sources.first() else { return false };
        let Some(Stored::Remote(object)) = src.data_versions.get(c.file) else { return false };
        self.remote.as_deref().is_some_and(|r| !r.chunks.contains(object, c.start, c.end))
    }

    /// For a chunk whose bytes are in object storage: fetches them into the chunk-range cache
    /// now (the daemon's reader stage does this ahead of the parsers, several at a time), and
    /// says whether they had to be fetched. `None` for a chunk of a local file.
    #[must_use]
    pub fn prefetch_object_range(&self, chunk: usize) -> Option<Result<bool>> {
        let c = self.chunks.get(chunk)?;
        let src = self.sources.first()?;
        let Stored::Remote(object) = src.data_versions.get(c.file)? else { return None };
        let name = &src.files[c.file];
        Some(remote::require(self.remote.as_deref(), name).and_then(|r| {
            if r.chunks.contains(object, c.start, c.end) {
                return Ok(false);
            }
            r.chunks.fetch(r.store.as_ref(), object, c.start, c.end).map(|_| true)
        }))
    }

    /// The sequences of chunk `chunk` in source `si`, in timeline order, with their places: in
    /// a dataset of one source, read from its index in order (each in constant time).
    fn chunk_sequences(&self, chunk: usize, si: usize) -> Box<dyn Iterator<Item = (SeqLoc, SequenceDesc)> + '_> {
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
    fn decode_records<D: RecordDecoder, T: DeepxElement>(
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
            usize::try_from(self.max_parsed_chunk_bytes / std::mem::size_of::<T>() as u64).unwrap_or(usize::MAX);
        let within = |out: &D::Buffers<T>, at: &RecordAt<'_>| {
            if d.dense_values(out) <= max_values {
                return Ok(());
            }
            Err(DataError::Fatal {
                at: crate::format::Location { file: at.file.clone(), line: at.line + 1, offset: at.offset },
                message: format!(
                    "the chunk's dense values pass {max_values}, its share of the memory limit \
                     (daemon.memory_limit_bytes); lower chunk_size_bytes or raise the limit"
                ),
            })
        };
        let mut out = d.buffers::<T>(chunk_bytes, count);
        let mut window = Self::window(src, self.remote.as_deref(), desc.file, desc.start, desc.end)?;
        if !src.indexes[desc.file].sequences.sizes_follow_lines() {
            for (loc, seq) in self.chunk_sequences(chunk, si) {
                let at = RecordAt { file: &src.files[loc.file as usize], line: seq.line, offset: seq.offset };
                d.decode(window.bytes(seq.offset, seq.size)?, &at, &mut out, errors);
                within(&out, &at)?;
            }
            return Ok(d.finish(out));
        }
        // Its sequences are the chunk's lines, in order, one each: sequence `i` of the file is
        // its line `i`.
        let file = &src.files[desc.file];
        let mut offset = desc.start;
        for line in desc.first_seq as u64..(desc.first_seq + count) as u64 {
            let bytes = window.line(offset)?;
            let at = RecordAt { file, line, offset };
            offset += bytes.len() as u64;
            d.decode(bytes, &at, &mut out, errors);
            within(&out, &at)?;
        }
        if offset != desc.end {
            let what = format!(
                "chunk {chunk}'s {count} lines end at byte {offset}, the chunk at {}: the file holds other lines than \
                 its index says (changed since it was indexed?)",
                desc.end
            );
            return Err(DataError::io(file, std::io::Error::new(std::io::ErrorKind::InvalidData, what)));
        }
        Ok(d.finish(out))
    }

    /// Decodes chunk `chunk`; the errors come back by source (`[s]`: source `s`'s, in order).
    fn decode_chunk<T: DeepxElement>(&self, chunk: usize) -> Result<(ParsedChunk, Vec<Vec<Malformed>>)> {
        let desc = self.chunks.get(chunk).ok_or_else(|| DataError::Dataset(format!("no chunk {chunk}")))?;
        let seqs = self.timeline.chunk_start[chunk]..self.timeline.chunk_start[chunk + 1];
        let mut by_source: Vec<Vec<Malformed>> = Vec::with_capacity(self.sources.len());
        let mut streams = Vec::new();
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
                usize::try_from(self.max_parsed_chunk_bytes / std::mem::size_of::<T>() as u64).unwrap_or(usize::MAX);
            for (i, buf) in bufs.iter_mut().enumerate() {
                buf.seq_offsets.reserve(seqs.len());
                if let Some(dim) = decoder.dense_dim(i) {
                    buf.values.reserve(seqs.len().saturating_mul(dim).min(max_values));
                    minibatchd_sys::advise_huge_pages(&buf.values);
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
                for (_, seq) in self.chunk_sequences(chunk, 0) {
                    let seq = &seq;
                    let slice = window.bytes(seq.offset, seq.size)?;
                    decoder
                        .decode_sequence(slice, &SeqContext { file: path, seq }, &mut bufs, &mut errors)
                        .and_then(|()| within(&mut bufs, path, seq))
                        .map_err(|e| self.fatal_after(e, &by_source, &errors))?;
                }
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
                        .map_err(|e| self.fatal_after(e, &by_source, &errors))?;
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
        Ok((ParsedChunk { chunk, num_sequences: seqs.len(), streams }, by_source))
    }
}

/// Indexes `input` with `reader`: its bytes at `data` (the input itself, or a decompressed copy)
/// through the index cache in `cache`, or, for an object, through object storage's shared index;
/// `stored` becomes the version indexed.
///
/// # Errors
/// The reader's, the file changing while it is read, and object storage's.
#[allow(clippy::too_many_arguments)]
fn index_input(
    reader: &dyn RecordReader,
    input: &Input,
    data: &Path,
    stored: &mut Stored,
    cache: Option<&Path>,
    remote: Option<&Remote>,
    left: IndexLimits,
    threads: usize,
    report: &mut dyn FnMut(u64),
) -> Result<FileIndex> {
    let name: Arc<Path> = Arc::from(input.name.as_path());
    let fingerprint = reader.fingerprint();
    match &*stored {
        Stored::Remote(object) => {
            let r = remote::require(remote, &input.name)?;
            let left = left.for_shared_index();
            let built = remote::index_object(r, object, &fingerprint, cache, left.max_sequences, report, &mut |p| {
                let mut stream = r.chunks.tee(object, r.store.open(object).map_err(remote::RemoteError::into_data)?);
                reader.index_stream(&mut stream, name.clone(), object.size, left, p)
            })?;
            Ok(built.0)
        }
        Stored::Local(_) => {
            let (idx, version) =
                index_with_cache(&name, data, &fingerprint, cache, left.max_sequences, report, &mut |p| {
                    reader.index_file(data, name.clone(), left, threads, p)
                })?;
            *stored = Stored::Local(version);
            Ok(idx)
        }
    }
}

/// Where each input's bytes are read: the file or object itself, or — for a gzip input — a copy
/// decompressed once into `state_dir` ([`inflate`]), with the version of what is read.
fn readable_inputs(
    inputs: &[Input],
    config: &DatasetConfig,
    reader: &dyn RecordReader,
    state_dir: &Path,
    remote: Option<&Remote>,
) -> Result<(Vec<PathBuf>, Vec<Stored>)> {
    let mut data: Vec<PathBuf> = Vec::with_capacity(inputs.len());
    let mut versions = Vec::with_capacity(inputs.len());
    for input in inputs {
        let compression = match config.compression {
            // A file the format's reader recognises as plain data, whatever its first bytes.
            Compression::Auto
                if reader.plain_head_bytes() > 0 && reader.plain_head(&head_of(input, reader, remote)?) =>
            {
                Compression::None
            }
            other => other,
        };
        let copy = match &input.object {
            None => Some(inflate::readable_path_as(&input.name, compression, state_dir, &config.inflate)?)
                .filter(|c| *c != input.name),
            Some(object) => remote::inflated_object(
                object,
                remote::require(remote, &input.name)?,
                compression,
                state_dir,
                &config.inflate,
            )?,
        };
        if let Some(copy) = copy {
            versions.push(Stored::Local(version_of(&copy)?));
            data.push(copy);
        } else {
            versions.push(Stored::of(input)?);
            data.push(input.name.clone());
        }
    }
    Ok((data, versions))
}

/// The first [`RecordReader::plain_head_bytes`] bytes of `input` (fewer in a shorter file).
///
/// # Errors
/// I/O and object-storage errors reading its first bytes.
fn head_of(input: &Input, reader: &dyn RecordReader, remote: Option<&Remote>) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let n = reader.plain_head_bytes();
    let mut head = Vec::with_capacity(n);
    match &input.object {
        None => {
            let f = minibatchd_sys::files::open_regular(&input.name).map_err(|e| DataError::io(&input.name, e))?;
            f.take(n as u64).read_to_end(&mut head).map_err(|e| DataError::io(&input.name, e))?;
        }
        Some(object) => {
            let r = remote::require(remote, &input.name)?;
            r.store
                .read_range(object, 0, object.size.min(n as u64), &mut head)
                .map_err(crate::remote::RemoteError::into_data)?;
        }
    }
    Ok(head)
}

/// The bytes the index pass reads from `data` (a decompressed copy's, not its `.gz`'s), for
/// progress.
fn readable_bytes(data: &[PathBuf], versions: &[Stored]) -> u64 {
    data.iter()
        .zip(versions)
        .map(|(d, v)| match v {
            Stored::Remote(o) => o.size,
            Stored::Local(_) => std::fs::metadata(d).map_or(0, |m| m.len()),
        })
        .sum()
}

/// What the index of a file costs the dataset ([`index_cost`]), or an error naming the file when
/// that passes what `left` leaves: an index read from its cache file (made under a larger limit,
/// perhaps) is checked here, one built now was checked sequence by sequence as it grew.
fn within_index_budget(idx: &FileIndex, left: &IndexLimits) -> Result<u64> {
    let cost = index_cost(&idx.sequences, left);
    if cost > left.max_index_bytes {
        return Err(DataError::Dataset(format!(
            "{}: its index holds {cost} bytes ({} sequences), more than the {} bytes the memory limit leaves it \
             (daemon.memory_limit_bytes / {INDEX_SHARE_OF_MEMORY_LIMIT} for the indexes of all datasets); raise \
             daemon.memory_limit_bytes",
            idx.path.display(),
            idx.sequences.len(),
            left.max_index_bytes
        )));
    }
    Ok(cost)
}

/// An input's size now (an object's as listed), for progress.
fn input_size(input: &Input) -> u64 {
    input.object.as_ref().map_or_else(|| std::fs::metadata(&input.name).map_or(0, |m| m.len()), |o| o.size)
}
