//! Who a connection is with, and what every connection task shares: kept apart from
//! [`super::connection`] (the conversation) so that a session ([`super::open_session`]) can name them
//! without naming the conversation that runs it.

use std::sync::Arc;

use actix::Addr;
use tokio::net::UnixStream;

use super::ControlPlane;
use crate::pipeline::data::delivery::Delivery;

/// What every connection task shares.
pub struct ConnShared {
    /// Daemon-wide state.
    pub shared: Arc<ControlPlane>,
    /// The delivery stage, which runs producers.
    pub delivery: Addr<Delivery>,
}

/// Who is at the other end of the socket (`SO_PEERCRED`, set by the kernel at `connect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The peer's uid; `u32::MAX` (no user) when the kernel would not say.
    pub uid: u32,
    label: String,
}

impl Peer {
    /// The credentials of `stream`'s peer.
    #[must_use]
    pub fn of(stream: &UnixStream) -> Self {
        match rustix::net::sockopt::socket_peercred(stream) {
            Ok(c) => Self {
                uid: c.uid.as_raw(),
                label: format!("pid={} uid={} gid={}", c.pid.as_raw_nonzero(), c.uid.as_raw(), c.gid.as_raw()),
            },
            Err(e) => Self { uid: u32::MAX, label: format!("unknown ({e})") },
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}
