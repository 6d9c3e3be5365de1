//! A blocking Rust client for the daemon: the same protocol and ring as the Python client
//! (`clients/python`), for Rust trainers, tools and the integration tests.
//!
//! ```no_run
//! use minibatchd_client::Client;
//! use minibatchd_client::protocol::SessionOptions;
//! let client = Client::connect("/run/minibatchd/minibatchd.sock")?;
//! let options = SessionOptions { minibatch_size: Some(256), full_sweep: true, ..Default::default() };
//! let mut session = client.open("train", &options)?;
//! while let Some(mb) = session.next_minibatch()? {
//!     let view = session.tensors(&mb)?;      // zero-copy tensors of the slot
//!     println!("minibatch {} has {} tensors", mb.meta.index, view.len());
//!     session.release(mb);                   // the slot goes back with the next request
//! }
//! # Ok::<(), minibatchd_client::ClientError>(())
//! ```
//! A [`Delivered`] minibatch holds its slot until [`Session::release`]; release is sent with the
//! next request (batched). [`Session::next_owned`] copies a minibatch out and releases at once.
//!
//! The session reports the time it spent waiting for the daemon (`wait_ns`, when the daemon
//! lists the `consumer_wait` feature) for the input-bound metric. When the daemon stops
//! (`error{shutting_down}`), the session reports what it took (`close{taken}`) before returning
//! the error, so the daemon's checkpoint holds its exact position; [`Session::state`] then
//! returns that final state without the daemon.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::protocol::{
    self, ClientMessage, ErrorCode, ErrorDetail, FrameBuffer, FrameError, MinibatchMeta, MixtureSlot,
    MixtureSourceInfo, Resumed, ServerMessage, SessionOptions, SessionState, StreamInfo, FEATURE_CONSUMER_WAIT,
    FEATURE_OPEN_WAITS_FOR_INDEX, PROTOCOL_VERSION,
};
use crate::Result;
use minibatchd_shm::layout::{LayoutError, RingHeader};
use minibatchd_shm::Minibatch;
use minibatchd_sys::{ReadOnlyMapping, ShmError};

mod regrow;
mod slots;

/// Client failures.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Socket I/O.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// Framing or decoding.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// An `error` reply.
    #[error("daemon error {code:?}: {message}")]
    Daemon {
        /// Its code.
        code: ErrorCode,
        /// Its message.
        message: String,
        /// For a data error: file, line, byte offset and kind; for `minibatch_too_large`, the
        /// bytes needed. Boxed: it is rare, and keeps the error small.
        detail: Option<Box<ErrorDetail>>,
    },
    /// An unexpected reply.
    #[error("protocol: {0}")]
    Protocol(String),
    /// Mapping the ring.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// Reading a slot.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// How long a session waits for the daemon's `closed` after reporting its final position.
const FINAL_REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection that has said hello.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    frames: FrameBuffer,
    /// The socket's path: a session reopens on it ([`Session::slot_regrowths`]).
    path: PathBuf,
    /// The daemon's per-start id.
    pub daemon_id: String,
    report_wait: bool,
    /// The daemon holds an `open` while its dataset is indexed ([`FEATURE_OPEN_WAITS_FOR_INDEX`]).
    open_waits: bool,
    /// The daemon speaks version 2: `release` goes out as a binary frame.
    binary: bool,
}

fn read_message(stream: &mut UnixStream, frames: &mut FrameBuffer) -> Result<ServerMessage> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(body) = frames.next_frame()? {
            return Ok(protocol::decode_server(&body)?);
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(ClientError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        frames.push(&buf[..n]);
    }
}

/// Whether `e` says the daemon ended the session or went: an `error{shutting_down}` or
/// `error{unknown_dataset}` (a reload removed the dataset), or a connection it closed.
fn ended_by_daemon(e: &ClientError) -> bool {
    use std::io::ErrorKind as K;
    match e {
        ClientError::Daemon { code, .. } => matches!(code, ErrorCode::ShuttingDown | ErrorCode::UnknownDataset),
        ClientError::Io(io) => {
            matches!(io.kind(), K::UnexpectedEof | K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted)
        }
        _ => false,
    }
}

fn daemon_error(m: ServerMessage) -> ClientError {
    match m {
        ServerMessage::Error { code, message, detail } => {
            ClientError::Daemon { code, message, detail: detail.map(Box::new) }
        }
        other => ClientError::Protocol(format!("unexpected reply {other:?}")),
    }
}

