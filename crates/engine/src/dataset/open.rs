//! Opening a dataset: its inputs resolved (globs, directories, `s3://` prefixes), compressed ones
//! decompressed once into `state_dir`, every input indexed through its format's reader (and the
//! index cache or object storage's shared index) within the index budget, and the sources
//! assembled — CTF's joined by sequence key.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ahead::{Ahead, FileAhead, Reserve};
use super::files::{index_with_cache, resolve_inputs, Input};
use super::read::version_of;
use super::{Dataset, IndexProgress, OpenSource, SourceDecoder, Stored};
use crate::format::chunk::{StreamKind, StreamSpec};
use crate::format::ctf::{CtfDecoder, CtfIndexOptions};
use crate::format::deepx::{DeepxDecoder, LineIndexOptions, Schema};
use crate::format::errors::DataError;
use crate::format::index::{build_chunks, index_cost, ChunkDesc, FileIndex};
use crate::format::inflate::{self, Compression};
use crate::format::line_chunks::{self, ParseAhead};
use crate::format::record::{CtfReader, LineReader, RecordReader};
use crate::format::registry::{self, RecordFormat};
use crate::options::{DatasetConfig, FormatKind, IndexLimits, StreamFormat, INDEX_SHARE_OF_MEMORY_LIMIT};
use crate::remote::{self, Remote};
use crate::Result;

