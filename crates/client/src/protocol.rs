//! The control protocol between a trainer (client) and the daemon (`docs/daemon.md`), version
//! [`PROTOCOL_VERSION`].
//!
//! One file on purpose, though past 600 lines: it is the whole wire contract — every message,
//! option, state and error code with its serde names — that the daemon and the Rust client both
//! compile, and a reader (or a reviewer of a protocol change) checks it in one place.
//!
//! **Framing.** A Unix stream socket carries frames: a 4-byte little-endian length, then that many
//! bytes of UTF-8 JSON, one object with a `"type"` tag. A frame longer than
//! [`MAX_MESSAGE_BYTES`] is refused: the daemon replies `error{code: "message_too_large"}` and
//! closes the connection (it cannot find the next frame boundary without reading the body). A
//! frame that is not a valid message gets `error{code: "bad_message"}` and the connection goes
//! on. The daemon never panics on client input.
//!
//! **Conversation.**
//! ```text
//! client                                   daemon
//! hello{version}                      →
//!                                     ←    hello{version, daemon_id}   | error{version_mismatch} + close
//! open{dataset, options}              →
//!                                     ←    opened{session, ring, streams, state} + memfd (SCM_RIGHTS)
//!                                     ←    ready{slot, generation, minibatch}   (as slots fill)
//! release{slot, generation, taken}    →    (slot free again; a stale generation is ignored)
//! state{taken}                        →
//!                                     ←    state{state}
//!                                     ←    end{state}                  (the epoch is over)
//! close{taken}                        →
//!                                     ←    closed{state}
//! ```
//! `taken` is the number of minibatches the client library has handed to its user in this
//! session (counted from the session's start, resumed ones included). It defines the session's
//! position: the checkpoint position after the last minibatch taken (see [`SessionState`]).
//! Prefetched minibatches — announced with `ready` but not yet taken — never count.
//!
//! **Version 2: binary hot messages.** A client that says `hello{version: 2}` gets
//! `hello{version: 2}` back, then `ready` as a binary frame, and may send `release` as one (JSON
//! `release` stays valid). A binary frame has the same 4-byte length prefix; its body starts with
//! a tag byte that no JSON body starts with (JSON bodies start with `{`). All integers are
//! little-endian:
//! ```text
//! ready   (40 bytes): u8 tag = 0x01, u8 flags (bit 0: end_of_sweep), u16 0, u32 slot,
//!                     u64 generation, u64 minibatch index, u64 sweep, u64 position
//! release (32 bytes): u8 tag = 0x02, u8 flags (bit 0: wait_ns present), u16 0, u32 slot,
//!                     u64 generation, u64 taken, u64 wait_ns
//! ```
//! Every other message stays JSON. The daemon still speaks version 1 (JSON only) to a client
//! that says `hello{version: 1}`; a client that wants version 2 from an older daemon gets
//! `version_mismatch` and may say hello again, with version 1, on a new connection. A `ready`
//! costs a Python client a `struct` unpack instead of a JSON parse: most of its per-minibatch
//! cost (docs/benchmarks.md).
//!
//! **Additions within version 1** (optional fields; old peers ignore or never see them):
//! * `hello.features` (daemon → client): the optional fields this daemon accepts;
//!   [`FEATURE_CONSUMER_WAIT`] means `wait_ns` below; [`FEATURE_OPEN_WAITS_FOR_INDEX`] means an
//!   `open` on a dataset still being indexed is answered once the dataset is ready, or with
//!   `dataset_indexing` after a short wait, so a client asks again at once rather than polling.
//! * `wait_ns` in `release`, `state` and `close`: the total time, in nanoseconds, the client has
//!   spent waiting for the daemon in this connection (cumulative, so a lost or batched report
//!   loses nothing). It feeds `minibatchd_session_consumer_wait_seconds_total`, whose rate is the
//!   trainer's input-bound fraction.
//! * Shutdown: on SIGTERM the daemon stops producing and sends `error{shutting_down}` after the
//!   last `ready`; a client answers with `close{taken}` (the clients of this crate and
//!   `clients/python` do) so the daemon checkpoints its exact position, then `closed{state}`.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

/// The newest protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 2;
/// The oldest protocol version this build still serves (JSON `ready`/`release`).
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// First body byte of a binary `ready` (version 2).
pub const BINARY_READY: u8 = 0x01;
/// First body byte of a binary `release` (version 2).
pub const BINARY_RELEASE: u8 = 0x02;
/// Body length of a binary `ready`.
pub const BINARY_READY_BYTES: usize = 40;
/// Body length of a binary `release`.
pub const BINARY_RELEASE_BYTES: usize = 32;
/// Largest frame body accepted, in bytes (either direction).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Version of the [`SessionState`] token.
pub const STATE_VERSION: u32 = 1;
/// Feature (in the daemon's `hello.features`): the daemon accepts `wait_ns` in `release`,
/// `state` and `close`. A client sends `wait_ns` only to a daemon that lists it, so new clients
/// keep working with older daemons (whose messages refuse unknown fields).
pub const FEATURE_CONSUMER_WAIT: &str = "consumer_wait";
/// Feature (in the daemon's `hello.features`): an `open` on a dataset still being indexed waits
/// there for the index pass (a quarter of a second at most) before `dataset_indexing` is sent,
/// so a client that retries asks again at once instead of sleeping a poll interval.
pub const FEATURE_OPEN_WAITS_FOR_INDEX: &str = "open_waits_for_index";

