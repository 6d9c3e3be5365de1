//! A streamed object's body as a blocking [`Read`] ([`Body`]): the runtime's
//! task sends its bytes through a bounded pipe, a break midway is requested again from the byte
//! where it stopped (with the same `If-Match`), and every wait is within its deadline.

use std::io::Read;
use std::sync::Arc;

use minibatchd_engine::format::errors::DataError;
use minibatchd_engine::remote::RemoteError;

pub(crate) const PIPE_DEPTH: usize = 64;

/// The receiving end of [`crate::Inner::pipe`], as a [`Read`] (the index pass's stream of a whole object)
/// or piece by piece (a range written to the cache).
pub(crate) struct Body {
    rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, RemoteError>>,
    current: bytes::Bytes,
    /// Bytes received, and the range's length: the channel closing before it is whole is an
    /// error, not the end (a streaming task that stopped must not look like the object's end).
    received: u64,
    expected: u64,
}

impl Body {
    pub(crate) fn new(rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, RemoteError>>, expected: u64) -> Self {
        Self { rx, current: bytes::Bytes::new(), received: 0, expected }
    }

    /// The next piece; empty at the end.
    pub(crate) fn next(&mut self) -> std::io::Result<bytes::Bytes> {
        if !self.current.is_empty() {
            return Ok(std::mem::take(&mut self.current));
        }
        loop {
            return match self.rx.blocking_recv() {
                Some(Ok(b)) if b.is_empty() => continue,
                Some(Ok(b)) => {
                    self.received += b.len() as u64;
                    Ok(b)
                }
                Some(Err(e)) => Err(std::io::Error::other(e)),
                None if self.received < self.expected => Err(std::io::Error::other(format!(
                    "the object's stream stopped after {} of {} bytes",
                    self.received, self.expected
                ))),
                None => Ok(bytes::Bytes::new()),
            };
        }
    }
}

/// An error of the stream for its reader, who names the object itself (as the engine's
/// `DataError::Io`): the store's words without the URL they start with.
pub(crate) fn for_reader(e: std::io::Error) -> std::io::Error {
    match e.downcast::<RemoteError>() {
        Ok(remote) => match remote.into_data() {
            DataError::Io { source, .. } => {
                Arc::try_unwrap(source).unwrap_or_else(|s| std::io::Error::new(s.kind(), s.to_string()))
            }
            other => std::io::Error::other(other.to_string()),
        },
        Err(e) => e,
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.current.is_empty() {
                let n = buf.len().min(self.current.len());
                buf[..n].copy_from_slice(&self.current[..n]);
                self.current = self.current.slice(n..);
                return Ok(n);
            }
            let piece = self.next().map_err(for_reader)?;
            if piece.is_empty() {
                return Ok(0);
            }
            self.current = piece;
        }
    }
}
