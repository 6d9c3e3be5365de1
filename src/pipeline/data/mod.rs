//! The data plane: chunks requested by the sessions' producers are read, parsed on the pool and
//! kept in the shared cache, from which each producer gathers its minibatches into its ring.
//!
//! ```text
//!  producer pool ──requests─────► readahead ─to_parse► parsers (SyncArbiter) ──parsed──► cache stage
//!  (misses, prefetch)   (bounded)  (fadvise)    (bounded)  (Dataset::load_chunk)  (bounded)  (SharedCache)
//!        ▲                                                                                     │
//!        └──────────────────────────── Arc<ParsedChunk> (condvar wake-up) ◄───────────────────┘
//! ```
//!
//! Plain logic: [`chunk_cache`] (the budgeted LRU and its waiters), [`catalog`] (the datasets in force),
//! [`producer`] (a session's loop over the engine's `Feeder`). Thin actors: [`readahead`],
//! [`parsers`], [`chunk_cache_stage`], [`delivery`] (the producer pool, [`pool`]); [`preload`] warms the cache.
//!
//! [`DataPlane`] is what they share. It also carries the daemon-wide services every plane reports
//! to — the metrics registry and the stages' health — so the data plane imports nothing of the
//! control plane or of operations.

pub mod catalog;
pub mod chunk_cache;
pub mod chunk_cache_stage;
pub mod delivery;
pub mod indexing;
pub mod mixing;
pub mod parsers;
pub mod persister;
pub mod pool;
pub mod preload;
pub mod producer;
pub mod readahead;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

use crate::config::Config;
use crate::metrics::Metrics;

use super::lifecycle::Health;
use catalog::{Catalog, CatalogError, DatasetRuntime};
use chunk_cache::{ChunkRequest, ParsedMsg, SharedCache};
use indexing::Indexing;

/// The data-plane channels, created once and owned for the daemon's lifetime, so that a
/// restarted stage reattaches to the same queues. Every one is bounded.
#[derive(Debug)]
pub struct Channels {
    /// Producers → readahead: chunk requests (`read_queue_chunks`).
    pub requests: (flume::Sender<ChunkRequest>, flume::Receiver<ChunkRequest>),
    /// Readahead → parser pool (`read_queue_chunks`).
    pub to_parse: (flume::Sender<ChunkRequest>, flume::Receiver<ChunkRequest>),
    /// Parser pool → cache stage (`parsed_queue_chunks`).
    pub parsed: (flume::Sender<ParsedMsg>, flume::Receiver<ParsedMsg>),
}

impl Channels {
    /// The channels with the capacities of `[daemon]`.
    #[must_use]
    pub fn new(read_queue_chunks: usize, parsed_queue_chunks: usize) -> Self {
        Self {
            requests: flume::bounded(read_queue_chunks),
            to_parse: flume::bounded(read_queue_chunks),
            parsed: flume::bounded(parsed_queue_chunks),
        }
    }
}

/// What the data plane's stages share.
#[derive(Debug)]
pub struct DataPlane {
    catalog: RwLock<Arc<Catalog>>,
    catalog_generation: tokio::sync::watch::Sender<u64>,
    /// The chunk cache.
    pub cache: Arc<SharedCache>,
    /// Channels between the stages.
    pub channels: Channels,
    /// Parser threads.
    pub parser_threads: usize,
    /// Object chunk ranges the readahead stage fetches ahead of the parsers at once (`object_fetches`).
    pub object_fetches: usize,
    /// Every metric.
    pub metrics: Metrics,
    /// Phase and stage liveness.
    pub health: Health,
    /// Datasets being opened (indexed) now.
    pub indexing: Indexing,
    /// Set once the datasets configured at start have been opened (or failed to).
    pub opened_at_start: std::sync::atomic::AtomicBool,
    /// Catalog indices of the datasets whose preload has been started (each dataset version once).
    preloaded: Mutex<HashSet<u32>>,
    /// Parsed chunks to the persister ([`persister`]).
    pub persist: flume::Sender<chunk_cache::PersistJob>,
    /// The session producers working now: the persister writes at full speed while none is.
    pub demand: Arc<persister::Demand>,
}

impl DataPlane {
    /// The data plane over the opened `catalog`, its cache holding `cache_budget` bytes.
    #[must_use]
    pub fn new(config: &Config, catalog: Catalog, metrics: Metrics, parser_threads: usize, cache_budget: u64) -> Self {
        let d = &config.daemon;
        let channels = Channels::new(d.read_queue_chunks, d.parsed_queue_chunks);
        let (persist, jobs) = persister::channel();
        let cache = Arc::new(SharedCache::new(cache_budget, channels.requests.0.clone()).with_owner(persist.clone()));
        cache.set_budget_and_ceiling(cache_budget, cache_budget);
        let demand = Arc::new(persister::Demand::shown_by(metrics.data.sessions_wanting_data.clone()));
        persister::spawn(
            jobs,
            Arc::downgrade(&cache),
            demand.clone(),
            metrics.data.parsed_cache_deferred_seconds.clone(),
            catalog.huge_pages().clone(),
        );
        Self {
            catalog: RwLock::new(Arc::new(catalog)),
            catalog_generation: tokio::sync::watch::channel(0).0,
            cache,
            channels,
            parser_threads,
            object_fetches: d.objects.fetches,
            metrics,
            health: Health::default(),
            indexing: Indexing::default(),
            opened_at_start: std::sync::atomic::AtomicBool::new(false),
            preloaded: Mutex::new(HashSet::new()),
            persist,
            demand,
        }
    }

