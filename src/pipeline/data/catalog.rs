//! The datasets the daemon serves, opened (indexed) at start and again by a configuration reload,
//! shared by every stage: the readahead stage and parsers look chunks up here, sessions their timeline and
//! stream schema.
//!
//! A catalog's datasets are fixed; a reload builds a new catalog with [`Catalog::reopen`] and the daemon swaps it in.
//! A dataset whose configuration is unchanged keeps its runtime (same `Arc`: its sessions and
//! cached chunks are untouched); an added or changed one is opened anew under a fresh catalog index.
//! Indices are never reused: the new catalog keeps weak references to every runtime of the old one,
//! so a session still reading a replaced or removed version finds its chunks until it ends, and
//! the version is freed with its last session.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use crate::config::{Config, DatasetConfig, Precision};
use crate::metrics::{DatasetMetrics, Metrics};
use minibatchd_client::protocol::StreamInfo;
use minibatchd_engine::dataset::{Dataset, Reserve};
use minibatchd_engine::format::chunk::StreamKind;
use minibatchd_engine::format::errors::DataError;
use minibatchd_engine::format::parsed_cache::ParsedCache;
use minibatchd_engine::options::{FeatureLength, FeatureType, IndexLimits, RecordOptions};
use minibatchd_engine::remote::Remote;
use minibatchd_sys::HugePages;

use super::indexing::Indexing;

/// Why a session cannot have a dataset.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CatalogError {
    /// The dataset is configured but failed to open (its error, with place and kind).
    #[error("dataset '{name}' failed to open: {source}")]
    Failed {
        /// The dataset.
        name: String,
        /// Why.
        source: DataError,
    },
    /// The dataset is being opened (indexed): retry later. Clients wait on this code.
    #[error("dataset '{name}' is still being indexed ({progress}); retry shortly")]
    Indexing {
        /// The dataset.
        name: String,
        /// How far its index pass is.
        progress: super::indexing::Progress,
    },
    /// No dataset of that name is configured. The message does not list the configured names:
    /// it goes to any client of the socket, and dataset names are the operator's business (the
    /// daemon's log has them); it says where a user finds them.
    #[error(
        "no dataset '{name}' is configured (the daemon does not list its datasets to clients: they are the \
         [datasets.NAME] tables of its config, which `minibatchd validate --config FILE` names, and its log \
         lists them with this refusal)"
    )]
    Unknown {
        /// The name asked for.
        name: String,
        /// The configured names.
        known: Vec<String>,
    },
}

/// An opened dataset and what sessions need to know about it.
#[derive(Debug)]
pub struct DatasetRuntime {
    /// Index in the catalog (the first half of a chunk key).
    pub index: u32,
    /// Configured name.
    pub name: String,
    /// The dataset.
    pub dataset: Dataset,
    /// Stream names, in tensor order.
    pub names: Vec<String>,
    /// Stream dimensions.
    pub dims: Vec<usize>,
    /// Kind, dimension and precision per stream (the tensor table of every minibatch).
    pub shapes: Vec<minibatchd_engine::minibatch::StreamShape>,
    /// Schema sent in `opened`.
    pub streams: Vec<StreamInfo>,
    /// [`Dataset::identity`], computed once.
    pub identity: u64,
    /// [`Dataset::legacy_identity`]: what states written before file contents counted carry.
    pub legacy_identity: u64,
    /// [`Dataset::decode_digest`], computed once (a session's state carries it).
    pub decode_digest: u64,
    /// Longest sequence, in nominal samples (bounds a minibatch's samples).
    pub max_seq_len: u64,
    /// Bytes per value.
    pub value_bytes: u64,
    /// Of a whole-file dataset, `[k]`: the bytes of its `k` largest files together, computed at
    /// the first `open` that asks ([`DatasetRuntime::slot_bound`]).
    largest_files: std::sync::OnceLock<Vec<u64>>,
    /// Reader and parser counters of this dataset.
    pub metrics: DatasetMetrics,
    /// Why the last reload could not open a new version of it (its files changed), while this
    /// version goes on serving: said to a session refused on the changed files, which would
    /// otherwise be told to send the SIGHUP that just failed.
    pub reopen_failure: std::sync::Mutex<Option<String>>,
}

