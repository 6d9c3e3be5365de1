//! The object cache: object byte ranges (chunks) on disk, under `state_dir/objects` (or a configured
//! directory, typically local NVMe), bounded in bytes, least recently used out first.
//!
//! One file per (object URL, ETag, start, end), named by a hash of the four, written privately
//! and atomically for readers ([`state_file::write_replacing_unsynced`]: `0600`, `O_CREAT|O_EXCL`,
//! rename; not fsynced, which would cost more than the fetch) and read back only if trusted
//! ([`state_file::open_trusted`]) and of the expected length: an interrupted or foreign file is
//! fetched again, never served. The cache records the kernel's boot id (`.boot-id`); after a
//! reboot (when unsynced bytes may not have reached the disk) every entry is dropped. Two threads that want the same
//! range fetch it once (the second waits). A fetch that the store failed (after its retries and
//! deadlines) fails the same way, without a request, for whoever asks for the range within
//! [`FAILED_HOLD`]: the readahead stage's fetch and the parser that then wants the range do not
//! wait for a stalled store twice. An entry is evicted by unlinking its file: a reader
//! that opened it keeps reading it. After a restart the directory is scanned, and its files count
//! as used in the order of their modification times.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, UNIX_EPOCH};

use super::{ObjectMeta, ObjectStore};
use crate::format::errors::DataError;
use crate::hash::Fnv1a;
use crate::state_file::{self, unix_now, FileVersion};

mod ahead;
mod tee;
mod trailer;
use ahead::NoRoom;
use trailer::{entry_sum, holds_its_trailer, trailer, Summing, TRAILER_BYTES};

/// The file that records the boot the cache's files were written in.
const BOOT_ID: &str = ".boot-id";

/// How long a range whose fetch the store failed fails at once, without a request: long enough
/// for the parser to take the range the readahead stage failed to fetch ahead of it, short against
/// the retries the failed fetch made (`object_retry_secs`).
pub const FAILED_HOLD: Duration = Duration::from_secs(10);

/// The warning of ranges read into memory because the cache could not keep them: a line every
/// 10 s at most (a full disk fails every range).
static MEMORY_READS_LOG: crate::throttle::LogThrottle = crate::throttle::LogThrottle::new(Duration::from_secs(10));

/// What the cache holds and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCacheStats {
    /// Ranges found on disk.
    pub hits: u64,
    /// Ranges fetched.
    pub misses: u64,
    /// Bytes fetched from object storage.
    pub fetched_bytes: u64,
    /// Entries evicted.
    pub evictions: u64,
    /// Bytes on disk now.
    pub bytes: u64,
    /// Entries on disk now.
    pub entries: u64,
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    used: u64,
    /// Its file's version when its bytes were last checked against its trailer in this run, once
    /// that version had settled ([`FileVersion::settled_by`]); `None`: to be checked at its next
    /// use (also one written in this run). Found by a probe: bytes changed on disk after an
    /// entry's first check, their modification time put back, were served for the rest of the
    /// run; an entry whose version differs is checked again before it is served.
    verified: Option<FileVersion>,
}

/// The file system block the bound counts an entry in ([`ObjectCache::on_disk`]).
const BLOCK_BYTES: u64 = 4096;

#[derive(Debug, Default)]
struct State {
    scanned: bool,
    entries: HashMap<String, Entry>,
    fetching: HashSet<String>,
    /// Ranges whose fetch the store failed, and when.
    failed: HashMap<String, (DataError, Instant)>,
    /// Bytes on disk reserved for entries being written (fetches, the index pass's copy):
    /// counted with the entries against the bound, so writes at once stay within it together.
    pending: u64,
    /// Fetches holding a reservation in `pending` (the rest is the index passes' copies).
    fetches_reserving: u64,
    tick: u64,
    stats: ObjectCacheStats,
}

/// The cache (see the module documentation).
#[derive(Debug)]
pub struct ObjectCache {
    dir: PathBuf,
    max_bytes: u64,
    /// What the bound counts an entry in: [`BLOCK_BYTES`] (1 in unit tests of tiny ranges).
    block: u64,
    state: Mutex<State>,
    fetched: Condvar,
}

impl ObjectCache {
    /// A cache in `dir` (created `0700` when first written) of at most `max_bytes`.
    #[must_use]
    pub fn new(dir: PathBuf, max_bytes: u64) -> Self {
        Self { dir, max_bytes, block: BLOCK_BYTES, state: Mutex::new(State::default()), fetched: Condvar::new() }
    }

    /// What an entry file of `len` bytes (trailer included) takes on disk, as the bound counts it:
    /// whole blocks (found by a probe: 3,000 ranges of 30–90 bytes, counted by their lengths,
    /// took 35 times the bound on disk).
    fn on_disk(&self, len: u64) -> u64 {
        len.div_ceil(self.block).saturating_mul(self.block)
    }

