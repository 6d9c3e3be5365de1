//! The chunk cache's logic without its locks ([`CacheCore`]): entries `Loading | Ready | Failed`,
//! the byte budget, the LRU of chunks no session holds, pins for waiting sessions, the ceiling of
//! what sessions hold, and the chunks kept until the persister has written them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Instant;

use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::format::errors::DataError;

use super::{ChunkKey, REQUEST_RETRY};

#[derive(Debug)]
pub(super) enum Entry {
    /// Requested at `since`; `demanded` once a session waits for it (not just a prefetch).
    Loading { since: Instant, demanded: bool },
    /// Parsed. `pinned_until`: a session waits for it — it may not be evicted before that
    /// session takes it (first hit) or the pin expires, or a budget below one chunk would
    /// evict every chunk on arrival and the waiting session would never progress.
    Ready {
        chunk: Arc<ParsedChunk>,
        bytes: u64,
        used: u64,
        pinned_until: Option<Instant>,
        /// Lookups that found it (a chunk mapped from the parsed cache is copied into the
        /// daemon's memory at its second: [`CacheCore::take_to_own`]).
        hits: u32,
        /// Waiting for the persister: not evicted before it is written (or the persister let
        /// it go), so that one sweep fills the parsed cache whatever the memory limit.
        unwritten: bool,
    },
    /// A read or parse that failed: told to whoever asks for the chunk, until a reload forgets it
    /// ([`CacheCore::forget_failures`]) — or, for an I/O error (an object store that did not
    /// answer, a read that failed), until `until`: found by a probe, a chunk that failed during a
    /// store's short stall kept failing every later session after the store had recovered.
    Failed { error: DataError, until: Option<Instant> },
}

/// How long an I/O failure of a chunk is told before the chunk is read again.
const IO_FAILURE_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// Chunks loading at once before any is in the cache (their size unknown): one per parser
/// thread of a small machine; more start as soon as one arrives and sizes them.
const UNSIZED_LOADS: u64 = 2;

/// The cache's logic.
#[derive(Debug)]
pub struct CacheCore {
    pub(super) entries: HashMap<ChunkKey, Entry>,
    pub(super) budget: u64,
    /// What the chunks sessions hold may reach before demand loads are refused (`u64::MAX`: no
    /// such bound).
    pub(super) ceiling: u64,
    /// Entries `Loading` (requested, not yet parsed).
    loading: u64,
    tick: u64,
    pub(super) stats: CacheStats,
    /// Chunks mapped from the parsed cache found a second time: to be copied into the
    /// daemon's memory in the background ([`CacheCore::take_to_own`]).
    to_own: Vec<(ChunkKey, Weak<ParsedChunk>)>,
    /// Chunks [`CacheCore::replace`]d while sessions still held them, and their bytes: resident
    /// beside their copies until the sessions let go, so counted in `stats.bytes` (and held)
    /// until then (found by a probe: a cold pass's second sweep held mapped entries and their
    /// copies at once, RSS near twice the limit).
    displaced: Vec<(Weak<ParsedChunk>, u64)>,
    /// Of `stats.bytes`, what is charged ([`CacheCore::charge`]: the copies of minibatches
    /// gathered a chunk at a time, the chunks an index pass keeps until the cache takes them):
    /// memory no session can let go of for another.
    charged: u64,
}

impl CacheCore {
    /// An empty cache with `budget` bytes and no ceiling.
    #[must_use]
    pub fn new(budget: u64) -> Self {
        Self {
            entries: HashMap::new(),
            budget,
            ceiling: u64::MAX,
            loading: 0,
            tick: 0,
            stats: CacheStats::default(),
            to_own: Vec::new(),
            displaced: Vec::new(),
            charged: 0,
        }
    }

    /// Sets the ceiling: demand loads are refused once the chunks sessions hold reach it.
    pub fn set_ceiling(&mut self, ceiling: u64) {
        self.ceiling = ceiling;
    }

    /// Changes the budget (rings come and go) and evicts down to it.
    pub fn set_budget(&mut self, budget: u64) {
        self.budget = budget;
        self.evict();
    }

    /// Looks `key` up for a session that needs it now; a miss marks it `Loading`.
    pub fn lookup(&mut self, key: ChunkKey, now: Instant) -> Lookup {
        self.lookup_for(key, now, true, false)
    }

