//! Opening a session on a connection: waiting for a dataset's index pass, and watching the client
//! while the open is prepared (a client that goes away cancels it).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use minibatchd_client::protocol::{ServerMessage, SessionOptions};

use super::super::admission::Refusal;
use super::super::mixture::open_mixture;
use super::super::open_session::{open, OpenSession};
use super::super::peer::{ConnShared, Peer};
use super::send;
use crate::pipeline::data::catalog::CatalogError;

/// How long an `open` on a dataset still being indexed waits for its index pass before it is
/// answered `dataset_indexing` (with the progress): a client asks again at once
/// ([`minibatchd_client::protocol::FEATURE_OPEN_WAITS_FOR_INDEX`]), so it opens as soon as the dataset is
/// ready instead of a poll interval later, and still hears the progress this often.
const OPEN_WAITS_FOR_INDEX: std::time::Duration = std::time::Duration::from_millis(250);

/// [`open_either`], waiting up to [`OPEN_WAITS_FOR_INDEX`] while the dataset is being indexed: every
/// change of the datasets in force (an index pass ending puts its dataset in force) is a new try.
async fn open_when_indexed(
    dataset: &str,
    options: &SessionOptions,
    conn: &ConnShared,
    peer: &Peer,
    cancelled: &Arc<AtomicBool>,
) -> Result<(OpenSession, ServerMessage, OwnedFd), Refusal> {
    // Subscribed before the first try: a change between the try and the wait is not missed.
    let mut catalog = conn.shared.data.catalog_changes();
    let deadline = tokio::time::Instant::now() + OPEN_WAITS_FOR_INDEX;
    loop {
        match open_either(dataset, options, conn, peer, cancelled).await {
            Err(Refusal::Dataset(CatalogError::Indexing { .. }))
                if tokio::time::Instant::now() < deadline && !cancelled.load(Ordering::Relaxed) =>
            {
                tokio::select! {
                    changed = catalog.changed() => {
                        if changed.is_err() {
                            // No more changes to wait for: answer with what there is.
                            return open_either(dataset, options, conn, peer, cancelled).await;
                        }
                    }
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
            other => return other,
        }
    }
}

/// Opens a session of a dataset ([`open`]) or of a mixture ([`open_mixture`]), by what the name
/// is in the configuration in force.
async fn open_either(
    name: &str,
    options: &SessionOptions,
    conn: &ConnShared,
    peer: &Peer,
    cancelled: &Arc<AtomicBool>,
) -> Result<(OpenSession, ServerMessage, OwnedFd), Refusal> {
    // In the user's lane while it is prepared: one user's costly opens do not hold up another's.
    let _turn = conn.shared.open_lanes.enter(peer.uid).await;
    let config = conn.shared.config();
    let unknown = !config.mixtures.contains_key(name) && !config.datasets.contains_key(name);
    // A mixture's state (weights alone may be a misspelt configured mixture's name).
    let a_mixtures_state = options.resume.as_ref().is_some_and(|s| s.mixture.is_some());
    if options.mixture.is_none() && unknown && a_mixtures_state {
        // Found by a probe: the resume of a mixture given at open, without its definition, was
        // told only that no dataset of that name is configured.
        return Err(Refusal::Mixture {
            name: name.to_owned(),
            message: "no mixture or dataset of this name is configured, and the state resumed is a mixture's: a \
                      mixture given at open is given again (mixture=...) at every open of it, its resumes included \
                      (else: is the name misspelt, or did a reload remove the mixture?)"
                .into(),
        });
    }
    if options.mixture.is_some() || config.mixtures.contains_key(name) {
        open_mixture(name, options, conn, peer, cancelled).await
    } else {
        open(name, options, conn, peer, cancelled).await
    }
}

/// [`open_when_indexed`], watching the client meanwhile: a client that goes away while its open
/// is prepared cancels the preparation's walks (found by a probe: an equal-steps walk kept a core
/// busy for 65 s after its client had gone); the open then ends as a refusal would, undoing what
/// it reserved. `true` beside the outcome when the client went.
pub(super) async fn open_watching(
    dataset: &str,
    options: &SessionOptions,
    conn: &ConnShared,
    rd: &OwnedReadHalf,
    peer: &Peer,
) -> (Result<(OpenSession, ServerMessage, OwnedFd), Refusal>, bool) {
    let cancelled = Arc::new(AtomicBool::new(false));
    let opening = open_when_indexed(dataset, options, conn, peer, &cancelled);
    tokio::pin!(opening);
    tokio::select! {
        done = &mut opening => (done, false),
        () = hung_up(rd) => {
            cancelled.store(true, Ordering::Relaxed);
            tracing::info!(peer = %peer, dataset = %dataset, "the client shut its side of the socket while its session was being opened: the preparation's walks are cancelled");
            (opening.await, true)
        }
    }
}

/// Answers a refused `open`: counted, logged, and the error to the client.
pub(super) async fn refuse(
    refusal: &Refusal,
    dataset: &str,
    conn: &ConnShared,
    wr: &mut OwnedWriteHalf,
    peer: &Peer,
) -> std::io::Result<()> {
    let code = refusal.code();
    let label = serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    conn.shared.data.metrics.control.sessions_refused.with_label_values(&[label.as_str()]).inc();
    // The client chose the name (up to a message's 64 KiB, found by a probe: logged twice whole):
    // the log keeps its start.
    let reason = refusal.to_string();
    let (dataset, reason) = (clipped(dataset, 256), clipped(&reason, 1024));
    tracing::info!(peer = %peer, dataset = %dataset, code = %label, reason = %reason, "open refused");
    if let Refusal::Dataset(CatalogError::Unknown { known, .. }) = refusal {
        tracing::info!(configured = %known.join(", "), "the datasets a client may open");
    }
    send(wr, &ServerMessage::error_with(code, refusal.to_string(), refusal.detail())).await
}

/// `text` as a log shows what a client chose: its first `max` bytes (whole characters), then how
/// long it was.
fn clipped(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}… ({} bytes)", &text[..end], text.len()).into()
}

/// The `code` under which `minibatchd_sessions_refused_total` counts the opens whose preparation
/// was cancelled because their client shut its side of the socket before they were answered.
pub(super) const CLIENT_GONE: &str = "client_gone";

/// What such an open is answered, should its client still read.
pub(super) const CANCELLED: &str =
    "the session's preparation was cancelled: this client shut its side of the socket while the session was being opened";

/// Resolves when the client has shut its end of the socket (or it failed), without reading: a
/// client waits for the reply to its `open`, so nothing but the end is expected meanwhile. Bytes
/// sent ahead of the reply are left for the frame reader, and the end is then no longer watched.
async fn hung_up(rd: &OwnedReadHalf) {
    match rd.ready(tokio::io::Interest::READABLE).await {
        Ok(ready) if !ready.is_read_closed() => std::future::pending().await,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::clipped;

    #[test]
    fn a_client_chosen_name_is_logged_by_its_start_and_length() {
        assert_eq!(clipped("train", 256), "train");
        let long = "é".repeat(300);
        let shown = clipped(&long, 255);
        assert!(shown.starts_with(&"é".repeat(127)) && shown.ends_with("… (600 bytes)"), "{shown}");
    }
}