impl DatasetRuntime {
    /// Counts chunk `chunk` parsed from its text: a parse, and its bytes read.
    pub fn count_parse(&self, chunk: usize) {
        self.metrics.chunks_parsed.inc();
        if let Some((_, start, end)) = self.dataset.chunk_byte_range(chunk) {
            self.metrics.read_bytes.inc_by(end.saturating_sub(start));
        }
    }

    /// Where `chunk` goes once in the chunk cache (`SharedCache::insert`): to the persister,
    /// unless the dataset has no parsed cache or the chunk was read back from it (mapped).
    pub fn persist_target(
        self: &Arc<Self>,
        chunk: &minibatchd_engine::format::chunk::ParsedChunk,
    ) -> Option<Weak<Self>> {
        (self.dataset.parsed_cache().is_some() && !chunk.is_mapped()).then(|| Arc::downgrade(self))
    }

    fn new(index: u32, dataset: Dataset, metrics: DatasetMetrics) -> Self {
        let (dtype, value_bytes) = match dataset.config().precision {
            Precision::Float32 => ("float32", 4),
            Precision::Float64 => ("float64", 8),
        };
        // The dataset's own stream list covers every format (CTF streams, deepx tensors).
        let streams = dataset
            .streams()
            .iter()
            .map(|s| StreamInfo {
                name: s.name.clone(),
                kind: s.kind.as_str().into(),
                dim: s.dim as u64,
                dtype: dtype.into(),
            })
            .collect();
        Self {
            index,
            name: dataset.config().name.clone(),
            names: dataset.streams().iter().map(|s| s.name.clone()).collect(),
            dims: dataset.streams().iter().map(|s| s.dim).collect(),
            shapes: dataset.stream_shapes(),
            streams,
            identity: dataset.identity(),
            legacy_identity: dataset.legacy_identity(),
            decode_digest: dataset.decode_digest(),
            max_seq_len: u64::from(dataset.timeline().seq_len.max().max(1)),
            value_bytes,
            largest_files: std::sync::OnceLock::new(),
            dataset,
            metrics,
            reopen_failure: std::sync::Mutex::new(None),
        }
    }

    /// A slot size that holds any minibatch of `local_samples` samples as far as the index and
    /// the configuration can tell: dense streams in full; for a sparse stream its per-sample
    /// offsets and one entry per sample (so a one-hot label fits); for a string stream its rows
    /// (one a sample; a `csv` stream's columns, a fixed-length `tfrecord` bytes feature's `dim`)
    /// of one byte; a `whole_file` dataset's largest files and longest names in full. Samples
    /// with more entries or longer strings, and the rows that streams beside a `defines_mb_size`
    /// stream have past its count, have no bound before they are parsed: such a minibatch fails
    /// with `minibatch_too_large` (nothing taken; reopen with a larger `slot_size_bytes` and
    /// resume).
    #[must_use]
    pub fn slot_bound(&self, local_samples: u64) -> u64 {
        let samples = local_samples.max(self.max_seq_len);
        let mut bytes = 4096u64; // the slot's header and the table's alignment
        for (s, &dim) in self.dataset.streams().iter().zip(&self.dims) {
            let (tensors, per_sample) = match s.kind {
                StreamKind::Dense => (2, (dim as u64).saturating_mul(self.value_bytes)),
                // Sample offsets, then one index and one value.
                StreamKind::SparseI32 => (4, 8 + 4 + self.value_bytes),
                StreamKind::SparseU64 => (4, 8 + 8 + self.value_bytes),
                // Each row's string offset and one byte, but a whole file's contents and path
                // in full (below).
                StreamKind::Strings => (3, self.string_rows(&s.name) * (8 + 1)),
            };
            bytes = bytes.saturating_add(self.whole_file_bytes(&s.name, samples));
            // Each tensor's table entry (64 bytes) and name (`stream/field`, the longest field
            // `sequence_offsets`), its sequence offsets, and each array rounded up to 64 bytes.
            let table = tensors * (64 + s.name.len() as u64 + 17);
            let offsets = (samples + 1).saturating_mul(8) + 8;
            bytes = bytes.saturating_add(table + tensors * 64 + offsets + samples.saturating_mul(per_sample));
        }
        bytes
    }