/// Error codes of `error` replies (stable strings: clients match on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not a valid message (JSON, type or fields).
    BadMessage,
    /// The frame is larger than [`MAX_MESSAGE_BYTES`]; the connection is closed.
    MessageTooLarge,
    /// The client speaks another protocol version; the connection is closed.
    VersionMismatch,
    /// The first message was not `hello`.
    HelloRequired,
    /// The message is not valid in the connection's state (e.g. `release` before `open`).
    UnexpectedMessage,
    /// No dataset of that name is configured (or it failed to open).
    UnknownDataset,
    /// The dataset is still being indexed (at start, or after a reload added it); the message
    /// says how far. Retry: the clients wait on this code.
    DatasetIndexing,
    /// Invalid session options.
    InvalidOptions,
    /// The `resume` state belongs to other data or other sampling options.
    ResumeMismatch,
    /// A session of that name is connected elsewhere.
    SessionBusy,
    /// A limit is reached: not enough memory under `memory_limit_bytes` for the session's ring
    /// (at `open`), the chunks its randomization window holds would pass that limit (during the
    /// session: reopen with a smaller window), or a connection or session limit.
    ResourceExhausted,
    /// A minibatch does not fit in a slot; reopen with a larger `slot_size_bytes`.
    MinibatchTooLarge,
    /// Reading or parsing the data failed.
    DataError,
    /// The daemon is stopping.
    ShuttingDown,
    /// An internal failure (a bug or a system error); the message says which.
    Internal,
}

/// A session's resumable state: what `state()` returns and `resume` takes.
///
/// `position` is the global checkpoint position after the last minibatch *taken* (handed to the
/// user); `minibatches` counts the minibatches taken since the session started (so a resumed
/// session numbers its minibatches on). The hashes identify the data and the sampling options
/// that shape the order (randomize, window, seed, epoch limit), so a resume against anything
/// else is refused. The minibatch size may change across a resume (not with equal steps:
/// `equal_steps_minibatch`); the worker count and rank may
/// change across a resume of a one-worker session's state (`worker` unset), and across
/// `resume_job` (every worker's state) for a run of several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// The dataset name.
    pub dataset: String,
    /// Checkpoint position after the last minibatch taken.
    pub position: u64,
    /// Minibatches taken so far.
    pub minibatches: u64,
    /// The dataset's identity hash, 16 hex digits.
    pub data_identity: String,
    /// The hash of the order-shaping options, 16 hex digits.
    pub options_hash: String,
    /// Set when the session continues a run of another worker count (`resume_job`): where that
    /// run's workers stood. Not sent when unset, so states without it read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobBase>,
    /// Set when the session is one of several workers (`num_workers` > 1): which one. Workers
    /// stop at different places, so `position` is this worker's own: the state resumes this
    /// worker at this worker count, and `resume_job` (every worker's state) changes the count.
    /// Not sent for a session of one worker, whose state resumes any worker count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerOf>,
    /// A mixture's session (`dataset` names a mixture): where the mixture stands after the last
    /// minibatch taken — the same on every worker after the same minibatch, so any worker's
    /// state resumes every worker, at any worker count. `position` is then the mixture's slots
    /// (sequences) taken in the epoch. Not sent for a dataset's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixture: Option<MixtureState>,
    /// Set when the session has `equal_steps`: the minibatch size its epoch's equal step count
    /// was cut for. The cut is a count of minibatches of that size, so the state resumes only at
    /// that size (another would give the workers unequal step counts); `resume_job`, which counts
    /// equal steps afresh from where the earlier run stood, may change it. Not sent otherwise, so
    /// states without it read as before (and resume at any size, as they did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equal_steps_minibatch: Option<u64>,
    /// How the dataset decoded its values when the state was written (its streams, format and
    /// precision options: 16 hex digits). A resume under a configuration that decodes them
    /// otherwise (a reload swapped two streams' columns, say) continues at the exact position
    /// and is warned that the values from there are decoded by the new definitions. Not sent by
    /// a mixture's session; a state without it resumes without the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_digest: Option<String>,
}

/// Which of several workers a session is ([`SessionState::worker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerOf {
    /// The worker's rank.
    pub rank: u64,
    /// The worker count.
    pub of: u64,
}

impl WorkerOf {
    /// Worker `rank` of `of`, or `None` for a session of one worker.
    #[must_use]
    pub fn of_session(rank: u64, of: u64) -> Option<Self> {
        (of > 1).then_some(Self { rank, of })
    }
}

impl std::fmt::Display for WorkerOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "worker {} of {}", self.rank, self.of)
    }
}

/// Where a mixture stands (`docs/mixtures.md`, "State and resume"): a few integers per source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureState {
    /// Minibatches taken in the epoch, by all workers (the next one's step).
    pub step: u64,
    /// Slots (sequences) taken in the epoch, by all workers.
    pub slots: u64,
    /// Nominal samples taken in the epoch, by all workers.
    pub samples: u64,
    /// The epoch has ended.
    pub ended: bool,
    /// Each source, in the mixture's source order.
    pub sources: Vec<MixtureSourceState>,
}

