//! `object_store`'s HTTP client with every response bounded, in size and in time.
//!
//! `object_store` collects a listing page, an error document or a credentials answer into memory
//! with a reserve of the size its `Content-Length` claims: a broken or hostile endpoint that
//! claims 100 TB aborted the process (an allocation failure is not an error in Rust). Through
//! [`CappedConnector`]:
//!
//! * every response body reports at most [`MAX_RESERVE`] bytes as its size, so no collect reserves
//!   more than that up front (a real body grows its buffer as it arrives);
//! * a response other than an object's data — any answer that is not a success to a `GET` of an
//!   object (a listing is a `GET` with `list-type` in its query) — fails once it passes
//!   [`MAX_COLLECTED`] bytes. An object's data is streamed by the callers, who count what they
//!   asked for (a range, or the most a shared index can take);
//! * every request waits at most the request timeout (`object_request_timeout_secs`) for its
//!   answer's head (connecting, sending the request and any payload included), and every response
//!   body at most that long for its next bytes: a server that accepts the connection and never
//!   answers, or stops sending midway, is a [`HttpErrorKind::Timeout`] (which `object_store`
//!   retries within `object_retry_secs`), never a wait without end. The body's clock runs only
//!   while its reader waits for it, so a slow reader (a parser, a full channel) is not taken for a
//!   stalled server.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpResponseBody, HttpService,
    ReqwestConnector,
};
use object_store::ClientOptions;

/// The most a response body may announce as its size (what a collect reserves at once).
pub const MAX_RESERVE: u64 = 16 << 20;
/// The most bytes of a response that is not an object's data: a listing page of 1,000 keys with
/// long names is a few MiB, an error document or a credentials answer a few KiB.
pub const MAX_COLLECTED: u64 = 64 << 20;

/// `object_store`'s reqwest client, its responses bounded in size and in time.
#[derive(Debug)]
pub struct CappedConnector {
    /// How long a request waits for its answer's head, and a body for its next bytes.
    pub timeout: Duration,
}

impl HttpConnector for CappedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Capped { inner: ReqwestConnector::default().connect(options)?, timeout: self.timeout }))
    }
}

#[derive(Debug)]
struct Capped {
    inner: HttpClient,
    timeout: Duration,
}

#[async_trait::async_trait]
impl HttpService for Capped {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let object_get = req.method().as_str() == "GET" && !req.uri().query().is_some_and(|q| q.contains("list-type"));
        let resp = match tokio::time::timeout(self.timeout, self.inner.execute(req)).await {
            Ok(resp) => resp?,
            Err(_) => return Err(HttpError::new(HttpErrorKind::Timeout, Stalled::Answer(self.timeout))),
        };
        let limit = if object_get && resp.status().is_success() { u64::MAX } else { MAX_COLLECTED };
        let (parts, body) = resp.into_parts();
        let body = Bounded { inner: body, left: limit, idle: self.timeout, waiting: None };
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

/// A body that reports at most [`MAX_RESERVE`] as its size, fails past `left` bytes, and fails
/// when its reader has waited `idle` for the next bytes.
#[derive(Debug)]
struct Bounded {
    inner: HttpResponseBody,
    left: u64,
    idle: Duration,
    /// Since when the reader waits for the next frame (`None` while it does not).
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// A server that did not answer in time.
#[derive(Debug, thiserror::Error)]
enum Stalled {
    #[error("no answer within {} s (object_request_timeout_secs)", .0.as_secs_f64())]
    Answer(Duration),
    #[error("the response body stalled: no bytes for {} s (object_request_timeout_secs)", .0.as_secs_f64())]
    Body(Duration),
}

/// The error of a body past its bound.
#[derive(Debug, thiserror::Error)]
#[error(
    "the response body passes {MAX_COLLECTED} bytes, more than such an answer can be (a broken or hostile endpoint)"
)]
struct TooLarge;

/// The error a body past its bound fails with.
pub fn too_large() -> HttpError {
    HttpError::new(HttpErrorKind::Decode, TooLarge)
}