    /// [`CacheCore::lookup`]; `session` false for a lookup that is not a session's use of the
    /// chunk (the preload), which does not count towards copying a mapped chunk. `behind`: other
    /// sessions wait for memory ahead of the one asking, which then takes no memory
    /// ([`Lookup::Behind`]) — it starts no load, waits for no prefetch and takes no chunk that
    /// eviction could free — so that the first in line gets the room that is freed. What is held
    /// already costs nothing more: a chunk a session holds, one pinned for a waiting session or
    /// waiting for the persister, a load a session waits for (pinned when it arrives: abandoned,
    /// it would stay so for [`REQUEST_RETRY`]).
    pub fn lookup_for(&mut self, key: ChunkKey, now: Instant, session: bool, behind: bool) -> Lookup {
        self.tick += 1;
        if behind && self.takes_memory(key, now) {
            self.stats.refused_loads += 1;
            return Lookup::Behind;
        }
        if matches!(self.entries.get(&key), Some(Entry::Failed { until: Some(t), .. }) if *t <= now) {
            self.entries.remove(&key);
        }
        match self.entries.get_mut(&key) {
            Some(Entry::Ready { chunk, used, pinned_until, hits, .. }) => {
                *used = self.tick;
                *pinned_until = None;
                if session {
                    *hits = hits.saturating_add(1);
                    if *hits == 2 && chunk.is_mapped() {
                        self.to_own.push((key, Arc::downgrade(chunk)));
                    }
                }
                Lookup::Hit(chunk.clone())
            }
            Some(Entry::Loading { since, demanded }) => {
                *demanded = true;
                Lookup::Pending(*since)
            }
            Some(Entry::Failed { error, .. }) => Lookup::Failed(error.clone()),
            None => {
                self.evict();
                if self.unsized_loads_in_flight() {
                    return Lookup::Unsized;
                }
                if self.stats.bytes >= self.ceiling {
                    // Whatever eviction left is held by sessions (or pinned for them).
                    let held = self.held_bytes();
                    if held > 0 && held >= self.ceiling {
                        self.stats.refused_loads += 1;
                        return Lookup::OverLimit { held, ceiling: self.ceiling };
                    }
                }
                if self.stats.bytes >= self.budget {
                    self.stats.over_budget_loads += 1;
                }
                self.entries.insert(key, Entry::Loading { since: now, demanded: true });
                self.loading += 1;
                Lookup::Miss
            }
        }
    }

    /// Whether taking `key` now adds to what is held: a load started or a prefetch waited for (it
    /// is pinned when it arrives), or a chunk eviction could free. A chunk a session holds, one
    /// pinned or waiting for the persister, a load a session waits for, are held already.
    fn takes_memory(&self, key: ChunkKey, now: Instant) -> bool {
        match self.entries.get(&key) {
            Some(Entry::Ready { chunk, pinned_until, unwritten, .. }) => {
                Arc::strong_count(chunk) == 1 && !*unwritten && pinned_until.is_none_or(|t| t <= now)
            }
            Some(Entry::Loading { demanded, .. }) => !*demanded,
            Some(Entry::Failed { .. }) => false,
            None => true,
        }
    }

    /// Counts a use of a chunk that a lookup found ready: a hit when the user found it there at
    /// once, a miss when it waited for its load (started by its lookup or ahead of it). Found by
    /// a probe: loads were counted as misses at their start and every use as a hit after, so a
    /// cold sweep read as a 50 % hit ratio.
    pub fn count_use(&mut self, waited: bool) {
        if waited {
            self.stats.misses += 1;
        } else {
            self.stats.hits += 1;
        }
    }