/// Where one source of a mixture stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureSourceState {
    /// Nominal samples on the source's own timeline, over all its sweeps.
    pub position: u64,
    /// Sequences the mixture took from the source, in all.
    pub taken: u64,
    /// The source's credit in the weighted round-robin.
    pub credit: i64,
    /// The weight parts (of 2^30) the credit was built under.
    pub weight: u64,
}

/// Weights from a step (minibatch index of the epoch) on: `SessionOptions::weight_schedule`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightStageOption {
    /// The first step these weights fill (the first stage's is 0).
    pub from_step: u64,
    /// One weight (≥ 0) per source.
    pub weights: Vec<f64>,
}

/// A mixture's sources, as `opened` describes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixtureInfo {
    /// Each source, in source order.
    pub sources: Vec<MixtureSourceInfo>,
}

/// One source of a mixture (`opened.mixture.sources`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixtureSourceInfo {
    /// The source's dataset.
    pub dataset: String,
    /// Nominal samples per sweep of the source.
    pub sweep_size: u64,
}

/// The earlier run a session continues (`SessionOptions::resume_job`): the positions its workers
/// stood at, in rank order (their count is that run's worker count).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobBase {
    /// Each earlier worker's position.
    pub positions: Vec<u64>,
}

/// What equal steps do with the workers' ragged tails (`SessionOptions::tail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TailPolicy {
    /// Every worker stops after as many minibatches as the worker with the fewest.
    #[default]
    Drop,
    /// Every worker gets as many minibatches as the worker with the most; the others get empty
    /// minibatches (no sample) at the end of the epoch.
    Pad,
}

/// Session options of `open` (`docs/daemon.md`, "Session options"). Unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOptions {
    /// Global minibatch size in samples (required).
    pub minibatch_size: Option<u64>,
    /// Epoch size in samples.
    pub max_samples: Option<u64>,
    /// Epoch size in sweeps.
    pub max_sweeps: Option<u64>,
    /// Exactly one sweep.
    #[serde(default)]
    pub full_sweep: bool,
    /// Exactly sweep `k` (0-based), the k-th epoch of a trainer that iterates once per sweep.
    /// Not sent when unset, so a daemon without it accepts the options of a client that has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<u64>,
    /// Equal step counts for `DistributedDataParallel`: every worker gets as many minibatches in
    /// the epoch as the worker that gets the fewest; the others' ragged tails are dropped. Needs
    /// a finite epoch. Not sent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub equal_steps: bool,
    /// With `equal_steps`: drop the ragged tails (default) or pad with empty minibatches. Not
    /// sent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<TailPolicy>,
    /// Randomize (default: the dataset's setting).
    pub randomize: Option<bool>,
    /// Randomization window in chunks.
    pub window_chunks: Option<u64>,
    /// Randomization window in samples.
    pub window_samples: Option<u64>,
    /// Randomization seed.
    pub seed: Option<u64>,
    /// CNTK frame mode.
    #[serde(default)]
    pub frame_mode: bool,
    /// Data-parallel workers (default 1).
    pub num_workers: Option<u64>,
    /// This worker's rank (default 0).
    pub rank: Option<u64>,
    /// Continue from a saved state.
    pub resume: Option<SessionState>,
    /// Continue a whole earlier run, at any worker count: the `state()` of every one of its
    /// workers, in rank order. Nothing that run delivered is delivered again, nothing it did not
    /// is lost; the following sweeps are a fresh run's of this worker count. Not sent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_job: Option<Vec<SessionState>>,
    /// Ring slots (default: `daemon.ring_slots`); at least 2.
    pub prefetch: Option<u64>,
    /// Bytes per slot (default: `daemon.slot_size_bytes`, raised to fit the minibatches the index can bound).
    pub slot_size_bytes: Option<u64>,
    /// A name under which a disconnected session stays resumable for `session_linger_secs`.
    pub session: Option<String>,
    /// A mixture's session: its weights (one per source, ≥ 0) for the whole epoch, instead of
    /// the configured ones. Not sent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Vec<f64>>,
    /// A mixture's session: its weights by step, instead of the configured ones (the first stage
    /// from step 0). Not sent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_schedule: Option<Vec<WeightStageOption>>,
    /// A mixture given at `open` rather than configured: `open`'s `dataset` names it (a name no
    /// dataset or mixture of the configuration has), its weights are `weights` or
    /// `weight_schedule`. Not sent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixture: Option<MixtureSpec>,
}

/// A mixture given at `open` (`SessionOptions::mixture`), as a `[mixtures.NAME]` table has it
/// but the weights.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureSpec {
    /// The configured datasets mixed, in source order.
    pub datasets: Vec<String>,
    /// `endless` (the default) or `first_sweep_end`; or `max_samples` among the options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// The mixture's streams from the datasets' own: each stream's name and the stream of each
    /// dataset that fills it (default: the first dataset's streams, by name in every dataset).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub streams: std::collections::BTreeMap<String, Vec<String>>,
}

