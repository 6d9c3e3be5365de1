//! minibatchd's delivery format: how a minibatch lies in a shared-memory ring, written by the
//! daemon and read in place by trainers.
//!
//! * [`layout`] — what the bytes mean: the `#[repr(C)]` ring header (magic, layout version,
//!   per-daemon-start id, slot geometry), the slot header and the tensor table entries (name,
//!   dtype, shape, offset), data 64-byte aligned. Pure, safe encoding and decoding. Layout
//!   version 1; `docs/daemon.md` is its contract.
//! * [`table`] — the one tensor table: which tensors a stream has, in which order, of which type
//!   and shape, and the [`table::SlotSource`] trait through which any minibatch is written.
//! * [`owned`] — the owned [`owned::Minibatch`] (dump, tests, the Rust client's copies) and its
//!   decoder.
//! * [`ring`] — a [`ring::Ring`] over some [`minibatchd_sys::SlotMemory`] (a [`ring::SharedRing`]
//!   for several writers, one per slot): header written once,
//!   minibatches encoded into slots, the slot header written last.
//!
//! Invariants: a slot's header is written after its data, so a reader that checks the
//! generation never takes a half-written slot for a valid one; nothing in shared memory holds a
//! pointer; decoding checks every offset and shape against the slot. The ring never changes size
//! (the memfd is sealed, `minibatchd-sys`).
//!
//! Depends on `minibatchd-sys` only (byte views, memory); knows nothing of formats, sampling or
//! the daemon. The engine depends on it for the tensor table; the client for decoding.

#![forbid(unsafe_code)]

pub mod layout;
pub mod owned;
pub mod ring;
pub mod table;

pub use layout::{DType, LayoutError, RingHeader, SlotHeader, TensorEntry, LAYOUT_VERSION, RING_MAGIC};
pub use owned::{decode_minibatch, Indices, MbData, MbStream, Minibatch, Values};
pub use ring::{needed_bytes, Ring, RingGeometry, SharedRing};
pub use table::{Field, SlotSource, TensorDesc};

/// This crate's result: encoding or decoding a ring fails with [`LayoutError`].
pub type Result<T, E = LayoutError> = std::result::Result<T, E>;