    /// Marks `key` for a prefetch if it is absent and the budget has room; `true` if the caller
    /// should request it. The room counts the chunks being loaded at the mean size of those
    /// parsed, so that prefetches in flight do not carry the cache past its budget, and leaves
    /// out the chunks no session holds, which an arriving chunk evicts (a cache kept full of
    /// retired chunks must not stop the parse-ahead of a dataset larger than the budget).
    pub fn begin_prefetch(&mut self, key: ChunkKey, now: Instant) -> bool {
        if self.entries.contains_key(&key) {
            return false;
        }
        self.evict();
        if self.stats.bytes >= self.budget || self.unsized_loads_in_flight() {
            return false;
        }
        let mean = self.stats.bytes.checked_div(self.stats.chunks).unwrap_or(0);
        let in_flight = self.loading.saturating_mul(mean);
        // The exact test (held bytes, a pass over the entries) only when the cheap one fails;
        // chunks loaded ahead and not used yet are not room for more.
        if self.stats.bytes.saturating_add(in_flight) >= self.budget
            && self.held_bytes().saturating_add(self.unused_bytes()).saturating_add(in_flight) >= self.budget
        {
            return false;
        }
        self.entries.insert(key, Entry::Loading { since: now, demanded: false });
        self.loading += 1;
        true
    }

    /// Forgets a `Loading` mark whose request could not be sent.
    pub fn abort(&mut self, key: ChunkKey) {
        if matches!(self.entries.get(&key), Some(Entry::Loading { .. })) {
            self.entries.remove(&key);
            self.loading = self.loading.saturating_sub(1);
        }
    }

    /// Marks a pending chunk as requested again at `now`.
    pub fn retried(&mut self, key: ChunkKey, now: Instant) {
        if let Some(Entry::Loading { since, .. }) = self.entries.get_mut(&key) {
            *since = now;
        }
    }

    /// The cache stage delivers a parsed chunk (or its failure).
    pub fn insert(&mut self, key: ChunkKey, result: Result<Arc<ParsedChunk>, DataError>) {
        self.insert_with(key, result, false);
    }

    /// [`CacheCore::insert`]; an `unwritten` chunk is not evicted until [`CacheCore::written`].
    pub fn insert_with(&mut self, key: ChunkKey, result: Result<Arc<ParsedChunk>, DataError>, unwritten: bool) {
        self.tick += 1;
        let entry = match result {
            Ok(chunk) => {
                let demanded = match self.entries.get(&key) {
                    Some(Entry::Ready { .. }) => return, // a duplicate parse (retry): keep the first
                    Some(Entry::Loading { demanded, .. }) => *demanded,
                    _ => false,
                };
                let bytes = chunk.size_bytes() as u64;
                self.stats.bytes += bytes;
                self.stats.chunks += 1;
                let pinned_until = demanded.then(|| Instant::now() + REQUEST_RETRY);
                Entry::Ready { chunk, bytes, used: self.tick, pinned_until, hits: 0, unwritten }
            }
            Err(error) => {
                let until = matches!(error, DataError::Io { .. }).then(|| Instant::now() + IO_FAILURE_HOLD);
                Entry::Failed { error, until }
            }
        };
        match self.entries.insert(key, entry) {
            Some(Entry::Ready { bytes, .. }) => {
                self.stats.bytes -= bytes;
                self.stats.chunks -= 1;
            }
            Some(Entry::Loading { .. }) => self.loading = self.loading.saturating_sub(1),
            _ => {}
        }
        self.evict();
    }

    /// The persister is done with `chunk` (the one `key` holds, if it still does): written to
    /// the parsed cache, or let go (not to be persisted, or the write failed). It may now be
    /// evicted.
    pub fn written(&mut self, key: ChunkKey, chunk: &Weak<ParsedChunk>) {
        if let Some(Entry::Ready { chunk: c, unwritten, .. }) = self.entries.get_mut(&key) {
            if is(c, chunk) {
                *unwritten = false;
            }
        }
        self.evict();
    }

