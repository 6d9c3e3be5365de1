//! The parsed cache: the columnar form of a chunk ([`ParsedChunk`]) written to
//! disk the first time the chunk is parsed, and read back instead of parsing the text again —
//! after an eviction from the chunk cache, after a daemon restart, by another job or by
//! `dump`.
//!
//! One file per (dataset parse identity, chunk) in a private directory (`state_dir/parsed` by
//! default, `0700`), named `{identity:016x}-{chunk}.mbp`. The identity
//! ([`crate::dataset::Dataset::parse_identity`]) covers everything that shapes the parse: the
//! format and its options, the streams, the precision, the chunking, and every input file's path
//! and version (size, modification and status-change times, device and inode; an object's ETag);
//! a file that changes gets a new identity,
//! and its old entries age out of the LRU. Layout (native byte order, declared in the header):
//!
//! ```text
//! header   magic b"MBDPARSD", version u32, layout u32 (1: little-endian, 64-bit),
//!          identity u64, chunk u64, num_sequences u64, num_streams u64, payload_len u64
//! payload  per stream: 6 × u64 { tag, dim, len_a, len_b, len_c, len_d }, then its arrays:
//!          seq_offsets (len_a × u64), then by tag
//!            dense:   values (len_b)
//!            sparse:  sample_offsets (len_b × u64), indices (len_c: i32, u32 or u64 by the
//!                     tag's bits 9 and 10), values (len_d)
//!            strings: offsets (len_b × u64), bytes (len_c, padded to 8)
//! trailer  crc32 (CRC-32/ISO-HDLC over header and payload) u32, magic b"END1"
//! ```
//!
//! An entry is used only when its header names the identity and chunk asked for, its streams are
//! the dataset's (kind, element type, dimension), its checksum is right, and its arrays are
//! consistent (offsets start at 0, never decrease, and end at the lengths they index; sparse CTF
//! indices lie below the stream's dimension): a truncated, corrupt, stale or foreign entry is a
//! miss, removed, and the chunk is parsed again — never served. Entries are read only if they are
//! regular files owned by this user and not writable by others ([`state_file::open_trusted`]). The
//! checksum is computed the first time this process reads a version of an entry's file (its
//! device, inode, size, modification and status-change times, taken once the bytes are mapped
//! under the lease or read — a write in place or a replacement makes a new one); a later read of
//! that same version checks everything but the checksum (a pass over the entry, a tenth of a warm
//! sweep) — provided the version had stayed unchanged for at least a second before the read that
//! checked it began, so that no write in the same tick of the kernel's coarse clock left its times
//! as they were. What this cannot see, a restart checks again: a change below the file system (the
//! block device, bit rot) after the first check, or stores through another process's writable
//! shared mapping of the entry to a page already dirty (its times move at the page's first write).
//!
//! Only chunks parsed without a malformed place are written: a chunk with errors is parsed again
//! each time, so its errors are charged to the error budget and reported exactly as without the
//! cache. Values come back bit for bit (the arrays are written as they are in memory).
//!
//! Writes are atomic for readers (a temporary file renamed into place) but not fsynced: after a
//! machine crash a torn entry fails its checksum. Each entry's writeback is started as it is
//! written ([`state_file::write_replacing_unsynced`]), not left to the kernel's flusher, whose pass
//! 30 s later made a restarted daemon's first `fsync` wait for every entry of the run before. The
//! directory is bounded by `parsed_cache_bytes`: least-recently-used entries are removed when a
//! write would pass it, and an entry larger than the bound is not written. Each process accounts
//! for the entries it finds at start and those it writes or reads; two processes on one directory
//! (the daemon and `minibatchd index --parsed`) can together pass the bound by what the other wrote
//! since it started, until their next eviction scan.
//!
//! Reading an entry of 1 MiB and more maps its file read-only ([`FileMapping`], populated at once
//! so that an I/O error is an error here, not a fault later) under a read lease that guards it
//! against other processes — one that opens the entry for writing or truncates it waits until the
//! mapping has been moved into the daemon's own memory, so a cache file can neither crash the
//! daemon (`SIGBUS`) nor change what it serves ([`minibatchd_sys::lease`]) — and checks its
//! checksum over the mapping; the chunk's value and index columns are then the mapped bytes themselves
//! ([`Column`]), which the gather reads as it reads a parsed chunk's: no copy, and no fresh memory
//! to touch (on a VM whose host takes freed memory back, that first touch cost more than the
//! copy; docs/benchmarks.md). The offsets (a few percent of an entry) are copied, and so is a
//! column whose place in the file is not aligned for its type. Smaller entries, and any entry that
//! cannot be mapped (no lease: a file system without leases, the entry open for writing
//! elsewhere; `vm.max_map_count`), are read into memory and checked there. A mapping lives as long as the
//! chunk: evicting or replacing the entry on disk (unlink, rename) leaves it intact. Entries are
//! written in whole 2 MiB pieces ([`WRITE_PIECE`]) so that the page cache holds them in 2 MiB
//! folios and the mapping is on huge pages where the kernel and filesystem allow it.
//!
//! [`FileMapping`]: crate::format::chunk::FileMapping
//! [`Column`]: crate::format::chunk::Column
//! [`WRITE_PIECE`]: entry::WRITE_PIECE

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::format::chunk::{ParsedChunk, StreamSpec};
use crate::options::Precision;
use crate::state_file::{self, unix_now, FileVersion};

