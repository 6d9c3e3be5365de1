//! minibatchd's object storage: S3 and S3-compatible servers through the `object_store` crate,
//! behind the engine's blocking [`minibatchd_engine::remote::ObjectStore`] trait.
//!
//! * **Settings** come from the standard AWS environment and files ([`aws`]), never from the
//!   dataset configuration.
//! * **One small runtime** (two `mbd-s3` threads) runs `object_store`'s futures; callers block on
//!   them from their own threads (parser threads, the readahead stage's fetches), so several
//!   requests are in flight at once and the engine stays synchronous.
//! * **Retries**: `object_store` retries a request on 5xx, 429 and connection errors with
//!   exponential backoff (100 ms doubling to 15 s, up to 10 times within `object_retry_secs`, 3
//!   minutes by default); a body that
//!   breaks off mid-transfer (a reset) is requested again from the byte where it stopped, up to
//!   [`BODY_RETRIES`] times, with the same `If-Match`.
//! * **Deadlines** ([`Timeouts`]): one request waits at most `object_request_timeout_secs` for
//!   its answer, a response body as long for its next bytes (`capped`); and every operation —
//!   list, head, ranged or streaming read, get, conditional put, delete — ends at the latest
//!   `object_retry_secs` + `object_request_timeout_secs` after its start or its last bytes, retries
//!   included. A server that accepts connections and never answers is an error naming the object,
//!   what was asked and the endpoint, never a wait without end.
//! * **Errors** say what failed: a connection refused, reset or timed out, or a name that does
//!   not resolve is "cannot reach the object store at ENDPOINT"; only a `403` mentions the
//!   credentials.
//! * **Versions**: every read names the ETag listed at open (`If-Match`); an object overwritten
//!   since is [`RemoteError::Changed`], never read through the old index.

#![forbid(unsafe_code)]

pub mod aws;
mod body;
mod capped;
mod names;
mod reach;

use body::{Body, PIPE_DEPTH};
use reach::{short, transport, Deadline, Reach};

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use minibatchd_engine::remote::{ObjectMeta, ObjectStore, RemoteError, SCHEME};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};

use names::{key_of, modified_tag, same_version, NO_ETAG};
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions,
    PutPayload, RetryConfig,
};

/// How long a failed request is retried by default (`object_store`'s own default).
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(180);

/// How long one request waits for its answer, and a response body for its next bytes, by
/// default (`object_request_timeout_secs`): `object_store`'s own default request timeout. A
/// response's head takes milliseconds; a server silent this long is stalled.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a body that breaks off is requested again from where it stopped.
pub const BODY_RETRIES: u32 = 8;

/// The most one connection attempt may take (less when the request timeout is shorter).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The deadlines of object-storage requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// How long a failing request is retried, with backoff (`object_retry_secs`).
    pub retry: Duration,
    /// How long one request waits for its answer, and a response body for its next bytes
    /// (`object_request_timeout_secs`).
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { retry: DEFAULT_RETRY_TIMEOUT, request: DEFAULT_REQUEST_TIMEOUT }
    }
}

impl Timeouts {
    /// How long an operation may go without progress (its start, or its last bytes) before it
    /// is an error: its retries, and one more request.
    #[must_use]
    pub fn patience(&self) -> Duration {
        self.retry + self.request
    }
}

/// S3 as an [`ObjectStore`] (cheap to clone: one runtime and one client per bucket, shared).
#[derive(Clone)]
pub struct S3Objects(Arc<Inner>);

struct Inner {
    settings: aws::Settings,
    runtime: tokio::runtime::Runtime,
    /// A client per bucket, and per retry policy: `true` for [`Inner::courtesy`]'s.
    buckets: Mutex<HashMap<(String, bool), Arc<AmazonS3>>>,
    retry: RetryConfig,
    reach: Reach,
}

impl std::fmt::Debug for S3Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Objects")
            .field("endpoint", &self.0.settings.endpoint)
            .field("region", &self.0.settings.region)
            .field("profile", &self.0.settings.profile)
            .field("timeouts", &self.0.reach.timeouts)
            .finish_non_exhaustive()
    }
}