    /// Parsed bytes waiting for the persister (not evictable until written).
    #[must_use]
    pub fn unwritten_bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|e| match e {
                Entry::Ready { bytes, unwritten: true, .. } => *bytes,
                _ => 0,
            })
            .sum()
    }

    /// The chunks mapped from the parsed cache that lookups found a second time since the last
    /// call. Their first use (a sweep after a restart, or after the chunk was evicted) reads the
    /// mapping: no copy, no fresh memory to touch; uses after it gain from a copy on huge pages
    /// (fewer TLB misses), made in the background by the persister and swapped in with
    /// [`CacheCore::replace`].
    pub fn take_to_own(&mut self) -> Vec<(ChunkKey, Weak<ParsedChunk>)> {
        std::mem::take(&mut self.to_own)
    }

    /// Puts `new` in the place of `old` if `key` still holds `old` (the same data in other memory:
    /// a chunk mapped from the parsed cache, copied into the daemon's own); sessions holding
    /// `old` go on with it until they let it go. Returns whether it was swapped.
    ///
    /// `old` is a weak reference, so that whoever makes the copy need not hold the chunk (which
    /// would count as a session holding it: not evictable, and in the held bytes); it keeps the
    /// allocation, so its address is not another chunk's.
    pub fn replace(&mut self, key: ChunkKey, old: &Weak<ParsedChunk>, new: Arc<ParsedChunk>) -> bool {
        match self.entries.get_mut(&key) {
            Some(Entry::Ready { chunk, bytes, .. }) if is(chunk, old) => {
                let size = new.size_bytes() as u64;
                if Arc::strong_count(chunk) > 1 {
                    // Sessions hold the old one: it stays counted until they let go.
                    self.displaced.push((Arc::downgrade(chunk), *bytes));
                    self.stats.bytes += size;
                } else {
                    self.stats.bytes = self.stats.bytes - *bytes + size;
                }
                *bytes = size;
                *chunk = new;
                self.stats.mapped_copies += 1;
                true
            }
            _ => false,
        }
    }

    /// Evicts least recently used chunks that no session holds (and none waits for) until under
    /// budget.
    pub(super) fn evict(&mut self) {
        let stats = &mut self.stats;
        self.displaced.retain(|(old, bytes)| {
            let held = old.strong_count() > 0;
            if !held {
                stats.bytes -= bytes;
            }
            held
        });
        let now = Instant::now();
        while self.stats.bytes > self.budget {
            let victim = self
                .entries
                .iter()
                .filter_map(|(k, e)| match e {
                    // Chunks a session used first, least recently used first; then those loaded
                    // ahead and not used yet, the last loaded first (the furthest ahead): a
                    // prefetch pushed out the ones before it, and a sequential reader under a
                    // tight limit parsed each chunk three times (a probe).
                    Entry::Ready { chunk, used, pinned_until, unwritten: false, hits, .. }
                        if Arc::strong_count(chunk) == 1 && pinned_until.is_none_or(|t| t <= now) =>
                    {
                        Some(if *hits == 0 { (true, u64::MAX - *used, *k) } else { (false, *used, *k) })
                    }
                    _ => None,
                })
                .min();
            let Some((_, _, key)) = victim else { return };
            if let Some(Entry::Ready { bytes, .. }) = self.entries.remove(&key) {
                self.stats.bytes -= bytes;
                self.stats.chunks -= 1;
                self.stats.evictions += 1;
            }
        }
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Forgets every failed chunk, so the next request reads and parses it again (after a reload:
    /// the operator may have repaired the file). Returns how many were forgotten.
    pub fn forget_failures(&mut self) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, e| !matches!(e, Entry::Failed { .. }));
        before - self.entries.len()
    }

    /// Drops the chunks of the datasets `dead` (catalog indices of versions that no catalog nor
    /// session holds any more: a reload replaced or removed them) that nobody holds, and their
    /// failures: no session can ask for them again. Chunks still loading land and go at the next
    /// call. Returns how many were dropped.
    pub fn forget_datasets(&mut self, dead: &HashSet<u32>) -> usize {
        let before = self.entries.len();
        let stats = &mut self.stats;
        self.entries.retain(|k, e| {
            if !dead.contains(&k.dataset) {
                return true;
            }
            match e {
                Entry::Ready { chunk, bytes, .. } => {
                    let held = Arc::strong_count(chunk) > 1;
                    if !held {
                        stats.bytes -= *bytes;
                        stats.chunks -= 1;
                    }
                    held
                }
                Entry::Loading { .. } => true,
                Entry::Failed { .. } => false,
            }
        });
        before - self.entries.len()
    }

    /// The byte budget in force.
    #[must_use]
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Counts `bytes` of copies as held (minibatches gathered a chunk at a time, not yet in
    /// their slots): in the cache's bytes, never evicted, until [`CacheCore::discharge`].
    pub fn charge(&mut self, bytes: u64) {
        self.stats.bytes += bytes;
        self.charged += bytes;
        self.evict();
    }

    /// Ends a [`CacheCore::charge`] of `bytes`.
    pub fn discharge(&mut self, bytes: u64) {
        self.stats.bytes = self.stats.bytes.saturating_sub(bytes);
        self.charged = self.charged.saturating_sub(bytes);
    }

    /// The bytes charged now ([`CacheCore::charge`]).
    #[must_use]
    pub fn charged_bytes(&self) -> u64 {
        self.charged
    }

    /// Whether [`UNSIZED_LOADS`] chunks are loading under a ceiling while none is in the cache
    /// to size them by: no more start until one arrives (a cold start's first chunks, asked for
    /// by every session and prefetch at once, all arrived over the limit).
    fn unsized_loads_in_flight(&self) -> bool {
        self.ceiling < u64::MAX && self.stats.chunks == 0 && self.loading >= UNSIZED_LOADS
    }

    /// Parsed bytes that sessions hold or wait for, or that wait for the persister (what
    /// eviction cannot free now).
    pub(super) fn held_bytes(&self) -> u64 {
        self.stats.bytes - self.evictable_bytes()
    }

    /// Of [`Self::evictable_bytes`], the chunks no session has used yet (loaded ahead).
    fn unused_bytes(&self) -> u64 {
        let now = Instant::now();
        self.entries
            .values()
            .map(|e| match e {
                Entry::Ready { chunk, bytes, pinned_until, unwritten: false, hits: 0, .. }
                    if Arc::strong_count(chunk) == 1 && pinned_until.is_none_or(|t| t <= now) =>
                {
                    *bytes
                }
                _ => 0,
            })
            .sum()
    }

    /// Parsed bytes that no session holds or waits for and that are written (what eviction
    /// could free now).
    #[must_use]
    pub fn evictable_bytes(&self) -> u64 {
        let now = Instant::now();
        self.entries
            .values()
            .map(|e| match e {
                Entry::Ready { chunk, bytes, pinned_until, unwritten: false, .. }
                    if Arc::strong_count(chunk) == 1 && pinned_until.is_none_or(|t| t <= now) =>
                {
                    *bytes
                }
                _ => 0,
            })
            .sum()
    }
}