const EXT: &str = "mbp";
/// The default subdirectory of `state_dir`.
pub const PARSED_DIR: &str = "parsed";

/// Counters for logs and metrics (`minibatchd_parsed_cache_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParsedCacheStats {
    /// Chunks read back instead of parsed.
    pub hits: u64,
    /// Of the hits, chunks whose columns are the entry's mapped pages (entries of 1 MiB and more).
    pub mapped: u64,
    /// Lookups that found no usable entry.
    pub misses: u64,
    /// Entries refused (corrupt, truncated, inconsistent, untrusted) and removed.
    pub rejected: u64,
    /// Entries whose checksum was computed: the first read of each version of an entry's file.
    pub checksums: u64,
    /// Entries written.
    pub writes: u64,
    /// Writes that failed (disk full, permissions); the chunk is served from the parse anyway.
    pub write_errors: u64,
    /// Entries removed to stay within the bound.
    pub evictions: u64,
    /// Bytes read from entries.
    pub bytes_read: u64,
    /// Bytes written to entries.
    pub bytes_written: u64,
    /// Bytes on disk in entries this process knows of.
    pub bytes: u64,
    /// Entries this process knows of.
    pub entries: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    mapped: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
    checksums: AtomicU64,
    writes: AtomicU64,
    write_errors: AtomicU64,
    evictions: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

#[derive(Debug)]
struct LruEntry {
    bytes: u64,
    /// Last use tick.
    tick: u64,
    /// The file version whose checksum this process checked, once it had settled: a later read
    /// of that same version skips the checksum (its structure is checked every time).
    checked: Option<FileVersion>,
}

#[derive(Debug, Default)]
struct Lru {
    /// File name → its entry.
    entries: HashMap<String, LruEntry>,
    bytes: u64,
    tick: u64,
    /// Identities forgotten ([`ParsedCache::forget_identity`]) and not opened again since
    /// ([`ParsedCache::revive`]): a write of theirs that lands later is removed at once.
    retired: std::collections::HashSet<u64>,
    /// Bytes of the writes in flight, room taken for them ([`ParsedCache::reserve`]).
    pending: u64,
}

impl Lru {
    /// Marks `name` used now, `bytes` long, with `checked` the version of its file whose checksum
    /// is known to be right (`None`: none, as after this process wrote it).
    fn touch(&mut self, name: &str, bytes: u64, checked: Option<FileVersion>) {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.insert(name.to_owned(), LruEntry { bytes, tick, checked }) {
            Some(old) => self.bytes = self.bytes - old.bytes + bytes,
            None => self.bytes += bytes,
        }
    }

    /// Whether the checksum of this version of `name` was checked already.
    fn checked(&self, name: &str, version: &FileVersion) -> bool {
        self.entries.get(name).and_then(|e| e.checked).is_some_and(|v| v == *version)
    }

    fn forget(&mut self, name: &str) {
        if let Some(e) = self.entries.remove(name) {
            self.bytes -= e.bytes;
        }
    }

    /// The least recently used entry other than `keep`.
    fn oldest(&self, keep: &str) -> Option<String> {
        self.entries.iter().filter(|(n, _)| n.as_str() != keep).min_by_key(|(_, e)| e.tick).map(|(n, _)| n.clone())
    }
}

/// A bounded on-disk cache of parsed chunks, shared by every dataset of a process.
#[derive(Debug)]
pub struct ParsedCache {
    dir: PathBuf,
    limit: u64,
    lru: Mutex<Lru>,
    counters: Counters,
    /// Unix seconds now ([`FileVersion::settled_by`]); another clock in tests.
    clock: fn() -> i64,
    /// Whether entries mapped, and columns copied, are advised huge pages.
    huge: minibatchd_sys::HugePages,
}