    /// Of a whole-file dataset's stream `name`, the bytes that `samples` samples can hold at most:
    /// the `samples` largest files' contents, or as many of the longest file name.
    fn whole_file_bytes(&self, name: &str, samples: u64) -> u64 {
        if !matches!(self.dataset.config().records, Some(RecordOptions::WholeFile)) {
            return 0;
        }
        if name != minibatchd_engine::format::whole_file::STREAMS[0] {
            return samples.saturating_mul(self.dataset.longest_file_name());
        }
        let largest = self.largest_files.get_or_init(|| {
            let mut sizes: Vec<u64> = self.dataset.chunk_bytes().collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            let mut sum = 0u64;
            std::iter::once(0)
                .chain(sizes.into_iter().map(|s| {
                    sum = sum.saturating_add(s);
                    sum
                }))
                .collect()
        });
        let k = usize::try_from(samples).unwrap_or(usize::MAX).min(largest.len().saturating_sub(1));
        largest.get(k).copied().unwrap_or(0)
    }

    /// The rows (strings) a sample of string stream `name` holds at least, as configured.
    fn string_rows(&self, name: &str) -> u64 {
        let at_least_one = |n: usize| (n as u64).max(1);
        match &self.dataset.config().records {
            Some(RecordOptions::Csv(c)) => {
                c.streams.iter().find(|s| s.name == name).map_or(1, |s| at_least_one(s.columns.len()))
            }
            // A var-length feature's `dim` is only its most: sized for it, a generous `dim` would
            // reserve rings that refuse other sessions, so it counts as one string (as a
            // var-length number feature counts as one entry).
            Some(RecordOptions::TfRecord(features)) => match features.iter().find(|f| f.stream == name) {
                Some(f) if f.dtype == FeatureType::Bytes && matches!(f.length, FeatureLength::Fixed { .. }) => {
                    at_least_one(f.dim)
                }
                _ => 1,
            },
            _ => 1,
        }
    }
}

/// What a reload did to the datasets.
#[derive(Debug, Clone, Default)]
pub struct CatalogChanges {
    /// Newly configured datasets (opened, or failed: see `failed`).
    pub added: Vec<String>,
    /// Datasets no longer configured.
    pub removed: Vec<String>,
    /// Datasets whose configuration changed and that opened anew.
    pub changed: Vec<String>,
    /// Changed datasets whose new version failed to open: the old version goes on serving.
    pub kept_old: Vec<String>,
    /// Datasets that failed to open (name, the data error with its place and kind).
    pub failed: Vec<(String, DataError)>,
}

/// How the datasets of two configurations relate (plain logic for a reload).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatasetDiff {
    /// Only in the new configuration.
    pub added: Vec<String>,
    /// Only in the old one.
    pub removed: Vec<String>,
    /// In both, configured differently.
    pub changed: Vec<String>,
    /// In both, configured the same.
    pub unchanged: Vec<String>,
}

/// Compares the dataset tables of two configurations.
#[must_use]
pub fn diff(old: &BTreeMap<String, DatasetConfig>, new: &BTreeMap<String, DatasetConfig>) -> DatasetDiff {
    let mut d = DatasetDiff::default();
    for (name, cfg) in new {
        match old.get(name) {
            None => d.added.push(name.clone()),
            Some(o) if o == cfg => d.unchanged.push(name.clone()),
            Some(_) => d.changed.push(name.clone()),
        }
    }
    d.removed = old.keys().filter(|k| !new.contains_key(*k)).cloned().collect();
    d
}

/// All configured datasets by name; the ones that failed to open keep their error.
#[derive(Debug, Default)]
pub struct Catalog {
    by_name: BTreeMap<String, Result<Arc<DatasetRuntime>, DataError>>,
    by_index: Vec<Weak<DatasetRuntime>>,
    /// The configurations the datasets were opened with (failed ones included).
    configs: BTreeMap<String, DatasetConfig>,
    /// The parsed cache, opened when the first dataset opens and handed on by
    /// every reload (its directory and bound change with a restart); `None` inside when
    /// `parsed_cache_bytes` is 0 or it could not be opened.
    parsed: Arc<std::sync::OnceLock<Option<Arc<ParsedCache>>>>,
    /// Object storage, set up by the first configuration that reads objects (at start or at a
    /// reload; `crate::objects::ensure`) and handed on by every reload.
    remote: Arc<std::sync::OnceLock<Arc<Remote>>>,
    /// `[daemon] huge_pages`, shared with every dataset, the parsed cache and the persister,
    /// and handed on by every reload, which sets it.
    huge: HugePages,
    /// The decompressed copies (`state_dir/inflated/`) that datasets of this process opened,
    /// handed on by every reload: the tidy removes them past `max_inflated_bytes` once no dataset
    /// reads them (found by a probe: a copy of a dataset dropped by a reload before any tidy ran
    /// was taken for another process's and kept for a day, 8.8 MB past a 5 MB bound).
    copies: Arc<std::sync::Mutex<std::collections::HashSet<std::path::PathBuf>>>,
    /// What the index passes of this reopening count the chunks they parse against (the chunk
    /// cache, [`super::DataPlane::parse_ahead_reserve`]; [`Dataset::open_reserving`]): kept only
    /// while it has room for them, as if they were in it; `None`: nothing is parsed in a pass.
    parse_ahead: Option<SharedReserve>,
}

