//! # minibatchd — the daemon
//!
//! A node-local daemon that turns training data stored as text — CNTK Text Format (CTF) and
//! deepx's instance formats — into randomized minibatches with CNTK `MinibatchSource`
//! semantics, and hands them to trainer processes through shared memory.
//!
//! This crate is the daemon around the workspace's libraries (`ARCHITECTURE.md` draws the whole):
//! * `minibatchd-engine` — formats, datasets, sampling, minibatch assembly (pure, synchronous);
//! * `minibatchd-shm` — the ring and slot layout and the one tensor table;
//! * `minibatchd-client` — the control protocol and the Rust client;
//! * `minibatchd-sys` — every `unsafe` line.
//!
//! Its own modules:
//! * [`config`] — TOML + environment overrides, validated into the engine's option types and the
//!   daemon's settings, every problem reported at once;
//! * [`dump`] — `minibatchd dump`, the in-process consumer (JSON lines, the ledger);
//! * [`pipeline`] — `minibatchd run`: the data plane (readahead, parser pool, chunk cache, producer),
//!   the control plane (server, connections, sessions, admission) and operations (signals,
//!   checkpoint, reload, notify, memory guard), as supervised actix actors over bounded flume
//!   channels;
//! * [`parsed_cache`] — the parsed cache of the process, handed to every dataset;
//! * [`metrics`] — every Prometheus metric in one registry, and the `/metrics` endpoint;
//! * [`stage`] — the supervised stages, named once (supervisor, health, metric labels);
//! * [`log_lines`] — each log event one line, control bytes in its fields escaped.

#![forbid(unsafe_code)]

pub mod config;
pub mod dump;
pub mod log_lines;
pub mod metrics;
pub mod objects;
pub mod parsed_cache;
pub mod pipeline;
pub mod stage;

pub use config::Config;