impl Dataset {
    pub(super) fn open_ctf(
        config: &DatasetConfig,
        state_dir: &Path,
        (limits, reserve): (IndexLimits, Option<Reserve>),
        remote: Option<&Remote>,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        let main_source = config.sources.iter().position(|s| s.streams.iter().any(|st| st.defines_mb_size));
        let resolved: Vec<Vec<Input>> =
            config.sources.iter().map(|s| resolve_inputs(&s.files, remote)).collect::<Result<_, _>>()?;
        let bytes_total: u64 = resolved.iter().flatten().map(input_size).sum();
        let mut done = 0u64;
        // Indexes built and not written to the index cache ([`Dataset::uncached_indexes`]).
        let mut uncached = 0u64;
        let (mut sequences, mut index_bytes) = (0u64, 0u64);
        // A file of the dataset keeps a samples column, so the timeline keeps every length.
        let mut lengths_kept = false;
        let mut sources = Vec::new();
        let mut first_stream = 0;
        // A dataset of one source is chunked a file at a time, as each file is indexed: a file
        // whose sequences are its lines then lets go of their sizes, as a deepx file does.
        let one_source = config.sources.len() == 1;
        let mut chunks = Vec::new();
        // A dataset of one source in line mode is parsed in its index pass, within the room given.
        let ahead =
            (one_source && limits.parse_ahead_bytes > 0 && config.first_minibatch_needs_every_chunk(bytes_total))
                .then(|| Ahead::new(limits.parse_ahead_bytes, reserve));
        for (src, files) in config.sources.iter().zip(resolved) {
            let decoder = CtfDecoder::new(&src.streams);
            let shapes: Vec<(usize, bool)> =
                src.streams.iter().map(|s| (s.dim, s.format == StreamFormat::Sparse)).collect();
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
                let lines = one_source.then_some(config.chunk_size_bytes);
                let name: Arc<Path> = Arc::from(input.name.as_path());
                let file = FileAhead::new(ahead.as_ref(), indexes.len(), &name, &limits, config.precision);
                let parse = |_: usize, start: u64, end: u64| file.ctf(&decoder, &shapes, start, end);
                let parse = file.active().then_some(&parse as ParseAhead<'_>);
                let idx = index_input(
                    &reader,
                    &input,
                    f,
                    &mut stored,
                    cache,
                    remote,
                    left,
                    (config.index_threads, lines, parse),
                    (&mut report, &mut uncached),
                )?;
                // The file's end, which a pass need not report (found by a probe: the scanned
                // bytes stayed at 96.8 % of the total once a dataset was open).
                report(idx.size);
                versions.push(stored);
                let cost = within_index_budget(&idx, &left)?;
                let mut idx = idx;
                index_bytes +=
                    if one_source { chunk_by_lines(&mut idx, indexes.len(), config, &left, &mut chunks) } else { cost };
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
                decoder: SourceDecoder::Ctf(decoder),
                first_stream,
            });
            first_stream += src.streams.len();
        }
        let mut ds = Self::assemble(
            config,
            sources,
            one_source.then_some(chunks),
            main_source,
            Self::configured_streams(config),
        )?;
        ds.ahead = ahead.filter(|a| !a.is_empty());
        ds.uncached_indexes = uncached;
        Ok(ds)
    }

    /// How many of its files the open indexed and could not write to the index cache (a warning
    /// said why each time): `minibatchd index`, whose purpose the cache is, fails on them.
    #[must_use]
    pub fn uncached_indexes(&self) -> u64 {
        self.uncached_indexes
    }

    /// The streams a dataset of `config` has, without reading any data: a CTF dataset's configured
    /// streams, deepx's tensors, a record format's decoded streams. What [`Dataset::streams`]
    /// will be once it is open (a configuration check compares mixtures' sources with it).
    #[must_use]
    pub fn configured_streams(config: &DatasetConfig) -> Vec<StreamSpec> {
        match config.format {
            FormatKind::Ctf => config
                .streams()
                .map(|s| StreamSpec {
                    name: s.name.clone(),
                    kind: match s.format {
                        StreamFormat::Dense => StreamKind::Dense,
                        StreamFormat::Sparse => StreamKind::SparseI32,
                    },
                    dim: s.dim,
                })
                .collect(),
            FormatKind::Libsvm | FormatKind::LibsvmEx | FormatKind::Uch => {
                Schema::new(config.format, &config.deepx.clone().unwrap_or_default()).specs()
            }
            _ => config.records.as_ref().map(|o| registry::open(o).streams).unwrap_or_default(),
        }
    }

    /// A deepx dataset: one source, every line a sequence of one sample.
    pub(super) fn open_deepx(
        config: &DatasetConfig,
        state_dir: &Path,
        (limits, reserve): (IndexLimits, Option<Reserve>),
        remote: Option<&Remote>,
        progress: &mut dyn FnMut(IndexProgress),
    ) -> Result<Self> {
        let schema = Schema::new(config.format, &config.deepx.clone().unwrap_or_default());
        let patterns = config.sources.first().map(|s| s.files.as_slice()).unwrap_or_default();
        let inputs = resolve_inputs(patterns, remote)?;
        let reader = LineReader(LineIndexOptions { comments: schema.comments });
        let decoder = DeepxDecoder::new(schema.clone());
        let (data, mut data_versions, file_versions) = readable_inputs(&inputs, config, &reader, state_dir, remote)?;
        let bytes_total = readable_bytes(&data, &data_versions);
        let ahead = (limits.parse_ahead_bytes > 0 && config.first_minibatch_needs_every_chunk(bytes_total))
            .then(|| Ahead::new(limits.parse_ahead_bytes, reserve));
        let mut done = 0u64;
        let mut uncached = 0u64;
        let (mut sequences, mut index_bytes) = (0u64, 0u64);
        // A file of the dataset keeps a samples column, so the timeline keeps every length.
        let mut lengths_kept = false;
        let mut indexes: Vec<FileIndex> = Vec::new();
        let mut chunks = Vec::new();
        for ((input, d), stored) in inputs.iter().zip(&data).zip(data_versions.iter_mut()) {
            let base = done;
            let mut report = |b: u64| progress(IndexProgress { bytes_done: base + b, bytes_total });
            let left = limits.left_after(sequences, index_bytes, lengths_kept);
            let cache = config.cache_index.then_some(state_dir);
            let name: Arc<Path> = Arc::from(input.name.as_path());
            let file = FileAhead::new(ahead.as_ref(), indexes.len(), &name, &limits, config.precision);
            let parse = |_: usize, start: u64, end: u64| file.records(&decoder, start, end);
            let parse = file.active().then_some(&parse as ParseAhead<'_>);
            let threads = (config.index_threads, Some(config.chunk_size_bytes), parse);
            let idx =
                index_input(&reader, input, d, stored, cache, remote, left, threads, (&mut report, &mut uncached))?;
            report(idx.size);
            // The file's index whole must fit beside what the earlier files keep (its sizes are
            // held until it is chunked)...
            within_index_budget(&idx, &left)?;
            // ... and once chunked (chunks never cross files), a file whose sequences are its
            // lines keeps an offset every 64 of them: the next file's pass does not find every
            // earlier file's sizes still held.
            let mut idx = idx;
            index_bytes += chunk_by_lines(&mut idx, indexes.len(), config, &left, &mut chunks);
            done += idx.size;
            sequences += idx.sequences.len() as u64;
            lengths_kept |= idx.sequences.columns().samples;
            indexes.push(idx);
        }
        let streams = schema.specs();
        let source = OpenSource {
            files: inputs.iter().map(|f| Arc::from(f.name.as_path())).collect(),
            file_versions: as_indexed(file_versions, &data, &inputs, &data_versions),
            data: data.iter().map(|d| Arc::from(d.as_path())).collect(),
            data_versions,
            indexes,
            decoder: SourceDecoder::Deepx(decoder),
            first_stream: 0,
        };
        let mut ds = Self::assemble(config, vec![source], Some(chunks), None, streams)?;
        ds.ahead = ahead.filter(|a| !a.is_empty());
        ds.uncached_indexes = uncached;
        Ok(ds)
    }

    /// A dataset of one source whose files its format's reader splits into records that its
    /// decoder decodes (`crate::format::registry`; compressed inputs read from their copies).
    pub(super) fn open_records(
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
        let (data, mut data_versions, file_versions) = readable_inputs(&inputs, config, &*reader, state_dir, remote)?;
        let bytes_total = readable_bytes(&data, &data_versions);
        let (mut done, mut sequences, mut index_bytes) = (0u64, 0u64, 0u64);
        let mut uncached = 0u64;
        let mut lengths_kept = false;
        let mut indexes = Vec::new();
        for ((input, d), stored) in inputs.iter().zip(&data).zip(data_versions.iter_mut()) {
            let base = done;
            let mut report = |b: u64| progress(IndexProgress { bytes_done: base + b, bytes_total });
            let left = limits.left_after(sequences, index_bytes, lengths_kept);
            let cache = config.cache_index.then_some(state_dir);
            let threads = (config.index_threads, None, None);
            let idx =
                index_input(&*reader, input, d, stored, cache, remote, left, threads, (&mut report, &mut uncached))?;
            report(idx.size);
            index_bytes += within_index_budget(&idx, &left)?;
            done += idx.size;
            sequences += idx.sequences.len() as u64;
            lengths_kept |= idx.sequences.columns().samples;
            indexes.push(idx);
        }
        let source = OpenSource {
            files: inputs.iter().map(|f| Arc::from(f.name.as_path())).collect(),
            file_versions: as_indexed(file_versions, &data, &inputs, &data_versions),
            data: data.iter().map(|d| Arc::from(d.as_path())).collect(),
            data_versions,
            indexes,
            decoder: SourceDecoder::Records(decoder),
            first_stream: 0,
        };
        let mut ds = Self::assemble(config, vec![source], None, None, streams)?;
        ds.uncached_indexes = uncached;
        Ok(ds)
    }
}

