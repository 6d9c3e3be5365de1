//! A session reopened with larger slots when its next minibatch outgrows them
//! (`minibatch_too_large`: samples with more sparse entries or longer strings than the daemon can
//! bound at `open`), as the Python client does (`docs/client.md`): `resume` the state after the
//! last minibatch returned, the same session name, slots of the bytes needed and a quarter more.
//! Nothing is lost or given twice — the order does not depend on the slot size — and minibatches
//! still held keep the old ring mapped.

use std::time::{Duration, Instant};

use minibatchd_shm::layout::RingHeader;
use minibatchd_sys::ReadOnlyMapping;

use super::{Client, ClientError, Session};
use crate::protocol::{ClientMessage, ErrorCode, ErrorDetail, ServerMessage, SessionOptions};
use crate::Result;

/// How long a reopen asks again while the daemon still holds the old session (`session_busy`)
/// or the connection fails.
const REOPEN_PATIENCE: Duration = Duration::from_secs(60);

/// A ring of an earlier open of the session, mapped while minibatches returned from it are held.
pub(super) struct OldRing {
    pub(super) ring: u32,
    pub(super) mapping: ReadOnlyMapping,
    pub(super) header: RingHeader,
    held: usize,
}

impl Session {
    /// A minibatch of an earlier ring given back: nothing to tell the daemon (that session is
    /// closed); the ring is unmapped with its last minibatch.
    pub(super) fn release_old(&mut self, ring: u32) {
        if let Some(i) = self.old_rings.iter().position(|r| r.ring == ring) {
            self.old_rings[i].held = self.old_rings[i].held.saturating_sub(1);
            if self.old_rings[i].held == 0 {
                self.old_rings.swap_remove(i);
            }
        }
    }

    /// Reopens the session with slots that hold `detail.needed_bytes` and a quarter more.
    ///
    /// # Errors
    /// The daemon's `minibatch_too_large` (`message`, `detail`) when it did not say how many bytes
    /// or no more than a slot holds, or when the reopen fails (then its reason is appended, and
    /// every later `next_minibatch` returns the same error; `state()` answers without the daemon).
    pub(super) fn regrow(&mut self, message: String, detail: Option<ErrorDetail>) -> Result<()> {
        let needed = detail.as_ref().and_then(|d| d.needed_bytes).filter(|&n| n > self.header.slot_size);
        let too_large = |message: String, detail: Option<ErrorDetail>| ClientError::Daemon {
            code: ErrorCode::MinibatchTooLarge,
            message,
            detail: detail.map(Box::new),
        };
        let Some(needed) = needed else { return Err(too_large(message, detail)) };
        let slot = needed.saturating_add(needed / 4).div_ceil(4096).saturating_mul(4096);
        // The old session ends where this client stands; its releases go with the close.
        let state = self.last.clone();
        let wait_ns = self.wait_ns();
        let _closed = self
            .flush(Some(ClientMessage::Close { taken: Some(self.taken), wait_ns }))
            .and_then(|()| self.await_reply(|m| matches!(m, ServerMessage::Closed { .. })));
        let mut options = self.options.clone();
        options.resume_job = None; // the state carries the run a `resume_job` continued
        options.resume = Some(state.clone());
        options.slot_size_bytes = Some(slot);
        options.session = Some(self.name.clone());
        let fresh = match self.reopen(&options) {
            Ok(fresh) => fresh,
            Err(e) => {
                let message = format!("{message} (reopening the session with slots of {slot} bytes failed: {e})");
                self.regrow_failed = Some(message.clone());
                self.stopped = true;
                self.final_state = Some(state);
                return Err(too_large(message, detail));
            }
        };
        let Session { stream, frames, mapping, header, last, taken, binary, report_wait, .. } = fresh;
        let old_mapping = std::mem::replace(&mut self.mapping, mapping);
        let old_header = std::mem::replace(&mut self.header, header);
        if self.held > 0 {
            self.old_rings.push(OldRing { ring: self.ring, mapping: old_mapping, header: old_header, held: self.held });
        }
        self.ring = self.ring.wrapping_add(1);
        self.held = 0;
        (self.stream, self.frames, self.last, self.taken) = (stream, frames, last, taken);
        (self.binary, self.report_wait) = (binary, report_wait);
        self.pending.clear();
        self.queued.clear();
        self.options = options;
        self.slot_regrowths += 1;
        Ok(())
    }

    /// A new connection and `open` with `options`, asked again while the daemon lets the old
    /// session go.
    fn reopen(&self, options: &SessionOptions) -> Result<Session> {
        let deadline = Instant::now() + REOPEN_PATIENCE;
        loop {
            match Client::connect(&self.path).and_then(|c| c.open(&self.dataset, options)) {
                Err(
                    ClientError::Io(_)
                    | ClientError::Daemon {
                        code: ErrorCode::SessionBusy | ErrorCode::DatasetIndexing | ErrorCode::ShuttingDown,
                        ..
                    },
                ) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                other => return other,
            }
        }
    }
}