/// Whether `e` (through its chain of sources) is a body refused for its size: not worth retrying,
/// a server that sent one would send it again.
pub fn is_too_large(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(<dyn std::error::Error>::is::<TooLarge>)
}

impl Body for Bounded {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_pending() {
            let idle = self.idle;
            let timer = self.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
            if timer.as_mut().poll(cx).is_ready() {
                self.waiting = None;
                return Poll::Ready(Some(Err(HttpError::new(HttpErrorKind::Timeout, Stalled::Body(idle)))));
            }
            return Poll::Pending;
        }
        self.waiting = None;
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let n = data.len() as u64;
                if n > self.left {
                    self.left = 0;
                    return Poll::Ready(Some(Err(too_large())));
                }
                self.left -= n;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().min(MAX_RESERVE));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.max(hint.lower()));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `chunks`, announcing `claimed` bytes.
    #[derive(Debug)]
    struct Lying {
        chunks: Vec<Bytes>,
        claimed: u64,
    }

    impl Body for Lying {
        type Data = Bytes;
        type Error = HttpError;

        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
            Poll::Ready(if self.chunks.is_empty() { None } else { Some(Ok(Frame::data(self.chunks.remove(0)))) })
        }

        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(self.claimed)
        }
    }

    fn bounded(inner: HttpResponseBody, left: u64) -> Bounded {
        Bounded { inner, left, idle: Duration::from_secs(10), waiting: None }
    }

    fn collect(body: Bounded) -> Result<Vec<u8>, HttpError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        rt.block_on(async move { HttpResponseBody::new(body).bytes().await.map(|b| b.to_vec()) })
    }

    #[test]
    fn a_claimed_size_reserves_at_most_the_cap_and_a_long_body_fails_past_its_bound() {
        let lying = |chunks: Vec<Bytes>| HttpResponseBody::new(Lying { chunks, claimed: 100_000_000_000_000 });
        let two = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"def")];
        let b = bounded(lying(two.clone()), MAX_COLLECTED);
        assert_eq!(b.size_hint().lower(), MAX_RESERVE);
        assert_eq!(collect(b).expect("collected"), b"abcdef");
        let e = collect(bounded(lying(two), 4)).expect_err("past the bound");
        assert!(is_too_large(&e), "{e:?}");
        let exact = bounded(HttpResponseBody::from(b"12345".to_vec()), 5);
        assert_eq!(exact.size_hint().lower(), 5);
        assert_eq!(collect(exact).expect("at the bound"), b"12345");
    }

    /// A body that never sends its next bytes.
    #[derive(Debug)]
    struct Silent;

    impl Body for Silent {
        type Data = Bytes;
        type Error = HttpError;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
            Poll::Pending
        }
    }

    /// A silent body fails after the idle time with a timeout (which the client retries); a
    /// reader slower than the idle time does not make a body that has its bytes fail.
    #[test]
    fn a_silent_body_times_out_and_a_slow_reader_does_not() {
        let idle = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let e = collect(Bounded { inner: HttpResponseBody::new(Silent), left: MAX_COLLECTED, idle, waiting: None })
            .expect_err("stalled");
        assert_eq!(e.kind(), HttpErrorKind::Timeout);
        assert!(e.to_string().contains("no bytes for 0.2 s (object_request_timeout_secs)"), "{e}");
        assert!((idle..idle * 10).contains(&started.elapsed()), "{:?}", started.elapsed());
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let chunks = vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cd"), Bytes::from_static(b"ef")];
        let body = Bounded {
            inner: HttpResponseBody::new(Lying { chunks, claimed: 6 }),
            left: MAX_COLLECTED,
            idle,
            waiting: None,
        };
        let got = rt.block_on(async move {
            use futures::StreamExt as _;
            let mut stream = HttpResponseBody::new(body).bytes_stream();
            let mut got = Vec::new();
            while let Some(piece) = stream.next().await {
                got.extend_from_slice(&piece?);
                tokio::time::sleep(idle * 2).await;
            }
            Ok::<_, HttpError>(got)
        });
        assert_eq!(got.expect("a slow reader"), b"abcdef");
    }
}