    /// What an index pass counts the chunks it parses against ([`catalog::SharedReserve`]): the
    /// chunk cache, charged within its budget (found by a probe: a reload's pass kept chunks
    /// nobody counted beside a cache that sessions filled, twice the budget).
    #[must_use]
    pub fn parse_ahead_reserve(&self) -> catalog::SharedReserve {
        let cache = self.cache.clone();
        catalog::SharedReserve(Arc::new(move |bytes| {
            cache.try_charge(bytes).map(|c| Box::new(c) as Box<dyn std::any::Any + Send + Sync>)
        }))
    }

    /// The datasets in force.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The dataset `name` for a new session: open, or why not — [`CatalogError::Indexing`] (with its
    /// progress) while it is being opened, even if an earlier attempt failed.
    ///
    /// # Errors
    /// [`CatalogError`].
    pub fn dataset(&self, name: &str) -> Result<Arc<DatasetRuntime>, CatalogError> {
        // The indexing table first: a reload puts the new catalog in force before it forgets the
        // dataset there, so reading them in this order never finds the dataset in neither.
        let progress = self.indexing.get(name);
        match self.catalog().get(name) {
            Ok(rt) => Ok(rt),
            Err(e) => match progress {
                Some(progress) => Err(CatalogError::Indexing { name: name.to_owned(), progress }),
                None => Err(e),
            },
        }
    }

    /// The runtime with catalog index `index` (current, or a replaced version a session still reads).
    #[must_use]
    pub fn runtime(&self, index: u32) -> Option<Arc<DatasetRuntime>> {
        self.catalog().by_index(index)
    }

    /// Swaps in the datasets of a reloaded configuration and tells the connections.
    pub fn replace_catalog(&self, catalog: Catalog) {
        *self.catalog.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(catalog);
        self.catalog_generation.send_modify(|g| *g += 1);
    }

    /// Notified after every [`DataPlane::replace_catalog`].
    #[must_use]
    pub fn catalog_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.catalog_generation.subscribe()
    }
}

/// The parser threads' parallelism: `parser_threads`, or one per core when 0.
#[must_use]
pub fn parser_threads(config: &Config) -> usize {
    per_core(config.daemon.parser_threads)
}

/// The producer pool's threads: `producer_threads`, or one per core when 0.
#[must_use]
pub fn producer_threads(config: &Config) -> usize {
    per_core(config.daemon.producer_threads)
}

fn per_core(n: usize) -> usize {
    match n {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    }
}

/// Memory the parser threads keep between chunks: each reuses one read buffer, a 256 KiB window
/// that grows to the longest sequence it has read; counted as `threads` × the largest chunk of
/// the open datasets, a bound that holds whatever the sequences.
#[must_use]
pub fn read_buffer_bytes(config: &Config, catalog: &Catalog, threads: usize) -> u64 {
    let largest = config
        .datasets
        .keys()
        .filter_map(|name| catalog.get(name).ok())
        .filter_map(|rt| rt.dataset.chunks().iter().map(|c| c.end.saturating_sub(c.start)).max())
        .max()
        .unwrap_or(0);
    // A thread keeps its buffer between chunks only up to `MAX_REUSED_READ_BUFFER`; a larger
    // one is freed after each chunk, so at most that much stays held per thread.
    largest.min(minibatchd_engine::dataset::MAX_REUSED_READ_BUFFER).saturating_mul(threads as u64)
}

/// Starts [`preload`] for each configured dataset that is open, has `preload = true`, and has not
/// been preloaded in this version yet: at start, and after a reload for the datasets it added or
/// changed and for those that failed to open before and open now. A dataset whose index pass
/// parsed chunks ([`minibatchd_engine::options::IndexLimits::parse_ahead_bytes`]) has those moved
/// into the chunk cache the same way.
pub fn preload_datasets(data: &Arc<DataPlane>, config: &Config) {
    let catalog = data.catalog();
    let mut started = data.preloaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for name in config.datasets.keys() {
        if let Ok(rt) = catalog.get(name) {
            if rt.dataset.config().preload && started.insert(rt.index) {
                preload::spawn(data.clone(), rt, preload::Load::All);
            } else if !rt.dataset.parsed_ahead().is_empty() && started.insert(rt.index) {
                preload::spawn(data.clone(), rt, preload::Load::ParsedAhead);
            }
        }
    }
}
