//! One client connection: an async task that speaks the protocol ([`minibatchd_client::protocol`]) and
//! drives one session's plain state ([`SlotTable`](super::session::SlotTable),
//! [`Progress`](super::session::Progress)) between the socket and the
//! session's producer (tasks of the delivery stage's pool).
//!
//! Phases: `hello` → `open` → serving (`ready` out as slots fill; `release`, `state`, `close` in).
//! Client input never panics the daemon: bad frames get `error{bad_message}`, an oversized frame
//! or a version mismatch gets an error reply and the connection is closed. When the socket closes
//! for any reason, the session's producer is stopped at once (its slots are reclaimed with the
//! ring) and the session is parked in the registry, resumable by name for
//! `session_linger_secs` at the position after the last minibatch taken.
//!
//! **Shutdown.** When the daemon stops, a serving connection stops its producer, sends
//! `error{shutting_down}` (after any `ready` already sent: those minibatches stay valid in the
//! client's mapping) and keeps reading for `shutdown_grace_secs`, so the client can report what
//! it took (`close{taken}`, answered with `closed{state}`). The session is then parked with that
//! position, which the shutdown checkpoint saves.
//!
//! **Reload.** When a configuration reload removes the session's dataset (or configured mixture,
//! or one of its datasets), the session ends with `error{unknown_dataset}` (parked, resumable by
//! name should it return).
//!
//! Metrics, per message: the consumer wait the client reports (`wait_ns`, cumulative), ring slots
//! by state; the acknowledged state goes to the registry, whence the checkpoints take it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use minibatchd_client::protocol::{
    self, hex64, ClientMessage, ErrorCode, FrameBuffer, FrameError, ServerMessage, SessionState, FEATURE_CONSUMER_WAIT,
    FEATURE_OPEN_WAITS_FOR_INDEX, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

use super::admission::Refusal;
use super::mixture::AT_OPEN;
use super::open_session::OpenSession;
use super::peer::{ConnShared, Peer};
use super::session::Release;
use super::ControlPlane;
use crate::pipeline::data::producer::{FreeSlot, ProducerEvent};
use opening::{open_watching, refuse, CANCELLED, CLIENT_GONE};

mod opening;

/// Bytes read from the socket at a time.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Where the conversation stands.
enum Phase {
    Hello,
    /// Hello done, with this protocol version.
    Open(u32),
    Serving(Box<OpenSession>),
}

/// What to do after a frame.
enum Flow {
    Continue,
    Close,
}

async fn send(wr: &mut OwnedWriteHalf, msg: &ServerMessage) -> std::io::Result<()> {
    within_send_timeout(wr.write_all(&protocol::encode(msg))).await
}

/// How long a reply to a client's message may wait for the client to read: a client that sends
/// but never reads (replies pile up in the socket until it is full) is disconnected after this
/// long instead of holding the connection — and its handshake timeout, and the daemon's stop —
/// for ever. A client waits for the reply to each request it makes, so a legitimate one is never
/// cut off; the `ready` messages of a session, which a busy trainer may leave unread for a long
/// time, are not under it.
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn within_send_timeout(io: impl std::future::Future<Output = std::io::Result<()>>) -> std::io::Result<()> {
    tokio::time::timeout(SEND_TIMEOUT, io).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the client read nothing for {} s", SEND_TIMEOUT.as_secs()),
        ))
    })
}

/// Sends `msg` with `fd` attached (`SCM_RIGHTS` on the first bytes).
async fn send_with_fd(wr: &mut OwnedWriteHalf, msg: &ServerMessage, fd: &OwnedFd) -> std::io::Result<()> {
    within_send_timeout(send_with_fd_now(wr, msg, fd)).await
}