/// How often, at most, [`Client::open_when_indexed`] asks again while the dataset is being
/// indexed.
pub const INDEXING_POLL: Duration = Duration::from_millis(250);

/// The first wait of [`Client::open_when_indexed`]; each later one doubles, up to
/// [`INDEXING_POLL`]. A daemon that has just started reads a dataset's index cache in tens of
/// milliseconds: a trainer started with it opens its session then, not a whole poll later.
pub const INDEXING_FIRST_POLL: Duration = Duration::from_millis(2);

impl Client {
    /// Connects to the socket at `path` and checks the protocol version.
    ///
    /// # Errors
    /// [`ClientError`].
    /// Says hello with [`PROTOCOL_VERSION`] and, if the daemon answers `version_mismatch` (one
    /// older than binary `ready`/`release`), again with version 1 on a new connection.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        match Self::connect_with(path, PROTOCOL_VERSION) {
            Err(ClientError::Daemon { code: ErrorCode::VersionMismatch, .. }) if PROTOCOL_VERSION > 1 => {
                Self::connect_with(path, 1)
            }
            other => other,
        }
    }

    /// Connects and says hello with `version`.
    ///
    /// # Errors
    /// [`ClientError`]; a daemon that does not speak `version` answers `version_mismatch`.
    pub fn connect_with(path: &Path, version: u32) -> Result<Self> {
        let mut stream = UnixStream::connect(path)?;
        protocol::write_frame(&mut stream, &ClientMessage::Hello { version, client: Some("minibatchd-rust".into()) })?;
        let mut frames = FrameBuffer::default();
        match read_message(&mut stream, &mut frames)? {
            ServerMessage::Hello { daemon_id, features, version, .. } => Ok(Self {
                stream,
                frames,
                path: path.to_path_buf(),
                daemon_id,
                report_wait: features.iter().any(|f| f == FEATURE_CONSUMER_WAIT),
                open_waits: features.iter().any(|f| f == FEATURE_OPEN_WAITS_FOR_INDEX),
                binary: version >= 2,
            }),
            other => Err(daemon_error(other)),
        }
    }

    /// Connects to `path` and opens a session on `dataset`, asking again while the daemon answers
    /// `dataset_indexing` (it is still indexing the dataset: it just started, or a reload added
    /// it) — at once when the daemon held the `open` for the index pass
    /// ([`FEATURE_OPEN_WAITS_FOR_INDEX`]), else after [`INDEXING_FIRST_POLL`], then twice as long
    /// each time up to [`INDEXING_POLL`] — for up to `wait` (`None`: as long as it takes).
    ///
    /// # Errors
    /// [`ClientError`]; `dataset_indexing` once `wait` has passed.
    pub fn open_when_indexed(
        path: impl AsRef<Path>,
        dataset: &str,
        options: &SessionOptions,
        wait: Option<Duration>,
    ) -> Result<Session> {
        let start = std::time::Instant::now();
        let mut poll = INDEXING_FIRST_POLL;
        loop {
            let client = Self::connect(path.as_ref())?;
            let waited_there = client.open_waits;
            match client.open(dataset, options) {
                Err(ClientError::Daemon { code: ErrorCode::DatasetIndexing, .. })
                    if wait.is_none_or(|w| start.elapsed() < w) =>
                {
                    if !waited_there {
                        std::thread::sleep(poll);
                        poll = (poll * 2).min(INDEXING_POLL);
                    }
                }
                other => return other,
            }
        }
    }

    /// Opens a session on `dataset` (this connection then carries it).
    ///
    /// # Errors
    /// [`ClientError`], e.g. [`ClientError::Daemon`] with `invalid_options`.
    pub fn open(mut self, dataset: &str, options: &SessionOptions) -> Result<Session> {
        protocol::write_frame(
            &mut self.stream,
            &ClientMessage::Open { dataset: dataset.into(), options: options.clone() },
        )?;
        // The memfd arrives with the first bytes of `opened`.
        let mut buf = vec![0u8; 64 * 1024];
        let mut fd = None;
        let opened = loop {
            if let Some(body) = self.frames.next_frame()? {
                break protocol::decode_server(&body)?;
            }
            let (n, got) = minibatchd_sys::fdpass::recv_with_fd(self.stream.as_fd(), &mut buf)?;
            if n == 0 {
                return Err(ClientError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            fd = fd.or(got);
            self.frames.push(&buf[..n]);
        };
        let ServerMessage::Opened { session, ring, streams, state, resumed, warnings, mixture, .. } = opened else {
            return Err(daemon_error(opened));
        };
        let fd = fd.ok_or_else(|| ClientError::Protocol("opened without a memfd".into()))?;
        let mapping = ReadOnlyMapping::map(fd, ring.size_bytes)?;
        let header = RingHeader::read(mapping.bytes())?;
        if header.slot_count != ring.slot_count || header.slot_size != ring.slot_size {
            return Err(ClientError::Protocol("ring header disagrees with the opened message".into()));
        }
        Ok(Session {
            stream: self.stream,
            frames: self.frames,
            path: self.path,
            dataset: dataset.to_owned(),
            options: options.clone(),
            ring: 0,
            held: 0,
            old_rings: Vec::new(),
            slot_regrowths: 0,
            regrow_failed: None,
            name: session,
            mapping,
            header,
            streams,
            resumed,
            warnings,
            mixture_sources: mixture.map(|m| m.sources),
            taken: state.minibatches,
            last: state,
            pending: Vec::new(),
            queued: VecDeque::new(),
            end: None,
            report_wait: self.report_wait,
            binary: self.binary,
            waited: Duration::ZERO,
            stopped: false,
            final_state: None,
        })
    }
}

/// A minibatch announced to this client; holds its slot until released.
#[derive(Debug)]
#[must_use = "release the minibatch to give its slot back"]
pub struct Delivered {
    /// Slot index.
    pub slot: u64,
    /// Slot generation.
    pub generation: u64,
    /// Metadata.
    pub meta: MinibatchMeta,
    /// A mixture's session: the mixture's state after this minibatch, the source of each
    /// sequence and the sources whose sweep ended in it (read from its slot). `None` for a
    /// dataset's session.
    pub mixture: Option<Box<MixtureSlot>>,
    /// Which of the session's rings holds the slot: a reopen for larger slots maps another.
    ring: u32,
}

/// An open session.
pub struct Session {
    stream: UnixStream,
    frames: FrameBuffer,
    path: PathBuf,
    dataset: String,
    options: SessionOptions,
    /// The ring in use (counted from 0; each reopen for larger slots maps the next) and how many
    /// minibatches returned from it are not released.
    ring: u32,
    held: usize,
    /// Earlier rings still mapped for minibatches held across a reopen.
    old_rings: Vec<regrow::OldRing>,
    /// How many times a minibatch too large for the slots reopened the session with larger
    /// ones (`minibatch_too_large`: `docs/client.md`).
    pub slot_regrowths: u64,
    /// Why a reopen for larger slots failed: every later `next_minibatch` returns it.
    regrow_failed: Option<String>,
    /// The session name (resumable by it).
    pub name: String,
    mapping: ReadOnlyMapping,
    header: RingHeader,
    /// Streams in tensor order.
    pub streams: Vec<StreamInfo>,
    /// Set when the session continued one the daemon kept by name (`opened.resumed`): with
    /// `exact == false` the trainer may have taken minibatches past this position, and they
    /// come again.
    pub resumed: Option<Resumed>,
    /// What the daemon said the trainer should know about this session (`opened.warnings`):
    /// e.g. that this worker gets no data.
    pub warnings: Vec<String>,
    /// A mixture's session (`opened.mixture`): its sources, in source order. `None` for a
    /// dataset's session.
    pub mixture_sources: Option<Vec<MixtureSourceInfo>>,
    taken: u64,
    /// The state after the last minibatch returned, as this client knows it.
    last: SessionState,
    pending: Vec<(u64, u64)>,
    queued: VecDeque<ServerMessage>,
    end: Option<SessionState>,
    report_wait: bool,
    binary: bool,
    waited: Duration,
    /// The daemon stopped (`error{shutting_down}`).
    stopped: bool,
    /// The final state it confirmed.
    final_state: Option<SessionState>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("name", &self.name).field("taken", &self.taken).finish_non_exhaustive()
    }
}

