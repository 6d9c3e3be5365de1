//! Index an object once per dataset, not once per node.
//!
//! An object's index is looked for, in order: in this node's index cache (`state_dir/index`,
//! when `cache_index` is on); in object storage, beside the object (`<url>.mbdidx.<hash>`) or
//! under a configured prefix (`<prefix><hash of url>.<hash>.mbdidx`), where `<hash>` covers the
//! object's ETag and size and the index options, so a changed object or other options never find
//! an old index. A downloaded index is checked (its checksum, the URL, size, ETag and options it
//! records) before use.
//!
//! When there is none, one node indexes: it takes a lock object (`<index>.lock`, a conditional
//! put that only one node wins), streams the object once, and writes the index with a
//! conditional put (if another node wrote one meanwhile, that one stays); then it removes the
//! lock. A node that finds the lock taken polls for the index for up to [`IndexPlace::wait`], then
//! indexes the object itself (the node holding the lock may have died). Indexing nodes never
//! clobber each other: the first index written stays.

use std::path::Path;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ObjectMeta, Remote, INDEX_POLL};
use crate::format::errors::DataError;
use crate::format::index::FileIndex;
use crate::format::index_cache::{self, FileStamp, Miss};
use crate::hash::Fnv1a;

/// Builds an index by streaming the object, reporting the bytes scanned.
pub type BuildIndex<'a> = dyn FnMut(&mut dyn FnMut(u64)) -> Result<FileIndex, DataError> + 'a;

/// Where shared indexes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexPlace {
    /// `None`: beside each object; `Some("s3://bucket/prefix/")`: under that prefix.
    pub prefix: Option<String>,
    /// How long a node waits for another node's index before indexing the object itself.
    pub wait: Duration,
}

impl Default for IndexPlace {
    fn default() -> Self {
        Self { prefix: None, wait: Duration::from_secs(600) }
    }
}

/// How an object's index was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedIndexOutcome {
    /// From this node's index cache.
    LocalCache,
    /// Downloaded from object storage (another node indexed it).
    Downloaded,
    /// Indexed here (this node held the lock).
    Indexed,
    /// Indexed here after waiting for another node that never wrote it.
    IndexedAfterWait,
}

impl SharedIndexOutcome {
    /// All of them, in the order of [`super::Remote::outcome_counts`].
    pub const ALL: [Self; 4] = [Self::LocalCache, Self::Downloaded, Self::Indexed, Self::IndexedAfterWait];

    /// The metric label.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LocalCache => "local_cache",
            Self::Downloaded => "downloaded",
            Self::Indexed => "indexed",
            Self::IndexedAfterWait => "indexed_after_wait",
        }
    }
}

/// The index cache's record of `object`: its URL, size, and its ETag in place of a file's mtime.
#[must_use]
pub fn stamp(object: &ObjectMeta) -> FileStamp {
    let etag = Fnv1a::of(object.etag.as_bytes());
    FileStamp {
        path: object.url.clone().into(),
        size: object.size,
        mtime_secs: i64::from_le_bytes(etag.to_le_bytes()),
        ..FileStamp::default()
    }
}

/// The URL of `object`'s shared index for `fingerprint`, in the index cache's format version: a
/// node of another version writes and reads its own (under the same URL, a node would wait for a
/// lock holder's index and find only one it cannot read, and could never replace it).
#[must_use]
pub fn index_url(place: &IndexPlace, object: &ObjectMeta, fingerprint: &str) -> String {
    let mut h = Fnv1a::new();
    h.field(object.etag.as_bytes());
    h.u64(object.size);
    h.field(fingerprint.as_bytes());
    h.u64(u64::from(index_cache::VERSION));
    let version = h.finish();
    match &place.prefix {
        None => format!("{}.mbdidx.{version:016x}", object.url),
        Some(prefix) => {
            let sep = if prefix.ends_with('/') { "" } else { "/" };
            format!("{prefix}{sep}{:016x}.{version:016x}.mbdidx", Fnv1a::of(object.url.as_bytes()))
        }
    }
}

/// Whether a listed key is one of minibatchd's own (a shared index or its lock), never data.
#[must_use]
pub fn is_index_key(url: &str) -> bool {
    url.contains(".mbdidx")
}

/// The shared index of `object` at `url`, if there is a usable one. The download holds at most
/// what an index of the object can take (a sequence holds a byte at least), whatever the response
/// claims; a larger or unusable one is set aside with a warning (the caller indexes the object).
fn download(
    remote: &Remote,
    url: &str,
    object: &ObjectMeta,
    stamp: &FileStamp,
    fingerprint: &str,
    name: &Arc<Path>,
    max_sequences: u64,
) -> Result<Option<FileIndex>, DataError> {
    let max_bytes = index_cache::max_encoded_len(stamp, fingerprint, max_sequences.min(object.size));
    let got = match remote.store.get(url, max_bytes) {
        // S3 answers a missing key with 403 to credentials without s3:ListBucket.
        Err(e @ super::RemoteError::Denied { .. }) => {
            tracing::info!(index = %url, error = %e, "no shared index readable here; indexing the object");
            return Ok(None);
        }
        Err(super::RemoteError::TooLarge { .. }) => {
            tracing::warn!(index = %url, max_bytes, "the shared index is larger than an index of this object can be; indexing the object here");
            return Ok(None);
        }
        other => other.map_err(super::RemoteError::into_data)?,
    };
    let Some(bytes) = got else { return Ok(None) };
    match index_cache::decode_bytes(&bytes, stamp, fingerprint, name, max_sequences) {
        Ok(idx) => Ok(Some(idx)),
        Err(Miss::Stale(why)) => {
            tracing::warn!(index = %url, why, "the shared index cannot be used; indexing the object here");
            Ok(None)
        }
        Err(Miss::Absent) => Ok(None),
    }
}