    /// The directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit, in bytes.
    #[must_use]
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Whether a range of `len` bytes fits the cache as an entry (its trailer included).
    #[must_use]
    pub fn keeps(&self, len: u64) -> bool {
        self.on_disk(len.saturating_add(TRAILER_BYTES)) <= self.max_bytes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counters and sizes now.
    #[must_use]
    pub fn stats(&self) -> ObjectCacheStats {
        let s = self.lock();
        ObjectCacheStats {
            bytes: s.entries.values().map(|e| e.bytes).sum(),
            entries: s.entries.len() as u64,
            ..s.stats
        }
    }

    fn key(object: &ObjectMeta, start: u64, end: u64) -> String {
        let mut h = Fnv1a::new();
        h.field(object.url.as_bytes());
        h.field(object.etag.as_bytes());
        h.u64(start);
        h.u64(end);
        let name = object.url.rsplit('/').next().unwrap_or("object");
        let name: String =
            name.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')).take(64).collect();
        format!("{name}.{start}-{end}.{:016x}.chunk", h.finish())
    }

    /// Whether the range is on disk now.
    #[must_use]
    pub fn contains(&self, object: &ObjectMeta, start: u64, end: u64) -> bool {
        let mut s = self.lock();
        self.scan(&mut s);
        s.entries.contains_key(&Self::key(object, start, end))
            || s.entries.contains_key(&Self::key(object, 0, object.size))
    }

    /// Reserves `bytes` on disk for an entry about to be written, evicting the least recently
    /// used entries for room: `false` (nothing reserved) when the entries and the other writes'
    /// reservations leave too little even then.
    fn reserve(&self, s: &mut State, bytes: u64) -> bool {
        self.scan(s);
        if s.pending.saturating_add(bytes) > self.max_bytes {
            return false;
        }
        s.pending += bytes;
        self.evict(s, "");
        true
    }

    /// Gives back a reservation of [`ObjectCache::reserve`] (its entry kept or given up).
    fn release(&self, bytes: u64) {
        let mut s = self.lock();
        s.pending = s.pending.saturating_sub(bytes);
        self.fetched.notify_all();
    }

    /// Reads what a previous run left (once).
    fn scan(&self, s: &mut State) {
        if s.scanned {
            return;
        }
        s.scanned = true;
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let marker = self.dir.join(BOOT_ID);
        let same_boot = !boot.is_empty() && std::fs::read_to_string(&marker).is_ok_and(|b| b == boot);
        let mut found: Vec<(u64, String, u64)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            if name == BOOT_ID {
                continue;
            }
            // Only the cache's own files: a directory shared by mistake keeps everything else.
            if state_file::is_temp_name(&name) {
                // A temporary file of an interrupted write.
                if !state_file::writer_alive(&name) {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            if !meta.is_file() || !is_entry_name(&name) {
                continue;
            }
            if !same_boot {
                // Written before the machine restarted: maybe not on disk whole.
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let when = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
            found.push((when, name, meta.len()));
        }
        found.sort();
        for (_, name, bytes) in found {
            s.tick += 1;
            s.entries.insert(name, Entry { bytes: self.on_disk(bytes), used: s.tick, verified: None });
        }
        // A bound lowered since the last run applies at once (found by a probe: the entries of a
        // larger one stayed for good, as only a new entry evicted).
        self.evict(s, "");
        if !same_boot && !boot.is_empty() {
            let _ = state_file::write_atomic(&marker, boot.as_bytes());
        }
    }

    /// An open file holding bytes `start..end` of `object` (at offset 0), fetched from `store`
    /// if it is not on disk.
    ///
    /// # Errors
    /// The store's errors (naming the URL), and I/O errors of the cache directory.
    pub fn fetch(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectMeta,
        start: u64,
        end: u64,
    ) -> Result<Cached, DataError> {
        self.fetch_needed(store, object, start, end).map_err(|(e, _)| e)
    }

    /// [`ObjectCache::fetch_kept`] of a range a parser needs now: never skipped (without room it
    /// is read into memory).
    fn fetch_needed(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectMeta,
        start: u64,
        end: u64,
    ) -> Result<Cached, (DataError, bool)> {
        self.fetch_kept(store, object, start, end, NoRoom::ReadIntoMemory)?
            .ok_or_else(|| (DataError::Dataset("the object cache skipped a range it must read".into()), false))
    }

    /// [`ObjectCache::fetch`], its error with whether the store failed (else the directory);
    /// `None` when there is no room for the range and `no_room` says to skip it.
    fn fetch_kept(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectMeta,
        start: u64,
        end: u64,
        no_room: NoRoom,
    ) -> Result<Option<Cached>, (DataError, bool)> {
        let key = Self::key(object, start, end);
        let path = self.dir.join(&key);
        let url = Path::new(&object.url);
        let whole = Self::key(object, 0, object.size);
        let bytes = self.on_disk(end - start + TRAILER_BYTES);
        let mut keep = self.keeps(end - start);
        {
            let mut s = self.lock();
            self.scan(&mut s);
            loop {
                // The whole object (kept by the index pass) holds every range of it.
                if whole != key && s.entries.contains_key(&whole) {
                    let (back, file) = self.hit(s, &whole, object.size, &object.url);
                    s = back;
                    if let Some(file) = file {
                        return Ok(Some(Cached { file, base: 0 }));
                    }
                    continue;
                }
                if s.entries.contains_key(&key) {
                    let (back, file) = self.hit(s, &key, end - start, &object.url);
                    s = back;
                    if let Some(file) = file {
                        return Ok(Some(Cached { file, base: start }));
                    }
                    continue;
                }
                if s.fetching.contains(&key) {
                    s = self.fetched.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
                    continue;
                }
                if let Some((e, when)) = s.failed.get(&key) {
                    if when.elapsed() < FAILED_HOLD {
                        return Err((e.clone(), true));
                    }
                    s.failed.remove(&key);
                }
                s.fetching.insert(key.clone());
                s.stats.misses += 1;
                break;
            }
            // Room on disk for the entry before it is written: other fetches' entries in the
            // making count (found by a probe: `object_fetches` ranges written at once, each
            // counted once whole, took 6 times the bound). A range the whole cache cannot hold
            // is read into memory, uncached, never written; so is one whose room only index
            // passes' copies of whole objects hold (they may stream for minutes: not waited for).
            while keep && !self.reserve(&mut s, bytes) {
                keep = s.fetches_reserving > 0;
                if keep {
                    s = self.fetched.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            }
            if !keep && no_room == NoRoom::Skip {
                s.fetching.remove(&key);
                s.stats.misses -= 1;
                self.fetched.notify_all();
                return Ok(None);
            }
            s.fetches_reserving += u64::from(keep);
        }
        let mut by_the_store = false;
        let result = if keep {
            self.download(store, object, start, end, &path, &mut by_the_store).and_then(|()| {
                open_range(&path, end - start).map(|(file, _)| file).ok_or_else(|| {
                    DataError::io(
                        url,
                        std::io::Error::other(format!("the cached range {} could not be read back", path.display())),
                    )
                })
            })
        } else {
            if let Some(left_out) = MEMORY_READS_LOG.admit(Instant::now()) {
                tracing::warn!(url = %object.url, start, end, object_cache_bytes = self.max_bytes, left_out, "a range the object cache has no room for is read into memory, uncached: give object_cache_bytes room for a few chunks besides the objects being indexed");
            }
            by_the_store = true;
            Self::in_memory(store, object, start, end)
        };
        let mut s = self.lock();
        s.fetching.remove(&key);
        s.failed.retain(|_, (_, when)| when.elapsed() < FAILED_HOLD);
        if let (Err(e), true) = (&result, by_the_store) {
            s.failed.insert(key.clone(), (e.clone(), Instant::now()));
        }
        if result.is_ok() {
            s.stats.fetched_bytes += end - start;
        }
        if keep {
            s.pending = s.pending.saturating_sub(bytes);
            s.fetches_reserving -= 1;
            if result.is_ok() {
                s.tick += 1;
                let tick = s.tick;
                // Written just now: not settled, checked at its next use.
                s.entries.insert(key.clone(), Entry { bytes, used: tick, verified: None });
                self.evict(&mut s, &key);
            }
        }
        self.fetched.notify_all();
        drop(s);
        result.map(|file| Some(Cached { file, base: start })).map_err(|e| (e, by_the_store))
    }

    /// [`ObjectCache::fetch`] of a chunk a parser reads now: when the cache's directory fails
    /// (a full disk), not the store, the range is read into memory instead, uncached, so that
    /// the object stays readable on this node (one warning a while).
    ///
    /// # Errors
    /// The store's errors (naming the URL), and the directory's when the read into memory fails
    /// too.
    pub fn fetch_or_read(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectMeta,
        start: u64,
        end: u64,
    ) -> Result<Cached, DataError> {
        match self.fetch_needed(store, object, start, end) {
            Ok(cached) => Ok(cached),
            Err((e, false)) => {
                if let Some(left_out) = MEMORY_READS_LOG.admit(Instant::now()) {
                    tracing::warn!(url = %object.url, start, end, error = %e, left_out, "cannot keep a range in the object cache; read from the store into memory instead");
                }
                let file = Self::in_memory(store, object, start, end).map_err(|_| e)?;
                Ok(Cached { file, base: start })
            }
            Err((e, true)) => Err(e),
        }
    }

    /// Bytes `start..end` of `object` from `store` in an anonymous in-memory file.
    fn in_memory(store: &dyn ObjectStore, object: &ObjectMeta, start: u64, end: u64) -> Result<File, DataError> {
        let url = Path::new(&object.url);
        let mut file = minibatchd_sys::files::anonymous_file("minibatchd-range").map_err(|e| DataError::io(url, e))?;
        let written = store.read_range(object, start, end, &mut file).map_err(super::RemoteError::into_data)?;
        if written != end - start {
            return Err(DataError::io(url, std::io::Error::other("a short range from object storage")));
        }
        Ok(file)
    }

    /// Entry `name` (on disk and in `s`) of a range of `len` bytes, opened: checked against its
    /// trailer at its first use in this run and again whenever its file's version changed since
    /// (outside the lock: a whole object may be large), and counted as used. `None` when it is
    /// damaged, foreign or gone: the entry is dropped (and fetched again by the caller).
    fn hit<'s>(
        &'s self,
        mut s: MutexGuard<'s, State>,
        name: &str,
        len: u64,
        url: &str,
    ) -> (MutexGuard<'s, State>, Option<File>) {
        let path = self.dir.join(name);
        // Before the open: a version is trusted only if it had settled by then.
        let now = unix_now();
        let file = open_range(&path, len);
        let Some((file, version)) = file else {
            // Gone or cut since it was written (checked or not): removed from the cache, so the
            // caller fetches it again. Found by a probe: a checked entry whose file another
            // process had removed stayed, and the caller's loop opened it again for ever,
            // holding the lock (the daemon hung, SIGTERM included).
            tracing::warn!(url, entry = %path.display(), "an object cache entry is gone or cut short on disk; fetched again");
            s.entries.remove(name);
            let _ = std::fs::remove_file(&path);
            return (s, None);
        };
        // Checked in this run, and its file unchanged since.
        let file = if s.entries.get(name).is_some_and(|e| e.verified == Some(version)) {
            Some(file)
        } else {
            drop(s);
            let good = holds_its_trailer(&file, name, len);
            s = self.lock();
            if !good {
                tracing::warn!(url, entry = %path.display(), "an object cache entry does not hold what it was written with; fetched again");
            }
            good.then_some(file)
        };
        if file.is_some() {
            s.tick += 1;
            let tick = s.tick;
            if let Some(e) = s.entries.get_mut(name) {
                e.used = tick;
                e.verified = version.settled_by(now).then_some(version);
            }
            s.stats.hits += 1;
        } else if !s.fetching.contains(name) {
            // Not if another thread fetches it again (its new file may be renamed in at any time)
            // or has (that entry is a new file). The lock is held: no fetch begins meanwhile.
            match std::fs::symlink_metadata(&path) {
                Ok(m) if FileVersion::of(&m) == version => {
                    s.entries.remove(name);
                    let _ = std::fs::remove_file(&path);
                }
                Ok(_) => {}
                Err(_) => {
                    s.entries.remove(name);
                }
            }
        }
        (s, file)
    }

    /// Registers a whole object the index pass streamed into `tmp` (complete: `object.size`
    /// bytes and its trailer), in the room `reserved` for it, which it gives back.
    fn keep_whole(&self, object: &ObjectMeta, tmp: &Path, reserved: u64) {
        let key = Self::key(object, 0, object.size);
        if std::fs::rename(tmp, self.dir.join(&key)).is_err() {
            let _ = std::fs::remove_file(tmp);
            self.release(reserved);
            return;
        }
        let mut s = self.lock();
        s.pending = s.pending.saturating_sub(reserved);
        self.fetched.notify_all();
        s.tick += 1;
        let tick = s.tick;
        // Written just now: not settled, checked at its next use.
        s.entries.insert(
            key.clone(),
            Entry { bytes: self.on_disk(object.size + TRAILER_BYTES), used: tick, verified: None },
        );
        self.evict(&mut s, &key);
    }

    /// Fetches the range into `path`; `by_the_store` tells a failure of the store from one of
    /// the cache's directory.
    fn download(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectMeta,
        start: u64,
        end: u64,
        path: &Path,
        by_the_store: &mut bool,
    ) -> Result<(), DataError> {
        let url = Path::new(&object.url);
        let mut failure = None;
        let mut disk = false;
        let written = state_file::write_replacing_unsynced(path, &mut |out| {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let mut summing = Summing { out, crc: entry_sum(&name), failed: false };
            let read = store.read_range(object, start, end, &mut summing);
            disk = summing.failed;
            read.map_err(|e| {
                let io = std::io::Error::other(e.to_string());
                failure = Some(e);
                io
            })?;
            let crc = summing.crc.finalize();
            out.write_all(&trailer(crc))
        });
        if let Some(e) = failure {
            // A write into the cache that failed (a full disk) is the directory's failure.
            *by_the_store = !disk;
            return Err(e.into_data());
        }
        written.map_err(|e| {
            DataError::io(url, std::io::Error::new(e.kind(), format!("caching a range in {}: {e}", self.dir.display())))
        })
    }

    /// Removes the least recently used entries (never `keep`) until they and the reservations
    /// of entries being written fit the cache's limit.
    fn evict(&self, s: &mut State, keep: &str) {
        let mut total: u64 = s.entries.values().map(|e| e.bytes).sum::<u64>() + s.pending;
        while total > self.max_bytes {
            let Some(victim) = s
                .entries
                .iter()
                .filter(|(k, _)| k.as_str() != keep)
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = s.entries.remove(&victim) {
                total -= e.bytes;
                s.stats.evictions += 1;
                let _ = std::fs::remove_file(self.dir.join(&victim));
            }
        }
        // A range larger than the whole cache is served once and not kept.
        if total > self.max_bytes && s.entries.remove(keep).is_some() {
            s.stats.evictions += 1;
            let _ = std::fs::remove_file(self.dir.join(keep));
        }
    }
}

/// A cached range: `file` holds the object's bytes from offset `base` on.
#[derive(Debug)]
pub struct Cached {
    /// The open file.
    pub file: File,
    /// The object offset of the file's first byte.
    pub base: u64,
}

/// Whether `name` is an entry's name ([`ObjectCache::key`]: `{name}.{start}-{end}.{hash:016x}.chunk`).
fn is_entry_name(name: &str) -> bool {
    let Some(rest) = name.strip_suffix(".chunk") else { return false };
    let mut parts = rest.rsplitn(3, '.');
    let (Some(hash), Some(range), Some(_object)) = (parts.next(), parts.next(), parts.next()) else { return false };
    state_file::is_hex64(hash)
        && range.split_once('-').is_some_and(|(a, b)| state_file::is_number(a) && state_file::is_number(b))
}

/// The cached file at `path` if it is trusted and holds `len` bytes and a trailer, with its
/// version.
fn open_range(path: &Path, len: u64) -> Option<(File, FileVersion)> {
    let (file, meta) = state_file::open_trusted(path).ok()?;
    (meta.len() == len + TRAILER_BYTES).then(|| (file, FileVersion::of(&meta)))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::trailer::TRAILER_MARK;
    use super::*;
    use crate::remote::RemoteError;

    /// A cache of at most `max_bytes` that counts its entries by their lengths (the tests' ranges
    /// are tens of bytes).
    fn tiny(dir: PathBuf, max_bytes: u64) -> ObjectCache {
        ObjectCache { block: 1, ..ObjectCache::new(dir, max_bytes) }
    }

    /// Found by a probe: 3,000 ranges of tens of bytes, counted by their lengths, took 35 times
    /// the bound on disk. Each counts its 4 KiB blocks.
    #[test]
    fn an_entry_counts_its_blocks_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let o = object();
        let cache = ObjectCache::new(dir.path().join("objects"), 3 * 4096);
        for k in 0..5u64 {
            cache.fetch(&store, &o, 10 * k, 10 * k + 10).expect("fetch");
        }
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes), (3, 3 * 4096), "three blocks' worth kept");
        assert!(cache.keeps(3 * 4096 - TRAILER_BYTES) && !cache.keeps(3 * 4096 - TRAILER_BYTES + 1));
    }