impl Session {
    fn wait_ns(&self) -> Option<u64> {
        self.report_wait.then(|| u64::try_from(self.waited.as_nanos()).unwrap_or(u64::MAX))
    }

    fn flush(&mut self, extra: Option<ClientMessage>) -> Result<()> {
        let mut out = Vec::new();
        let wait_ns = self.wait_ns();
        for (slot, generation) in self.pending.drain(..) {
            if self.binary {
                out.extend(protocol::encode_release_binary(slot, generation, self.taken, wait_ns));
            } else {
                out.extend(protocol::encode(&ClientMessage::Release {
                    slot,
                    generation,
                    taken: Some(self.taken),
                    wait_ns,
                }));
            }
        }
        if let Some(m) = extra {
            out.extend(protocol::encode(&m));
        }
        if !out.is_empty() {
            self.stream.write_all(&out)?;
        }
        Ok(())
    }

    /// The next minibatch, `None` at the end of the epoch.
    ///
    /// # Errors
    /// [`ClientError`] (an `error` from the daemon included).
    pub fn next_minibatch(&mut self) -> Result<Option<Delivered>> {
        if self.end.is_some() {
            return Ok(None);
        }
        if let Some(message) = &self.regrow_failed {
            return Err(ClientError::Daemon {
                code: ErrorCode::MinibatchTooLarge,
                message: message.clone(),
                detail: None,
            });
        }
        if self.stopped {
            return Err(ClientError::Daemon {
                code: ErrorCode::ShuttingDown,
                message: "the daemon stopped; state() holds the final position".into(),
                detail: None,
            });
        }
        if let Err(e) = self.flush(None) {
            // The daemon may have ended the session and closed the socket: its reason is still
            // readable, and more useful than a broken pipe.
            return Err(
                match self.queued.pop_front().map_or_else(|| read_message(&mut self.stream, &mut self.frames), Ok) {
                    Ok(m @ ServerMessage::Error { .. }) => daemon_error(m),
                    _ => e,
                },
            );
        }
        let msg = if let Some(m) = self.queued.pop_front() {
            m
        } else {
            let started = Instant::now();
            let m = read_message(&mut self.stream, &mut self.frames);
            self.waited += started.elapsed();
            m?
        };
        match msg {
            ServerMessage::Ready { slot, generation, minibatch } => {
                let mut delivered = Delivered { slot, generation, meta: minibatch, mixture: None, ring: self.ring };
                if self.mixture_sources.is_some() {
                    let m = match self.mixture_slot(&delivered) {
                        Ok(m) => m,
                        Err(e) => {
                            // The slot goes back; the session's count and state stay before it.
                            self.pending.push((slot, generation));
                            return Err(e);
                        }
                    };
                    self.last.mixture = Some(m.state.clone());
                    delivered.mixture = Some(Box::new(m));
                }
                self.taken = minibatch.index.saturating_add(1);
                self.last.position = minibatch.position;
                self.last.minibatches = self.taken;
                self.held += 1;
                Ok(Some(delivered))
            }
            ServerMessage::End { state } => {
                // Tell the daemon the last minibatch was taken: a client that reads to the end
                // and goes without `close` would leave its session a minibatch short (a resume
                // by name then not exact).
                self.report_final();
                self.end = Some(state);
                Ok(None)
            }
            ServerMessage::Error {
                code: code @ (ErrorCode::ShuttingDown | ErrorCode::UnknownDataset),
                message,
                detail,
            } => {
                // The daemon ended the session (stopping, or the dataset was removed): tell it
                // what was taken, so that a resume by name continues exactly after it.
                self.report_final();
                Err(ClientError::Daemon { code, message, detail: detail.map(Box::new) })
            }
            // The next minibatch outgrew the slots (nothing taken): reopened where this client
            // stands with slots that hold it, and read from there.
            ServerMessage::Error { code: ErrorCode::MinibatchTooLarge, message, detail } => {
                self.regrow(message, detail)?;
                self.next_minibatch()
            }
            other => Err(daemon_error(other)),
        }
    }