/// [`Reserve`] shared by the index passes of one reopening.
#[derive(Clone)]
pub struct SharedReserve(pub Arc<dyn Fn(u64) -> Option<Box<dyn std::any::Any + Send + Sync>> + Send + Sync>);

impl std::fmt::Debug for SharedReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedReserve")
    }
}

impl Catalog {
    /// Opens every dataset of `config` (indexing through the cache in `state_dir`). A dataset
    /// that fails is logged and refused to clients; the others are served.
    #[must_use]
    pub fn open(config: &Config, metrics: &Metrics) -> Self {
        let catalog = Self::default();
        catalog.huge.set(config.daemon.huge_pages);
        catalog.reopen(config, metrics, &Indexing::default(), None).0
    }

    /// Where object storage is kept once set up (`crate::objects::ensure` fills it).
    #[must_use]
    pub fn remote_cell(&self) -> &std::sync::OnceLock<Arc<Remote>> {
        &self.remote
    }

    /// `[daemon] huge_pages` as the datasets, the parsed cache and the persister follow it
    /// (one setting: [`HugePages::set`] reaches them all).
    #[must_use]
    pub fn huge_pages(&self) -> &HugePages {
        &self.huge
    }

    /// Raises every open dataset's bound on a parsed chunk (the current versions, and the replaced
    /// ones sessions still read) to that of `memory_limit`
    /// ([`minibatchd_engine::dataset::Dataset::set_memory_limit`]): a reload's higher limit reaches
    /// the datasets it did not open again; a lower one, only the versions opened after it.
    pub fn set_memory_limit(&self, memory_limit: u64) {
        for rt in self.by_index.iter().filter_map(Weak::upgrade) {
            rt.dataset.set_memory_limit(memory_limit);
        }
    }

    /// The parsed cache the datasets use, if one is open.
    #[must_use]
    pub fn parsed_cache(&self) -> Option<&Arc<ParsedCache>> {
        self.parsed.get().and_then(Option::as_ref)
    }

    /// The decompressed copies that datasets of this process opened and that are still there.
    #[must_use]
    pub fn copies(&self) -> std::collections::HashSet<std::path::PathBuf> {
        let mut copies = self.copies.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        copies.retain(|p| p.exists());
        copies.clone()
    }

    /// Every file and object the open datasets read: the current ones, and the replaced versions
    /// that sessions still read.
    #[must_use]
    pub fn inputs(&self) -> std::collections::HashSet<std::path::PathBuf> {
        let mut inputs = std::collections::HashSet::new();
        for rt in self.by_index.iter().filter_map(Weak::upgrade).chain(self.by_name.values().flatten().cloned()) {
            inputs.extend(rt.dataset.inputs().map(std::path::Path::to_path_buf));
        }
        with_canonical(inputs)
    }