impl ParsedCache {
    /// Opens (creating, mode `0700`) the cache directory `dir` bounded by `limit` bytes: the
    /// entries already there are counted (oldest modification time first out), temporary files
    /// left by a crashed writer are removed, and entries are evicted down to the bound.
    ///
    /// # Errors
    /// I/O errors, or a directory that is not this user's ([`state_file::is_untrusted`]).
    pub fn open(dir: &Path, limit: u64) -> io::Result<Self> {
        state_file::secure_dir(dir)?;
        let mut found = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            // Only the cache's own files: a directory shared by mistake keeps everything else.
            if state_file::is_temp_name(&name) {
                if !state_file::writer_alive(&name) {
                    let _ = std::fs::remove_file(e.path());
                }
                continue;
            }
            if Self::is_name(&name) {
                found.push((meta.modified().ok(), name, meta.len()));
            }
        }
        found.sort();
        let mut lru = Lru::default();
        for (_, name, len) in found {
            lru.touch(&name, len, None);
        }
        let cache = Self {
            dir: dir.to_owned(),
            limit,
            lru: Mutex::new(lru),
            counters: Counters::default(),
            clock: unix_now,
            huge: minibatchd_sys::HugePages::default(),
        };
        cache.evict_to(limit, "");
        Ok(cache)
    }

    /// Follows `huge` (shared with whoever opened the cache, who may change it) for the entries
    /// it maps and the columns it copies from now on; on by default.
    #[must_use]
    pub fn with_huge_pages(mut self, huge: minibatchd_sys::HugePages) -> Self {
        self.huge = huge;
        self
    }

    /// The directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bound, in bytes.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The counters now.
    #[must_use]
    pub fn stats(&self) -> ParsedCacheStats {
        let c = &self.counters;
        let (bytes, entries) = {
            let l = self.lock();
            (l.bytes, l.entries.len() as u64)
        };
        ParsedCacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            mapped: c.mapped.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            checksums: c.checksums.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            write_errors: c.write_errors.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            bytes,
            entries,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // The map stays consistent whatever panicked while holding it.
        self.lru.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn name(identity: u64, chunk: usize) -> String {
        format!("{identity:016x}-{chunk}.{EXT}")
    }

    /// Whether `name` is an entry's name ([`ParsedCache::name`]: `{identity:016x}-{chunk}.mbp`).
    fn is_name(name: &str) -> bool {
        let Some((identity, chunk)) =
            name.strip_suffix(EXT).and_then(|n| n.strip_suffix('.')).and_then(|n| n.split_once('-'))
        else {
            return false;
        };
        state_file::is_hex64(identity) && state_file::is_number(chunk)
    }

    /// The entry of chunk `chunk` of the dataset with `identity`, if there is a usable one for
    /// `streams` at `precision` with `num_sequences` sequences. Anything unusable is removed and
    /// counted as a miss.
    #[must_use]
    pub fn get(
        &self,
        identity: u64,
        chunk: usize,
        num_sequences: usize,
        streams: &[StreamSpec],
        precision: Precision,
    ) -> Option<ParsedChunk> {
        let name = Self::name(identity, chunk);
        let path = self.dir.join(&name);
        // Before anything of the entry is read: a version settled by then was not being written
        // while it was read.
        let now = (self.clock)();
        let opened = state_file::open_trusted(&path);
        let (file, meta) = match opened {
            Ok(x) => x,
            Err(e) => {
                // An entry that is not ours is removed; one that cannot be opened now (no
                // descriptor left, an I/O error) is only a miss.
                if state_file::is_untrusted(&e) {
                    self.reject(&name, &path);
                }
                self.lock().forget(&name);
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        // No entry larger than the cache's bound is ever written: one is not this cache's, and its
        // header could size the arrays read from it up to the file's length.
        if meta.len() > self.limit {
            self.reject(&name, &path);
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let expect = Expect { identity, chunk, num_sequences, streams, precision };
        // Whether the checksum of the version the entry's bytes were loaded as (its times taken
        // once they are mapped under the lease, or read) was checked before.
        let already = |v: &FileVersion| {
            let checked = self.lock().checked(&name, v);
            if !checked {
                self.counters.checksums.fetch_add(1, Ordering::Relaxed);
            }
            checked
        };
        if let Some((parsed, version, summed)) = decode(file, meta.len(), &expect, &already, &self.huge) {
            let checked = (!summed || version.settled_by(now)).then_some(version);
            self.lock().touch(&name, meta.len(), checked);
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            if parsed.is_mapped() {
                self.counters.mapped.fetch_add(1, Ordering::Relaxed);
            }
            self.counters.bytes_read.fetch_add(meta.len(), Ordering::Relaxed);
            Some(parsed)
        } else {
            self.reject(&name, &path);
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    fn reject(&self, name: &str, path: &Path) {
        tracing::warn!(entry = %path.display(), "a persisted parsed chunk is unusable (corrupt, truncated, stale or not this user's); removed, the chunk is parsed again");
        let _ = std::fs::remove_file(path);
        self.lock().forget(name);
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes `chunk` as the entry of its chunk of the dataset with `identity`, evicting the least
    /// recently used entries to stay within the bound. Failures are counted and logged, never
    /// returned: the chunk is served from its parse whatever happens here.
    pub fn put(&self, identity: u64, chunk: &ParsedChunk) {
        let len = encoded_len(chunk);
        // A forgotten version's write is refused before it evicts live entries for its room or
        // writes a file; the check after the write catches one that raced the forgetting.
        if len > self.limit || self.lock().retired.contains(&identity) {
            return;
        }
        let name = Self::name(identity, chunk.chunk);
        if !self.reserve(&name, len) {
            return;
        }
        let path = self.dir.join(&name);
        let written = state_file::write_replacing_unsynced(&path, &mut |f| encode(f, identity, chunk));
        match written {
            Ok(()) => {
                let mut l = self.lock();
                // The room taken becomes the entry's in one step: another writer never sees both
                // free.
                l.pending -= len;
                // Found by a probe: the chunks that a replaced version's session still held were
                // written after a reload had forgotten that version, entries nobody could read.
                // Forgotten while this write ran: removed (the check above saw it alive).
                if l.retired.contains(&identity) {
                    drop(l);
                    let _ = std::fs::remove_file(&path);
                    return;
                }
                l.touch(&name, len, None);
                drop(l);
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes_written.fetch_add(len, Ordering::Relaxed);
            }
            Err(e) => {
                self.lock().pending -= len;
                let n = self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                if n < 10 || n.is_power_of_two() {
                    tracing::warn!(entry = %path.display(), error = %e, failures = n + 1, "could not persist a parsed chunk (served from the parse; it will be parsed again next time)");
                }
            }
        }
    }

    /// Removes every entry of the dataset with `identity` (its files changed and it was opened
    /// again: no reader asks for them any more); returns how many. Found by a probe: 573
    /// rewrites of a 760 KB file left 294 MB of entries that could never be served again, until
    /// the cache's bound pushed them out.
    ///
    /// Later writes under `identity` are refused until [`ParsedCache::revive`].
    pub fn forget_identity(&self, identity: u64) -> usize {
        self.lock().retired.insert(identity);
        let prefix = format!("{identity:016x}-");
        // The directory, not only the entries counted: a write that was being renamed into place
        // is on disk before it is counted.
        let mut names: Vec<String> = self.lock().entries.keys().filter(|n| n.starts_with(&prefix)).cloned().collect();
        if let Ok(dir) = std::fs::read_dir(&self.dir) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) && Self::is_name(&name) && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        for name in &names {
            let _ = std::fs::remove_file(self.dir.join(name));
            self.lock().forget(name);
        }
        names.len()
    }

    /// Takes writes under `identity` again: a dataset version with it is in force (the
    /// configuration of a forgotten version came back and the reload was applied).
    pub fn revive(&self, identity: u64) {
        self.lock().retired.remove(&identity);
    }

    /// Takes room for a write of entry `name`, `len` bytes, until it ends ([`Lru::pending`]):
    /// evicts the least recently used entries (not `name`, which the write replaces) while the
    /// entries and the writes in flight would pass the bound with it. `false` when the writes in
    /// flight leave no room (the chunk is not persisted this time). Found by a probe: `index
    /// --parsed`, whose threads write at once, each evicted for its own entry alone and the
    /// directory passed the bound by about an entry.
    fn reserve(&self, name: &str, len: u64) -> bool {
        loop {
            let victim = {
                let mut l = self.lock();
                let replaced = l.entries.get(name).map_or(0, |e| e.bytes);
                if l.bytes - replaced + l.pending + len <= self.limit {
                    l.pending += len;
                    return true;
                }
                match l.oldest(name) {
                    Some(v) => v,
                    None => return false,
                }
            };
            self.evict(&victim);
        }
    }

    /// Removes entry `victim` to make room.
    fn evict(&self, victim: &str) {
        let _ = std::fs::remove_file(self.dir.join(victim));
        self.lock().forget(victim);
        self.counters.evictions.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes least-recently-used entries (not `keep`) until at most `target` bytes are left.
    fn evict_to(&self, target: u64, keep: &str) {
        loop {
            let victim = {
                let l = self.lock();
                if l.bytes <= target {
                    return;
                }
                match l.oldest(keep) {
                    Some(v) => v,
                    None => return,
                }
            };
            self.evict(&victim);
        }
    }
}

mod entry;

pub use entry::{checksum, entry_name};
use entry::{decode, encode, encoded_len, Expect};

#[cfg(test)]
mod tests;