    /// The daemon is stopping: report what was taken so its checkpoint is exact, and keep the
    /// final state it confirms (best effort: on any failure the last known position stays).
    fn report_final(&mut self) {
        let _ = self.stream.set_read_timeout(Some(FINAL_REPORT_TIMEOUT));
        let close = ClientMessage::Close { taken: Some(self.taken), wait_ns: self.wait_ns() };
        self.stopped = true;
        if let Ok(Some(ServerMessage::Closed { state })) =
            self.flush(Some(close)).map(|()| self.await_reply(|m| matches!(m, ServerMessage::Closed { .. })).ok())
        {
            self.final_state = Some(state);
        }
    }

    /// Gives `mb`'s slot back (sent with the next request).
    #[allow(clippy::needless_pass_by_value)] // taken by value so a released minibatch cannot be read again
    pub fn release(&mut self, mb: Delivered) {
        if mb.ring == self.ring {
            self.held = self.held.saturating_sub(1);
            self.pending.push((mb.slot, mb.generation));
        } else {
            self.release_old(mb.ring);
        }
    }

    /// The next minibatch as an owned copy, its slot released.
    ///
    /// # Errors
    /// As [`Session::next_minibatch`].
    pub fn next_owned(&mut self) -> Result<Option<Minibatch>> {
        let Some(d) = self.next_minibatch()? else { return Ok(None) };
        let mb = self.copy(&d);
        self.release(d);
        mb.map(Some)
    }

