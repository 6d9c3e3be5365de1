//! Where requests go and how long they may take ([`Reach`], [`Deadline`]): the endpoint the
//! errors name, each request's and each operation's deadline, and what a transport failure
//! is called.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use minibatchd_engine::remote::RemoteError;
use object_store::client::{HttpError, HttpErrorKind};

use crate::{broken_body, other, Timeouts, BODY_RETRIES};

/// The transport failure behind `e`, if it is one (through its chain of sources): a connection
/// refused or reset, a name that does not resolve, a request or body that timed out. A body
/// refused for its size is not one.
pub(crate) fn transport<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a HttpError> {
    std::iter::successors(Some(e), |e| e.source()).find_map(<dyn std::error::Error>::downcast_ref::<HttpError>).filter(
        |h| {
            matches!(
                h.kind(),
                HttpErrorKind::Connect | HttpErrorKind::Request | HttpErrorKind::Timeout | HttpErrorKind::Interrupted
            )
        },
    )
}

/// The first line of an error, without the XML body servers attach.
pub(crate) fn short(text: &str) -> String {
    let t = text.split("body: Some(").next().unwrap_or(text);
    t.chars().take(400).collect()
}

/// Seconds, as a person writes them (`2`, `0.5`).
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Where requests go and how long they may take: what the errors say.
#[derive(Debug, Clone)]
pub(crate) struct Reach {
    /// The endpoint, as the errors name it.
    pub(crate) endpoint: Arc<str>,
    pub(crate) timeouts: Timeouts,
}

impl Reach {
    /// An operation on `url` that made no progress for [`Timeouts::patience`]: `what` it waited
    /// for.
    pub(crate) fn stalled(&self, url: &str, what: &str) -> RemoteError {
        let t = self.timeouts;
        other(
            url,
            format!(
                "cannot reach the object store at {}: {what}: no answer within {} s (object_retry_secs {} + object_request_timeout_secs {})",
                self.endpoint,
                secs(t.patience()),
                secs(t.retry),
                secs(t.request)
            ),
        )
    }

    /// A transport failure of `what` on `url`: the store cannot be reached.
    pub(crate) fn unreachable(&self, url: &str, what: &str, cause: &str) -> RemoteError {
        other(url, format!("cannot reach the object store at {}: {what}: {}", self.endpoint, short(cause)))
    }

    /// What an `object_store` error of `what` on `url` means.
    pub(crate) fn classify(&self, url: &str, what: &str, e: &object_store::Error) -> RemoteError {
        let text = e.to_string();
        if transport(e).is_some() {
            return self.unreachable(url, what, &text);
        }
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
                RemoteError::Denied { url: url.to_owned(), message: format!("{what}: {}", short(&text)) }
            }
            _ if text.contains("NoSuchBucket") => {
                RemoteError::NotFound { url: url.to_owned(), message: "no such bucket".into() }
            }
            // An answer of the server (a listing's failure is not mapped to a variant by
            // `object_store`): its status, or S3's error codes. Never digits alone: the elapsed
            // time and the port in the message hold digits too.
            _ if text.contains("403 Forbidden")
                || text.contains("AccessDenied")
                || text.contains("InvalidAccessKeyId")
                || text.contains("SignatureDoesNotMatch") =>
            {
                RemoteError::Denied { url: url.to_owned(), message: format!("{what}: {}", short(&text)) }
            }
            // The request is named (a ranged GET's bytes): a failure after the client's retries
            // says which read failed, not only the store's words.
            _ => RemoteError::Other { url: url.to_owned(), message: format!("{what}: {}", short(&text)) },
        }
    }

    /// Runs the request `op` until it answers, and again, with backoff, while its response body
    /// breaks off (the client retries a request that fails, up to `object_retry_secs`, but not a
    /// body that fails midway): up to [`BODY_RETRIES`] times, and never past `deadline` — the
    /// operation then fails as stalled on `what`.
    pub(crate) async fn again<T, F: Future<Output = object_store::Result<T>>>(
        &self,
        url: &str,
        what: &str,
        deadline: &Deadline,
        mut op: impl FnMut() -> F,
    ) -> Result<T, RemoteError> {
        let mut failures = 0;
        loop {
            let e = match deadline.within(op()).await {
                None => return Err(self.stalled(url, what)),
                Some(Ok(v)) => return Ok(v),
                Some(Err(e)) => e,
            };
            if failures >= BODY_RETRIES || !broken_body(&e) {
                return Err(self.classify(url, what, &e));
            }
            failures += 1;
            tracing::debug!(url, error = %e, "request failed; trying again");
            if deadline.within(tokio::time::sleep(Duration::from_millis(100 << failures.min(6)))).await.is_none() {
                return Err(self.stalled(url, what));
            }
        }
    }
}

/// An operation's deadline: `patience` after its start or its last progress (bytes received).
/// Shared by reference with the futures that report progress (hence atomic).
pub(crate) struct Deadline {
    pub(crate) base: tokio::time::Instant,
    pub(crate) patience: Duration,
    /// Nanoseconds from `base` to the last progress.
    pub(crate) progress: AtomicU64,
}

impl Deadline {
    pub(crate) fn new(patience: Duration) -> Self {
        Self { base: tokio::time::Instant::now(), patience, progress: AtomicU64::new(0) }
    }

    /// Bytes arrived (or a reader took them): the clock starts again.
    pub(crate) fn progress(&self) {
        let nanos = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.progress.store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn at(&self) -> tokio::time::Instant {
        self.base + Duration::from_nanos(self.progress.load(Ordering::Relaxed)) + self.patience
    }

    /// `f`'s output, or `None` once the deadline passes first (it moves with the progress `f`
    /// reports meanwhile).
    pub(crate) async fn within<F: Future>(&self, f: F) -> Option<F::Output> {
        let mut f = std::pin::pin!(f);
        loop {
            let at = self.at();
            match tokio::time::timeout_at(at, f.as_mut()).await {
                Ok(v) => return Some(v),
                Err(_) if self.at() > at => {}
                Err(_) => return None,
            }
        }
    }
}
