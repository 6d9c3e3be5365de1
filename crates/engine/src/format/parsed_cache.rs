//! The persisted parsed-chunk cache: the columnar form of a chunk ([`ParsedChunk`]) written to
//! disk the first time the chunk is parsed, and read back instead of parsing the text again —
//! after an eviction from the in-memory cache, after a daemon restart, by another job or by
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
//! regular files owned by this user and not writable by others ([`persist::open_trusted`]). The
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
//! machine crash a torn entry fails its checksum. The directory is bounded by
//! `parsed_cache_bytes`: least-recently-used entries are removed when a write would pass it, and
//! an entry larger than the bound is not written. Each process accounts for the entries it finds
//! at start and those it writes or reads; two processes on one directory (the daemon and
//! `minibatchd index --parsed`) can together pass the bound by what the other wrote since it
//! started, until their next eviction scan.
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

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use minibatchd_sys::{as_bytes, as_bytes_mut, Column, FileMapping, Pod};

use crate::format::chunk::{Indices, ParsedChunk, StreamData, StreamKind, StreamSpec, StreamValues, Values};
use crate::options::Precision;
use crate::persist;

const MAGIC: &[u8; 8] = b"MBDPARSD";
const END: &[u8; 4] = b"END1";
const VERSION: u32 = 1;
/// The layout word: native little-endian with 64-bit `usize` (the only layout written or read).
const LAYOUT_LE64: u32 = 1;
const HEADER_BYTES: u64 = 8 + 4 + 4 + 8 * 5;
const TRAILER_BYTES: u64 = 8;
const EXT: &str = "mbp";
/// The default subdirectory of `state_dir`.
pub const PARSED_DIR: &str = "parsed";

const TAG_DENSE: u64 = 1;
const TAG_SPARSE: u64 = 2;
const TAG_STRINGS: u64 = 3;
const F64_BIT: u64 = 1 << 8;
const U64_INDICES_BIT: u64 = 1 << 9;
/// deepx feature ids stored in 32 bits ([`Indices::U32`]).
const U32_INDICES_BIT: u64 = 1 << 10;

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

/// What identifies one version of an entry's file: a write in place changes the modification
/// and status-change times, a replacement the inode. The status-change time cannot be set by a
/// user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileVersion {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileVersion {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the file was last changed [`STABLE_SECS`] whole seconds before `now` (Unix
    /// seconds, taken before the read that checks it; more than a second before it, then): a
    /// write within one tick of the kernel's coarse clock after that change could leave both
    /// times as they were ("racily clean", as git calls it), so a version that young is checked
    /// again at its next read.
    fn settled_by(&self, now: i64) -> bool {
        self.mtime.0.max(self.ctime.0).saturating_add(STABLE_SECS) <= now
    }
}