/// Splits `s3://bucket/rest` into (bucket, rest).
///
/// # Errors
/// Not an `s3://` URL, or no bucket.
pub fn split_url(url: &str) -> Result<(&str, &str), RemoteError> {
    let rest = url.strip_prefix(SCHEME).ok_or_else(|| other(url, "not an s3:// URL"))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(other(url, "no bucket in the URL (expected s3://BUCKET/KEY)"));
    }
    Ok((bucket, key))
}

fn other(url: &str, message: impl Into<String>) -> RemoteError {
    RemoteError::Other { url: url.to_owned(), message: message.into() }
}

/// Whether `e` is a response body that broke off midway (a reset), worth requesting again; a
/// body past its bound (`capped`) is not: a server that sent one would send it again.
fn broken_body(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { .. }) && e.to_string().contains("body") && !capped::is_too_large(e)
}

impl S3Objects {
    /// A store configured from this process's environment and the user's AWS files, with the
    /// default [`Timeouts`].
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn from_env() -> std::io::Result<Self> {
        Self::from_env_with(Timeouts::default())
    }

    /// [`S3Objects::from_env`] with `timeouts`.
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn from_env_with(timeouts: Timeouts) -> std::io::Result<Self> {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        let settings = aws::Settings::resolve(&|k| std::env::var(k).ok(), home.as_deref());
        Self::with_timeouts(settings, timeouts)
    }

    /// A store with `settings` and the default [`Timeouts`].
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn new(settings: aws::Settings) -> std::io::Result<Self> {
        Self::with_timeouts(settings, Timeouts::default())
    }

    /// A store with `settings` whose requests keep `timeouts`.
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn with_timeouts(settings: aws::Settings, timeouts: Timeouts) -> std::io::Result<Self> {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("mbd-s3").enable_all().build()?;
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: 10,
            retry_timeout: timeouts.retry,
        };
        let endpoint = settings.endpoint.clone().unwrap_or_else(|| {
            format!("https://s3.{}.amazonaws.com", settings.region.as_deref().unwrap_or("us-east-1"))
        });
        Ok(Self(Arc::new(Inner {
            settings,
            runtime,
            buckets: Mutex::new(HashMap::new()),
            retry,
            reach: Reach { endpoint: endpoint.into(), timeouts },
        })))
    }

    /// The settings in use (secrets included: do not log them whole).
    #[must_use]
    pub fn settings(&self) -> &aws::Settings {
        &self.0.settings
    }

    /// The deadlines in use.
    #[must_use]
    pub fn timeouts(&self) -> Timeouts {
        self.0.reach.timeouts
    }
}

/// How often, and for how long, a courtesy write is tried again ([`Inner::courtesy`]).
const COURTESY_RETRIES: (usize, Duration) = (2, Duration::from_secs(2));

impl Inner {
    fn bucket(&self, url: &str, name: &str) -> Result<Arc<AmazonS3>, RemoteError> {
        self.client(url, name, false)
    }

    /// The client of `name` for writes that are courtesies to other nodes (the index lock, a
    /// shared index): retried briefly, as failing one costs only the sharing (found by a probe:
    /// a server that answers conditional puts `501 Not Implemented` was retried for the whole
    /// `object_retry_secs`, per object).
    fn courtesy(&self, url: &str, name: &str) -> Result<Arc<AmazonS3>, RemoteError> {
        self.client(url, name, true)
    }

    fn client(&self, url: &str, name: &str, courtesy: bool) -> Result<Arc<AmazonS3>, RemoteError> {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(b) = buckets.get(&(name.to_owned(), courtesy)) {
            return Ok(b.clone());
        }
        let s = &self.settings;
        // The rest of the AWS_* environment (web identity, container credentials, ...) first;
        // the resolved settings over it.
        let mut b = AmazonS3Builder::from_env().with_bucket_name(name);
        for (key, value) in [
            (AmazonS3ConfigKey::AccessKeyId, &s.access_key_id),
            (AmazonS3ConfigKey::SecretAccessKey, &s.secret_access_key),
            (AmazonS3ConfigKey::Token, &s.session_token),
            (AmazonS3ConfigKey::Region, &s.region),
            (AmazonS3ConfigKey::Endpoint, &s.endpoint),
        ] {
            if let Some(v) = value {
                b = b.with_config(key, v);
            }
        }
        // No overall timeout: a chunk's or a whole object's body may take minutes to stream.
        // The connector bounds the wait for an answer and for each next piece of a body instead.
        let request = self.reach.timeouts.request;
        let mut options =
            ClientOptions::new().with_timeout_disabled().with_connect_timeout(request.min(CONNECT_TIMEOUT));
        if s.allow_http() {
            options = options.with_allow_http(true);
        }
        let store = b
            .with_client_options(options)
            .with_http_connector(capped::CappedConnector { timeout: request })
            .with_retry(if courtesy {
                let (max_retries, time) = COURTESY_RETRIES;
                RetryConfig { max_retries, retry_timeout: self.retry.retry_timeout.min(time), ..self.retry.clone() }
            } else {
                self.retry.clone()
            })
            .build()
            .map_err(|e| other(url, format!("cannot configure S3 access: {}", short(&e.to_string()))))?;
        let store = Arc::new(store);
        buckets.insert((name.to_owned(), courtesy), store.clone());
        Ok(store)
    }