/// Messages from the client.
// `Open` is much larger than the others; a message is parsed once per frame, so boxing it would
// buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    /// First message: the client's protocol version.
    Hello {
        /// [`PROTOCOL_VERSION`] of the client.
        version: u32,
        /// Free-form client name, for logs.
        #[serde(default)]
        client: Option<String>,
    },
    /// Opens a session.
    Open {
        /// A configured dataset.
        dataset: String,
        /// Options.
        #[serde(default)]
        options: SessionOptions,
    },
    /// Gives a slot back.
    Release {
        /// Slot index.
        slot: u64,
        /// The generation of the `ready` that announced it.
        generation: u64,
        /// Minibatches taken so far.
        #[serde(default)]
        taken: Option<u64>,
        /// Nanoseconds spent waiting for the daemon in this connection, in total
        /// ([`FEATURE_CONSUMER_WAIT`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ns: Option<u64>,
    },
    /// Asks for the session's state.
    State {
        /// Minibatches taken so far.
        #[serde(default)]
        taken: Option<u64>,
        /// Nanoseconds spent waiting for the daemon in this connection, in total
        /// ([`FEATURE_CONSUMER_WAIT`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ns: Option<u64>,
    },
    /// Ends the session (it stays resumable by name like a disconnect).
    Close {
        /// Minibatches taken so far.
        #[serde(default)]
        taken: Option<u64>,
        /// Nanoseconds spent waiting for the daemon in this connection, in total
        /// ([`FEATURE_CONSUMER_WAIT`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ns: Option<u64>,
    },
}

/// The ring a session's minibatches arrive in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingInfo {
    /// Bytes to map.
    pub size_bytes: u64,
    /// Slots.
    pub slot_count: u64,
    /// Bytes per slot.
    pub slot_size: u64,
    /// Offset of slot 0.
    pub slots_offset: u64,
    /// Layout version of the ring.
    pub layout_version: u32,
}

/// One stream of the session's minibatches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Stream name (tensor names start with `name/`).
    pub name: String,
    /// `dense`, `sparse` or `strings` (deepx uuids).
    pub kind: String,
    /// Sample dimension.
    pub dim: u64,
    /// dtype of `values`.
    pub dtype: String,
}

/// What the client needs of a minibatch besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinibatchMeta {
    /// Index in the session (continues across resumes).
    pub index: u64,
    /// Sweep at the start of the minibatch.
    pub sweep: u64,
    /// Whether it ends at or crosses a sweep end.
    pub end_of_sweep: bool,
    /// Checkpoint position after it.
    pub position: u64,
}

/// Messages from the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// Reply to `hello`.
    Hello {
        /// [`PROTOCOL_VERSION`].
        version: u32,
        /// Id of this daemon start, 16 hex digits (also in every ring header).
        daemon_id: String,
        /// `minibatchd/VERSION`.
        server: String,
        /// Optional protocol fields this daemon accepts (e.g. [`FEATURE_CONSUMER_WAIT`]).
        #[serde(default)]
        features: Vec<String>,
    },
    /// Reply to `open`; the ring's memfd is attached.
    Opened {
        /// The session's name (given or generated).
        session: String,
        /// The ring.
        ring: RingInfo,
        /// Streams in tensor order.
        streams: Vec<StreamInfo>,
        /// The state at the session's start.
        state: SessionState,
        /// Nominal samples per sweep.
        sweep_size: u64,
        /// Set when the session continues one the daemon kept by name (absent for a fresh
        /// session and for a client's own `resume` state): where its state came from, and
        /// whether minibatches after it may be delivered again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resumed: Option<Resumed>,
        /// What the trainer should know about this session before it runs (absent when
        /// nothing): e.g. that this worker gets no data because the dataset has fewer chunks
        /// than workers. The clients show them (Python: `warnings.warn`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
        /// A mixture's session: its sources. Absent for a dataset's session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mixture: Option<MixtureInfo>,
    },
    /// A slot holds the next minibatch.
    Ready {
        /// Slot index.
        slot: u64,
        /// Its generation (echo it in `release`).
        generation: u64,
        /// Minibatch metadata.
        minibatch: MinibatchMeta,
    },
    /// The epoch is over; no more `ready` will come.
    End {
        /// The state after the last minibatch produced.
        state: SessionState,
    },
    /// Reply to `state`.
    State {
        /// The state.
        state: SessionState,
    },
    /// Reply to `close`.
    Closed {
        /// The final state.
        state: SessionState,
    },
    /// Something went wrong.
    Error {
        /// Machine-readable code.
        code: ErrorCode,
        /// Human-readable explanation.
        message: String,
        /// For `data_error`: where in which file, and what kind. Absent otherwise, and from
        /// daemons before 0.1 with this field (clients must treat it as optional).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<ErrorDetail>,
    },
}

/// What a mixture's minibatch carries in its slot after its streams (`mixture/sources`,
/// `mixture/sweeps_ended`, `mixture/state`), read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixtureSlot {
    /// The mixture's state after the minibatch.
    pub state: MixtureState,
    /// The source (index into `opened.mixture.sources`) of each sequence, in order.
    pub sources: Vec<u32>,
    /// Sources that completed a sweep within the minibatch (any worker's slot).
    pub sweeps_ended: Vec<u32>,
}