/// How long an entry's file must have stayed unchanged for its checked version to be trusted
/// without its checksum ([`FileVersion::settled_by`]).
const STABLE_SECS: i64 = 2;

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
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl ParsedCache {
    /// Opens (creating, mode `0700`) the cache directory `dir` bounded by `limit` bytes: the
    /// entries already there are counted (oldest modification time first out), temporary files
    /// left by a crashed writer are removed, and entries are evicted down to the bound.
    ///
    /// # Errors
    /// I/O errors, or a directory that is not this user's ([`persist::is_untrusted`]).
    pub fn open(dir: &Path, limit: u64) -> io::Result<Self> {
        persist::secure_dir(dir)?;
        let mut found = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            if name.starts_with('.') && Path::new(&name).extension().is_some_and(|x| x == "tmp") {
                if !persist::writer_alive(&name) {
                    let _ = std::fs::remove_file(e.path());
                }
                continue;
            }
            if Path::new(&name).extension().is_some_and(|x| x == EXT) {
                found.push((meta.modified().ok(), name, meta.len()));
            }
        }
        found.sort();
        let mut lru = Lru::default();
        for (_, name, len) in found {
            lru.touch(&name, len, None);
        }
        let cache =
            Self { dir: dir.to_owned(), limit, lru: Mutex::new(lru), counters: Counters::default(), clock: unix_now };
        cache.evict_to(limit, "");
        Ok(cache)
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
        let opened = persist::open_trusted(&path);
        let (file, meta) = match opened {
            Ok(x) => x,
            Err(e) => {
                // An entry that is not ours is removed; one that cannot be opened now (no
                // descriptor left, an I/O error) is only a miss.
                if persist::is_untrusted(&e) {
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
        if let Some((parsed, version, summed)) = decode(file, meta.len(), &expect, &already) {
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
        if len > self.limit {
            return;
        }
        let name = Self::name(identity, chunk.chunk);
        self.evict_to(self.limit - len, &name);
        let path = self.dir.join(&name);
        let written = persist::write_replacing_unsynced(&path, &mut |f| encode(f, identity, chunk));
        match written {
            Ok(()) => {
                self.lock().touch(&name, len, None);
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes_written.fetch_add(len, Ordering::Relaxed);
            }
            Err(e) => {
                let n = self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                if n < 10 || n.is_power_of_two() {
                    tracing::warn!(entry = %path.display(), error = %e, failures = n + 1, "could not persist a parsed chunk (served from the parse; it will be parsed again next time)");
                }
            }
        }
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
            let _ = std::fs::remove_file(self.dir.join(&victim));
            self.lock().forget(&victim);
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The checksum an entry's trailer carries over its header and payload (CRC-32/ISO-HDLC), for
/// tools that build entries byte by byte (the fuzz target).
#[must_use]
pub fn checksum(header_and_payload: &[u8]) -> u32 {
    crc32fast::hash(header_and_payload)
}

/// The file name of chunk `chunk`'s entry for dataset identity `identity`.
#[must_use]
pub fn entry_name(identity: u64, chunk: usize) -> String {
    ParsedCache::name(identity, chunk)
}

fn encoded_len(chunk: &ParsedChunk) -> u64 {
    let mut n = HEADER_BYTES + TRAILER_BYTES;
    for s in &chunk.streams {
        n += 48 + 8 * s.seq_offsets.len() as u64;
        n += match &s.data {
            StreamValues::Dense { values, .. } => values.size_bytes() as u64,
            StreamValues::Sparse { sample_offsets, indices, values } => {
                8 * sample_offsets.len() as u64 + indices.size_bytes() as u64 + values.size_bytes() as u64
            }
            StreamValues::Strings { offsets, bytes } => {
                8 * offsets.len() as u64 + (bytes.len() as u64).next_multiple_of(8)
            }
        };
    }
    n
}

/// Each `write` of an entry hands the file exactly this many bytes (the last one less), at offsets
/// that are multiples of it: the page cache then holds the entry in 2 MiB folios, and a mapping of
/// the entry ([`FileMapping`]) is backed by huge pages (`FilePmdMapped` in `smaps`), so the
/// gather's random reads from a mapped chunk miss the TLB as rarely as from a parsed one. With
/// smaller or unaligned writes the folios are smaller and a mapped sweep is slower. (On a VM whose
/// balloon reports free memory to its host, the larger folios cost the writer some system time;
/// `scripts/bench/write_sizes.py` measures it, and `docs/benchmarks.md` has the figures of both.)
const WRITE_PIECE: usize = 2 << 20;

/// A writer that hands `inner` whole pieces of [`WRITE_PIECE`] bytes, and what is left at the end.
struct Pieces<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> Pieces<W> {
    fn new(inner: W) -> Self {
        Self { inner, buf: Vec::with_capacity(WRITE_PIECE) }
    }

    fn put(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = (WRITE_PIECE - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() == WRITE_PIECE {
                self.inner.write_all(&self.buf)?;
                self.buf.clear();
            }
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        self.inner.write_all(&self.buf)?;
        self.inner.flush()
    }
}

/// A writer that checksums what passes through it.
struct Crc<W: Write> {
    inner: Pieces<W>,
    crc: crc32fast::Hasher,
}

impl<W: Write> Crc<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.inner.put(bytes)
    }

    fn u64s(&mut self, v: &[u64]) -> io::Result<()> {
        self.put(as_bytes(v))
    }
}

fn values_tag(v: &Values) -> u64 {
    match v {
        Values::F32(_) => 0,
        Values::F64(_) => F64_BIT,
    }
}

fn values_bytes(v: &Values) -> &[u8] {
    match v {
        Values::F32(x) => as_bytes(x),
        Values::F64(x) => as_bytes(x),
    }
}

fn encode(out: &mut dyn Write, identity: u64, chunk: &ParsedChunk) -> io::Result<()> {
    let mut w = Crc { inner: Pieces::new(out), crc: crc32fast::Hasher::new() };
    let payload = encoded_len(chunk) - HEADER_BYTES - TRAILER_BYTES;
    w.put(MAGIC)?;
    w.put(&VERSION.to_ne_bytes())?;
    w.put(&LAYOUT_LE64.to_ne_bytes())?;
    w.u64s(&[identity, chunk.chunk as u64, chunk.num_sequences as u64, chunk.streams.len() as u64, payload])?;
    for s in &chunk.streams {
        let n_seq = s.seq_offsets.len() as u64;
        match &s.data {
            StreamValues::Dense { dim, values } => {
                w.u64s(&[TAG_DENSE | values_tag(values), *dim as u64, n_seq, values.len() as u64, 0, 0])?;
                w.put(as_bytes(&s.seq_offsets))?;
                w.put(values_bytes(values))?;
            }
            StreamValues::Sparse { sample_offsets, indices, values } => {
                let (it, ilen, ibytes) = match indices {
                    Indices::I32(x) => (0, x.len(), as_bytes(x)),
                    Indices::U32(x) => (U32_INDICES_BIT, x.len(), as_bytes(x)),
                    Indices::U64(x) => (U64_INDICES_BIT, x.len(), as_bytes(x)),
                };
                w.u64s(&[
                    TAG_SPARSE | values_tag(values) | it,
                    0,
                    n_seq,
                    sample_offsets.len() as u64,
                    ilen as u64,
                    values.len() as u64,
                ])?;
                w.put(as_bytes(&s.seq_offsets))?;
                w.put(as_bytes(sample_offsets))?;
                w.put(ibytes)?;
                w.put(values_bytes(values))?;
            }
            StreamValues::Strings { offsets, bytes } => {
                w.u64s(&[TAG_STRINGS, 0, n_seq, offsets.len() as u64, bytes.len() as u64, 0])?;
                w.put(as_bytes(&s.seq_offsets))?;
                w.put(as_bytes(offsets))?;
                w.put(bytes)?;
                let pad = bytes.len().next_multiple_of(8) - bytes.len();
                w.put(&[0u8; 8][..pad])?;
            }
        }
    }
    let crc = w.crc.finalize();
    w.inner.put(&crc.to_ne_bytes())?;
    w.inner.put(END)?;
    w.inner.finish()
}

/// What the caller asks for: an entry must match all of it.
struct Expect<'a> {
    identity: u64,
    chunk: usize,
    num_sequences: usize,
    streams: &'a [StreamSpec],
    precision: Precision,
}

/// Entries this large and up are mapped (their columns read straight from the page cache);
/// smaller ones are read into memory, so that a cache of many small chunks does not hold a
/// mapping each.
const MAP_AT_LEAST: u64 = 1 << 20;

/// An entry's bytes: a mapping of its file, or (small entries, or when mapping fails) a copy.
enum Bytes {
    Mapped(Arc<FileMapping>),
    Read(Vec<u8>),
}

impl Bytes {
    /// The entry's `len` bytes, and the version of its file once they are loaded (mapped
    /// under the lease, which holds writers off from then on, or read).
    fn load(mut file: File, len: u64) -> Option<(Self, FileVersion)> {
        let size = usize::try_from(len).ok()?;
        if len >= MAP_AT_LEAST {
            match file.try_clone().and_then(|f| FileMapping::map(f, size)) {
                Ok(map) => return Some((Self::Mapped(map), FileVersion::of(&file.metadata().ok()?))),
                // No lease (a file system without leases, the entry open for writing elsewhere),
                // too many mappings (`vm.max_map_count`) or no address space: read it instead.
                Err(e) => tracing::debug!(error = %e, "a persisted parsed chunk could not be mapped; read instead"),
            }
        }
        let mut v = Vec::with_capacity(size);
        (&mut file).take(len).read_to_end(&mut v).ok()?;
        (v.len() == size).then_some((Self::Read(v), FileVersion::of(&file.metadata().ok()?)))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m.bytes(),
            Self::Read(v) => v,
        }
    }
}

/// A cursor over an entry's payload that never reads past it.
struct Src<'a> {
    bytes: &'a Bytes,
    at: usize,
    end: usize,
}

impl Src<'_> {
    /// The next `n` bytes.
    fn take(&mut self, n: u64) -> Option<std::ops::Range<usize>> {
        let n = usize::try_from(n).ok()?;
        let end = self.at.checked_add(n).filter(|&e| e <= self.end)?;
        let r = self.at..end;
        self.at = end;
        Some(r)
    }

    fn byte_len<T>(len: u64) -> Option<u64> {
        len.checked_mul(std::mem::size_of::<T>() as u64)
    }

    /// `len` values of `T`, copied (offsets, which the entry's checks read anyway).
    fn array<T: Pod>(&mut self, len: u64) -> Option<Vec<T>> {
        let r = self.take(Self::byte_len::<T>(len)?)?;
        minibatchd_sys::copy_from_bytes(&self.bytes.as_slice()[r])
    }

    /// `len` values of `T`: the mapped bytes themselves when the entry is mapped and they are
    /// aligned for `T` (an odd number of 4-byte values before 8-byte ones is not), else a copy.
    fn column<T: Pod>(&mut self, len: u64) -> Option<Column<T>> {
        let r = self.take(Self::byte_len::<T>(len)?)?;
        if let Bytes::Mapped(map) = self.bytes {
            if let Some(c) = Column::mapped(map, r.start, usize::try_from(len).ok()?) {
                return Some(c);
            }
        }
        minibatchd_sys::copy_from_bytes(&self.bytes.as_slice()[r]).map(Column::from)
    }

    fn u64s<const N: usize>(&mut self) -> Option<[u64; N]> {
        let r = self.take(8 * N as u64)?;
        let mut v = [0u64; N];
        as_bytes_mut(&mut v).copy_from_slice(&self.bytes.as_slice()[r]);
        Some(v)
    }

    fn values(&mut self, f64: bool, len: u64) -> Option<Values> {
        Some(if f64 { Values::F64(self.column(len)?) } else { Values::F32(self.column(len)?) })
    }
}

