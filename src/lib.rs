//! # minibatchd
//!
//! A node-local daemon that turns training data stored as text — CNTK Text Format (CTF) and
//! deepx's instance formats — into randomized minibatches with CNTK `MinibatchSource`
//! semantics, and hands them to trainer processes through shared memory.
//!
//! ## Architecture (read this first)
//!
//! The data path has three pure layers and a thin actor shell around them:
//!
//! ```text
//!  files ─► format::*  (index pass → FileIndex; decode → ParsedChunk, columnar)
//!             │
//!  dataset::Dataset    (files + index cache + source join → chunks and a sampling::Timeline)
//!             │
//!  sampling::Sampler   (BlockRandomizer / NoRandomizer + minibatch scheduler → MinibatchPlan)
//!             │
//!  minibatch::assemble (plan + parsed chunks → Minibatch) ─► dump (JSON lines) | daemon (shm)
//! ```
//!
//! * [`format`] knows bytes: CNTK's index pass, its number grammar and parser, error accounting
//!   (each malformed place charged once against `max_errors`) and the on-disk index cache.
//! * [`sampling`] knows only nominal lengths and chunk boundaries. The order of sequences is a
//!   function of (data, chunking, window, seed, sweep) — never of the minibatch size — and a
//!   checkpoint is a position on that timeline.
//! * [`dataset`] ties a configured dataset to both: it resolves files, indexes them (through the
//!   cache), joins several sources by sequence key and loads chunks.
//! * [`dump`] is the in-process consumer behind `minibatchd dump`.
//!
//! Everything in those modules is synchronous and deterministic, tested without a running actor
//! system.
//!
//! The daemon (`minibatchd run`) is a shell around them:
//! * [`pipeline`] — the supervised actix stages (chunk reader, parser pool, chunk cache, delivery,
//!   session manager) joined by bounded flume channels; sessions, slot bookkeeping and the cache
//!   are plain structs inside it;
//! * [`shm`] — the memfd ring and its slot layout (all `unsafe` code of the crate);
//! * [`protocol`] — the control messages on the Unix socket;
//! * [`client`] — a blocking Rust client (the Python one is in `clients/python`);
//! * [`metrics`] — every Prometheus metric, in one registry, and the `/metrics` endpoint.
//!
//! `docs/daemon.md` describes the protocol, the slot layout, session state and memory. See `ARCHITECTURE.md` for the daemon's stages and `docs/differences.md` for every
//! place where minibatchd deliberately differs from CNTK or deepx.

pub mod client;
pub mod config;
pub mod dataset;
pub mod dump;
pub mod format;
pub mod metrics;
pub mod minibatch;
pub mod persist;
pub mod pipeline;
pub mod protocol;
pub mod sampling;
pub mod shm;

pub use config::Config;
pub use dataset::Dataset;