impl MixtureState {
    /// The state from the `mixture/state` tensor of a slot: `[step, slots, samples, ended, then
    /// per source position, taken, credit, weight]`; `None` when it is not that shape.
    #[must_use]
    pub fn from_tensor(v: &[i64]) -> Option<Self> {
        let (head, rest) = v.split_at_checked(4)?;
        if rest.len() % 4 != 0 {
            return None;
        }
        let u = |x: i64| u64::try_from(x).ok();
        let sources = rest
            .chunks_exact(4)
            .map(|s| Some(MixtureSourceState { position: u(s[0])?, taken: u(s[1])?, credit: s[2], weight: u(s[3])? }))
            .collect::<Option<Vec<_>>>()?;
        Some(Self { step: u(head[0])?, slots: u(head[1])?, samples: u(head[2])?, ended: head[3] != 0, sources })
    }
}

/// How a session resumed by name got its starting state (`opened.resumed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// `lingering`: the session's connection had closed and the daemon kept its exact position.
    /// `checkpoint`: the daemon restarted and took the position from its checkpoint.
    pub from: String,
    /// For `checkpoint`: when the checkpoint was written (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_unix_secs: Option<u64>,
    /// `true` only when nothing the trainer was given can come again. `false` when the position
    /// may be behind what the trainer took, and those minibatches are delivered again: an
    /// earlier connection ended without saying what it took (`close{taken}`) while minibatches
    /// announced to it were unreported, or the daemon did not stop cleanly (kill -9, a crash,
    /// power loss) and its last checkpoint is a periodic one.
    pub exact: bool,
}

/// Where a data error is, as the client's error reply carries it: the same file, 1-based line,
/// byte offset and kind as the daemon's log line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// The data file, when the error is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// 1-based line, when the error is about one place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// 0-based byte offset from the start of the file (of the decompressed data for `.gz`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Snake-case kind: an input error kind (`bad_number`, `bad_line`, …, as the
    /// `minibatchd_parse_errors_total` label) for a spent `max_errors` budget; `fatal`, `io` or
    /// `dataset` otherwise; `slot` for `minibatch_too_large`.
    pub kind: String,
    /// With `minibatch_too_large`: the bytes the minibatch needs, so that a client can reopen
    /// with a slot that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed_bytes: Option<u64>,
}

impl ServerMessage {
    /// An `error` reply.
    #[must_use]
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Error { code, message: bounded_message(message.into()), detail: None }
    }

    /// An `error` reply with a data error's place and kind.
    #[must_use]
    pub fn error_with(code: ErrorCode, message: impl Into<String>, detail: Option<ErrorDetail>) -> Self {
        Self::Error { code, message: bounded_message(message.into()), detail }
    }
}

/// Most bytes of an error reply's message: it may quote what the client sent (a dataset name, an
/// option's name), and the reply must stay within [`MAX_MESSAGE_BYTES`].
pub const MAX_ERROR_MESSAGE_BYTES: usize = 8 << 10;

/// `message` cut to [`MAX_ERROR_MESSAGE_BYTES`] at a character boundary, saying so.
fn bounded_message(mut message: String) -> String {
    if message.len() <= MAX_ERROR_MESSAGE_BYTES {
        return message;
    }
    let total = message.len();
    let mut end = MAX_ERROR_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    let cut = total - end;
    message + &format!(" … ({cut} of {total} bytes cut)")
}

/// A framing or decoding failure.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// A frame longer than the limit.
    #[error("frame of {0} bytes exceeds the limit of {MAX_MESSAGE_BYTES} bytes")]
    TooLarge(usize),
    /// The body is not a valid message.
    #[error("invalid message: {0}")]
    Invalid(String),
    /// The connection failed or closed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
}

/// Serialises `msg` as one frame (length prefix included).
#[must_use]
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let body = serde_json::to_vec(msg)
        .unwrap_or_else(|e| format!("{{\"type\":\"error\",\"code\":\"internal\",\"message\":\"{e}\"}}").into_bytes());
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&length_prefix(body.len()));
    out.extend_from_slice(&body);
    out
}

/// The 4-byte length prefix of a frame whose body is `len` bytes. Saturating: a body of 4 GiB or
/// more (far over [`MAX_MESSAGE_BYTES`]) gets a prefix every reader refuses, not a wrapped one.
fn length_prefix(len: usize) -> [u8; 4] {
    u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes()
}

/// Parses a frame body.
///
/// # Errors
/// [`FrameError::Invalid`] with serde's explanation.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(body).map_err(|e| FrameError::Invalid(e.to_string()))
}

/// Push decoder for frames: feed bytes as they arrive, take whole bodies out.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
}

impl FrameBuffer {
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame body, if one has arrived.
    ///
    /// # Errors
    /// [`FrameError::TooLarge`] as soon as a length prefix over the limit is seen.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return Err(FrameError::TooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let body = self.buf[4..4 + len].to_vec();
        self.buf.drain(..4 + len);
        Ok(Some(body))
    }
}