    /// A store in memory; with `fail`, every read fails; with `gauge`, it notes in `peak` the
    /// most bytes on disk in that directory while it writes a range, and takes a while to, so
    /// that fetches overlap.
    #[derive(Debug, Default)]
    struct Memory {
        data: Vec<u8>,
        reads: AtomicU64,
        fail: bool,
        gauge: Option<PathBuf>,
        peak: AtomicU64,
    }

    impl ObjectStore for Memory {
        fn list(&self, _: &str) -> Result<Vec<ObjectMeta>, RemoteError> {
            unreachable!()
        }
        fn read_range(&self, o: &ObjectMeta, start: u64, end: u64, out: &mut dyn Write) -> Result<u64, RemoteError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            if self.fail {
                return Err(RemoteError::Other { url: o.url.clone(), message: "cannot reach the object store".into() });
            }
            let (start, end) = (usize::try_from(start).expect("small"), usize::try_from(end).expect("small"));
            out.write_all(&self.data[start..end]).expect("write");
            if let Some(dir) = &self.gauge {
                out.flush().expect("flush");
                self.peak.fetch_max(on_disk(dir), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok((end - start) as u64)
        }
        fn open(&self, _: &ObjectMeta) -> Result<Box<dyn Read + Send>, RemoteError> {
            unreachable!()
        }
        fn get(&self, _: &str, _: u64) -> Result<Option<Vec<u8>>, RemoteError> {
            unreachable!()
        }
        fn put_if_absent(&self, _: &str, _: Vec<u8>) -> Result<bool, RemoteError> {
            unreachable!()
        }
        fn delete(&self, _: &str) -> Result<(), RemoteError> {
            unreachable!()
        }
    }

