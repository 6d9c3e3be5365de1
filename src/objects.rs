//! Object storage: when a configured dataset reads `s3://` inputs, the S3 store
//! ([`minibatchd_remote::S3Objects`], settings from the AWS environment and files) is set up once,
//! with the object cache and the shared-index place of `[daemon]` (`docs/object-storage.md`),
//! into a cell that whoever opens datasets keeps (the daemon's catalog, and through it every reload;
//! `dump`, `index` and `validate` their own) and that hands it to each dataset it opens.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use minibatchd_engine::remote::{self, IndexPlace, ObjectCache, Remote};

use crate::config::Config;

/// Whether any dataset of `config` reads from object storage.
#[must_use]
pub fn wanted(config: &Config) -> bool {
    config.datasets.values().flat_map(|d| &d.sources).flat_map(|s| &s.files).any(|f| remote::is_remote(f))
}

/// The object storage in `cell`, set up there first if `config` is the first configuration that
/// needs it; `None` while no configuration has needed it.
///
/// # Errors
/// The store's runtime cannot start.
pub fn ensure(cell: &OnceLock<Arc<Remote>>, config: &Config) -> std::io::Result<Option<Arc<Remote>>> {
    if let Some(r) = cell.get() {
        return Ok(Some(r.clone()));
    }
    // Another thread may have set it up meanwhile: the cell's is the one used.
    Ok(open(config)?.map(|r| cell.get_or_init(|| r).clone()))
}

/// Object storage for `config` when it reads objects, made now (`dump`, `index`: once per run).
///
/// # Errors
/// The store's runtime cannot start.
pub fn open(config: &Config) -> std::io::Result<Option<Arc<Remote>>> {
    if !wanted(config) {
        return Ok(None);
    }
    let o = &config.daemon.objects;
    let store = minibatchd_remote::S3Objects::from_env_with(minibatchd_remote::Timeouts {
        retry: Duration::from_secs(o.retry_secs),
        request: Duration::from_secs(o.request_timeout_secs),
    })?;
    let s = store.settings();
    tracing::info!(
        endpoint = s.endpoint.as_deref().unwrap_or("AWS"),
        region = s.region.as_deref().unwrap_or("(default)"),
        profile = s.profile.as_deref().unwrap_or("(environment)"),
        credentials = if s.access_key_id.is_some() { "access key" } else { "from the environment or instance" },
        retry_secs = o.retry_secs,
        request_timeout_secs = o.request_timeout_secs,
        "object storage"
    );
    Ok(Some(Arc::new(Remote::new(
        Arc::new(store),
        ObjectCache::new(o.cache_dir.clone(), o.cache_bytes),
        IndexPlace { prefix: o.index_prefix.clone(), wait: Duration::from_secs(o.index_wait_secs) },
    ))))
}