    /// Opens dataset `name` into this catalog, within what `daemon.memory_limit_bytes` leaves to its
    /// index after the datasets already in this catalog, reporting its progress to `indexing`.
    fn open_one(
        &mut self,
        name: &str,
        d: &DatasetConfig,
        config: &Config,
        metrics: &Metrics,
        indexing: &Indexing,
    ) -> Result<Arc<DatasetRuntime>, DataError> {
        self.configs.insert(name.to_owned(), d.clone());
        let mut limits = IndexLimits::within(config.daemon.memory_limit_bytes, self.index_bytes(), d.sources.len());
        limits.parse_ahead_bytes = if self.parse_ahead.is_some() { u64::MAX } else { 0 };
        // The setting being applied: a reload sets it only once its datasets are open.
        limits.parse_ahead_huge_pages = config.daemon.huge_pages;
        indexing.begin(name, metrics);
        // Each chunk a pass keeps is counted in the cache until the cache takes it: sessions on the
        // other datasets fill it meanwhile (found by a probe: a reload's pass kept a whole room of
        // chunks beside a full cache, twice the budget).
        let reserve = self.parse_ahead.clone().map(|shared| -> Reserve { Box::new(move |bytes| (shared.0)(bytes)) });
        let remote = self.remote.get().cloned();
        let opened = Dataset::open_reserving(d, &config.daemon.state_dir, (limits, reserve), remote, &mut |p| {
            indexing.advance(name, p, metrics);
        })
        .map(|mut ds| {
            // `max_errors` counts per session, as per `dump` of the session's options.
            ds.charge_per_reader();
            ds.set_huge_pages(self.huge.clone());
            let parsed = self.parsed.get_or_init(|| crate::parsed_cache::open(&config.daemon, &self.huge));
            crate::parsed_cache::attach(&mut ds, parsed.as_ref(), minibatchd_engine::dataset::Persist::Later);
            ds
        });
        let elapsed = indexing.finish(name, opened.is_ok());
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        match opened {
            Ok(ds) => {
                let index = u32::try_from(self.by_index.len()).unwrap_or(u32::MAX);
                let rt = Arc::new(DatasetRuntime::new(index, ds, metrics.dataset(name)));
                let index_bytes = rt.dataset.index_bytes();
                metrics
                    .data
                    .dataset_index_memory_bytes
                    .with_label_values(&[name])
                    .set(i64::try_from(index_bytes).unwrap_or(i64::MAX));
                let parsed_in_pass = rt.dataset.parsed_ahead().len();
                tracing::info!(dataset = %name, sequences = rt.dataset.timeline().num_sequences(), chunks = rt.dataset.timeline().num_chunks(), parsed_in_pass, index_bytes, elapsed_ms, "dataset indexed");
                self.by_index.push(Arc::downgrade(&rt));
                let inflated = config.daemon.state_dir.join(minibatchd_engine::format::inflate::INFLATED_DIR);
                self.copies
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend(rt.dataset.inputs().filter(|p| p.starts_with(&inflated)).map(std::path::Path::to_path_buf));
                self.by_name.insert(name.to_owned(), Ok(rt.clone()));
                Ok(rt)
            }
            Err(e) => {
                tracing::error!(dataset = %name, error = %e, elapsed_ms, "cannot open dataset");
                self.by_name.insert(name.to_owned(), Err(e.clone()));
                Err(e)
            }
        }
    }

    /// The catalog for `config` after a reload: unchanged datasets carried over, added and changed
    /// ones opened (a changed one that fails keeps its old version), removed ones dropped (their
    /// open sessions keep the runtime alive until they end). Datasets that had failed are tried
    /// again, and datasets whose files changed are opened again as changed ones
    /// ([`Dataset::is_current`]). Blocking: indexing happens here.
    /// The index passes of line-based files parse their chunks too, keeping them while
    /// `parse_ahead` (the chunk cache) has room ([`IndexLimits::parse_ahead_bytes`]).
    #[must_use]
    pub fn reopen(
        &self,
        config: &Config,
        metrics: &Metrics,
        indexing: &Indexing,
        parse_ahead: Option<SharedReserve>,
    ) -> (Self, CatalogChanges) {
        let mut catalog = Self {
            by_name: BTreeMap::new(),
            by_index: self.by_index.clone(),
            configs: BTreeMap::new(),
            parsed: self.parsed.clone(),
            remote: self.remote.clone(),
            huge: self.huge.clone(),
            copies: self.copies.clone(),
            parse_ahead,
        };
        let d = diff(&self.configs, &config.datasets);
        let mut changes = CatalogChanges { removed: d.removed, ..CatalogChanges::default() };
        // `diff` took every name from `config.datasets`, so each lookup finds its entry.
        let configured = |names: Vec<String>| names.into_iter().filter_map(|n| config.datasets.get(&n).map(|c| (n, c)));
        // A dataset whose files changed (rewritten, replaced, or its patterns match others now)
        // is opened again like a changed one, its configuration unchanged.
        let mut to_reopen = d.changed;
        for (name, cfg) in configured(d.unchanged) {
            match self.by_name.get(&name) {
                Some(Ok(rt)) if !rt.dataset.is_current() => {
                    tracing::info!(dataset = %name, "its files changed since it was indexed; opening it again");
                    to_reopen.push(name);
                }
                Some(Ok(rt)) => {
                    catalog.by_name.insert(name.clone(), Ok(rt.clone()));
                    catalog.configs.insert(name, cfg.clone());
                }
                _ => {
                    if let Err(e) = catalog.open_one(&name, cfg, config, metrics, indexing) {
                        changes.failed.push((name, e));
                    }
                }
            }
        }
        for (name, cfg) in configured(d.added) {
            changes.added.push(name.clone());
            if let Err(e) = catalog.open_one(&name, cfg, config, metrics, indexing) {
                changes.failed.push((name, e));
            }
        }
        for (name, cfg) in configured(to_reopen) {
            match catalog.open_one(&name, cfg, config, metrics, indexing) {
                Ok(_) => changes.changed.push(name),
                Err(e) => {
                    if let Some(Ok(old)) = self.by_name.get(&name) {
                        catalog.by_name.insert(name.clone(), Ok(old.clone()));
                        if let Some(c) = self.configs.get(&name) {
                            catalog.configs.insert(name.clone(), c.clone());
                        }
                        changes.kept_old.push(name.clone());
                    }
                    changes.failed.push((name, e));
                }
            }
        }
        (catalog, changes)
    }