    fn meta(bucket: &str, m: &object_store::ObjectMeta) -> ObjectMeta {
        let url = format!("{SCHEME}{bucket}/{}", m.location);
        let etag = m.e_tag.clone().unwrap_or_else(|| modified_tag(m.last_modified.timestamp()));
        ObjectMeta { url, size: m.size, etag }
    }

    /// The objects of a "directory" listing whose keys, below the directory (the first `skip`
    /// bytes of the URL), have no component starting with `.`: hidden files and directories are
    /// skipped, as a local directory walk (and deepx) skips them.
    fn visible(objects: Vec<ObjectMeta>, skip: usize) -> Vec<ObjectMeta> {
        objects
            .into_iter()
            .filter(|o| o.url.get(skip..).is_none_or(|below| !below.split('/').any(|c| c.starts_with('.'))))
            .collect()
    }

    fn deadline(&self) -> Deadline {
        Deadline::new(self.reach.timeouts.patience())
    }

    /// Every object under `prefix` (a directory-like prefix, or all of the bucket), by key. Each
    /// page of the listing is progress: a long listing is not cut at the deadline, a stalled one
    /// is.
    fn list_prefix(&self, url: &str, bucket: &str, prefix: &str) -> Result<Vec<ObjectMeta>, RemoteError> {
        let store = self.bucket(url, bucket)?;
        let prefix = prefix.trim_end_matches('/');
        let key = if prefix.is_empty() { None } else { Some(key_of(url, prefix)?) };
        let what = format!("listing {SCHEME}{bucket}/{prefix}");
        let deadline = self.deadline();
        let found = self.runtime.block_on(self.reach.again(url, &what, &deadline, || async {
            let mut listing = store.list(key.as_ref());
            let mut found = Vec::new();
            while let Some(m) = listing.next().await {
                found.push(m?);
                deadline.progress();
            }
            Ok(found)
        }))?;
        let mut out = Vec::new();
        for m in found {
            if m.location.as_ref().ends_with('/') {
                continue; // a "directory" marker
            }
            out.push(Self::meta(bucket, &m));
        }
        out.sort_by(|a, b| a.url.cmp(&b.url));
        Ok(out)
    }