/// Offsets that start at 0, never decrease and end at `end`.
fn offsets_ok(o: &[usize], end: usize) -> bool {
    o.first() == Some(&0) && o.last() == Some(&end) && o.windows(2).all(|w| w[0] <= w[1])
}

/// The entry's chunk, the version of its file its bytes were loaded as, and whether its checksum
/// was checked: not when `checked_before` says that version's was ([`LruEntry::checked`]; asked
/// once, after the bytes are loaded, so that a write before the load is a new version). The
/// header and the arrays' structure are checked either way.
fn decode(
    file: File,
    len: u64,
    want: &Expect<'_>,
    checked_before: &dyn Fn(&FileVersion) -> bool,
) -> Option<(ParsedChunk, FileVersion, bool)> {
    if !cfg!(all(target_endian = "little", target_pointer_width = "64")) {
        return None;
    }
    let payload_max = len.checked_sub(HEADER_BYTES + TRAILER_BYTES)?;
    let (bytes, loaded_as) = Bytes::load(file, len)?;
    let checksum = !checked_before(&loaded_as);
    let all = bytes.as_slice();
    let (checked, trailer) = all.split_at(all.len().checked_sub(8)?); // TRAILER_BYTES
                                                                      // The checksum first: nothing is sized from an entry whose bytes are not what was written.
    if &trailer[4..] != END || (checksum && trailer[..4] != crc32fast::hash(checked).to_ne_bytes()) {
        return None;
    }
    let mut r = Src { bytes: &bytes, at: 0, end: checked.len() };
    let magic = r.take(8)?;
    let words = r.take(8)?;
    let [identity, chunk, num_sequences, num_streams, payload] = r.u64s::<5>()?;
    let version = u32::from_ne_bytes(all[words.start..words.start + 4].try_into().ok()?);
    let layout = u32::from_ne_bytes(all[words.start + 4..words.end].try_into().ok()?);
    let header_ok = &all[magic] == MAGIC
        && version == VERSION
        && layout == LAYOUT_LE64
        && identity == want.identity
        && chunk == want.chunk as u64
        && num_sequences == want.num_sequences as u64
        && num_streams == want.streams.len() as u64
        && payload == payload_max;
    if !header_ok {
        return None;
    }
    let f64 = want.precision == Precision::Float64;
    let mut streams = Vec::with_capacity(want.streams.len());
    for spec in want.streams {
        let [tag, dim, n_seq, a, b, c] = r.u64s::<6>()?;
        if Some(n_seq) != num_sequences.checked_add(1) {
            return None;
        }
        let seq_offsets: Vec<usize> = r.array(n_seq)?;
        let samples = *seq_offsets.last()?;
        // The entries' offsets count one more than the samples (read from the file: no overflow).
        let entry_offsets = u64::try_from(samples).ok()?.checked_add(1)?;
        if !offsets_ok(&seq_offsets, samples) {
            return None;
        }
        let is_f64 = tag & F64_BIT != 0;
        let data = match (spec.kind, tag & 0xff) {
            (StreamKind::Dense, TAG_DENSE) if is_f64 == f64 && dim == spec.dim as u64 => {
                if a != (samples as u64).checked_mul(dim)? {
                    return None;
                }
                StreamValues::Dense { dim: spec.dim, values: r.values(f64, a)? }
            }
            (StreamKind::SparseI32 | StreamKind::SparseU64, TAG_SPARSE) if is_f64 == f64 => {
                let ids = tag & (U64_INDICES_BIT | U32_INDICES_BIT);
                let feature_ids = ids != 0;
                if ids == U64_INDICES_BIT | U32_INDICES_BIT
                    || feature_ids != (spec.kind == StreamKind::SparseU64)
                    || a != entry_offsets
                    || b != c
                {
                    return None;
                }
                let sample_offsets: Vec<usize> = r.array(a)?;
                if !offsets_ok(&sample_offsets, usize::try_from(b).ok()?) {
                    return None;
                }
                let indices = match ids {
                    U64_INDICES_BIT => Indices::U64(r.column(b)?),
                    U32_INDICES_BIT => Indices::U32(r.column(b)?),
                    _ => {
                        let ix: Column<i32> = r.column(b)?;
                        if ix.iter().any(|&i| usize::try_from(i).map_or(true, |i| i >= spec.dim)) {
                            return None;
                        }
                        Indices::I32(ix)
                    }
                };
                StreamValues::Sparse { sample_offsets, indices, values: r.values(f64, c)? }
            }
            (StreamKind::Strings, TAG_STRINGS) => {
                if a != entry_offsets {
                    return None;
                }
                let offsets: Vec<usize> = r.array(a)?;
                if !offsets_ok(&offsets, usize::try_from(b).ok()?) {
                    return None;
                }
                let bytes: Vec<u8> = r.array(b)?;
                r.take(b.next_multiple_of(8) - b)?;
                StreamValues::Strings { offsets, bytes }
            }
            _ => return None,
        };
        streams.push(StreamData::new(seq_offsets, data));
    }
    if r.at != r.end {
        return None;
    }
    Some((ParsedChunk { chunk: want.chunk, num_sequences: want.num_sequences, streams }, loaded_as, checksum))
}

#[cfg(test)]
mod tests;