/// Indexes `input` with `reader`: its bytes at `data` (the input itself, or a decompressed copy)
/// through the index cache in `cache`, or, for an object, through object storage's shared index;
/// `stored` becomes the version indexed, and `uncached` counts an index built and not written to
/// the cache ([`Dataset::uncached_indexes`]). `threads`: the threads the pass may use, and, for a file
/// chunked as it is indexed (a dataset of one source), its chunk size: a local file of one-line
/// sequences is then indexed by its chunks alone ([`line_chunks`]), and its cache is of them.
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
    (threads, chunked, parse): (usize, Option<u64>, Option<ParseAhead<'_>>),
    (report, uncached): (&mut dyn FnMut(u64), &mut u64),
) -> Result<FileIndex> {
    let name: Arc<Path> = Arc::from(input.name.as_path());
    let fingerprint = reader.fingerprint();
    let by_chunks = reader.line_kind().zip(chunked);
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
            // An index of chunks is of one chunk size: it keys the cache too.
            let fingerprint = match by_chunks {
                Some((_, size)) => fingerprint + &line_chunks::fingerprint_suffix(size),
                None => fingerprint,
            };
            let (idx, version, not_cached) =
                index_with_cache(&name, data, &fingerprint, cache, left.max_sequences, report, &mut |p| {
                    if let Some((kind, size)) = by_chunks {
                        if let Some(idx) = line_chunks::index_file(data, &name, kind, size, left, threads, p, parse)? {
                            return Ok(idx);
                        }
                    }
                    reader.index_file(data, name.clone(), left, threads, p)
                })?;
            *stored = Stored::Local(version);
            *uncached += u64::from(not_cached);
            Ok(idx)
        }
    }
}

