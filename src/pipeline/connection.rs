//! One client connection: an async task that speaks the protocol ([`crate::protocol`]) and
//! drives one session's plain state ([`SlotTable`], [`Progress`]) between the socket and the
//! session's producer thread.
//!
//! Phases: `hello` → `open` → serving (`ready` out as slots fill; `release`, `state`, `close` in).
//! Client input never panics the daemon: bad frames get `error{bad_message}`, an oversized frame
//! or a version mismatch gets an error reply and the connection is closed. When the socket closes
//! for any reason, the session's producer is stopped at once (its slots are reclaimed with the
//! ring) and the session is parked in the registry, resumable by name for
//! `session_linger_secs` at the position after the last minibatch taken.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use actix::Addr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;

use crate::protocol::{self, hex64, ClientMessage, ErrorCode, FrameBuffer, FrameError, RingInfo, ServerMessage, SessionOptions, SessionState, PROTOCOL_VERSION, STATE_VERSION};
use crate::sampling::Sampler;
use crate::shm::{MemfdMemory, Ring, RingGeometry, LAYOUT_VERSION};

use super::hub::DatasetRuntime;
use super::producer::{FreeSlot, Producer, ProducerEvent};
use super::session::{check_resume, options_hash, resolve_options, Claim, Progress, Release, SlotTable, MAX_SLOT_SIZE_BYTES};
use super::stages::{Delivery, StartProducer};
use super::Shared;

/// What every connection task shares.
pub struct ConnShared {
    /// Daemon-wide state.
    pub shared: Arc<Shared>,
    /// The delivery stage, which runs producers.
    pub delivery: Addr<Delivery>,
}

/// Bytes read from the socket at a time.
const READ_BUFFER_BYTES: usize = 16 * 1024;

type Reply = (ErrorCode, String);

/// A session open on this connection.
struct Active {
    name: String,
    runtime: Arc<DatasetRuntime>,
    options_hash: u64,
    slots: SlotTable,
    progress: Progress,
    free: flume::Sender<FreeSlot>,
    events: flume::Receiver<ProducerEvent>,
    stop: Arc<AtomicBool>,
    ring_bytes: u64,
    producing: bool,
}

impl Active {
    fn state(&self) -> SessionState {
        SessionState {
            version: STATE_VERSION,
            dataset: self.runtime.name.clone(),
            position: self.progress.position(),
            minibatches: self.progress.taken_count(),
            data_identity: hex64(self.runtime.identity),
            options_hash: hex64(self.options_hash),
        }
    }

    fn taken(&mut self, taken: Option<u64>) {
        if let Some(n) = taken {
            self.progress.taken(n);
        }
    }
}

/// Where the conversation stands.
enum Phase {
    Hello,
    Open,
    Serving(Box<Active>),
}

/// What to do after a frame.
enum Flow {
    Continue,
    Close,
}

fn peer_label(stream: &UnixStream) -> String {
    match rustix::net::sockopt::socket_peercred(stream) {
        Ok(c) => format!("pid={} uid={} gid={}", c.pid.as_raw_nonzero(), c.uid.as_raw(), c.gid.as_raw()),
        Err(e) => format!("unknown ({e})"),
    }
}

async fn send(wr: &mut OwnedWriteHalf, msg: &ServerMessage) -> std::io::Result<()> {
    wr.write_all(&protocol::encode(msg)).await
}