async fn send_with_fd_now(wr: &mut OwnedWriteHalf, msg: &ServerMessage, fd: &OwnedFd) -> std::io::Result<()> {
    let bytes = protocol::encode(msg);
    let sent = {
        let sock: &UnixStream = wr.as_ref();
        loop {
            sock.writable().await?;
            match sock.try_io(tokio::io::Interest::WRITABLE, || {
                minibatchd_sys::fdpass::send_with_fd(sock.as_fd(), &bytes, fd.as_fd())
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    };
    wr.write_all(&bytes[sent..]).await
}

/// The refused connections' warning: a line every 10 s at most.
static REFUSED_LOG: minibatchd_engine::throttle::LogThrottle =
    minibatchd_engine::throttle::LogThrottle::new(std::time::Duration::from_secs(10));

/// Serves one client until it goes, errs fatally, or the daemon stops.
pub async fn serve(stream: UnixStream, conn: Arc<ConnShared>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let peer = Peer::of(&stream);
    let limits = conn.shared.limits;
    let (mut rd, mut wr) = stream.into_split();
    let _alive = match conn.shared.connections.enter(peer.uid, &limits) {
        Ok(guard) => guard,
        Err(e) => {
            // A client in a reconnect loop is refused thousands of times: one line a while
            // (the metric counts every refusal).
            if let Some(left_out) = REFUSED_LOG.admit(std::time::Instant::now()) {
                tracing::warn!(peer = %peer, refused_since_last_line = left_out, "{e}; connection closed");
            }
            conn.shared.data.metrics.control.connections_refused.with_label_values(&[e.key]).inc();
            let _ = send(&mut wr, &ServerMessage::error(ErrorCode::ResourceExhausted, e.to_string())).await;
            return;
        }
    };
    // At debug: a connection that opens a session is logged once, when it does ("session
    // opened"); the clients' probe handshake (`connect()`) and other session-less connections
    // stay out of the info log.
    tracing::debug!(peer = %peer, "client connected");
    // A connection holds a descriptor: without a session it may not hold it for long.
    let handshake = tokio::time::sleep(limits.handshake_timeout);
    tokio::pin!(handshake);
    let mut frames = FrameBuffer::default();
    let mut buf = vec![0u8; READ_BUFFER_BYTES];
    let mut phase = Phase::Hello;
    let mut reloads = conn.shared.data.catalog_changes();
    'conn: loop {
        let events = match &phase {
            Phase::Serving(a) if a.producing => Some(a.events.clone()),
            _ => None,
        };
        tokio::select! {
            read = rd.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break 'conn,
                    Ok(n) => n,
                };
                frames.push(&buf[..n]);
                if !on_frames(&mut frames, &mut phase, &conn, &rd, &mut wr, &peer).await {
                    break 'conn;
                }
            }
            event = async {
                match &events {
                    Some(rx) => rx.recv_async().await.ok(),
                    None => std::future::pending().await,
                }
            } => {
                let Phase::Serving(active) = &mut phase else { continue };
                if on_events(event, active, &mut wr).await.is_err() {
                    break 'conn;
                }
                // What the trainer may now hold, for the checkpoints.
                active.record(&conn.shared);
            }
            changed = reloads.changed() => {
                if changed.is_err() {
                    continue;
                }
                if let Phase::Serving(a) = &phase {
                    let catalog = conn.shared.data.catalog();
                    let dataset = a.sources.iter().find(|d| !catalog.contains(d)).map(|d| format!("dataset '{d}'"));
                    // Found by a probe: a configured mixture removed by a reload went on serving
                    // its open sessions (2.4 M minibatches), where a removed dataset's sessions end.
                    let mixture = a.configured_mixture.as_ref().filter(|m| !conn.shared.config().mixtures.contains_key(*m));
                    if let Some(gone) = dataset.or_else(|| mixture.map(|m| format!("mixture '{m}'"))) {
                        let m = format!(
                            "{gone} was removed by a configuration reload; report the minibatches taken with close{{taken}}: the session is kept resumable by name from there",
                        );
                        tracing::info!(peer = %peer, session = %a.name, "{m}");
                        let ending = Ending { code: ErrorCode::UnknownDataset, message: m };
                        drain(&mut phase, &mut rd, &mut wr, &mut frames, &mut buf, &conn, &peer, ending).await;
                        break 'conn;
                    }
                }
            }
            () = &mut handshake, if !matches!(phase, Phase::Serving(_)) => {
                let m = format!(
                    "no session opened within {} s (daemon.handshake_timeout_secs); connection closed",
                    limits.handshake_timeout.as_secs()
                );
                tracing::info!(peer = %peer, "{m}");
                conn.shared.data.metrics.control.connections_refused.with_label_values(&["handshake_timeout"]).inc();
                let _ = send(&mut wr, &ServerMessage::error(ErrorCode::ResourceExhausted, m)).await;
                break 'conn;
            }
            _ = shutdown.changed() => {
                let ending = Ending {
                    code: ErrorCode::ShuttingDown,
                    message: "the daemon is stopping; report the minibatches taken with close{taken} to checkpoint this session's position".to_owned(),
                };
                drain(&mut phase, &mut rd, &mut wr, &mut frames, &mut buf, &conn, &peer, ending).await;
                break 'conn;
            }
        }
    }
    if let Phase::Serving(active) = phase {
        finish(*active, &conn.shared, &peer);
    } else {
        tracing::debug!(peer = %peer, "client disconnected without a session");
    }
}