    fn object() -> ObjectMeta {
        ObjectMeta { url: "s3://b/data.txt".into(), size: 100, etag: "\"e1\"".into() }
    }

    /// A cached file's range: its bytes before the trailer.
    fn read(mut f: File) -> Vec<u8> {
        let mut v = Vec::new();
        f.read_to_end(&mut v).expect("read");
        let at = v.len() - TRAILER_MARK.len() - 4;
        assert_eq!(v[at + 4..], TRAILER_MARK, "a trailer");
        v.truncate(at);
        v
    }

    #[test]
    fn a_range_is_fetched_once_then_served_from_disk_and_the_cache_stays_within_its_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let cache = tiny(dir.path().join("objects"), 66);
        let o = object();
        assert_eq!(read(cache.fetch(&store, &o, 10, 30).expect("fetch").file), (10..30u8).collect::<Vec<_>>());
        assert_eq!(read(cache.fetch(&store, &o, 10, 30).expect("again").file), (10..30u8).collect::<Vec<_>>());
        assert_eq!(store.reads.load(Ordering::SeqCst), 1, "the second read came from disk");
        // Two more ranges of 20 (28 bytes each with their trailers): the least recently used one
        // goes.
        cache.fetch(&store, &o, 30, 50).expect("fetch");
        cache.fetch(&store, &o, 50, 70).expect("fetch");
        let s = cache.stats();
        assert_eq!((s.entries, s.bytes, s.evictions, s.hits, s.misses), (2, 56, 1, 1, 3));
        assert!(!cache.contains(&o, 10, 30) && cache.contains(&o, 50, 70));
        // Another ETag is another object: never served from the old one's range.
        let newer = ObjectMeta { etag: "\"e2\"".into(), ..o.clone() };
        assert!(!cache.contains(&newer, 50, 70));
        // A restart finds what is on disk.
        let again = tiny(dir.path().join("objects"), 66);
        assert!(again.contains(&o, 50, 70));
        // Written in another boot (the machine restarted: unsynced writes may be torn): dropped.
        std::fs::write(dir.path().join("objects").join(BOOT_ID), "another boot").expect("marker");
        let rebooted = tiny(dir.path().join("objects"), 66);
        assert!(!rebooted.contains(&o, 50, 70), "an entry of an earlier boot was kept");
        let again = tiny(dir.path().join("objects"), 66);
        again.fetch(&store, &o, 50, 70).expect("fetch");
        let again = tiny(dir.path().join("objects"), 66);
        assert!(again.contains(&o, 50, 70), "an entry of this boot is found after a restart");
        // A damaged file (wrong length) is fetched again, not served.
        let name = ObjectCache::key(&o, 50, 70);
        std::fs::write(dir.path().join("objects").join(&name), b"short").expect("damage");
        assert_eq!(read(again.fetch(&store, &o, 50, 70).expect("refetch").file), (50..70u8).collect::<Vec<_>>());
    }