/// A whole binary `ready` frame (length prefix included), version 2.
#[must_use]
pub fn encode_ready_binary(slot: u64, generation: u64, meta: &MinibatchMeta) -> [u8; 4 + BINARY_READY_BYTES] {
    let mut out = [0u8; 4 + BINARY_READY_BYTES];
    out[..4].copy_from_slice(&length_prefix(BINARY_READY_BYTES));
    out[4] = BINARY_READY;
    out[5] = u8::from(meta.end_of_sweep);
    // Slots are counted in u32 on the wire; rings hold far fewer (the ring size is bounded).
    out[8..12].copy_from_slice(&u32::try_from(slot).unwrap_or(u32::MAX).to_le_bytes());
    for (i, v) in [generation, meta.index, meta.sweep, meta.position].into_iter().enumerate() {
        out[12 + i * 8..20 + i * 8].copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// A whole binary `release` frame (length prefix included), version 2.
#[must_use]
pub fn encode_release_binary(
    slot: u64,
    generation: u64,
    taken: u64,
    wait_ns: Option<u64>,
) -> [u8; 4 + BINARY_RELEASE_BYTES] {
    let mut out = [0u8; 4 + BINARY_RELEASE_BYTES];
    out[..4].copy_from_slice(&length_prefix(BINARY_RELEASE_BYTES));
    out[4] = BINARY_RELEASE;
    out[5] = u8::from(wait_ns.is_some());
    out[8..12].copy_from_slice(&u32::try_from(slot).unwrap_or(u32::MAX).to_le_bytes());
    for (i, v) in [generation, taken, wait_ns.unwrap_or(0)].into_iter().enumerate() {
        out[12 + i * 8..20 + i * 8].copy_from_slice(&v.to_le_bytes());
    }
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

/// A JSON message: a body that is a JSON object (after any blanks), or the error for one that is
/// not (its kind named only when the body is JSON of that kind; found by probes: `[1,2]` or
/// `null` was told of a binary tag, `not json` that it is `null`, `1abc` that it is not a number,
/// and ` null` was answered in serde's words).
fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    match body.trim_ascii_start().first() {
        Some(&b'{') | None => decode(body),
        Some(_) => Err(neither_binary_nor_object(body)),
    }
}

/// The error for a body that is neither a binary message (its first byte no tag) nor a JSON
/// object.
fn neither_binary_nor_object(body: &[u8]) -> FrameError {
    let json = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(_)) => Some("an array"),
        Ok(serde_json::Value::String(_)) => Some("a string"),
        Ok(serde_json::Value::Null) => Some("null"),
        Ok(serde_json::Value::Bool(_)) => Some("a boolean"),
        Ok(serde_json::Value::Number(_)) => Some("a number"),
        // A number past `f64`'s range (`1e400`) is JSON's all the same.
        Err(e) if e.to_string().starts_with("number out of range") => Some("a number"),
        Ok(serde_json::Value::Object(_)) | Err(_) => None,
    };
    let b = body[0];
    let first = body.trim_ascii_start().first().copied().unwrap_or(b);
    FrameError::Invalid(match json {
        Some(what) => format!("a message is a JSON object ({{\"type\": ...}}), not {what}"),
        // Found by a probe: `hello world` was told of a binary tag 0x68.
        None if first.is_ascii_graphic() => format!(
            "a message is a JSON object ({{\"type\": ...}}) or a binary message; this frame starts with {:?}",
            char::from(first)
        ),
        None => format!("unknown binary message tag 0x{b:02x}"),
    })
}

/// Decodes a client frame body: a binary `release` or a JSON message.
///
/// # Errors
/// [`FrameError::Invalid`] for a binary frame of the wrong length, an unknown tag or flag, or
/// invalid JSON.
pub fn decode_client(body: &[u8]) -> Result<ClientMessage, FrameError> {
    match body.first() {
        Some(&BINARY_RELEASE) => {
            if body.len() != BINARY_RELEASE_BYTES {
                return Err(FrameError::Invalid(format!(
                    "binary release of {} bytes, expected {BINARY_RELEASE_BYTES}",
                    body.len()
                )));
            }
            if body[1] > 1 {
                return Err(FrameError::Invalid(format!("binary release with unknown flags 0x{:02x}", body[1])));
            }
            if body[2] != 0 || body[3] != 0 {
                return Err(FrameError::Invalid("binary release with its reserved bytes (2 and 3) not zero".into()));
            }
            Ok(ClientMessage::Release {
                slot: u64::from(u32_at(body, 4)),
                generation: u64_at(body, 8),
                taken: Some(u64_at(body, 16)),
                wait_ns: (body[1] == 1).then(|| u64_at(body, 24)),
            })
        }
        _ => json_object(body),
    }
}

/// Decodes a daemon frame body: a binary `ready` or a JSON message.
///
/// # Errors
/// As [`decode_client`].
pub fn decode_server(body: &[u8]) -> Result<ServerMessage, FrameError> {
    match body.first() {
        Some(&BINARY_READY) => {
            if body.len() != BINARY_READY_BYTES {
                return Err(FrameError::Invalid(format!(
                    "binary ready of {} bytes, expected {BINARY_READY_BYTES}",
                    body.len()
                )));
            }
            if body[1] > 1 || body[2] != 0 || body[3] != 0 {
                return Err(FrameError::Invalid("binary ready with unknown flags".into()));
            }
            Ok(ServerMessage::Ready {
                slot: u64::from(u32_at(body, 4)),
                generation: u64_at(body, 8),
                minibatch: MinibatchMeta {
                    index: u64_at(body, 16),
                    sweep: u64_at(body, 24),
                    end_of_sweep: body[1] == 1,
                    position: u64_at(body, 32),
                },
            })
        }
        _ => json_object(body),
    }
}

/// Blocking: reads one frame body from `r`.
///
/// # Errors
/// I/O errors (`UnexpectedEof` when the peer closed) and [`FrameError::TooLarge`].
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Blocking: writes `msg` as one frame.
///
/// # Errors
/// I/O errors.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg))?;
    Ok(())
}

