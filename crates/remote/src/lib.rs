//! minibatchd's object storage: S3 and S3-compatible servers through the `object_store` crate,
//! behind the engine's blocking [`minibatchd_engine::remote::ObjectStore`] trait.
//!
//! * **Settings** come from the standard AWS environment and files ([`aws`]), never from the
//!   dataset configuration.
//! * **One small runtime** (two `mbd-s3` threads) runs `object_store`'s futures; callers block on
//!   them from their own threads (parser threads, the reader stage's fetches), so several
//!   requests are in flight at once and the engine stays synchronous.
//! * **Retries**: `object_store` retries a request on 5xx, 429 and connection errors with
//!   exponential backoff (100 ms doubling to 15 s, up to 10 times within `object_retry_secs`, 3
//!   minutes by default); a body that
//!   breaks off mid-transfer (a reset) is requested again from the byte where it stopped, up to
//!   [`BODY_RETRIES`] times, with the same `If-Match`.
//! * **Versions**: every read names the ETag listed at open (`If-Match`); an object overwritten
//!   since is [`RemoteError::Changed`], never read through the old index.

#![forbid(unsafe_code)]

pub mod aws;
mod capped;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use minibatchd_engine::remote::{ObjectMeta, ObjectStore, RemoteError, SCHEME};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions,
    PutPayload, RetryConfig,
};

/// How long a failed request is retried by default (`object_store`'s own default).
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(180);

/// How often a body that breaks off is requested again from where it stopped.
pub const BODY_RETRIES: u32 = 8;

/// S3 as an [`ObjectStore`] (cheap to clone: one runtime and one client per bucket, shared).
#[derive(Clone)]
pub struct S3Objects(Arc<Inner>);

struct Inner {
    settings: aws::Settings,
    runtime: tokio::runtime::Runtime,
    buckets: Mutex<HashMap<String, Arc<AmazonS3>>>,
    retry: RetryConfig,
    timeout: Duration,
}

impl std::fmt::Debug for S3Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Objects")
            .field("endpoint", &self.0.settings.endpoint)
            .field("region", &self.0.settings.region)
            .field("profile", &self.0.settings.profile)
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

/// What an `object_store` error means for `url`.
fn classify(url: &str, e: &object_store::Error) -> RemoteError {
    let text = e.to_string();
    match e {
        object_store::Error::NotFound { .. } if text.contains("NoSuchBucket") => {
            RemoteError::NotFound { url: url.to_owned(), message: "no such bucket".into() }
        }
        object_store::Error::NotFound { .. } => {
            RemoteError::NotFound { url: url.to_owned(), message: "no such object".into() }
        }
        object_store::Error::Precondition { .. } => {
            RemoteError::Changed { url: url.to_owned(), indexed: String::new() }
        }
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            RemoteError::Denied { url: url.to_owned(), message: short(&text) }
        }
        _ if text.contains("NoSuchBucket") => {
            RemoteError::NotFound { url: url.to_owned(), message: "no such bucket".into() }
        }
        _ if text.contains("AccessDenied")
            || text.contains("InvalidAccessKeyId")
            || text.contains("SignatureDoesNotMatch")
            || text.contains("403") =>
        {
            RemoteError::Denied { url: url.to_owned(), message: short(&text) }
        }
        _ => RemoteError::Other { url: url.to_owned(), message: short(&text) },
    }
}

/// Whether a response's object (`size`, `etag`) is the version `object` was listed as. ETags are
/// compared without quotes and a weak `W/` mark; an object listed without one is checked by size.
fn same_version(object: &ObjectMeta, size: u64, etag: Option<&str>) -> bool {
    let bare = |t: &str| t.trim_start_matches("W/").trim_matches('"').to_owned();
    size == object.size
        && (object.etag.starts_with("last-modified:") || etag.is_none_or(|t| bare(t) == bare(&object.etag)))
}

/// The first line of an error, without the XML body servers attach.
fn short(text: &str) -> String {
    let t = text.split("body: Some(").next().unwrap_or(text);
    t.chars().take(400).collect()
}

impl S3Objects {
    /// A store configured from this process's environment and the user's AWS files.
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn from_env() -> std::io::Result<Self> {
        Self::from_env_retrying(DEFAULT_RETRY_TIMEOUT)
    }