    /// A range the store failed to deliver fails again at once for the next thread that wants
    /// it (the parser after the readahead stage's fetch), not after another wait on the store;
    /// later it is fetched again, and another range is not concerned.
    #[test]
    fn a_failed_fetch_fails_the_next_asker_at_once_for_a_while() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { fail: true, ..Memory::default() };
        let cache = tiny(dir.path().join("objects"), 1000);
        let o = object();
        let first = cache.fetch(&store, &o, 10, 30).expect_err("failed").to_string();
        let second = cache.fetch(&store, &o, 10, 30).expect_err("failed").to_string();
        assert_eq!((first.contains("cannot reach"), first == second), (true, true), "{first} / {second}");
        assert_eq!(store.reads.load(Ordering::SeqCst), 1, "the held failure asked the store again");
        cache.fetch(&store, &o, 30, 50).expect_err("failed");
        assert_eq!(store.reads.load(Ordering::SeqCst), 2, "another range is fetched");
        // Past the hold, the range is asked for again.
        cache.lock().failed.values_mut().for_each(|(_, when)| *when -= FAILED_HOLD);
        cache.fetch(&store, &o, 10, 30).expect_err("failed");
        assert_eq!(store.reads.load(Ordering::SeqCst), 3);
    }

    /// Found by a hostile probe: an entry was checked for its owner, mode and length only; one
    /// byte changed, or another entry's bytes of the same length, was served after a restart
    /// (293 samples twice and 293 never in a sweep) and then kept in the parsed cache. Each entry
    /// now carries its bytes' CRC-32, checked at its first use in a run: a changed one is
    /// fetched again.
    #[test]
    fn an_entry_changed_on_disk_is_fetched_again_not_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let o = object();
        let cache = tiny(dir.path().join("objects"), 1000);
        cache.fetch(&store, &o, 10, 30).expect("fetch");
        cache.fetch(&store, &o, 30, 50).expect("fetch");
        let path = |start: u64, end: u64| dir.path().join("objects").join(ObjectCache::key(&o, start, end));
        // A bit flipped in place.
        let mut bytes = std::fs::read(path(10, 30)).expect("entry");
        bytes[5] ^= 1;
        std::fs::write(path(10, 30), &bytes).expect("flip");
        // Another entry's bytes, trailer and all, of the same length.
        std::fs::copy(path(30, 50), path(50, 70)).expect("copy");
        let restarted = tiny(dir.path().join("objects"), 1000);
        assert!(restarted.contains(&o, 50, 70), "a planted entry of the right name and length");
        let reads = store.reads.load(Ordering::SeqCst);
        assert_eq!(read(restarted.fetch(&store, &o, 10, 30).expect("fetch").file), (10..30u8).collect::<Vec<_>>());
        assert_eq!(read(restarted.fetch(&store, &o, 50, 70).expect("fetch").file), (50..70u8).collect::<Vec<_>>());
        assert_eq!(store.reads.load(Ordering::SeqCst), reads + 2, "both fetched again");
        // A good entry is served from disk, checked once.
        assert_eq!(read(restarted.fetch(&store, &o, 30, 50).expect("fetch").file), (30..50u8).collect::<Vec<_>>());
        assert_eq!(store.reads.load(Ordering::SeqCst), reads + 2);
        // The whole object kept by the index pass, changed on disk: each range is fetched instead.
        let whole = tiny(dir.path().join("whole"), 1000);
        let mut streamed = Vec::new();
        whole.tee(&o, Box::new(std::io::Cursor::new(store.data.clone()))).read_to_end(&mut streamed).expect("read");
        let kept = dir.path().join("whole").join(ObjectCache::key(&o, 0, 100));
        let mut bytes = std::fs::read(&kept).expect("whole entry");
        bytes[40] ^= 0x80;
        std::fs::write(&kept, &bytes).expect("flip");
        let whole = tiny(dir.path().join("whole"), 1000);
        assert_eq!(read(whole.fetch(&store, &o, 35, 45).expect("fetch").file), (35..45u8).collect::<Vec<_>>());
        assert_eq!(store.reads.load(Ordering::SeqCst), reads + 3, "the range fetched, the whole object dropped");
        assert!(!whole.contains(&o, 0, 100));
    }

    /// Found by a probe: an entry already checked in this run whose file then went (another
    /// process sharing the directory evicted it, or someone cleaned it) was opened again and
    /// again for ever, the cache's lock held: the session hung, and SIGTERM with it. It is
    /// fetched again.
    #[test]
    fn a_checked_entry_whose_file_went_is_fetched_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let o = object();
        let cache = tiny(dir.path().join("objects"), 1000);
        let path = |start: u64, end: u64| dir.path().join("objects").join(ObjectCache::key(&o, start, end));
        for (start, end) in [(10, 30), (30, 50)] {
            assert_eq!(read(cache.fetch(&store, &o, start, end).expect("fetch").file).len(), 20);
            assert_eq!(read(cache.fetch(&store, &o, start, end).expect("checked").file).len(), 20);
        }
        let reads = store.reads.load(Ordering::SeqCst);
        // One removed, one cut short.
        std::fs::remove_file(path(10, 30)).expect("rm");
        std::fs::File::options().write(true).open(path(30, 50)).and_then(|f| f.set_len(7)).expect("cut");
        assert_eq!(read(cache.fetch(&store, &o, 10, 30).expect("fetch").file), (10..30u8).collect::<Vec<_>>());
        assert_eq!(read(cache.fetch(&store, &o, 30, 50).expect("fetch").file), (30..50u8).collect::<Vec<_>>());
        assert_eq!(store.reads.load(Ordering::SeqCst), reads + 2, "both fetched again");
        assert!(cache.contains(&o, 10, 30) && cache.contains(&o, 30, 50), "and kept again");
    }

    /// Found by a probe: an entry checked at its first use in a run, then changed on disk in
    /// place — a byte rewritten, its modification time put back — was served as checked for the
    /// rest of the run (71 of 794 minibatches differed from `dump`, without a word). An entry
    /// whose file changed since its check is checked again; unchanged, it is not read twice.
    #[test]
    fn an_entry_changed_after_its_check_is_checked_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let o = object();
        let cache = tiny(dir.path().join("objects"), 1000);
        let path = dir.path().join("objects").join(ObjectCache::key(&o, 10, 30));
        for _ in 0..3 {
            assert_eq!(read(cache.fetch(&store, &o, 10, 30).expect("fetch").file), (10..30u8).collect::<Vec<_>>());
        }
        let reads = store.reads.load(Ordering::SeqCst);
        assert_eq!(reads, 1, "fetched once, then served from disk");
        let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).expect("mtime");
        let mut bytes = std::fs::read(&path).expect("entry");
        bytes[5] ^= 1;
        let f = std::fs::File::options().write(true).open(&path).expect("open");
        std::os::unix::fs::FileExt::write_all_at(&f, &bytes[..8], 0).expect("rewrite");
        f.set_modified(mtime).expect("mtime put back");
        drop(f);
        assert_eq!(read(cache.fetch(&store, &o, 10, 30).expect("fetch").file), (10..30u8).collect::<Vec<_>>());
        assert_eq!(store.reads.load(Ordering::SeqCst), reads + 1, "fetched again, not served");
        assert_eq!(read(cache.fetch(&store, &o, 10, 30).expect("fetch").file), (10..30u8).collect::<Vec<_>>());
        assert_eq!(store.reads.load(Ordering::SeqCst), reads + 1, "the new entry served from disk");
    }

    /// Found by a probe: an object cache pointed at a shared directory (by mistake) removed
    /// `.x.tmp` and `foo.chunk` there, files it never wrote. Only names the cache makes are its
    /// own: entries (`{name}.{start}-{end}.{hash}.chunk`) and temporary files of dead writers.
    #[test]
    fn a_shared_directory_keeps_every_file_the_cache_did_not_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let objects = dir.path().join("objects");
        std::fs::create_dir(&objects).expect("mkdir");
        let foreign = [".x.tmp", "foo.chunk", "a.ctf.0-100.chunk", "a.1-2.XYZ.chunk", "notes.txt", ".hidden"];
        for name in foreign {
            std::fs::write(objects.join(name), b"not the cache's").expect("write");
        }
        let dead = ".a.ctf.0-9.00ff00ff00ff00ff.chunk.4294967.0.tmp";
        std::fs::write(objects.join(dead), b"left by a crashed writer").expect("write");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let o = object();
        let cache = tiny(objects.clone(), 45);
        for start in [0u64, 20, 40, 60] {
            cache.fetch(&store, &o, start, start + 20).expect("fetch");
        }
        drop(cache);
        let again = tiny(objects.clone(), 45);
        again.fetch(&store, &o, 80, 100).expect("fetch");
        for name in foreign {
            assert!(objects.join(name).exists(), "{name} was removed");
        }
        assert!(!objects.join(dead).exists(), "a dead writer's temporary file is removed");
    }

    #[test]
    fn the_index_pass_stream_keeps_the_whole_object_and_every_range_is_read_from_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let cache: &'static ObjectCache = Box::leak(Box::new(tiny(dir.path().join("objects"), 1000)));
        let o = object();
        // Read to the end: kept.
        let mut streamed = Vec::new();
        cache.tee(&o, Box::new(std::io::Cursor::new(store.data.clone()))).read_to_end(&mut streamed).expect("read");
        assert_eq!(streamed, store.data);
        assert!(cache.contains(&o, 30, 60));
        let c = cache.fetch(&store, &o, 30, 60).expect("fetch");
        assert_eq!((c.base, store.reads.load(Ordering::SeqCst)), (0, 0), "served from the whole object, not fetched");
        // A stream that stops early keeps nothing.
        let other = ObjectMeta { url: "s3://b/other.txt".into(), ..o.clone() };
        let mut part = [0u8; 10];
        cache.tee(&other, Box::new(std::io::Cursor::new(store.data.clone()))).read_exact(&mut part).expect("read");
        assert!(!cache.contains(&other, 0, 10));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("objects"))
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".whole"))
            .collect();
        assert!(leftovers.is_empty(), "a partial copy was left behind");
    }

    /// Bytes of every file in `dir` (entries and temporary files) but the boot id's.
    fn on_disk(dir: &Path) -> u64 {
        let files = std::fs::read_dir(dir).expect("dir").flatten().filter(|e| e.file_name() != BOOT_ID);
        files.filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
    }

    /// Found by a probe: ranges fetched at once were each counted only once written whole, so
    /// `object_fetches` of them took six times the bound on disk; and a range larger than the
    /// whole cache was written before it was dropped.
    #[test]
    fn fetches_at_once_stay_within_the_bound_together_and_a_range_too_large_is_never_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let objects = dir.path().join("objects");
        std::fs::create_dir(&objects).expect("mkdir");
        let store = Memory { data: (0..=255u8).collect(), gauge: Some(objects.clone()), ..Memory::default() };
        let o = ObjectMeta { size: 256, ..object() };
        // Entries of 40 bytes and their trailers, 48: two fit in 100.
        let cache = tiny(objects.clone(), 100);
        std::thread::scope(|s| {
            for k in 0..6u8 {
                let (cache, store, o) = (&cache, &store, &o);
                s.spawn(move || {
                    let start = 40 * u64::from(k);
                    let got = read(cache.fetch(store, o, start, start + 40).expect("fetch").file);
                    assert_eq!(got, (40 * k..40 * k + 40).collect::<Vec<_>>());
                });
            }
        });
        let peak = store.peak.load(Ordering::SeqCst);
        assert!(peak <= 100, "{peak} bytes on disk at once under a bound of 100");
        assert!(on_disk(&objects) <= 100 && cache.stats().bytes <= 100);
        // 120 bytes cannot be an entry of a 100-byte cache: served from memory, never written.
        store.peak.store(0, Ordering::SeqCst);
        let before = on_disk(&objects);
        let c = cache.fetch(&store, &o, 100, 220).expect("fetch");
        let mut got = vec![0u8; 120];
        std::os::unix::fs::FileExt::read_exact_at(&c.file, &mut got, 0).expect("read");
        assert_eq!((c.base, got), (100, (100..220u8).collect::<Vec<_>>()));
        assert_eq!(store.peak.load(Ordering::SeqCst), before, "the range was written to the cache's directory");
        assert!(!cache.contains(&o, 100, 220));
    }

    /// Found by a probe: the entries of a run with a larger bound stayed for good under a lower
    /// one (only a new entry evicted); and the index pass's copy of a whole object went past the
    /// bound with the entries already there until it was complete.
    #[test]
    fn a_lowered_bound_applies_at_once_and_the_index_pass_copy_makes_room_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let objects = dir.path().join("objects");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let o = object();
        let cache = tiny(objects.clone(), 1000);
        for k in 0..5u64 {
            cache.fetch(&store, &o, 20 * k, 20 * k + 20).expect("fetch");
        }
        assert_eq!(on_disk(&objects), 5 * 28);
        drop(cache);
        let cache: &'static ObjectCache = Box::leak(Box::new(tiny(objects.clone(), 120)));
        // At its first use.
        assert!(cache.contains(&o, 80, 100), "the most recently written entries stay");
        assert!(cache.stats().bytes <= 120 && on_disk(&objects) <= 120, "{} bytes on disk", on_disk(&objects));
        // A 50-byte object (58 with its trailer) copied while the entries fill 112 of 120.
        let small = ObjectMeta { url: "s3://b/small.txt".into(), size: 50, etag: "\"s\"".into() };
        let mut stream = cache.tee(&small, Box::new(std::io::Cursor::new(vec![9u8; 50])));
        let mut half = [0u8; 25];
        stream.read_exact(&mut half).expect("read");
        assert!(on_disk(&objects) <= 120, "{} bytes on disk during the copy", on_disk(&objects));
        std::io::copy(&mut stream, &mut std::io::sink()).expect("read");
        drop(stream);
        assert!(cache.contains(&small, 0, 50), "the copy was kept");
        assert!(on_disk(&objects) <= 120 && cache.stats().bytes <= 120);
    }

    /// A 120-byte cache's index-pass copy of a 50-byte object, half read: its reservation
    /// leaves no room for a 70-byte range until the stream is read to its end and dropped.
    fn copy_half_streamed(cache: &ObjectCache) -> (ObjectMeta, Box<dyn Read + Send + '_>) {
        let whole = ObjectMeta { url: "s3://b/whole.txt".into(), size: 50, etag: "\"w\"".into() };
        let mut stream = cache.tee(&whole, Box::new(std::io::Cursor::new(vec![9u8; 50])));
        let mut half = [0u8; 25];
        stream.read_exact(&mut half).expect("read");
        (whole, stream)
    }

    /// A fetch does not wait behind an index pass's copy of a whole object (a review: it may
    /// stream for minutes, and the same thread could hold it): without room, the range is read
    /// into memory and served.
    #[test]
    fn a_fetch_does_not_wait_for_room_an_index_pass_copy_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let cache = tiny(dir.path().join("objects"), 120);
        let (whole, mut stream) = copy_half_streamed(&cache);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let c = cache.fetch(&store, &object(), 0, 70).expect("fetch");
                let _ = tx.send(c);
            });
            let c = rx.recv_timeout(Duration::from_secs(10)).expect("the fetch waited for the index pass's copy");
            let mut got = vec![0u8; 70];
            std::os::unix::fs::FileExt::read_exact_at(&c.file, &mut got, 0).expect("read");
            assert_eq!(got, (0..70u8).collect::<Vec<_>>());
        });
        assert!(!cache.contains(&object(), 0, 70), "served uncached");
        std::io::copy(&mut stream, &mut std::io::sink()).expect("read");
        drop(stream);
        assert!(cache.contains(&whole, 0, 50), "the copy was kept");
    }

    /// A fetch ahead of the parser that finds no room downloads nothing (found in review: it
    /// read the range into memory and dropped it, so the parser downloaded it again); with room
    /// again, it keeps the range.
    #[test]
    fn a_fetch_ahead_without_room_downloads_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: (0..100u8).collect(), ..Memory::default() };
        let cache = tiny(dir.path().join("objects"), 120);
        let (_, mut stream) = copy_half_streamed(&cache);
        assert!(!cache.fetch_ahead(&store, &object(), 0, 70).expect("fetch ahead"), "no room: skipped");
        assert_eq!(store.reads.load(Ordering::SeqCst), 0, "nothing downloaded");
        assert!(!cache.contains(&object(), 0, 70));
        assert_eq!(cache.stats().misses, 0, "a skipped range is no miss");
        std::io::copy(&mut stream, &mut std::io::sink()).expect("read");
        drop(stream);
        assert!(cache.fetch_ahead(&store, &object(), 50, 100).expect("fetch ahead"), "room: fetched");
        assert_eq!(store.reads.load(Ordering::SeqCst), 1);
        assert!(cache.contains(&object(), 50, 100));
    }

    #[test]
    fn threads_that_want_the_same_range_fetch_it_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Memory { data: vec![7; 100], ..Memory::default() };
        let cache = tiny(dir.path().join("objects"), 1000);
        let o = object();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| assert_eq!(read(cache.fetch(&store, &o, 0, 100).expect("fetch").file), vec![7; 100]));
            }
        });
        assert_eq!(store.reads.load(Ordering::SeqCst), 1);
    }
}