/// 16 lowercase hex digits.
#[must_use]
pub fn hex64(v: u64) -> String {
    format!("{v:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by a hostile probe: an unknown dataset name of 65,000 bytes came back quoted in a
    /// reply of 65,724 bytes, past the frame limit, which the clients refuse.
    #[test]
    fn an_error_quoting_what_the_client_sent_stays_within_a_frame() {
        let name = "é".repeat(40_000);
        let reply = ServerMessage::error(ErrorCode::UnknownDataset, format!("unknown dataset '{name}'"));
        let bytes = encode(&reply);
        assert!(bytes.len() <= 4 + MAX_MESSAGE_BYTES, "{} bytes", bytes.len());
        let ServerMessage::Error { message, .. } = reply else { panic!("an error") };
        assert!(message.starts_with("unknown dataset 'é") && message.ends_with("bytes cut)"), "{message:.40}");
    }

    #[test]
    fn messages_round_trip_through_frames() {
        let m = ClientMessage::Open {
            dataset: "train".into(),
            options: SessionOptions { minibatch_size: Some(8), max_sweeps: Some(2), ..SessionOptions::default() },
        };
        let mut fb = FrameBuffer::default();
        let bytes = encode(&m);
        fb.push(&bytes[..3]);
        assert!(fb.next_frame().expect("ok").is_none());
        fb.push(&bytes[3..]);
        let body = fb.next_frame().expect("ok").expect("a frame");
        assert_eq!(decode::<ClientMessage>(&body).expect("valid"), m);
        assert!(fb.next_frame().expect("ok").is_none());
    }

    #[test]
    fn error_replies_with_and_without_detail_read_both_ways() {
        // A daemon before `detail`: the field is absent and reads as `None`.
        let old = decode_server(br#"{"type":"error","code":"data_error","message":"bad"}"#).expect("old error");
        assert_eq!(old, ServerMessage::error(ErrorCode::DataError, "bad"));
        // No detail: the reply is byte for byte what older daemons sent, so older clients read it.
        let plain = encode(&ServerMessage::error(ErrorCode::DataError, "bad"));
        assert_eq!(&plain[4..], br#"{"type":"error","code":"data_error","message":"bad"}"#);
        let detail = ErrorDetail {
            file: Some("/d/x.ctf".into()),
            line: Some(3),
            offset: Some(17),
            kind: "bad_number".into(),
            needed_bytes: None,
        };
        let with = ServerMessage::error_with(ErrorCode::DataError, "bad", Some(detail));
        let bytes = encode(&with);
        let text = std::str::from_utf8(&bytes[4..]).expect("utf-8");
        assert!(text.contains(r#""detail":{"file":"/d/x.ctf","line":3,"offset":17,"kind":"bad_number"}"#), "{text}");
        assert_eq!(decode_server(&bytes[4..]).expect("new error"), with);
    }

    #[test]
    fn wire_names_are_stable() {
        let hello: ClientMessage = decode(br#"{"type":"hello","version":1}"#).expect("hello");
        assert_eq!(hello, ClientMessage::Hello { version: 1, client: None });
        let e = String::from_utf8(encode(&ServerMessage::error(ErrorCode::VersionMismatch, "x"))[4..].to_vec())
            .expect("utf8");
        assert_eq!(e, r#"{"type":"error","code":"version_mismatch","message":"x"}"#);
        // Optional fields are left out when absent, so old daemons still accept new clients.
        let release = String::from_utf8(
            encode(&ClientMessage::Release { slot: 1, generation: 2, taken: Some(3), wait_ns: None })[4..].to_vec(),
        )
        .expect("utf8");
        assert_eq!(release, r#"{"type":"release","slot":1,"generation":2,"taken":3}"#);
        let with_wait: ClientMessage = decode(br#"{"type":"state","taken":1,"wait_ns":5}"#).expect("state");
        assert_eq!(with_wait, ClientMessage::State { taken: Some(1), wait_ns: Some(5) });
        let old_hello: ServerMessage =
            decode(br#"{"type":"hello","version":1,"daemon_id":"0","server":"x"}"#).expect("hello without features");
        assert!(matches!(old_hello, ServerMessage::Hello { features, .. } if features.is_empty()));
    }

    #[test]
    fn binary_hot_messages_round_trip_and_bad_ones_are_errors() {
        let meta = MinibatchMeta { index: 7, sweep: 2, end_of_sweep: true, position: u64::MAX - 3 };
        let frame = encode_ready_binary(5, 1 << 40, &meta);
        let mut fb = FrameBuffer::default();
        fb.push(&frame);
        let body = fb.next_frame().expect("ok").expect("a frame");
        assert_eq!(
            decode_server(&body).expect("ready"),
            ServerMessage::Ready { slot: 5, generation: 1 << 40, minibatch: meta }
        );
        // The layout, byte for byte, as documented (and as the Python client packs it).
        assert_eq!(&frame[..12], &[40, 0, 0, 0, 1, 1, 0, 0, 5, 0, 0, 0]);
        let release = encode_release_binary(3, 9, 11, Some(13));
        assert_eq!(
            decode_client(&release[4..]).expect("release"),
            ClientMessage::Release { slot: 3, generation: 9, taken: Some(11), wait_ns: Some(13) }
        );
        let no_wait = encode_release_binary(3, 9, 11, None);
        assert_eq!(
            decode_client(&no_wait[4..]).expect("release"),
            ClientMessage::Release { slot: 3, generation: 9, taken: Some(11), wait_ns: None }
        );
        assert!(decode_client(&release[4..20]).is_err(), "truncated");
        let mut flags = release;
        flags[5] = 7;
        assert_eq!(release[4 + 1], 1, "flags sit at body byte 1");
        assert!(decode_client(&flags[4..]).is_err(), "unknown flags");
        assert!(decode_client(&[0x7f, 0, 0]).is_err(), "unknown tag");
        assert!(decode_client(&[BINARY_READY; 40]).is_err(), "a ready is not a client message");
        // JSON still decodes, with leading whitespace too.
        assert_eq!(
            decode_client(b" {\"type\":\"close\"}").expect("json"),
            ClientMessage::Close { taken: None, wait_ns: None }
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600), cut in 0usize..600) {
            let mut fb = FrameBuffer::default();
            fb.push(&bytes[..cut.min(bytes.len())]);
            fb.push(&bytes[cut.min(bytes.len())..]);
            while let Ok(Some(body)) = fb.next_frame() {
                let _ = decode::<ClientMessage>(&body);
                let _ = decode_client(&body);
            }
            let _ = decode::<ClientMessage>(&bytes);
            let _ = decode_client(&bytes);
            let _ = decode_server(&bytes);
        }

        #[test]
        fn binary_bodies_of_any_length_and_content_never_panic(tag in proptest::sample::select(vec![BINARY_READY, BINARY_RELEASE]), rest in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut body = vec![tag];
            body.extend_from_slice(&rest);
            let client = decode_client(&body);
            let server = decode_server(&body);
            // Only a well-formed frame of the right length decodes; everything else is an error.
            proptest::prop_assert!(client.is_err() || (tag == BINARY_RELEASE && body.len() == BINARY_RELEASE_BYTES));
            proptest::prop_assert!(server.is_err() || (tag == BINARY_READY && body.len() == BINARY_READY_BYTES));
        }
    }

    #[test]
    fn oversized_garbage_and_unknown_fields_are_errors_not_panics() {
        let mut fb = FrameBuffer::default();
        fb.push(&u32::MAX.to_le_bytes());
        assert!(matches!(fb.next_frame(), Err(FrameError::TooLarge(_))));
        assert!(decode::<ClientMessage>(b"\xff\x00garbage").is_err());
        assert!(decode::<ClientMessage>(br#"{"type":"open","dataset":"t","options":{"minibatch_sizes":3}}"#).is_err());
        assert!(decode::<ClientMessage>(br#"{"type":"launch"}"#).is_err());
        assert!(decode::<ClientMessage>(br"[1,2,3]").is_err());
    }

    #[test]
    fn json_that_is_not_an_object_is_told_so() {
        for (body, what) in
            [(&b"[1,2]"[..], "an array"), (b"\"x\"", "a string"), (b"null", "null"), (b"1e400", "a number")]
        {
            let Err(FrameError::Invalid(e)) = decode_client(body) else { panic!("{body:?} decoded") };
            assert!(e.contains("JSON object") && e.contains(what), "{e}");
        }
        let Err(FrameError::Invalid(e)) = decode_client(b"\x07abc") else { panic!("decoded") };
        assert!(e.contains("unknown binary message tag 0x07"), "{e}");
        let Err(FrameError::Invalid(e)) = decode_client(b"hello world") else { panic!("decoded") };
        assert!(e.contains("JSON object") && e.contains("'h'"), "{e}");
        for body in [
            &b"not json"[..],
            b"nonsense",
            b"falsehood",
            b"t",
            b"-x",
            b"0x10",
            b"1abc",
            b"-",
            b"[1,2",
            b"\"abc",
            b"1.2.3",
            b"+1",
        ] {
            let Err(FrameError::Invalid(e)) = decode_client(body) else { panic!("{body:?} decoded") };
            assert!(e.contains("this frame starts with") && !e.contains(", not "), "{e}");
        }
        // A binary tag is the first byte's, blanks included.
        let Err(FrameError::Invalid(e)) = decode_client(b" \x07") else { panic!("decoded") };
        assert!(e.contains("unknown binary message tag 0x20"), "{e}");
        let Err(FrameError::Invalid(e)) = decode_client(b"true") else { panic!("decoded") };
        assert!(e.contains("not a boolean"), "{e}");
        for body in [&b" null"[..], b"\tnull\n"] {
            let Err(FrameError::Invalid(e)) = decode_client(body) else { panic!("{body:?} decoded") };
            assert!(e.contains("JSON object") && e.contains("not null"), "{e}");
        }
        // A binary release whose reserved bytes are not zero is told so, not of its flags.
        let mut release = [0u8; BINARY_RELEASE_BYTES];
        release[0] = BINARY_RELEASE;
        release[2] = 1;
        let Err(FrameError::Invalid(e)) = decode_client(&release) else { panic!("decoded") };
        assert!(e.contains("reserved"), "{e}");
        release[2] = 0;
        release[1] = 9;
        let Err(FrameError::Invalid(e)) = decode_client(&release) else { panic!("decoded") };
        assert!(e.contains("flags 0x09"), "{e}");
    }
}