    /// [`S3Objects::from_env`], retrying a failed request for at most `retry_timeout`.
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn from_env_retrying(retry_timeout: Duration) -> std::io::Result<Self> {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        let settings = aws::Settings::resolve(&|k| std::env::var(k).ok(), home.as_deref());
        Self::with_retry_timeout(settings, retry_timeout)
    }

    /// A store with `settings`.
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn new(settings: aws::Settings) -> std::io::Result<Self> {
        Self::with_retry_timeout(settings, DEFAULT_RETRY_TIMEOUT)
    }

    /// A store with `settings` that retries a failed request for at most `retry_timeout`.
    ///
    /// # Errors
    /// The runtime cannot start.
    pub fn with_retry_timeout(settings: aws::Settings, retry_timeout: Duration) -> std::io::Result<Self> {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("mbd-s3").enable_all().build()?;
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: 10,
            retry_timeout,
        };
        Ok(Self(Arc::new(Inner {
            settings,
            runtime,
            buckets: Mutex::new(HashMap::new()),
            retry,
            timeout: Duration::from_secs(120),
        })))
    }

    /// The settings in use (secrets included: do not log them whole).
    #[must_use]
    pub fn settings(&self) -> &aws::Settings {
        &self.0.settings
    }
}

impl Inner {
    fn bucket(&self, url: &str, name: &str) -> Result<Arc<AmazonS3>, RemoteError> {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(b) = buckets.get(name) {
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
        let mut options = ClientOptions::new().with_timeout(self.timeout).with_connect_timeout(Duration::from_secs(10));
        if s.allow_http() {
            options = options.with_allow_http(true);
        }
        let store = b
            .with_client_options(options)
            .with_http_connector(capped::CappedConnector)
            .with_retry(self.retry.clone())
            .build()
            .map_err(|e| other(url, format!("cannot configure S3 access: {}", short(&e.to_string()))))?;
        let store = Arc::new(store);
        buckets.insert(name.to_owned(), store.clone());
        Ok(store)
    }

    fn meta(bucket: &str, m: &object_store::ObjectMeta) -> ObjectMeta {
        let url = format!("{SCHEME}{bucket}/{}", m.location);
        let etag = m.e_tag.clone().unwrap_or_else(|| format!("last-modified:{}", m.last_modified.to_rfc3339()));
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

    /// Runs the request `op` again, with backoff, while its response body breaks off (the
    /// client retries a request that fails, up to `object_retry_secs`, but not a body that
    /// fails midway): up to [`BODY_RETRIES`] times.
    fn again<T>(url: &str, mut op: impl FnMut() -> object_store::Result<T>) -> object_store::Result<T> {
        let mut failures = 0;
        loop {
            match op() {
                // A body that broke off (the client's retries cover the request, not its body).
                // A body past its bound (`capped`) is refused at once: a server that sent one
                // would send it again.
                Err(e @ object_store::Error::Generic { .. })
                    if failures < BODY_RETRIES && e.to_string().contains("body") && !capped::is_too_large(&e) =>
                {
                    failures += 1;
                    tracing::debug!(url, error = %e, "request failed; trying again");
                    std::thread::sleep(Duration::from_millis(100 << failures.min(6)));
                }
                other => return other,
            }
        }
    }

    /// Every object under `prefix` (a directory-like prefix, or all of the bucket), by key.
    fn list_prefix(&self, url: &str, bucket: &str, prefix: &str) -> Result<Vec<ObjectMeta>, RemoteError> {
        use futures::TryStreamExt as _;
        let store = self.bucket(url, bucket)?;
        let prefix = prefix.trim_end_matches('/');
        let key = (!prefix.is_empty()).then(|| Key::from(prefix));
        let found = Self::again(url, || self.runtime.block_on(store.list(key.as_ref()).try_collect::<Vec<_>>()))
            .map_err(|e| classify(url, &e))?;
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
        store: Arc<AmazonS3>,
        object: &ObjectMeta,
        from: u64,
        end: u64,
    ) -> Result<BoxStream<'static, object_store::Result<bytes::Bytes>>, RemoteError> {
        let (_, key) = split_url(&object.url)?;
        let options = GetOptions {
            if_match: (!object.etag.starts_with("last-modified:")).then(|| object.etag.clone()),
            range: Some(GetRange::Bounded(from..end)),
            ..GetOptions::default()
        };
        match store.get_opts(&Key::from(key), options).await {
            // A server that ignores `If-Match` could answer with another version: its size and
            // ETag are checked against the listing's before a byte is used.
            Ok(r) if !same_version(object, r.meta.size, r.meta.e_tag.as_deref()) => {
                Err(RemoteError::Changed { url: object.url.clone(), indexed: object.etag.clone() })
            }
            Ok(r) => Ok(r.into_stream()),
            Err(e) => Err(match classify(&object.url, &e) {
                RemoteError::Changed { url, .. } => RemoteError::Changed { url, indexed: object.etag.clone() },
                other => other,
            }),
        }
    }

    /// Bytes `start..end` of `object`, streamed by a task on the runtime into a bounded channel
    /// while the caller consumes them (the network read goes on while the caller parses or
    /// writes). A body that breaks off is requested again from where it stopped, up to
    /// [`BODY_RETRIES`] times; a request that fails was retried by the client already.
    fn pipe(
        &self,
        object: &ObjectMeta,
        start: u64,
        end: u64,
    ) -> tokio::sync::mpsc::Receiver<Result<bytes::Bytes, RemoteError>> {
        let (tx, rx) = tokio::sync::mpsc::channel(PIPE_DEPTH);
        let object = object.clone();
        let store = split_url(&object.url).and_then(|(bucket, _)| self.bucket(&object.url, bucket));
        self.runtime.spawn(async move {
            let store = match store {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let mut at = start;
            let mut failures = 0u32;
            while at < end {
                let mut stream = match Self::get_from(store.clone(), &object, at, end).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                let broke = loop {
                    match stream.next().await {
                        Some(Ok(bytes)) if bytes.is_empty() => {}
                        Some(Ok(bytes)) => {
                            let take = usize::try_from(end - at).unwrap_or(usize::MAX).min(bytes.len());
                            at += take as u64;
                            if tx.send(Ok(bytes.slice(..take))).await.is_err() {
                                return; // the reader went away
                            }
                        }
                        Some(Err(e)) => break Some(e.to_string()),
                        None => break (at < end).then(|| "the response ended early".to_owned()),
                    }
                };
                if let Some(why) = broke {
                    failures += 1;
                    if failures > BODY_RETRIES {
                        let message = format!("reading bytes {start}..{end}: {why} ({BODY_RETRIES} retries)");
                        let _ = tx.send(Err(other(&object.url, message))).await;
                        return;
                    }
                    tracing::debug!(object = %object.url, at, why, "body broke off; requesting the rest again");
                    tokio::time::sleep(Duration::from_millis(100 << failures.min(6))).await;
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
            let key = Key::from(rest);
            match Self::again(pattern, || self.runtime.block_on(async { store.head(&key).await })) {
                Ok(m) => vec![Self::meta(bucket, &m)],
                // Not an object: a "directory" of objects, or nothing.
                Err(object_store::Error::NotFound { .. }) => {
                    Self::visible(self.list_prefix(pattern, bucket, &format!("{rest}/"))?, pattern.len() + 1)
                }
                Err(e) => return Err(classify(pattern, &e)),
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
            let piece = body.next().map_err(|e| other(&object.url, e.to_string()))?;
            if piece.is_empty() {
                return Ok(end - start);
            }
            out.write_all(&piece).map_err(|e| other(&object.url, format!("writing the range: {e}")))?;
        }
    }

    fn get(&self, url: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, RemoteError> {
        use futures::StreamExt as _;
        /// What a GET found.
        enum Got {
            Absent,
            Bytes(Vec<u8>),
            TooLarge,
        }
        let (bucket, key) = split_url(url)?;
        let store = self.bucket(url, bucket)?;
        let key = Key::from(key);
        let got = Self::again(url, || {
            self.runtime.block_on(async {
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
                    if (out.len() + piece.len()) as u64 > max_bytes {
                        return Ok(Got::TooLarge);
                    }
                    out.extend_from_slice(&piece);
                }
                Ok(Got::Bytes(out))
            })
        });
        match got.map_err(|e| classify(url, &e))? {
            Got::Absent => Ok(None),
            Got::Bytes(b) => Ok(Some(b)),
            Got::TooLarge => Err(RemoteError::TooLarge { url: url.to_owned(), limit: max_bytes }),
        }
    }

    fn put_if_absent(&self, url: &str, bytes: Vec<u8>) -> Result<bool, RemoteError> {
        let (bucket, key) = split_url(url)?;
        let store = self.bucket(url, bucket)?;
        let key = Key::from(key);
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let payload = PutPayload::from(bytes);
        let put = Self::again(url, || {
            self.runtime.block_on(async { store.put_opts(&key, payload.clone(), options.clone()).await })
        });
        match put {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(classify(url, &e)),
        }
    }

    fn delete(&self, url: &str) -> Result<(), RemoteError> {
        let (bucket, key) = split_url(url)?;
        let store = self.bucket(url, bucket)?;
        let key = Key::from(key);
        match Self::again(url, || self.runtime.block_on(async { store.delete(&key).await })) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(classify(url, &e)),
        }
    }
}

/// How many pieces of a body the streaming task may hold ahead of its reader.
const PIPE_DEPTH: usize = 64;

/// The receiving end of [`Inner::pipe`], as a [`Read`] (the index pass's stream of a whole object)
/// or piece by piece (a range written to the cache).
struct Body {
    rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, RemoteError>>,
    current: bytes::Bytes,
    /// Bytes received, and the range's length: the channel closing before it is whole is an
    /// error, not the end (a streaming task that stopped must not look like the object's end).
    received: u64,
    expected: u64,
}

impl Body {
    fn new(rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, RemoteError>>, expected: u64) -> Self {
        Self { rx, current: bytes::Bytes::new(), received: 0, expected }
    }

    /// The next piece; empty at the end.
    fn next(&mut self) -> std::io::Result<bytes::Bytes> {
        if !self.current.is_empty() {
            return Ok(std::mem::take(&mut self.current));
        }
        loop {
            return match self.rx.blocking_recv() {
                Some(Ok(b)) if b.is_empty() => continue,
                Some(Ok(b)) => {
                    self.received += b.len() as u64;
                    Ok(b)
                }
                Some(Err(e)) => Err(std::io::Error::other(e)),
                None if self.received < self.expected => Err(std::io::Error::other(format!(
                    "the object's stream stopped after {} of {} bytes",
                    self.received, self.expected
                ))),
                None => Ok(bytes::Bytes::new()),
            };
        }
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.current.is_empty() {
                let n = buf.len().min(self.current.len());
                buf[..n].copy_from_slice(&self.current[..n]);
                self.current = self.current.slice(n..);
                return Ok(n);
            }
            let piece = self.next()?;
            if piece.is_empty() {
                return Ok(0);
            }
            self.current = piece;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body refused for its size (`capped`) is not fetched again; one that broke off is.
    #[test]
    fn a_body_past_its_bound_is_not_retried_and_a_broken_one_is() {
        let failing = |source: object_store::client::HttpError| object_store::Error::Generic {
            store: "S3",
            source: Box::new(source),
        };
        let mut calls = 0;
        let r: object_store::Result<()> = Inner::again("s3://b/k", || {
            calls += 1;
            Err(failing(capped::too_large()))
        });
        assert!(r.is_err());
        assert_eq!(calls, 1, "refused at once");
        let mut calls = 0;
        let r: object_store::Result<()> = Inner::again("s3://b/k", || {
            calls += 1;
            if calls < 3 {
                let broken =
                    std::io::Error::new(std::io::ErrorKind::ConnectionReset, "error reading a body from connection");
                Err(failing(object_store::client::HttpError::new(object_store::client::HttpErrorKind::Request, broken)))
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok());
        assert_eq!(calls, 3, "retried while the body broke off");
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
        assert!(same_version(&listed, 10, Some("\"abc\"")));
        assert!(same_version(&listed, 10, Some("abc")));
        assert!(same_version(&listed, 10, Some("W/\"abc\"")));
        assert!(same_version(&listed, 10, None));
        assert!(!same_version(&listed, 10, Some("\"abd\"")));
        assert!(!same_version(&listed, 11, Some("\"abc\"")));
        let no_etag = ObjectMeta { etag: "last-modified:2026-01-01T00:00:00+00:00".into(), ..listed };
        assert!(same_version(&no_etag, 10, Some("\"anything\"")));
        assert!(!same_version(&no_etag, 9, None));
    }
}