    /// A GET of `object` from byte `from` to `end` with `If-Match` its ETag, as a stream.
    async fn get_from(
        reach: &Reach,
        store: Arc<AmazonS3>,
        object: &ObjectMeta,
        from: u64,
        end: u64,
    ) -> Result<BoxStream<'static, object_store::Result<bytes::Bytes>>, RemoteError> {
        let (_, key) = split_url(&object.url)?;
        let options = GetOptions {
            if_match: (!object.etag.starts_with(NO_ETAG)).then(|| object.etag.clone()),
            range: Some(GetRange::Bounded(from..end)),
            ..GetOptions::default()
        };
        match store.get_opts(&key_of(&object.url, key)?, options).await {
            // A server that ignores `If-Match` could answer with another version: its size and
            // ETag are checked against the listing's before a byte is used.
            Ok(r) if r.meta.e_tag.is_none() && !object.etag.starts_with(NO_ETAG) => Err(other(
                &object.url,
                format!(
                    "the answer to GET bytes {from}..{end} carries no ETag, so the version sent cannot be told from \
                     the one indexed (ETag {}); a server or proxy that drops ETags and If-Match may send another \
                     version's bytes, which are not read",
                    object.etag
                ),
            )),
            Ok(r) if !same_version(object, r.meta.size, r.meta.e_tag.as_deref(), r.meta.last_modified.timestamp()) => {
                Err(RemoteError::Changed { url: object.url.clone(), indexed: object.etag.clone() })
            }
            Ok(r) => Ok(r.into_stream()),
            Err(e) => Err(match reach.classify(&object.url, &format!("GET bytes {from}..{end}"), &e) {
                RemoteError::Changed { url, .. } => RemoteError::Changed { url, indexed: object.etag.clone() },
                other => other,
            }),
        }
    }

    /// Bytes `start..end` of `object`, streamed by a task on the runtime into a bounded channel
    /// while the caller consumes them (the network read goes on while the caller parses or
    /// writes). A body that breaks off is requested again from where it stopped, up to
    /// [`BODY_RETRIES`] times; a request that fails was retried by the client already. The task
    /// ends with an error once no bytes came for [`Timeouts::patience`] (the time the caller takes
    /// to consume them does not count).
    fn pipe(
        &self,
        object: &ObjectMeta,
        start: u64,
        end: u64,
    ) -> tokio::sync::mpsc::Receiver<Result<bytes::Bytes, RemoteError>> {
        let (tx, rx) = tokio::sync::mpsc::channel(PIPE_DEPTH);
        let object = object.clone();
        let store = split_url(&object.url).and_then(|(bucket, _)| self.bucket(&object.url, bucket));
        let reach = self.reach.clone();
        self.runtime.spawn(async move {
            let store = match store {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let deadline = Deadline::new(reach.timeouts.patience());
            let url = object.url.as_str();
            let mut at = start;
            let mut failures = 0u32;
            while at < end {
                let what = format!("GET bytes {at}..{end}");
                let mut stream = match deadline.within(Self::get_from(&reach, store.clone(), &object, at, end)).await {
                    Some(Ok(s)) => s,
                    Some(Err(e)) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    None => {
                        let _ = tx.send(Err(reach.stalled(url, &what))).await;
                        return;
                    }
                };
                let broke = loop {
                    match deadline.within(stream.next()).await {
                        None => {
                            let what = format!("the body of GET bytes {at}..{end}");
                            let _ = tx.send(Err(reach.stalled(url, &what))).await;
                            return;
                        }
                        Some(Some(Ok(bytes))) if bytes.is_empty() => {}
                        Some(Some(Ok(bytes))) => {
                            deadline.progress();
                            let take = usize::try_from(end - at).unwrap_or(usize::MAX).min(bytes.len());
                            at += take as u64;
                            if tx.send(Ok(bytes.slice(..take))).await.is_err() {
                                return; // the reader went away
                            }
                            // The reader's pace is not the server's: the wait starts again.
                            deadline.progress();
                        }
                        Some(Some(Err(e))) => break Some((e.to_string(), transport(&e).is_some())),
                        Some(None) => break (at < end).then(|| ("the response ended early".to_owned(), false)),
                    }
                };
                if let Some((why, unreachable)) = broke {
                    failures += 1;
                    if failures > BODY_RETRIES {
                        let what = format!("reading bytes {start}..{end}");
                        let e = if unreachable {
                            reach.unreachable(url, &what, &format!("{why} ({BODY_RETRIES} retries)"))
                        } else {
                            other(url, format!("{what}: {why} ({BODY_RETRIES} retries)"))
                        };
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    tracing::debug!(object = %object.url, at, why, "body broke off; requesting the rest again");
                    let pause = Duration::from_millis(100 << failures.min(6));
                    if deadline.within(tokio::time::sleep(pause)).await.is_none() {
                        let _ = tx.send(Err(reach.stalled(url, &format!("GET bytes {at}..{end}")))).await;
                        return;
                    }
                }
            }
        });
        rx
    }
}

impl ObjectStore for S3Objects {
    fn list(&self, pattern: &str) -> Result<Vec<ObjectMeta>, RemoteError> {
        self.0.list(pattern)
    }

    fn read_range(&self, object: &ObjectMeta, start: u64, end: u64, out: &mut dyn Write) -> Result<u64, RemoteError> {
        self.0.read_range(object, start, end, out)
    }

    fn open(&self, object: &ObjectMeta) -> Result<Box<dyn Read + Send>, RemoteError> {
        Ok(Box::new(Body::new(self.0.pipe(object, 0, object.size), object.size)))
    }

    fn get(&self, url: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, RemoteError> {
        self.0.get(url, max_bytes)
    }

    fn put_if_absent(&self, url: &str, bytes: Vec<u8>) -> Result<bool, RemoteError> {
        self.0.put_if_absent(url, bytes)
    }

    fn delete(&self, url: &str) -> Result<(), RemoteError> {
        self.0.delete(url)
    }
}

impl Inner {
    fn list(&self, pattern: &str) -> Result<Vec<ObjectMeta>, RemoteError> {
        let (bucket, rest) = split_url(pattern)?;
        let first_glob = rest.find(['*', '?', '[']);
        let found = if let Some(g) = first_glob {
            let literal = &rest[..g];
            let dir = literal.rfind('/').map_or("", |i| &literal[..=i]);
            let matcher = glob::Pattern::new(rest).map_err(|e| other(pattern, format!("not a valid glob: {e}")))?;
            let options = glob::MatchOptions {
                require_literal_separator: true,
                require_literal_leading_dot: true,
                ..glob::MatchOptions::new()
            };
            let prefix_len = SCHEME.len() + bucket.len() + 1;
            self.list_prefix(pattern, bucket, dir)?
                .into_iter()
                .filter(|o| o.url.get(prefix_len..).is_some_and(|key| matcher.matches_with(key, options)))
                .collect()
        } else if rest.is_empty() || rest.ends_with('/') {
            Self::visible(self.list_prefix(pattern, bucket, rest)?, pattern.len())
        } else {
            let store = self.bucket(pattern, bucket)?;
            let key = key_of(pattern, rest)?;
            let deadline = self.deadline();
            let head = self.runtime.block_on(self.reach.again(pattern, "HEAD", &deadline, || async {
                match store.head(&key).await {
                    Ok(m) => Ok(Some(m)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            }))?;
            match head {
                Some(m) => vec![Self::meta(bucket, &m)],
                // Not an object: a "directory" of objects, or nothing.
                None => Self::visible(self.list_prefix(pattern, bucket, &format!("{rest}/"))?, pattern.len() + 1),
            }
        };
        if found.is_empty() {
            return Err(RemoteError::NotFound { url: pattern.to_owned(), message: "no object matches".into() });
        }
        Ok(found)
    }

    fn read_range(&self, object: &ObjectMeta, start: u64, end: u64, out: &mut dyn Write) -> Result<u64, RemoteError> {
        let mut body = Body::new(self.pipe(object, start, end), end.saturating_sub(start));
        loop {
            let piece = body.next().map_err(|e| match e.downcast::<RemoteError>() {
                Ok(remote) => remote,
                Err(e) => other(&object.url, e.to_string()),
            })?;
            if piece.is_empty() {
                return Ok(end - start);
            }
            out.write_all(&piece).map_err(|e| other(&object.url, format!("writing the range: {e}")))?;
        }
    }

    fn get(&self, url: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, RemoteError> {
        /// What a GET found.
        enum Got {
            Absent,
            Bytes(Vec<u8>),
            TooLarge,
        }
        let (bucket, key) = split_url(url)?;
        let store = self.bucket(url, bucket)?;
        let key = key_of(url, key)?;
        let deadline = self.deadline();
        let got = self.runtime.block_on(self.reach.again(url, "GET", &deadline, || async {
            let r = match store.get(&key).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(Got::Absent),
                Err(e) => return Err(e),
            };
            if r.meta.size > max_bytes {
                return Ok(Got::TooLarge);
            }
            // Streamed and counted, not collected: the collection reserves what the
            // response's Content-Length claims, which a broken server can set to anything.
            let mut body = r.into_stream();
            let mut out = Vec::new();
            while let Some(piece) = body.next().await {
                let piece = piece?;
                deadline.progress();
                if (out.len() + piece.len()) as u64 > max_bytes {
                    return Ok(Got::TooLarge);
                }
                out.extend_from_slice(&piece);
            }
            Ok(Got::Bytes(out))
        }))?;
        match got {
            Got::Absent => Ok(None),
            Got::Bytes(b) => Ok(Some(b)),
            Got::TooLarge => Err(RemoteError::TooLarge { url: url.to_owned(), limit: max_bytes }),
        }
    }

    fn put_if_absent(&self, url: &str, bytes: Vec<u8>) -> Result<bool, RemoteError> {
        let (bucket, key) = split_url(url)?;
        let store = self.courtesy(url, bucket)?;
        let key = key_of(url, key)?;
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let payload = PutPayload::from(bytes);
        // The index lock and a shared index are courtesies to other nodes: retried briefly
        // ([`Inner::courtesy`]), then given up (the caller indexes without sharing).
        let deadline = Deadline::new(self.reach.timeouts.request + COURTESY_RETRIES.1);
        self.runtime.block_on(self.reach.again(url, "conditional PUT", &deadline, || async {
            match store.put_opts(&key, payload.clone(), options.clone()).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        }))
    }

    fn delete(&self, url: &str) -> Result<(), RemoteError> {
        let (bucket, key) = split_url(url)?;
        let store = self.bucket(url, bucket)?;
        let key = key_of(url, key)?;
        let deadline = self.deadline();
        self.runtime.block_on(self.reach.again(url, "DELETE", &deadline, || async {
            match store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::client::{HttpError, HttpErrorKind};

    fn reach(retry_ms: u64, request_ms: u64) -> Reach {
        Reach {
            endpoint: "http://127.0.0.1:9".into(),
            timeouts: Timeouts { retry: Duration::from_millis(retry_ms), request: Duration::from_millis(request_ms) },
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    }

    /// A body refused for its size (`capped`) is not fetched again; one that broke off is.
    #[test]
    fn a_body_past_its_bound_is_not_retried_and_a_broken_one_is() {
        let failing = |source: object_store::client::HttpError| object_store::Error::Generic {
            store: "S3",
            source: Box::new(source),
        };
        let (rt, reach) = (runtime(), reach(60_000, 60_000));
        let deadline = Deadline::new(reach.timeouts.patience());
        let mut calls = 0;
        let r: Result<(), _> = rt.block_on(reach.again("s3://b/k", "GET", &deadline, || {
            calls += 1;
            std::future::ready(Err(failing(capped::too_large())))
        }));
        assert!(r.is_err());
        assert_eq!(calls, 1, "refused at once");
        let mut calls = 0;
        let r: Result<(), _> = rt.block_on(reach.again("s3://b/k", "GET", &deadline, || {
            calls += 1;
            std::future::ready(if calls < 3 {
                let broken =
                    std::io::Error::new(std::io::ErrorKind::ConnectionReset, "error reading a body from connection");
                Err(failing(object_store::client::HttpError::new(object_store::client::HttpErrorKind::Request, broken)))
            } else {
                Ok(())
            })
        }));
        assert!(r.is_ok());
        assert_eq!(calls, 3, "retried while the body broke off");
    }

    /// An operation that gets no answer ends at its deadline with an error that names the URL,
    /// the endpoint, what it waited for and the keys that bound it; one that makes progress goes
    /// on past it.
    #[test]
    fn a_stalled_operation_ends_at_its_deadline_and_progress_moves_it() {
        let (rt, reach) = (runtime(), reach(200, 100));
        let deadline = Deadline::new(reach.timeouts.patience());
        let started = std::time::Instant::now();
        let r: Result<(), _> = rt.block_on(reach.again(
            "s3://b/k",
            "HEAD",
            &deadline,
            futures::future::pending::<object_store::Result<()>>,
        ));
        let waited = started.elapsed();
        let e = r.expect_err("stalled").to_string();
        assert!((Duration::from_millis(300)..Duration::from_secs(2)).contains(&waited), "{waited:?}");
        assert_eq!(
            e,
            "s3://b/k: cannot reach the object store at http://127.0.0.1:9: HEAD: no answer within 0.3 s (object_retry_secs 0.2 + object_request_timeout_secs 0.1)"
        );
        let deadline = Deadline::new(reach.timeouts.patience());
        let started = std::time::Instant::now();
        let r = rt.block_on(reach.again("s3://b/k", "GET", &deadline, || async {
            for _ in 0..6 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                deadline.progress();
            }
            Ok(())
        }));
        assert!(r.is_ok(), "{r:?}");
        assert!(started.elapsed() >= Duration::from_millis(600));
    }

    /// Transport failures are "cannot reach", whatever digits the message holds (the elapsed
    /// time, a port); only a server's `403` is a matter of credentials.
    #[test]
    fn transport_failures_are_unreachable_and_only_a_403_is_denied() {
        let reach = reach(1000, 1000);
        let generic =
            |source: Box<dyn std::error::Error + Send + Sync>| object_store::Error::Generic { store: "S3", source };
        for kind in [HttpErrorKind::Connect, HttpErrorKind::Request, HttpErrorKind::Timeout, HttpErrorKind::Interrupted]
        {
            let refused = std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "Connection refused (os error 111) after 2.403s",
            );
            let e = generic(Box::new(HttpError::new(kind, refused)));
            let got = reach.classify("s3://b/k", "HEAD", &e);
            assert!(
                matches!(&got, RemoteError::Other { message, .. } if message.starts_with("cannot reach the object store at http://127.0.0.1:9: HEAD: ")),
                "{kind:?}: {got}"
            );
        }
        let text = |t: &'static str| generic(t.into());
        assert!(matches!(
            reach.classify(
                "s3://b/k",
                "LIST",
                &text("Server returned non-2xx status code: 403 Forbidden: <Error><Code>AccessDenied</Code></Error>")
            ),
            RemoteError::Denied { .. }
        ));
        let server = reach.classify("s3://b/k", "GET bytes 10..20", &text("in 2.403s - 500 Internal Server Error"));
        assert!(
            matches!(&server, RemoteError::Other { message, .. } if message.starts_with("GET bytes 10..20: ")),
            "the failed request is named: {server}"
        );
        let denied = object_store::Error::PermissionDenied { path: "k".into(), source: "403".into() };
        assert!(matches!(reach.classify("s3://b/k", "HEAD", &denied), RemoteError::Denied { .. }));
        let too_large = generic(Box::new(capped::too_large()));
        assert!(
            matches!(reach.classify("s3://b/k", "GET", &too_large), RemoteError::Other { message, .. } if !message.contains("cannot reach"))
        );
    }

    /// A streaming task that stops before the range is whole (a panic, a dropped sender) is an
    /// error to the reader, not the object's end: the index pass would otherwise index a short
    /// object as whole. Empty pieces are skipped, not taken for the end.
    #[test]
    fn a_stream_that_stops_short_is_an_error_not_the_end() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.try_send(Ok(bytes::Bytes::from_static(b"abc"))).expect("send");
        tx.try_send(Ok(bytes::Bytes::new())).expect("send");
        tx.try_send(Ok(bytes::Bytes::from_static(b"de"))).expect("send");
        drop(tx);
        let mut short = Body::new(rx, 10);
        let mut out = Vec::new();
        let e = short.read_to_end(&mut out).expect_err("a short stream");
        assert_eq!(out, b"abcde");
        assert!(e.to_string().contains("after 5 of 10 bytes"), "{e}");

        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.try_send(Ok(bytes::Bytes::from_static(b"abcde"))).expect("send");
        drop(tx);
        let mut whole = Body::new(rx, 5);
        let mut out = Vec::new();
        whole.read_to_end(&mut out).expect("whole");
        assert_eq!(out, b"abcde");
    }

    #[test]
    fn a_response_of_another_version_is_told_by_size_and_etag() {
        let listed = ObjectMeta { url: "s3://b/k".into(), size: 10, etag: "\"abc\"".into() };
        assert!(same_version(&listed, 10, Some("\"abc\""), 0));
        assert!(same_version(&listed, 10, Some("abc"), 0));
        assert!(same_version(&listed, 10, Some("W/\"abc\""), 0));
        assert!(!same_version(&listed, 10, None, 0), "an answer without an ETag is no proof");
        assert!(!same_version(&listed, 10, Some("\"abd\""), 0));
        assert!(!same_version(&listed, 11, Some("\"abc\""), 0));
        // Listed without an ETag: its size and modification time.
        let no_etag = ObjectMeta { etag: modified_tag(1_767_225_600), ..listed };
        assert!(same_version(&no_etag, 10, Some("\"anything\""), 1_767_225_600));
        assert!(same_version(&no_etag, 10, None, 1_767_225_600));
        assert!(!same_version(&no_etag, 10, None, 1_767_225_601), "rewritten at the same size: another version");
        assert!(!same_version(&no_etag, 9, None, 1_767_225_600));
    }
}
