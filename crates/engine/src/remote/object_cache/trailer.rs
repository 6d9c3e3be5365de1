//! The trailer that ends each object cache entry on disk, and the checks and writer that use it.

use std::fs::File;
use std::io::Write;

/// What follows a cached range on disk: the CRC-32 of its entry's name (object, ETag, range)
/// and bytes, and this mark. An entry whose bytes changed on disk (a bit flipped, another entry's
/// file of the same length) fails the check at its first use in a run and is fetched again, never
/// served.
pub(super) const TRAILER_MARK: [u8; 4] = *b"MBOC";
/// Bytes of the trailer.
pub(super) const TRAILER_BYTES: u64 = 8;

/// The trailer of a range whose bytes have CRC-32 `crc`.
pub(super) fn trailer(crc: u32) -> [u8; 8] {
    let mut t = [0u8; 8];
    t[..4].copy_from_slice(&crc.to_le_bytes());
    t[4..].copy_from_slice(&TRAILER_MARK);
    t
}

/// The checksum of entry `name`'s bytes, before them.
pub(super) fn entry_sum(name: &str) -> crc32fast::Hasher {
    let mut h = crc32fast::Hasher::new();
    h.update(name.as_bytes());
    h
}

/// Whether `file`, entry `name`, holds `len` bytes that its trailer (after them) says it does.
pub(super) fn holds_its_trailer(file: &File, name: &str, len: u64) -> bool {
    use std::os::unix::fs::FileExt as _;
    let mut h = entry_sum(name);
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from((len - at).min(buf.len() as u64)).unwrap_or(buf.len());
        if file.read_exact_at(&mut buf[..n], at).is_err() {
            return false;
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    let mut t = [0u8; 8];
    file.read_exact_at(&mut t, len).is_ok() && t == trailer(h.finalize())
}

/// A writer that passes bytes on and keeps their CRC-32, and whether writing them failed (the
/// cache's disk, not the store).
pub(super) struct Summing<'a> {
    pub(super) out: &'a mut dyn Write,
    pub(super) crc: crc32fast::Hasher,
    pub(super) failed: bool,
}

impl Write for Summing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf).inspect_err(|_| self.failed = true)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