/// Sends `msg` with `fd` attached (SCM_RIGHTS on the first bytes).
async fn send_with_fd(wr: &mut OwnedWriteHalf, msg: &ServerMessage, fd: &OwnedFd) -> std::io::Result<()> {
    let bytes = protocol::encode(msg);
    let sent = {
        let sock: &UnixStream = wr.as_ref();
        loop {
            sock.writable().await?;
            match sock.try_io(tokio::io::Interest::WRITABLE, || crate::shm::fdpass::send_with_fd(sock.as_fd(), &bytes, fd.as_fd())) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    };
    wr.write_all(&bytes[sent..]).await
}

/// Serves one client until it goes, errs fatally, or the daemon stops.
pub async fn serve(stream: UnixStream, conn: Arc<ConnShared>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let peer = peer_label(&stream);
    tracing::info!(peer = %peer, "client connected");
    let (mut rd, mut wr) = stream.into_split();
    let mut frames = FrameBuffer::default();
    let mut buf = vec![0u8; READ_BUFFER_BYTES];
    let mut phase = Phase::Hello;
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
                loop {
                    let body = match frames.next_frame() {
                        Ok(Some(body)) => body,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(peer = %peer, error = %e, "closing connection");
                            let _ = send(&mut wr, &ServerMessage::error(ErrorCode::MessageTooLarge, e.to_string())).await;
                            break 'conn;
                        }
                    };
                    match on_frame(&body, &mut phase, &conn, &mut wr, &peer).await {
                        Ok(Flow::Continue) => {}
                        Ok(Flow::Close) | Err(_) => break 'conn,
                    }
                }
            }
            event = async {
                match &events {
                    Some(rx) => rx.recv_async().await.ok(),
                    None => std::future::pending().await,
                }
            } => {
                let Phase::Serving(active) = &mut phase else { continue };
                if on_event(event, active, &mut wr).await.is_err() {
                    break 'conn;
                }
            }
            _ = shutdown.changed() => {
                let _ = send(&mut wr, &ServerMessage::error(ErrorCode::ShuttingDown, "the daemon is stopping")).await;
                break 'conn;
            }
        }
    }
    if let Phase::Serving(active) = phase {
        finish(*active, &conn.shared, &peer);
    } else {
        tracing::info!(peer = %peer, "client disconnected");
    }
}

/// Stops the producer (reclaiming every slot with the ring), parks the session for resuming and
/// gives its ring memory back.
fn finish(active: Active, shared: &Shared, peer: &str) {
    active.stop.store(true, Ordering::Relaxed);
    let state = active.state();
    tracing::info!(peer, session = %active.name, position = state.position, minibatches = state.minibatches, leased = active.slots.leased(), "session ended; slots reclaimed");
    let mut reg = shared.registry();
    reg.park(&active.name, state, Instant::now());
    reg.unreserve(active.ring_bytes);
    shared.cache.set_budget(reg.cache_budget());
}

async fn on_event(event: Option<ProducerEvent>, a: &mut Active, wr: &mut OwnedWriteHalf) -> std::io::Result<()> {
    match event {
        Some(ProducerEvent::Filled { slot, generation, meta }) => {
            a.slots.announce(usize::try_from(slot).unwrap_or(usize::MAX), generation, meta.index);
            a.progress.announced(meta);
            send(wr, &ServerMessage::Ready { slot, generation, minibatch: meta }).await
        }
        Some(ProducerEvent::End { position, minibatches }) => {
            a.producing = false;
            let state = SessionState { position, minibatches, ..a.state() };
            send(wr, &ServerMessage::End { state }).await
        }
        Some(ProducerEvent::Failed { code, message }) => {
            a.producing = false;
            tracing::warn!(session = %a.name, ?code, %message, "session failed");
            send(wr, &ServerMessage::error(code, message)).await
        }
        None => {
            a.producing = false;
            send(wr, &ServerMessage::error(ErrorCode::Internal, "the session's producer stopped")).await
        }
    }
}

