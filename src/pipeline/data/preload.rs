//! `preload = true`: parse a dataset into the chunk cache before any session asks for it.
//!
//! With CNTK's default window (128 chunks: 4 GiB of text) the first minibatch of a sweep needs
//! nearly every chunk of a smaller file, so a trainer that connects to a cold daemon waits for the
//! whole file to be parsed before its first minibatch, and the rest of the sweep waits for nothing.
//! A daemon started ahead of its trainers (systemd, at boot) can do that parse while it is idle.
//!
//! One thread per preloaded dataset walks the chunks in file order through the ordinary cache
//! path ([`SharedCache::get`](super::chunk_cache::SharedCache::get): read ahead by the readahead stage,
//! parsed by the pool, inserted by the cache stage), keeping one more chunk requested than it waits
//! for, so both parser threads of a 2-core node stay busy. It stops at the cache budget (never
//! evicting what sessions hold or will need:
//! it only loads while the cache has room for another chunk), when the daemon stops, or when a
//! reload removes or replaces the dataset. A chunk that fails to parse is cached as failed, as
//! a session's load would be, and reported to the session that needs it; the preload logs it
//! and goes on. Errors are charged once per place however often a chunk is parsed
//! (docs/differences.md), so preloading changes no error budget.
//!
//! The same thread moves the chunks a dataset's index pass parsed (a cold start's one pass) into
//! the cache ([`Load::ParsedAhead`]): straight in, as the pool would insert them, while there is
//! room; those left are let go, and parsed when a session needs them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::catalog::DatasetRuntime;
use super::chunk_cache::{ChunkKey, FetchError, ParsedMsg};
use super::DataPlane;
use crate::pipeline::lifecycle::Phase;

/// How often a preload blocked on a chunk checks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Which chunks a preload loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Every chunk (`preload = true`).
    All,
    /// Only those the index pass parsed ([`Dataset::parsed_ahead`]): they move into the chunk
    /// cache without a parse, where sessions find them.
    ///
    /// [`Dataset::parsed_ahead`]: minibatchd_engine::dataset::Dataset::parsed_ahead
    ParsedAhead,
}

/// Starts preloading `runtime`'s chunks on a thread of its own (`mbd-preload-INDEX`: the catalog
/// index, not the dataset's name, which may hold any character, NUL included). However it ends,
/// the chunks its index pass parsed that did not reach the cache are let go.
pub fn spawn(shared: Arc<DataPlane>, runtime: Arc<DatasetRuntime>, load: Load) {
    let name = format!("mbd-preload-{}", runtime.index);
    let rt = runtime.clone();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        match load {
            Load::All => run(&shared, &runtime),
            Load::ParsedAhead => adopt(&shared, &runtime),
        }
        runtime.dataset.drop_parsed_ahead();
    });
    if let Err(e) = spawned {
        rt.dataset.drop_parsed_ahead();
        tracing::warn!(error = %e, "cannot start the preload thread; the dataset is parsed on demand");
    }
}

/// Why a preload ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Budget,
    Stopping,
    Replaced,
}

/// Whether `rt` is still to be loaded: the daemon is not stopping, and it is the version in force.
fn still_wanted(shared: &DataPlane, rt: &DatasetRuntime) -> Result<(), Ended> {
    if shared.health.phase() == Phase::Stopping {
        return Err(Ended::Stopping);
    }
    match shared.catalog().get(&rt.name) {
        Ok(current) if current.index == rt.index => Ok(()),
        _ => Err(Ended::Replaced),
    }
}

