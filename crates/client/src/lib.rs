//! What a trainer links to talk to a minibatchd daemon: the control [`protocol`] (framing,
//! messages, the binary fast path, versions 1–2) and a blocking client ([`Client`], [`Session`])
//! that opens a session, maps its shared-memory ring read-only and reads minibatches in place.
//!
//! No actix, no Prometheus, no parsers: it depends only on `minibatchd-shm` (the slot layout) and
//! `minibatchd-sys` (the read-only mapping, `SCM_RIGHTS`). The daemon's side of the protocol is
//! `minibatchd`'s control plane; the Python client (`clients/python`) speaks the same bytes.
//! `docs/daemon.md` is the contract.

#![forbid(unsafe_code)]

pub mod protocol;
mod session;

pub use session::{Client, ClientError, Delivered, Session};

/// This crate's result: a client call fails with [`ClientError`].
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