/// Handles every whole frame in `frames`; `false` when the connection must close.
async fn on_frames(
    frames: &mut FrameBuffer,
    phase: &mut Phase,
    conn: &ConnShared,
    rd: &OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    peer: &Peer,
) -> bool {
    loop {
        let body = match frames.next_frame() {
            Ok(Some(body)) => body,
            Ok(None) => return true,
            Err(e) => {
                tracing::warn!(peer = %peer, error = %e, "closing connection");
                let _ = send(wr, &ServerMessage::error(ErrorCode::MessageTooLarge, e.to_string())).await;
                return false;
            }
        };
        match on_frame(&body, phase, conn, rd, wr, peer).await {
            Ok(Flow::Continue) => {}
            Ok(Flow::Close) | Err(_) => return false,
        }
    }
}

/// Why the daemon ends a serving session: the error the client gets.
struct Ending {
    code: ErrorCode,
    message: String,
}

/// The daemon ends the session (it is stopping, or the session's dataset was removed): stop
/// producing, tell the client, and give it `shutdown_grace_secs` to report what it took
/// (`close{taken}`) before the session is parked — so that a resume by name can be exact.
#[allow(clippy::too_many_arguments)] // the connection task's parts, borrowed one by one
async fn drain(
    phase: &mut Phase,
    rd: &mut tokio::net::unix::OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    frames: &mut FrameBuffer,
    buf: &mut [u8],
    conn: &ConnShared,
    peer: &Peer,
    ending: Ending,
) {
    let Phase::Serving(a) = phase else {
        let _ = send(wr, &ServerMessage::error(ending.code, "the daemon is stopping")).await;
        return;
    };
    a.producer.stop();
    a.producing = false;
    if send(wr, &ServerMessage::error(ending.code, ending.message)).await.is_err() {
        return;
    }
    if a.progress.unacknowledged() == 0 {
        return; // every minibatch announced is reported taken: the position is exact already
    }
    let grace = std::time::Duration::from_secs(conn.shared.config().daemon.shutdown_grace_secs);
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        let n = match tokio::time::timeout_at(deadline, rd.read(buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            Ok(_) => return, // the client went
            Err(_) => {
                tracing::info!(peer = %peer, "the client did not report its position within shutdown_grace_secs");
                return;
            }
        };
        frames.push(&buf[..n]);
        if !on_frames(frames, phase, conn, rd, wr, peer).await {
            return;
        }
    }
}

/// Stops the producer (reclaiming every slot with the ring), parks the session for resuming and
/// gives its ring memory back.
fn finish(mut active: OpenSession, shared: &ControlPlane, peer: &Peer) {
    active.producer.stop();
    active.publish_slots(true);
    let state = active.state();
    let given_up_to = active.given_up_to();
    tracing::info!(peer = %peer, session = %active.name, position = state.position, minibatches = state.minibatches, given_up_to, leased = active.slots.leased(), "session ended; slots reclaimed");
    if given_up_to > state.minibatches {
        tracing::info!(
            session = %active.name,
            minibatches = state.minibatches,
            given_up_to,
            "the client went without saying what it took: a resume by name continues after its last reported minibatch, and says it is not exact"
        );
    }
    let mut reg = shared.registry();
    reg.park_given(&active.name, state, given_up_to, Instant::now());
    reg.unreserve(active.ring_bytes);
    shared.rebudget(&reg);
}

/// Most `ready` messages sent in one write: the producer can fill several slots while the
/// connection task waits for the socket, and one syscall for all of them costs less.
const READY_BATCH: usize = 64;

/// Handles `event` and whatever else the producer has queued already (up to [`READY_BATCH`]),
/// then sends the replies in one write.
async fn on_events(event: Option<ProducerEvent>, a: &mut OpenSession, wr: &mut OwnedWriteHalf) -> std::io::Result<()> {
    let mut out = Vec::new();
    let mut more = on_event(event, a, &mut out);
    let mut batched = 1;
    while more && batched < READY_BATCH {
        match a.events.try_recv() {
            Ok(event) => more = on_event(Some(event), a, &mut out),
            Err(flume::TryRecvError::Empty) => break,
            Err(flume::TryRecvError::Disconnected) => more = on_event(None, a, &mut out),
        }
        batched += 1;
    }
    // No timeout here: a trainer busy elsewhere (an evaluation pass, a checkpoint save) may leave
    // its `ready`s unread for minutes; only its own producer waits meanwhile.
    wr.write_all(&out).await
}

