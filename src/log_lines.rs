//! The log's lines as one event each, whatever its fields hold.
//!
//! Names a client sends (a dataset, a session, its own) go into log fields as given. A name with a
//! newline and escape sequences wrote lines of its own into the log — a forged `ERROR ... panicked`
//! for anything that reads or alerts on the log's text (found by a probe). [`Escaped`] writes each
//! event with its control bytes escaped (`\n`, `\r`, `\x1b`), its one final newline kept, and
//! drops an event the log's file refuses.

use std::io::{self, Write};

/// A writer that escapes control bytes in each event before its final newline. With `ansi` (a
/// terminal, where the formatter colours the output itself) the escape byte is left as it is.
pub struct Escaped<W> {
    inner: W,
    ansi: bool,
}

impl<W: Write> Escaped<W> {
    /// Escapes what is written through it to `inner`.
    pub fn new(inner: W, ansi: bool) -> Self {
        Self { inner, ansi }
    }

    fn kept(&self, b: u8) -> bool {
        (b >= 0x20 && b != 0x7f) || b == b'\t' || (self.ansi && b == 0x1b)
    }
}

impl<W: Write> Write for Escaped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    /// A log write that fails (a full disk, the file-size limit, a closed pipe) is dropped: there
    /// is nowhere else to say it, and the formatter would report it on the same stderr, which
    /// panics when that fails too (found by a probe: a log file at `ulimit -f` made every event a
    /// panic, connections dropped, and SIGTERM exit 101).
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let _ = self.escaped_write(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.inner.flush();
        Ok(())
    }
}

impl<W: Write> Escaped<W> {
    fn escaped_write(&mut self, buf: &[u8]) -> io::Result<()> {
        let (body, newline) = buf.strip_suffix(b"\n").map_or((buf, false), |b| (b, true));
        if body.iter().all(|&b| self.kept(b)) {
            return self.inner.write_all(buf);
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b if self.kept(b) => out.push(b),
                b => {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
        }
        if newline {
            out.push(b'\n');
        }
        self.inner.write_all(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &[u8], ansi: bool) -> Vec<u8> {
        let mut out = Vec::new();
        Escaped::new(&mut out, ansi).write_all(text).expect("write");
        out
    }

    #[test]
    fn an_event_stays_one_line_whatever_its_fields_hold() {
        let forged = b"WARN open refused dataset=fake\n2026-12-04T00:00:00Z ERROR panicked\x1b[31m\r\x00\n";
        let out = escaped(forged, false);
        assert_eq!(
            out,
            b"WARN open refused dataset=fake\\n2026-12-04T00:00:00Z ERROR panicked\\x1b[31m\\r\\x00\n".to_vec()
        );
        assert_eq!(out.split(|&b| b == b'\n').count(), 2, "one line");
        // Plain lines, tabs and UTF-8 pass as they are; a terminal keeps the formatter's colours.
        assert_eq!(escaped("INFO a\tb é\n".as_bytes(), false), "INFO a\tb é\n".as_bytes());
        assert_eq!(escaped(b"\x1b[2mINFO\x1b[0m x\n", true), b"\x1b[2mINFO\x1b[0m x\n");
        assert_eq!(escaped(b"no newline\x07", false), b"no newline\\x07");
    }

    /// A write the log's file refuses is dropped, not reported (to the same stderr).
    #[test]
    fn a_refused_log_write_is_dropped() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from_raw_os_error(27)) // EFBIG
            }
            fn flush(&mut self) -> io::Result<()> {
                Err(io::Error::from_raw_os_error(27))
            }
        }
        let mut w = Escaped::new(Full, false);
        assert!(w.write_all(b"INFO x\n").is_ok() && w.write_all(b"a\nb\n").is_ok() && w.flush().is_ok());
    }
}
