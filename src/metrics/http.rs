//! The `/metrics` and `/healthz` endpoint on `daemon.metrics_listen`: a minimal HTTP/1.1
//! responder on the daemon's tokio runtime (no HTTP framework: two read-only routes need no
//! more, and every byte of it is bounded).
//!
//! * `GET /metrics` — the Prometheus text exposition (`text/plain; version=0.0.4`).
//! * `GET /healthz` — `200 ok` while every stage runs and the daemon serves; `503` with the
//!   reason while it starts, reloads a stage or stops.
//! * `HEAD` on both; anything else gets 404/405/400.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once (further ones wait in the kernel's
//! accept backlog), a request head of at most [`MAX_REQUEST_BYTES`], [`REQUEST_TIMEOUT`] per
//! connection, one request per connection (`Connection: close`). Nothing here can panic on
//! what a peer sends.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Renders the metrics text (the daemon refreshes its gauges first).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;
/// `Ok` when healthy, else why not (the `503` body).
pub type Health = Arc<dyn Fn() -> Result<(), NotServing> + Send + Sync>;

/// Why `/healthz` answers `503`: the daemon's own explanation, as the body's one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotServing(pub String);

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Largest request head accepted.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Time allowed for one connection, request and response.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/metrics`; `true` for `HEAD`.
    Metrics(bool),
    /// `/healthz`; `true` for `HEAD`.
    Health(bool),
    /// An unknown path.
    NotFound,
    /// A method other than GET or HEAD.
    MethodNotAllowed,
    /// Not an HTTP request line.
    BadRequest,
}

/// Routes a request head (the bytes up to the blank line).
#[must_use]
pub fn route(head: &[u8]) -> Route {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else { return Route::BadRequest };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::BadRequest;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::MethodNotAllowed,
    };
    match target.split('?').next().unwrap_or("") {
        "/metrics" => Route::Metrics(head_only),
        "/healthz" => Route::Health(head_only),
        _ => Route::NotFound,
    }
}

/// Serves until the listener fails for good (never, in practice) or the task is dropped.
pub async fn serve(listener: TcpListener, render: Render, health: Health) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((stream, _)) => {
                let (render, health) = (render.clone(), health.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, handle(stream, &render, &health)).await;
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn head_complete(buf: &[u8]) -> bool {
    buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n")
}

async fn handle(mut stream: TcpStream, render: &Render, health: &Health) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head_complete(&buf) {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST_BYTES {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request too large\n",
                false,
            )
            .await;
        }
    }
    match route(&buf) {
        Route::Metrics(head_only) => {
            let body = render();
            respond(&mut stream, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body.as_bytes(), head_only).await
        }
        Route::Health(head_only) => match health() {
            Ok(()) => respond(&mut stream, "200 OK", "text/plain", b"ok\n", head_only).await,
            Err(why) => {
                respond(&mut stream, "503 Service Unavailable", "text/plain", format!("{why}\n").as_bytes(), head_only)
                    .await
            }
        },
        Route::NotFound => {
            respond(&mut stream, "404 Not Found", "text/plain", b"try /metrics or /healthz\n", false).await
        }
        Route::MethodNotAllowed => {
            respond(&mut stream, "405 Method Not Allowed", "text/plain", b"GET or HEAD\n", false).await
        }
        Route::BadRequest => respond(&mut stream, "400 Bad Request", "text/plain", b"bad request\n", false).await,
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(body).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Route::Metrics(false));
        assert_eq!(route(b"HEAD /healthz HTTP/1.0\r\n\r\n"), Route::Health(true));
        assert_eq!(route(b"GET /metrics?name[]=x HTTP/1.1\r\n\r\n"), Route::Metrics(false));
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), Route::MethodNotAllowed);
        assert_eq!(route(b"\xff\xfe"), Route::BadRequest);
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b""), Route::BadRequest);
    }

    #[test]
    fn serves_metrics_health_and_refuses_garbage() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            async fn get(addr: std::net::SocketAddr, req: &[u8]) -> String {
                let mut s = TcpStream::connect(addr).await.expect("connect");
                s.write_all(req).await.expect("write");
                let mut out = String::new();
                s.read_to_string(&mut out).await.expect("read");
                out
            }
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let h = healthy.clone();
            let render: Render = Arc::new(|| "minibatchd_up 1\n".to_owned());
            let health: Health = Arc::new(move || {
                if h.load(std::sync::atomic::Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err(NotServing("stopping".into()))
                }
            });
            tokio::spawn(serve(listener, render, health));
            let m = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
            assert!(m.starts_with("HTTP/1.1 200 OK") && m.ends_with("minibatchd_up 1\n"), "{m}");
            assert!(get(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await.ends_with("ok\n"));
            healthy.store(false, std::sync::atomic::Ordering::Relaxed);
            assert!(get(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 503"));
            assert!(get(addr, &[b'x'; 10_000]).await.starts_with("HTTP/1.1 431"));
            assert!(get(addr, b"\x00\x01\n\n").await.starts_with("HTTP/1.1 400"));
        });
    }
}