/// Appends the reply to `event` to `out`; `true` while the producer goes on.
fn on_event(event: Option<ProducerEvent>, a: &mut OpenSession, out: &mut Vec<u8>) -> bool {
    match event {
        Some(ProducerEvent::Filled { slot, generation, meta, mixture }) => {
            a.slots.announce(usize::try_from(slot).unwrap_or(usize::MAX), generation, meta.index);
            // A mixture's state after it rides in its slot (`mixture/state`) and here, for the
            // session's progress.
            a.progress.announced(meta, mixture.map(|m| *m));
            a.publish_slots(false);
            if a.binary {
                out.extend_from_slice(&protocol::encode_ready_binary(slot, generation, &meta));
            } else {
                out.extend_from_slice(&protocol::encode(&ServerMessage::Ready { slot, generation, minibatch: meta }));
            }
            return true;
        }
        Some(ProducerEvent::End { position, minibatches, mixture }) => {
            let state = SessionState { position, minibatches, mixture, ..a.state() };
            out.extend_from_slice(&protocol::encode(&ServerMessage::End { state }));
        }
        Some(ProducerEvent::Failed { code, message, detail }) => {
            let d = detail.as_ref();
            tracing::warn!(
                session = %a.name,
                ?code,
                file = d.and_then(|d| d.file.as_deref()),
                line = d.and_then(|d| d.line),
                offset = d.and_then(|d| d.offset),
                kind = d.map(|d| d.kind.as_str()),
                %message,
                "session failed"
            );
            out.extend_from_slice(&protocol::encode(&ServerMessage::error_with(code, message, detail)));
        }
        None => {
            out.extend_from_slice(&protocol::encode(&ServerMessage::error(
                ErrorCode::Internal,
                "the session's producer stopped",
            )));
        }
    }
    a.producing = false;
    false
}

/// `close{taken}` on a serving connection: records what was taken, parks the session and gives
/// its ring's memory back, then answers `closed` — in that order, so that a client that reopens
/// the session as soon as `closed` arrives finds it resumable, not busy or refused for memory its
/// own closed session still held.
async fn close(
    phase: &mut Phase,
    taken: Option<u64>,
    wait_ns: Option<u64>,
    conn: &ConnShared,
    wr: &mut OwnedWriteHalf,
    peer: &Peer,
) -> std::io::Result<Flow> {
    let Phase::Serving(mut active) = std::mem::replace(phase, Phase::Hello) else { return Ok(Flow::Close) };
    active.taken(taken);
    active.waited(wait_ns);
    // What it took is all its trainer has: the minibatches announced after are not. A close that
    // does not say (`taken` is optional) leaves them as possibly given.
    active.closed = taken.is_some();
    active.record(&conn.shared);
    let state = active.state();
    finish(*active, &conn.shared, peer);
    send(wr, &ServerMessage::Closed { state }).await?;
    Ok(Flow::Close)
}

/// The error for a message that needs a session, on a connection that has none.
const NO_SESSION: &str = "no session is open on this connection";

