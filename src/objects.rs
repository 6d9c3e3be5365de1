//! Object storage for this process: when a configured dataset reads `s3://` inputs, the S3 store
//! ([`minibatchd_remote::S3Objects`], settings from the AWS environment and files) is installed
//! into the engine once, with the chunk-range cache and the shared-index place of `[daemon]`
//! (`docs/object-storage.md`). Every command that opens datasets (`run`, a reload, `dump`,
//! `index`, `validate`) calls [`ensure`] first.

use std::sync::Arc;
use std::time::Duration;

use minibatchd_engine::remote::{self, ChunkFiles, IndexPlace, Remote};

use crate::config::Config;

/// Whether any dataset of `config` reads from object storage.
#[must_use]
pub fn wanted(config: &Config) -> bool {
    config.datasets.values().flat_map(|d| &d.sources).flat_map(|s| &s.files).any(|f| remote::is_remote(f))
}

/// Installs object storage if `config` needs it and it is not installed yet.
///
/// # Errors
/// The store's runtime cannot start.
pub fn ensure(config: &Config) -> std::io::Result<()> {
    if remote::installed().is_some() || !wanted(config) {
        return Ok(());
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
    remote::install(Remote {
        store: Arc::new(store),
        chunks: ChunkFiles::new(o.cache_dir.clone(), o.cache_bytes),
        index: IndexPlace { prefix: o.index_prefix.clone(), wait: Duration::from_secs(o.index_wait_secs) },
    });
    Ok(())
}