async fn on_frame(body: &[u8], phase: &mut Phase, conn: &ConnShared, wr: &mut OwnedWriteHalf, peer: &str) -> std::io::Result<Flow> {
    let msg: ClientMessage = match protocol::decode(body) {
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
            if version != PROTOCOL_VERSION {
                let m = format!("protocol version {version} is not supported; this daemon speaks version {PROTOCOL_VERSION}");
                send(wr, &ServerMessage::error(ErrorCode::VersionMismatch, m)).await?;
                return Ok(Flow::Close);
            }
            tracing::debug!(peer, client = client.as_deref().unwrap_or("?"), "hello");
            *phase = Phase::Open;
            let reply = ServerMessage::Hello { version: PROTOCOL_VERSION, daemon_id: hex64(conn.shared.daemon_id), server: format!("minibatchd/{}", env!("CARGO_PKG_VERSION")) };
            send(wr, &reply).await?;
        }
        (_, Phase::Hello) => {
            send(wr, &ServerMessage::error(ErrorCode::HelloRequired, "the first message must be hello")).await?;
            return Ok(Flow::Close);
        }
        (ClientMessage::Open { dataset, options }, Phase::Open) => match open(&dataset, &options, conn).await {
            Ok((active, opened, fd)) => {
                tracing::info!(peer, session = %active.name, dataset = %dataset, "session opened");
                *phase = Phase::Serving(Box::new(active));
                send_with_fd(wr, &opened, &fd).await?;
            }
            Err((code, message)) => send(wr, &ServerMessage::error(code, message)).await?,
        },
        (ClientMessage::Release { slot, generation, taken }, Phase::Serving(a)) => {
            a.taken(taken);
            match a.slots.release(slot, generation) {
                Release::Freed { minibatch } => {
                    a.progress.taken(minibatch.saturating_add(1));
                    let i = usize::try_from(slot).unwrap_or(usize::MAX);
                    // Capacity = slot count, so this never finds the channel full.
                    let _ = a.free.try_send(FreeSlot { slot, generation: a.slots.next_generation(i) });
                }
                Release::Stale => tracing::debug!(session = %a.name, slot, generation, "stale release ignored"),
            }
        }
        (ClientMessage::State { taken }, Phase::Serving(a)) => {
            a.taken(taken);
            send(wr, &ServerMessage::State { state: a.state() }).await?;
        }
        (ClientMessage::Close { taken }, Phase::Serving(a)) => {
            a.taken(taken);
            send(wr, &ServerMessage::Closed { state: a.state() }).await?;
            return Ok(Flow::Close);
        }
        (ClientMessage::Close { .. }, _) => return Ok(Flow::Close),
        (m, _) => {
            let what = match m {
                ClientMessage::Hello { .. } => "hello was already received",
                ClientMessage::Open { .. } => "a session is already open on this connection",
                _ => "no session is open on this connection",
            };
            send(wr, &ServerMessage::error(ErrorCode::UnexpectedMessage, what)).await?;
        }
    }
    Ok(Flow::Continue)
}

