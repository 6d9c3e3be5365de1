//! Dataset inputs in object storage: `s3://bucket/key`, `s3://bucket/prefix/` and globs.
//!
//! The engine stays synchronous and knows no HTTP: it speaks to object storage through the
//! [`ObjectStore`] trait, which the `minibatchd-remote` crate implements over S3 (and tests over
//! memory). Whoever opens datasets makes one [`Remote`] — the store, the object cache of chunk
//! byte ranges ([`ObjectCache`]) and where shared indexes live ([`IndexPlace`]) — and hands it to
//! each dataset that reads objects: no process global.
//!
//! What the engine does with an object (`crate::dataset`):
//!
//! * **Listing** ([`ObjectStore::list`]) resolves a pattern to objects, each with its size and
//!   ETag: the ETag is the object's version, as a local file's size and mtime are.
//! * **Index pass**: the object is streamed once ([`ObjectStore::open`]); its index is kept in
//!   the local index cache and in object storage beside the data ([`shared_index`]), written
//!   once with a conditional put, so other nodes download it instead of indexing again.
//! * **Chunks** are read with ranged GETs that name the ETag (`If-Match`): an object that changed
//!   since it was indexed is an error naming its URL, never read through the old index. Each
//!   range is kept in [`ObjectCache`] under `state_dir`, bounded in bytes, least recently used
//!   first out, and parsed from there like a local file.
//! * **gzip objects** are decompressed once into `state_dir/inflated`, as local ones are.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::format::errors::DataError;

mod inflate;
mod object_cache;
mod shared_index;

pub use inflate::inflated_object;
pub use object_cache::{Cached, ObjectCache, ObjectCacheStats};
pub use shared_index::{
    index_object, index_url, is_index_key, stamp as shared_index_stamp, IndexPlace, SharedIndexOutcome,
};

/// The scheme of an object URL.
pub const SCHEME: &str = "s3://";

/// Whether `path` names an object (`s3://…`) rather than a local file.
#[must_use]
pub fn is_remote(path: &Path) -> bool {
    path.as_os_str().as_encoded_bytes().starts_with(SCHEME.as_bytes())
}

/// An object as listed: its URL, size and version (ETag).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectMeta {
    /// `s3://bucket/key`.
    pub url: String,
    /// Size in bytes.
    pub size: u64,
    /// The ETag the store gave (quotes included): the object's version.
    pub etag: String,
}

/// Why an object-storage operation failed. The message names the URL and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// No such object, prefix or bucket.
    #[error("{url}: {message}")]
    NotFound {
        /// The URL.
        url: String,
        /// What is missing.
        message: String,
    },
    /// The object's ETag is not the one indexed: it was overwritten.
    #[error("{url}: the object changed since it was indexed (ETag {indexed} then, now another); its chunks are not read with the old index (a daemon indexes it again at a reload, SIGHUP; `dump` and `index` when run again)")]
    Changed {
        /// The URL.
        url: String,
        /// The ETag indexed.
        indexed: String,
    },
    /// Credentials missing or refused.
    #[error("{url}: access denied ({message}): check the AWS credentials in the daemon's environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...)")]
    Denied {
        /// The URL.
        url: String,
        /// The store's words.
        message: String,
    },
    /// The object is larger than the caller may hold ([`ObjectStore::get`]).
    #[error("{url}: larger than the {limit} bytes it may hold")]
    TooLarge {
        /// The URL.
        url: String,
        /// The bound.
        limit: u64,
    },
    /// Anything else, after retries (network, 5xx).
    #[error("{url}: {message}")]
    Other {
        /// The URL.
        url: String,
        /// What happened.
        message: String,
    },
}

impl RemoteError {
    /// As a [`DataError`] naming the object.
    #[must_use]
    pub fn into_data(self) -> DataError {
        let (url, kind) = match &self {
            Self::NotFound { url, .. } => (url.clone(), std::io::ErrorKind::NotFound),
            Self::Denied { url, .. } => (url.clone(), std::io::ErrorKind::PermissionDenied),
            Self::Changed { url, .. } | Self::Other { url, .. } | Self::TooLarge { url, .. } => {
                (url.clone(), std::io::ErrorKind::Other)
            }
        };
        // The message already names the URL; keep only what follows it.
        let text = self.to_string();
        let what = text.strip_prefix(&format!("{url}: ")).unwrap_or(&text).to_owned();
        DataError::io(Path::new(&url), std::io::Error::new(kind, what))
    }
}