    fn await_reply(&mut self, want: fn(&ServerMessage) -> bool) -> Result<ServerMessage> {
        loop {
            let m = read_message(&mut self.stream, &mut self.frames)?;
            if want(&m) {
                return Ok(m);
            }
            if let ServerMessage::Error { .. } = m {
                return Err(daemon_error(m));
            }
            self.queued.push_back(m);
        }
    }

    /// The session's state after the last minibatch returned by [`Session::next_minibatch`].
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn state(&mut self) -> Result<SessionState> {
        if let Some(s) = self.end.as_ref().or(self.final_state.as_ref()) {
            return Ok(s.clone());
        }
        if self.stopped {
            // The daemon went before confirming: what this client knows is exact.
            return Ok(self.last.clone());
        }
        let wait_ns = self.wait_ns();
        let asked = self.flush(Some(ClientMessage::State { taken: Some(self.taken), wait_ns }));
        match asked.and_then(|()| self.await_reply(|m| matches!(m, ServerMessage::State { .. }))) {
            Ok(ServerMessage::State { state }) => Ok(state),
            Ok(other) => Err(daemon_error(other)),
            // The daemon ended the session (or went) before answering: what this client knows is
            // exact — the position after the last minibatch it returned.
            Err(e) if ended_by_daemon(&e) => {
                self.report_final();
                Ok(self.final_state.clone().unwrap_or_else(|| self.last.clone()))
            }
            Err(e) => Err(e),
        }
    }

    /// Closes the session; returns its final state.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn close(mut self) -> Result<SessionState> {
        if self.stopped {
            return Ok(self.final_state.take().unwrap_or_else(|| self.last.clone()));
        }
        let wait_ns = self.wait_ns();
        self.flush(Some(ClientMessage::Close { taken: Some(self.taken), wait_ns }))?;
        match self.await_reply(|m| matches!(m, ServerMessage::Closed { .. }))? {
            ServerMessage::Closed { state } => Ok(state),
            other => Err(daemon_error(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A daemon that speaks only version 1: it refuses a newer hello as a real one would.
    fn old_daemon(listener: UnixListener) -> std::thread::JoinHandle<Vec<u32>> {
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            for conn in listener.incoming().take(2) {
                let mut conn = conn.expect("accept");
                let body = protocol::read_frame(&mut conn).expect("hello frame");
                let ClientMessage::Hello { version, .. } = protocol::decode_client(&body).expect("hello") else {
                    panic!("not a hello")
                };
                seen.push(version);
                let reply = if version == 1 {
                    ServerMessage::Hello {
                        version: 1,
                        daemon_id: "00000000000000aa".into(),
                        server: "minibatchd/old".into(),
                        features: Vec::new(),
                    }
                } else {
                    ServerMessage::error(
                        ErrorCode::VersionMismatch,
                        format!("version {version} is not supported; this daemon speaks 1"),
                    )
                };
                protocol::write_frame(&mut conn, &reply).expect("reply");
            }
            seen
        })
    }

    #[test]
    fn connect_falls_back_to_version_1_for_an_older_daemon() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.sock");
        let daemon = old_daemon(UnixListener::bind(&path).expect("bind"));
        let client = Client::connect(&path).expect("connects with version 1");
        assert!(!client.binary, "version 1: JSON release frames");
        assert_eq!(client.daemon_id, "00000000000000aa");
        drop(client);
        assert_eq!(
            daemon.join().expect("daemon"),
            vec![PROTOCOL_VERSION, 1],
            "newest first, then 1 on a new connection"
        );
    }

    #[test]
    fn connect_with_reports_the_version_mismatch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.sock");
        let daemon = old_daemon(UnixListener::bind(&path).expect("bind"));
        let err = Client::connect_with(&path, 2).expect_err("refused");
        assert!(matches!(err, ClientError::Daemon { code: ErrorCode::VersionMismatch, .. }), "{err:?}");
        assert!(Client::connect_with(&path, 1).is_ok());
        assert_eq!(daemon.join().expect("daemon"), vec![2, 1]);
    }
}