/// Opens a session: options, resume, name claim, memory, ring, producer.
async fn open(dataset: &str, options: &SessionOptions, conn: &ConnShared) -> Result<(Active, ServerMessage, OwnedFd), Reply> {
    let shared = &conn.shared;
    let rt = shared.hub.get(dataset).map_err(|e| (ErrorCode::UnknownDataset, e))?;
    let d = &shared.config.daemon;
    let resolved = resolve_options(options, rt.dataset.config(), d.ring_slots as u64, d.slot_size_bytes).map_err(|e| (ErrorCode::InvalidOptions, e))?;
    let ohash = options_hash(&resolved.sampling);
    if let Some(s) = &options.resume {
        check_resume(s, dataset, rt.identity, ohash).map_err(|e| (ErrorCode::ResumeMismatch, e))?;
    }
    let mut sampler = Sampler::new(rt.dataset.timeline().clone(), resolved.sampling.clone()).map_err(|e| (ErrorCode::InvalidOptions, e.to_string()))?;
    let local = resolved.minibatch_size as u64 / resolved.sampling.num_workers as u64 + 1;
    let slot_size = resolved.slot_size_bytes.max(rt.dense_slot_bound(local)).min(MAX_SLOT_SIZE_BYTES);
    let geometry = RingGeometry::new(resolved.slots, slot_size);
    let ring_bytes = geometry.total_bytes();

    // Claim the name and the memory; undo both on any later failure.
    let fresh = SessionState { version: STATE_VERSION, dataset: dataset.to_owned(), position: 0, minibatches: 0, data_identity: hex64(rt.identity), options_hash: hex64(ohash) };
    let (id, name, start, lingered) = {
        let mut reg = shared.registry();
        let id = reg.next_id();
        let name = resolved.session.clone().unwrap_or_else(|| format!("{dataset}-{id}"));
        let claim = reg.claim(&name, id, Instant::now()).map_err(|e| (ErrorCode::SessionBusy, e.to_string()))?;
        let lingered = match claim {
            Claim::Resume(s) => Some(s),
            Claim::Fresh => None,
        };
        let start = match (&options.resume, &lingered) {
            (Some(s), _) => s.clone(),
            (None, Some(s)) => {
                if let Err(e) = check_resume(s, dataset, rt.identity, ohash) {
                    reg.park(&name, s.clone(), Instant::now());
                    return Err((ErrorCode::ResumeMismatch, format!("session '{name}': {e}")));
                }
                s.clone()
            }
            (None, None) => fresh,
        };
        if let Err(e) = reg.reserve(ring_bytes) {
            reg.park(&name, lingered.clone().unwrap_or_else(|| start.clone()), Instant::now());
            return Err((ErrorCode::ResourceExhausted, e.to_string()));
        }
        shared.cache.set_budget(reg.cache_budget());
        (id, name, start, lingered)
    };
    let undo = |reply: Reply| {
        let mut reg = shared.registry();
        reg.park(&name, lingered.clone().unwrap_or_else(|| start.clone()), Instant::now());
        reg.unreserve(ring_bytes);
        shared.cache.set_budget(reg.cache_budget());
        reply
    };
    sampler.restore(start.position).map_err(|e| undo((ErrorCode::InvalidOptions, e.to_string())))?;
    let memory = MemfdMemory::create(&format!("minibatchd-{name}"), ring_bytes).map_err(|e| undo((ErrorCode::ResourceExhausted, format!("cannot create the ring: {e}"))))?;
    let fd = memory.fd().try_clone_to_owned().map_err(|e| undo((ErrorCode::Internal, format!("dup: {e}"))))?;
    let ring = Ring::new(memory, geometry, shared.daemon_id, id).map_err(|e| undo((ErrorCode::Internal, e.to_string())))?;
    let header = *ring.header();

    let slots = SlotTable::new(resolved.slots as usize);
    let (free_tx, free_rx) = flume::bounded(resolved.slots as usize);
    let (events_tx, events_rx) = flume::bounded(resolved.slots as usize + 2);
    for s in 0..resolved.slots {
        let _ = free_tx.try_send(FreeSlot { slot: s, generation: slots.next_generation(s as usize) });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let producer = Producer::new(rt.clone(), shared.cache.clone(), sampler, ring, resolved.minibatch_size, resolved.frame_mode, start.minibatches);
    let started = conn.delivery.send(StartProducer { name: name.clone(), producer, free: free_rx, events: events_tx, stop: stop.clone() }).await;
    match started {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(undo((ErrorCode::Internal, e))),
        Err(e) => return Err(undo((ErrorCode::ShuttingDown, format!("delivery stage unavailable: {e}")))),
    }
    let opened = ServerMessage::Opened {
        session: name.clone(),
        ring: RingInfo { size_bytes: header.total_bytes, slot_count: header.slot_count, slot_size: header.slot_size, slots_offset: header.slots_offset, layout_version: LAYOUT_VERSION },
        streams: rt.streams.clone(),
        state: start.clone(),
        sweep_size: rt.dataset.timeline().seq_len.iter().map(|&l| u64::from(l)).sum(),
    };
    let active = Active {
        name,
        runtime: rt,
        options_hash: ohash,
        slots,
        progress: Progress::new(&start),
        free: free_tx,
        events: events_rx,
        stop,
        ring_bytes,
        producing: true,
    };
    Ok((active, opened, fd))
}