/// Where each input's bytes are read: the file or object itself, or — for a gzip input — a copy
/// decompressed once into `state_dir` ([`inflate`]), with the version of what is read; and the
/// version of each input, taken before anything of it is read (an input replaced while it is
/// decompressed then no longer matches it: the dataset is not current, and no session is opened
/// on it, rather than the copy of the old content passing for the new).
#[allow(clippy::type_complexity)] // three columns, one entry per input
fn readable_inputs(
    inputs: &[Input],
    config: &DatasetConfig,
    reader: &dyn RecordReader,
    state_dir: &Path,
    remote: Option<&Remote>,
) -> Result<(Vec<PathBuf>, Vec<Stored>, Vec<Stored>)> {
    let mut data: Vec<PathBuf> = Vec::with_capacity(inputs.len());
    let mut versions = Vec::with_capacity(inputs.len());
    let mut originals = Vec::with_capacity(inputs.len());
    for input in inputs {
        originals.push(Stored::of(input)?);
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
    Ok((data, versions, originals))
}

/// The version of each input as its index describes it: a plain file's is the one its index pass
/// read (taken again after the wait for a young file to settle, `files::index_with_cache`: a
/// change in that wait left the dataset "not current" for a reload though it was indexed as it
/// is), a `.gz` input's the one taken before its copy was made.
fn as_indexed(originals: Vec<Stored>, data: &[PathBuf], inputs: &[Input], indexed: &[Stored]) -> Vec<Stored> {
    let plain = data.iter().zip(inputs).map(|(d, input)| *d == input.name);
    originals.into_iter().zip(plain).zip(indexed).map(|((o, plain), i)| if plain { i.clone() } else { o }).collect()
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

/// Chunks file `file` of a dataset of one source (`idx`, its index; chunks never cross files)
/// into `chunks`, then lets go of its sequences' sizes where its sequences are its lines
/// ([`crate::format::index::Sequences::let_go_of_line_sizes`]; a chunk's decode then finds them
/// in its bytes). Returns what the index keeps then ([`index_cost`]).
fn chunk_by_lines(
    idx: &mut FileIndex,
    file: usize,
    config: &DatasetConfig,
    left: &IndexLimits,
    chunks: &mut Vec<ChunkDesc>,
) -> u64 {
    match idx.sequences.line_chunks() {
        // Indexed by its chunks, for this chunk size (the cache's key holds it).
        Some(lc) => {
            let (mut start, mut first_seq) = (lc.first_offset, 0usize);
            for &(end, lines) in &lc.chunks {
                let num_seqs = usize::try_from(lines).unwrap_or(usize::MAX);
                chunks.push(ChunkDesc { file, start, end, first_seq, num_seqs, num_samples: lines });
                (start, first_seq) = (end, first_seq.saturating_add(num_seqs));
            }
        }
        None => chunks.extend(
            build_chunks(std::slice::from_ref(idx), config.chunk_size_bytes)
                .into_iter()
                .map(|c| ChunkDesc { file, ..c }),
        ),
    }
    idx.sequences.let_go_of_line_sizes();
    idx.sequences.shrink_to_fit();
    index_cost(&idx.sequences, left)
}

/// An input's size now (an object's as listed), for progress.
fn input_size(input: &Input) -> u64 {
    input.object.as_ref().map_or_else(|| std::fs::metadata(&input.name).map_or(0, |m| m.len()), |o| o.size)
}