/// Moves the chunks `rt`'s index pass parsed into the chunk cache, in file order, while it has
/// room for each (evicting nothing) and the dataset is still the one in force: straight into the
/// cache, as the parser pool would put them there (counted as parsed, handed to the persister),
/// without a trip through its queues. A chunk a session's load took first is in the cache already.
fn adopt(shared: &DataPlane, rt: &Arc<DatasetRuntime>) {
    let started = Instant::now();
    let (mut moved, mut failed) = (0usize, 0usize);
    let mut ended = None;
    for chunk in rt.dataset.parsed_ahead() {
        if let Err(e) = still_wanted(shared, rt) {
            ended = Some(e);
            break;
        }
        let key = ChunkKey::new(rt.index, u32::try_from(chunk).unwrap_or(u32::MAX));
        if shared.cache.is_ready(key) {
            continue;
        }
        let parsed = match rt.dataset.take_parsed_in_pass(chunk) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => continue,
            Err(e) => {
                // Its file changed: a session's load of it gets the error from its own read. Said
                // once (found by a probe: a line per chunk, thousands for a large file); the
                // count ends the log's last line.
                if failed == 0 {
                    tracing::warn!(dataset = %rt.name, chunk, error = %e, "chunks parsed in the index pass are not used");
                }
                failed += 1;
                continue;
            }
        };
        let (stats, budget, _) = shared.cache.snapshot();
        if stats.bytes.saturating_add(parsed.size_bytes() as u64) > budget {
            ended = Some(Ended::Budget);
            break;
        }
        rt.count_parse(chunk);
        let parsed = Arc::new(parsed);
        let persist = rt.persist_target(&parsed);
        shared.cache.insert(ParsedMsg { key, result: Ok(parsed), persist });
        moved += 1;
    }
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(dataset = %rt.name, chunks = moved, failed, elapsed_ms, stopped = ?ended, "chunks parsed in the index pass moved into the chunk cache");
}

fn run(shared: &DataPlane, rt: &DatasetRuntime) {
    let started = Instant::now();
    let chunks = rt.dataset.chunks().len();
    let stop = AtomicBool::new(false);
    // Raised by a watcher of the daemon's phase and the dataset's presence, so a preload blocked
    // on a chunk notices promptly.
    let still_wanted = || still_wanted(shared, rt);
    let mut loaded = 0usize;
    let mut failed = 0usize;
    let mut ended = None;
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if still_wanted().is_err() {
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
                std::thread::sleep(STOP_POLL);
            }
        });
        for chunk in 0..chunks {
            if let Err(e) = still_wanted() {
                ended = Some(e);
                break;
            }
            // Room for one more chunk of about the average size so far (the first always fits a
            // budget that admits any chunk at all).
            let (stats, budget, _) = shared.cache.snapshot();
            let average = stats.bytes.checked_div(stats.chunks).unwrap_or(0);
            if stats.bytes.saturating_add(average) > budget {
                ended = Some(Ended::Budget);
                break;
            }
            let key = ChunkKey::new(rt.index, u32::try_from(chunk).unwrap_or(u32::MAX));
            // The next chunk is requested ahead only when it fits beside this one.
            let room_for_two = stats.bytes.saturating_add(average.saturating_mul(2)) <= budget;
            if let Some(next) = chunk.checked_add(1).filter(|&n| n < chunks && room_for_two) {
                shared.cache.prefetch(None, [ChunkKey::new(rt.index, u32::try_from(next).unwrap_or(u32::MAX))]);
            }
            match shared.cache.get_for_preload(key, &stop) {
                Ok(_) => loaded += 1,
                Err(FetchError::Failed(m)) => {
                    failed += 1;
                    tracing::warn!(dataset = %rt.name, chunk, error = %m, "preload: chunk failed to parse; a session that needs it gets the error");
                }
                Err(FetchError::OverLimit { .. } | FetchError::Behind) => {
                    // The chunks sessions hold fill the limit (sessions wait for memory): no
                    // room to preload.
                    ended = Some(Ended::Budget);
                    break;
                }
                Err(_) => {
                    ended = Some(still_wanted().err().unwrap_or(Ended::Stopping));
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = watcher.join();
    });
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match ended {
        None => {
            tracing::info!(dataset = %rt.name, chunks = loaded, failed, elapsed_ms, "preloaded into the chunk cache");
        }
        Some(Ended::Budget) => {
            tracing::info!(dataset = %rt.name, chunks = loaded, of = chunks, failed, elapsed_ms, "preload stopped at the chunk cache's budget; the rest is parsed on demand");
        }
        Some(why) => {
            tracing::info!(dataset = %rt.name, chunks = loaded, of = chunks, elapsed_ms, reason = ?why, "preload stopped");
        }
    }
}