    /// The dataset `name`.
    ///
    /// # Errors
    /// [`CatalogError`] for an unknown dataset or one that failed to open.
    pub fn get(&self, name: &str) -> Result<Arc<DatasetRuntime>, CatalogError> {
        match self.by_name.get(name) {
            Some(Ok(d)) => Ok(d.clone()),
            Some(Err(e)) => Err(CatalogError::Failed { name: name.to_owned(), source: e.clone() }),
            None => Err(CatalogError::Unknown { name: name.to_owned(), known: self.by_name.keys().cloned().collect() }),
        }
    }

    /// Whether a dataset called `name` is configured (opened or not).
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The runtime with catalog index `index`, if it is still alive (current, or kept by a session).
    #[must_use]
    pub fn by_index(&self, index: u32) -> Option<Arc<DatasetRuntime>> {
        self.by_index.get(index as usize).and_then(Weak::upgrade)
    }

    /// Bytes the indexes of its open datasets hold (replaced versions still read by a session
    /// are not counted: they are freed with it).
    #[must_use]
    pub fn index_bytes(&self) -> u64 {
        self.by_name.values().filter_map(|r| r.as_ref().ok()).map(|rt| rt.dataset.index_bytes()).sum()
    }

    /// Notes on each dataset of this catalog why the reload that made it could not open its
    /// configuration (`changes.kept_old`: the version before serves on), or that nothing failed.
    /// Called once the reload is applied (found by a review: set while it was prepared, a
    /// reload then refused whole left the note on the version still in force).
    pub fn note_reopen_failures(&self, changes: &CatalogChanges) {
        for (name, rt) in self.by_name.iter().filter_map(|(n, r)| Some((n, r.as_ref().ok()?))) {
            let failure = changes
                .kept_old
                .contains(name)
                .then(|| changes.failed.iter().find(|(n, _)| n == name).map(|(_, e)| e.to_string()))
                .flatten();
            *rt.reopen_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = failure;
        }
    }

    /// The parse identities of the datasets in force ([`Dataset::parse_identity`]).
    #[must_use]
    pub fn parse_identities(&self) -> std::collections::HashSet<u64> {
        self.by_name.values().filter_map(|r| r.as_ref().ok()).map(|rt| rt.dataset.parse_identity()).collect()
    }

    /// Datasets (ready, failed).
    #[must_use]
    pub fn counts(&self) -> (usize, usize) {
        let ready = self.by_name.values().filter(|r| r.is_ok()).count();
        (ready, self.by_name.len() - ready)
    }
}