async fn on_frame(
    body: &[u8],
    phase: &mut Phase,
    conn: &ConnShared,
    rd: &OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    peer: &Peer,
) -> std::io::Result<Flow> {
    let msg: ClientMessage = match protocol::decode_client(body) {
        Ok(m) => m,
        Err(FrameError::Invalid(e)) => {
            send(wr, &ServerMessage::error(ErrorCode::BadMessage, e)).await?;
            return Ok(Flow::Continue);
        }
        Err(e) => {
            send(wr, &ServerMessage::error(ErrorCode::BadMessage, e.to_string())).await?;
            return Ok(Flow::Continue);
        }
    };
    match (msg, &mut *phase) {
        (ClientMessage::Hello { version, client }, Phase::Hello) => {
            if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
                let m = format!("protocol version {version} is not supported; this daemon speaks versions {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}");
                send(wr, &ServerMessage::error(ErrorCode::VersionMismatch, m)).await?;
                return Ok(Flow::Close);
            }
            tracing::debug!(peer = %peer, client = client.as_deref().unwrap_or("?"), version, "hello");
            *phase = Phase::Open(version);
            let reply = ServerMessage::Hello {
                version,
                daemon_id: hex64(conn.shared.daemon_id),
                server: format!("minibatchd/{}", env!("CARGO_PKG_VERSION")),
                features: vec![FEATURE_CONSUMER_WAIT.to_owned(), FEATURE_OPEN_WAITS_FOR_INDEX.to_owned()],
            };
            send(wr, &reply).await?;
        }
        (_, Phase::Hello) => {
            send(wr, &ServerMessage::error(ErrorCode::HelloRequired, "the first message must be hello")).await?;
            return Ok(Flow::Close);
        }
        (ClientMessage::Open { dataset, options }, Phase::Open(version)) => {
            // Answered whether or not the client shut its side meanwhile (found by a review: a
            // client that half-closes after `open` can still read its answer); a client that has
            // really gone makes the send fail, which closes the connection, and a session that
            // opened all the same is parked, as for any client that goes.
            let (opening, gone) = open_watching(&dataset, &options, conn, rd, peer).await;
            match opening {
                Err(Refusal::Sampling(minibatchd_engine::sampling::SamplingError::Cancelled)) => {
                    // Only a client that shut its side cancels: its answer is counted apart.
                    conn.shared.data.metrics.control.sessions_refused.with_label_values(&[CLIENT_GONE]).inc();
                    let cancelled = ServerMessage::error(ErrorCode::ResourceExhausted, CANCELLED.to_owned());
                    let _ = send(wr, &cancelled).await;
                    return Ok(Flow::Close);
                }
                Ok((mut active, opened, fd)) => {
                    active.binary = *version >= 2;
                    tracing::info!(peer = %peer, session = %active.name, dataset = %dataset, "session opened");
                    // A mixture given at open is counted under one label, whatever its name.
                    let label = if options.mixture.is_some() { AT_OPEN } else { dataset.as_str() };
                    conn.shared.data.metrics.control.sessions_opened.with_label_values(&[label]).inc();
                    active.publish_slots(false);
                    *phase = Phase::Serving(Box::new(active));
                    send_with_fd(wr, &opened, &fd).await?;
                }
                Err(refusal) => refuse(&refusal, &dataset, conn, wr, peer).await?,
            }
            if gone {
                // The client sends nothing more: what it was answered is all it gets.
                return Ok(Flow::Close);
            }
        }
        (ClientMessage::Release { slot, generation, taken, wait_ns }, Phase::Serving(a)) => {
            a.taken(taken);
            a.waited(wait_ns);
            match a.slots.release(slot, generation) {
                Release::Freed { minibatch } => {
                    let forced = a.progress.released(minibatch, taken, a.slot_count);
                    // Once a connection: a client that never reports would otherwise log each release.
                    if forced > 0 && a.progress.forced() == forced {
                        tracing::warn!(session = %a.name, "the client released the slots of more minibatches than \
                            it reported taken, past what may wait for its count: counted as taken (said once)");
                    }
                    let i = usize::try_from(slot).unwrap_or(usize::MAX);
                    a.producer.give(FreeSlot { slot, generation: a.slots.next_generation(i) });
                    a.publish_slots(false);
                }
                Release::Stale => tracing::debug!(session = %a.name, slot, generation, "stale release ignored"),
            }
            a.record(&conn.shared);
        }
        (ClientMessage::State { taken, wait_ns }, Phase::Serving(a)) => {
            a.taken(taken);
            a.waited(wait_ns);
            a.record(&conn.shared);
            send(wr, &ServerMessage::State { state: a.state() }).await?;
        }
        (ClientMessage::Close { taken, wait_ns }, Phase::Serving(_)) => {
            return close(phase, taken, wait_ns, conn, wr, peer).await;
        }
        (ClientMessage::Close { .. }, _) => {
            // Answered before the connection ends: a client waiting for `closed` need not guess.
            send(wr, &ServerMessage::error(ErrorCode::UnexpectedMessage, NO_SESSION)).await?;
            return Ok(Flow::Close);
        }
        (m, _) => {
            let what = match m {
                ClientMessage::Hello { .. } => "hello was already received",
                ClientMessage::Open { .. } => "a session is already open on this connection",
                _ => NO_SESSION,
            };
            send(wr, &ServerMessage::error(ErrorCode::UnexpectedMessage, what)).await?;
        }
    }
    Ok(Flow::Continue)
}