/// `object`'s index (see the module documentation): from the local cache, object storage, or
/// `build` (which streams the object); `state_dir` is the local cache's, when `cache_index` is on.
///
/// # Errors
/// `build`'s errors, and object-storage errors naming the URL.
pub fn index_object(
    remote: &Remote,
    object: &ObjectMeta,
    fingerprint: &str,
    state_dir: Option<&Path>,
    max_sequences: u64,
    progress: &mut dyn FnMut(u64),
    build: &mut BuildIndex<'_>,
) -> Result<(FileIndex, SharedIndexOutcome), DataError> {
    let name: Arc<Path> = Arc::from(Path::new(&object.url));
    let stamp = stamp(object);
    if let Some(dir) = state_dir {
        match index_cache::load(dir, &stamp, fingerprint, &name, max_sequences) {
            Ok(idx) => {
                progress(object.size);
                remote.count(SharedIndexOutcome::LocalCache);
                return Ok((idx, SharedIndexOutcome::LocalCache));
            }
            Err(Miss::Absent) => {}
            Err(Miss::Stale(why)) => tracing::info!(object = %object.url, why, "local index cache is stale"),
        }
    }
    let keep = |idx: &FileIndex| {
        if let Some(dir) = state_dir {
            if let Err(e) = index_cache::store(dir, &stamp, fingerprint, idx) {
                tracing::warn!(object = %object.url, error = %e, "cannot write the local index cache; going on without it");
            }
        }
    };
    let url = index_url(&remote.index, object, fingerprint);
    let lock = format!("{url}.lock");
    let download = || download(remote, &url, object, &stamp, fingerprint, &name, max_sequences);
    let downloaded = |idx: FileIndex, progress: &mut dyn FnMut(u64)| {
        progress(object.size);
        keep(&idx);
        remote.count(SharedIndexOutcome::Downloaded);
        tracing::info!(object = %object.url, index = %url, "downloaded the shared index");
        (idx, SharedIndexOutcome::Downloaded)
    };
    let mut outcome = SharedIndexOutcome::Indexed;
    if let Some(idx) = download()? {
        return Ok(downloaded(idx, progress));
    }
    let holder = format!("pid {} at {:?}", std::process::id(), std::time::SystemTime::now());
    // The lock, like the index itself, is a courtesy to other nodes: where the store refuses it —
    // credentials that may read but not write, a server without conditional puts (`501`, found
    // by a probe: the dataset could not be read at all), or one failing now — the object is
    // indexed here without sharing, and this process stops asking.
    let refused = |e: &dyn std::fmt::Display| {
        if !remote.sharing_refused.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(object = %object.url, lock = %lock, error = %e, "cannot write the index lock (read-only credentials, or a store without conditional puts?); indexing objects here without sharing their indexes");
        }
    };
    let locked = if remote.sharing_refused.load(std::sync::atomic::Ordering::Relaxed) {
        Err(())
    } else {
        remote.store.put_if_absent(&lock, holder.clone().into_bytes()).map_err(|e| refused(&e)).map(|written| {
            // "Already there" may be this node's own put, retried after its answer was lost (found
            // by a probe: the node waited for its own lock, object_index_wait_secs, and left it
            // behind): the lock's content says whose it is.
            written || matches!(remote.store.get(&lock, 4096), Ok(Some(body)) if body == holder.as_bytes())
        })
    };
    let Ok(locked) = locked else {
        let idx = build(progress)?;
        keep(&idx);
        remote.count(outcome);
        return Ok((idx, outcome));
    };
    if locked {
        // The node that held the lock before may have written the index and let the lock go
        // between our first look and our lock: look again before indexing.
        if let Some(idx) = download()? {
            let _ = remote.store.delete(&lock);
            return Ok(downloaded(idx, progress));
        }
    } else {
        // Another node is indexing it: wait for its index.
        tracing::info!(object = %object.url, lock = %lock, wait_secs = remote.index.wait.as_secs(), "another node is indexing this object; waiting for its index");
        let deadline = Instant::now() + remote.index.wait;
        while Instant::now() < deadline {
            std::thread::sleep(INDEX_POLL);
            if let Some(idx) = download()? {
                return Ok(downloaded(idx, progress));
            }
        }
        tracing::warn!(object = %object.url, lock = %lock, "no index appeared in time; indexing the object here too");
        outcome = SharedIndexOutcome::IndexedAfterWait;
    }
    let idx = match build(progress) {
        Ok(idx) => idx,
        Err(e) => {
            if locked {
                let _ = remote.store.delete(&lock);
            }
            return Err(e);
        }
    };
    keep(&idx);
    match index_cache::encode_to_vec(&stamp, fingerprint, &idx) {
        Ok(bytes) => match remote.store.put_if_absent(&url, bytes) {
            Ok(true) => tracing::info!(object = %object.url, index = %url, "indexed the object and shared its index"),
            Ok(false) => {
                tracing::info!(object = %object.url, index = %url, "indexed the object; another node's index was written first");
            }
            Err(e) => {
                tracing::warn!(object = %object.url, error = %e, "cannot write the shared index; other nodes will index the object themselves");
            }
        },
        Err(e) => tracing::warn!(object = %object.url, error = %e, "cannot encode the shared index"),
    }
    if locked {
        if let Err(e) = remote.store.delete(&lock) {
            tracing::warn!(lock = %lock, error = %e, "cannot remove the index lock");
        }
    }
    remote.count(outcome);
    Ok((idx, outcome))
}