/// Whether `weak` points to `chunk` (its allocation, which the weak reference keeps from reuse).
pub(super) fn is(chunk: &Arc<ParsedChunk>, weak: &Weak<ParsedChunk>) -> bool {
    std::ptr::eq(Arc::as_ptr(chunk), weak.as_ptr())
}

/// Counters for logs and metrics (`minibatchd_chunk_cache_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Chunk uses (a session's, or the preload's) that found the chunk ready at once.
    pub hits: u64,
    /// Chunk uses that waited for its load (started by the use, or ahead of it by a prefetch
    /// not done yet). So `hits / (hits + misses)` is the share of chunk uses that did not wait
    /// for a load; loads themselves are `minibatchd_chunks_parsed_total` and the parsed cache's.
    pub misses: u64,
    /// Chunks evicted.
    pub evictions: u64,
    /// Demand loads admitted over the budget.
    pub over_budget_loads: u64,
    /// Demand loads refused because the chunks sessions hold reached the ceiling.
    pub refused_loads: u64,
    /// Chunks mapped from the parsed cache replaced by a copy in the daemon's memory.
    pub mapped_copies: u64,
    /// Chunks sessions let go while they waited and memory was short ([`super::SharedCache::shed`]).
    pub shed_chunks: u64,
    /// Parsed bytes held now.
    pub bytes: u64,
    /// Chunks held now.
    pub chunks: u64,
}

/// What a lookup found.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The chunk.
    Hit(Arc<ParsedChunk>),
    /// Being loaded since then.
    Pending(Instant),
    /// Not there: the caller must request it (the entry is now `Loading`).
    Miss,
    /// Not there, and chunks whose size nothing in the cache tells yet are loading under a
    /// ceiling: wait for one to arrive, then ask again (nothing is marked).
    Unsized,
    /// Loading failed.
    Failed(DataError),
    /// Other sessions wait for memory ahead of the one asking: it is to take none (load nothing,
    /// take no chunk that no session holds) and wait its turn.
    Behind,
    /// Not there, and the chunks that sessions hold or wait for (`held` bytes) already reach the
    /// `ceiling`: loading it would pass the memory limit.
    OverLimit {
        /// Parsed bytes held by sessions (not evictable).
        held: u64,
        /// The ceiling in force.
        ceiling: u64,
    },
}
