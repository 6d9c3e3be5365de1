//! minibatchd's engine: everything between bytes of training data and a minibatch, synchronous,
//! deterministic and free of I/O policy. It knows nothing of the daemon, actix, Prometheus or
//! sockets; `minibatchd dump` and the daemon drive it the same way (see [`feed`]).
//!
//! ```text
//!  files ─► format::*  (index pass → FileIndex; decode → ParsedChunk, columnar)
//!             │
//!  dataset::Dataset    (files + index cache + source join → chunks and a sampling::Timeline)
//!             │
//!  sampling::Sampler   (BlockRandomizer / NoRandomizer + minibatch scheduler → MinibatchPlan)
//!             │
//!  minibatch::gather   (plan + parsed chunks → Gathered, a minibatchd_shm::SlotSource)
//! ```
//!
//! * [`options`] — the option types of a dataset (built and validated by the daemon's config).
//! * [`mod@format`] knows bytes: CNTK's index pass, its number grammar and parser, deepx's formats,
//!   error accounting (each malformed place charged once against `max_errors`), the on-disk index
//!   cache and `.gz` inputs.
//! * [`sampling`] knows only nominal lengths and chunk boundaries. The order of sequences is a
//!   function of (data, chunking, window, seed, sweep) — never of the minibatch size — and a
//!   checkpoint is a position on that timeline.
//! * [`dataset`] ties a configured dataset to both: resolves files, indexes them (through the
//!   cache), joins several sources by sequence key and loads chunks.
//! * [`minibatch`] locates a plan's sequences in parsed chunks and copies them, once, into a slot
//!   or an owned minibatch, through the one tensor table of `minibatchd-shm`.
//! * [`feed`] — the sampling → load → gather → retire loop that `dump` and the daemon's producer
//!   share.
//! * [`hash`] — the one stable hash; [`state_file`] — atomic file writes.
//!
//! `#![forbid(unsafe_code)]`: byte views and SIMD come from `minibatchd-sys`.

#![forbid(unsafe_code)]

pub mod dataset;
pub mod feed;

pub mod format;
pub mod hash;
pub mod minibatch;
pub mod options;
pub mod remote;
pub mod sampling;
pub mod state_file;
pub mod throttle;

pub use dataset::Dataset;

pub use format::errors::DataError;

/// This crate's result: reading data fails with [`DataError`] (file, line, byte offset, kind).
pub type Result<T, E = DataError> = std::result::Result<T, E>;