/// `paths` and, for each local one (not an object's URL), its canonical form: the index cache
/// records the canonical path of the file it indexed (`FileStamp::of`), a dataset the path as
/// configured or found (a symlinked directory, a `..`), and the tidy must see both as the same
/// input.
fn with_canonical(
    paths: std::collections::HashSet<std::path::PathBuf>,
) -> std::collections::HashSet<std::path::PathBuf> {
    let canonical: Vec<std::path::PathBuf> = paths
        .iter()
        .filter(|p| !minibatchd_engine::remote::is_remote(p))
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let mut all = paths;
    all.extend(canonical);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;
    use std::path::Path;

    fn config(dir: &Path, datasets: &[(&str, &str, u64)]) -> Config {
        let mut text = format!("[daemon]\nstate_dir = \"{}/state\"\n", dir.display());
        for (name, file, chunk) in datasets {
            let _ = write!(text, "[datasets.{name}]\nformat = \"ctf\"\nfiles = [\"{file}\"]\nchunk_size_bytes = {chunk}\n[datasets.{name}.streams.f]\ndim = 1\nformat = \"dense\"\n");
        }
        Config::from_toml_str(&text, dir).expect("config")
    }

    /// The tidy keeps the index caches of the files the open datasets read; a cache records the
    /// canonical path of its file, a dataset the path as configured.
    #[test]
    fn inputs_include_the_canonical_paths_the_index_caches_record() {
        use minibatchd_engine::format::index_cache::FileStamp;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("real")).expect("mkdir");
        std::fs::write(dir.path().join("real/a.ctf"), "|f 1\n|f 2\n").expect("write");
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("current")).expect("symlink");
        let metrics = Metrics::new().expect("metrics");
        let catalog = Catalog::open(&config(dir.path(), &[("a", "current/../current/a.ctf", 100)]), &metrics);
        assert_eq!(catalog.counts(), (1, 0));
        let recorded = FileStamp::of(&dir.path().join("current/a.ctf")).expect("stamp").path;
        assert!(recorded.ends_with("real/a.ctf"), "{}", recorded.display());
        let inputs = catalog.inputs();
        assert!(inputs.contains(&recorded), "{recorded:?} not in {inputs:?}");
    }

    #[test]
    fn a_reload_keeps_unchanged_datasets_and_never_reuses_an_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in ["a.ctf", "b.ctf", "c.ctf"] {
            std::fs::write(dir.path().join(f), "|f 1\n|f 2\n|f 3\n").expect("write");
        }
        let metrics = Metrics::new().expect("metrics");
        let catalog = Catalog::open(
            &config(dir.path(), &[("a", "a.ctf", 100), ("b", "b.ctf", 100), ("gone", "missing.ctf", 100)]),
            &metrics,
        );
        assert_eq!(catalog.counts(), (2, 1));
        let a = catalog.get("a").expect("a");
        let b = catalog.get("b").expect("b");
        std::fs::write(dir.path().join("missing.ctf"), "|f 4\n").expect("write");
        let new = config(
            dir.path(),
            &[("a", "a.ctf", 100), ("b", "b.ctf", 4), ("c", "c.ctf", 100), ("gone", "missing.ctf", 100)],
        );
        let (catalog2, changes) = catalog.reopen(&new, &metrics, &Indexing::default(), None);
        assert_eq!(changes.added, vec!["c".to_owned()]);
        assert_eq!(changes.changed, vec!["b".to_owned()]);
        assert!(changes.removed.is_empty() && changes.failed.is_empty(), "{changes:?}");
        assert!(Arc::ptr_eq(&a, &catalog2.get("a").expect("a")), "unchanged: the same runtime");
        let b2 = catalog2.get("b").expect("b");
        assert!(!Arc::ptr_eq(&b, &b2) && b2.index > b.index, "changed: a new runtime and index");
        assert!(catalog2.get("gone").is_ok(), "a failed dataset is tried again");
        assert!(Arc::ptr_eq(&catalog2.by_index(b.index).expect("the old version is alive while held"), &b));
        let only_a = config(dir.path(), &[("a", "a.ctf", 100)]);
        let (catalog3, changes) = catalog2.reopen(&only_a, &metrics, &Indexing::default(), None);
        assert_eq!(changes.removed.len(), 3);
        assert!(!catalog3.contains("b") && catalog3.get("b").is_err());
        drop((catalog, catalog2, b));
        assert!(catalog3.by_index(b2.index).is_some(), "held by a session");
        let idx = b2.index;
        drop(b2);
        assert!(catalog3.by_index(idx).is_none(), "freed with its last holder");
    }

    #[test]
    fn diff_classifies_datasets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = config(dir.path(), &[("a", "a.ctf", 1), ("b", "b.ctf", 1)]);
        let new = config(dir.path(), &[("b", "b.ctf", 2), ("c", "c.ctf", 1)]);
        let d = diff(&old.datasets, &new.datasets);
        assert_eq!(
            (d.added, d.removed, d.changed, d.unchanged.len()),
            (vec!["c".to_owned()], vec!["a".to_owned()], vec!["b".to_owned()], 0)
        );
    }
}
