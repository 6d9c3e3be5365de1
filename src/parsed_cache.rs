//! The parsed cache (`minibatchd_engine::format::parsed_cache`): opened from
//! `[daemon] parsed_cache_dir` / `parsed_cache_bytes` by whoever opens datasets — the daemon's
//! catalog once at start, `dump` and `index` once per run — and handed to each dataset it opens. A cache that cannot be opened (a directory of
//! another user, a read-only file system) is logged and left out: chunks are parsed as without
//! it.

use std::sync::Arc;

use minibatchd_engine::dataset::{Dataset, Persist};
use minibatchd_engine::format::parsed_cache::ParsedCache;
use minibatchd_sys::HugePages;

use crate::config::DaemonConfig;

/// Opens the parsed cache `daemon` configures (its directory and bound are read once: they
/// change with a restart), following `huge` for what it maps and copies; `None` when
/// `parsed_cache_bytes` is 0 or the directory could not be opened (logged). The daemon opens it
/// once, with its catalog; `dump` and `index` once per run.
#[must_use]
pub fn open(daemon: &DaemonConfig, huge: &HugePages) -> Option<Arc<ParsedCache>> {
    if daemon.parsed_cache_bytes == 0 {
        return None;
    }
    match ParsedCache::open(&daemon.parsed_cache_dir, daemon.parsed_cache_bytes) {
        Ok(c) => {
            let c = c.with_huge_pages(huge.clone());
            let s = c.stats();
            tracing::info!(dir = %daemon.parsed_cache_dir.display(), entries = s.entries, bytes = s.bytes, limit = daemon.parsed_cache_bytes, "parsed cache");
            Some(Arc::new(c))
        }
        Err(e) => {
            tracing::warn!(dir = %daemon.parsed_cache_dir.display(), error = %e, "cannot open the parsed cache; chunks are parsed every time they are loaded");
            None
        }
    }
}

/// Hands `cache` (if any) to `dataset`, persisting parsed chunks when `persist` says (the daemon:
/// later, by its persister; `dump` and `index`: on load).
pub fn attach(dataset: &mut Dataset, cache: Option<&Arc<ParsedCache>>, persist: Persist) {
    if let Some(c) = cache {
        dataset.use_parsed_cache(c.clone(), persist);
    }
}

/// What [`fill`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FillReport {
    /// Chunks of the dataset.
    pub chunks: u64,
    /// Chunks already in the cache.
    pub present: u64,
    /// Chunks parsed and written now.
    pub written: u64,
    /// Chunks parsed but not kept: they have malformed places (parsed again each time, so their
    /// errors are charged as without the cache), or the write failed or passed the bound.
    pub not_kept: u64,
}

/// Parses every chunk of `dataset` that is not in its parsed cache yet, on `threads` threads,
/// calling `progress(done, total)` after each chunk (`minibatchd index --parsed`).
///
/// # Errors
/// The dataset has no parsed cache (`parsed_cache_bytes = 0` or its directory unusable), or
/// a chunk fails to load (I/O, a fatal data error, or more malformed places than `max_errors`).
pub fn fill(
    dataset: &Dataset,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<FillReport, minibatchd_engine::format::errors::DataError> {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    let Some(cache) = dataset.parsed_cache() else {
        return Err(minibatchd_engine::format::errors::DataError::Dataset(
            "no parsed cache: [daemon] parsed_cache_bytes is 0, or its directory could not be opened (see the log)"
                .into(),
        ));
    };
    let total = dataset.timeline().num_chunks();
    let before = cache.stats();
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let first_error = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let c = next.fetch_add(1, Ordering::Relaxed);
                if c >= total || first_error.lock().map_or(true, |e| e.is_some()) {
                    return;
                }
                if let Err(e) = dataset.load_chunk(c) {
                    if let Ok(mut slot) = first_error.lock() {
                        slot.get_or_insert(e);
                    }
                    return;
                }
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, total as u64);
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        return Err(e);
    }
    let after = cache.stats();
    let present = after.hits - before.hits;
    let written = after.writes - before.writes;
    Ok(FillReport { chunks: total as u64, present, written, not_kept: total as u64 - present - written })
}