/// What the engine needs of object storage. Blocking: every call returns when done (the
/// implementation retries transient failures — 5xx, resets, timeouts — with backoff first).
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// The objects `pattern` names, sorted by key: one key; a prefix ending in `/` (every object
    /// under it); a key that is a "directory" (every object under `key/`); or a glob (`*`, `?`,
    /// `[…]`, `**` across `/`). An empty match is [`RemoteError::NotFound`].
    ///
    /// # Errors
    /// [`RemoteError`].
    fn list(&self, pattern: &str) -> Result<Vec<ObjectMeta>, RemoteError>;

    /// Writes bytes `start..end` of `object` to `out` (ranged GET with `If-Match` its ETag);
    /// returns the number written.
    ///
    /// # Errors
    /// [`RemoteError::Changed`] when the ETag no longer matches; others.
    fn read_range(&self, object: &ObjectMeta, start: u64, end: u64, out: &mut dyn Write) -> Result<u64, RemoteError>;

    /// The whole object as a stream (`If-Match` its ETag), for the index pass and inflation.
    ///
    /// # Errors
    /// As [`ObjectStore::read_range`].
    fn open(&self, object: &ObjectMeta) -> Result<Box<dyn Read + Send>, RemoteError>;

    /// The object at `url` whole, `None` if there is none. Never holds more than `max_bytes`
    /// (whatever the response claims).
    ///
    /// # Errors
    /// [`RemoteError::TooLarge`] past `max_bytes`; others than not found.
    fn get(&self, url: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, RemoteError>;

    /// Stores `bytes` at `url` unless an object is there already (a conditional put,
    /// `If-None-Match: *`): `true` if this call wrote it.
    ///
    /// # Errors
    /// [`RemoteError`].
    fn put_if_absent(&self, url: &str, bytes: Vec<u8>) -> Result<bool, RemoteError>;

    /// Deletes the object at `url` (no error if there is none).
    ///
    /// # Errors
    /// [`RemoteError`].
    fn delete(&self, url: &str) -> Result<(), RemoteError>;
}

/// Object storage as datasets use it: the store, the object cache and where shared
/// indexes go. Whoever opens datasets (the daemon's catalog, `dump`, `index`) makes one and hands it
/// to each dataset that reads objects ([`crate::dataset::Dataset::open_in`]).
#[derive(Debug)]
pub struct Remote {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The on-disk cache of chunk byte ranges.
    pub chunks: ObjectCache,
    /// Where shared indexes are kept and how long to wait for another node's.
    pub index: IndexPlace,
    /// How each object's index was obtained, by [`SharedIndexOutcome`].
    outcomes: [std::sync::atomic::AtomicU64; 4],
    /// The store refused an index lock: objects are indexed without sharing from then on.
    pub(crate) sharing_refused: std::sync::atomic::AtomicBool,
}

impl Remote {
    /// Object storage over `store`, with its object cache and shared-index place.
    #[must_use]
    pub fn new(store: Arc<dyn ObjectStore>, chunks: ObjectCache, index: IndexPlace) -> Self {
        Self {
            store,
            chunks,
            index,
            outcomes: Default::default(),
            sharing_refused: std::sync::atomic::AtomicBool::default(),
        }
    }

    /// How many objects' indexes came each way, in [`SharedIndexOutcome::ALL`]'s order.
    #[must_use]
    pub fn outcome_counts(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.outcomes[i].load(std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn count(&self, o: SharedIndexOutcome) {
        self.outcomes[o as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `remote`, or an error naming `url` that says object storage is not available.
///
/// # Errors
/// [`DataError`] when there is none.
pub fn require<'r>(remote: Option<&'r Remote>, url: &Path) -> Result<&'r Remote, DataError> {
    remote.ok_or_else(|| {
        DataError::io(url, std::io::Error::other("object storage is not available to this command (no store set up)"))
    })
}

/// How long to wait between polls for another node's shared index.
pub const INDEX_POLL: Duration = Duration::from_millis(500);
