//! Opening input files without blocking on what is not a file; reading arrays of numbers from a
//! file without zeroing them first; advisory locks.

use std::fs::File;
use std::io;
use std::path::Path;

/// Opens `path` for reading if it is a regular file, without ever blocking in `open`: a FIFO
/// put where a data file was (after the name was checked) would otherwise block the opener until
/// someone writes to it. Opened with `O_NONBLOCK` (no effect on regular files: their reads never
/// return `EAGAIN`), then checked with `fstat` on the opened descriptor; a FIFO, socket or
/// device is an `InvalidInput` error saying so.
///
/// # Errors
/// The `open` or `fstat` error, or `InvalidInput` for anything but a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let nonblock = i32::try_from(rustix::fs::OFlags::NONBLOCK.bits()).unwrap_or(0);
    let file = std::fs::OpenOptions::new().read(true).custom_flags(nonblock).open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{what}, not a regular file")))
}

/// Takes a shared advisory lock (`flock(LOCK_SH)`) on `file` (a file or a directory opened for
/// reading), waiting while another holds it exclusively; released when the file is closed.
///
/// # Errors
/// The `flock` error.
pub fn lock_shared(file: &File) -> io::Result<()> {
    loop {
        match rustix::fs::flock(file, rustix::fs::FlockOperation::LockShared) {
            Err(rustix::io::Errno::INTR) => {}
            other => return other.map_err(io::Error::from),
        }
    }
}

/// Takes an exclusive advisory lock (`flock(LOCK_EX | LOCK_NB)`) on `file` if nobody holds one:
/// `Ok(false)` when another does. Released when the file is closed.
///
/// # Errors
/// The `flock` error other than "would block".
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    match rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Reads the next `len` values of `T` (native endianness) from `reader` into a new vector: what
/// its buffer holds first, then straight from the file into the vector's unused capacity. Unlike
/// `vec![0; len]` and `read_exact`, the memory is written once, by the copy: for the parsed-chunk
/// cache's columns (tens of MiB each) the zeroing pass was a whole extra write of every byte.
/// Large vectors are backed by huge pages ([`crate::advise_huge_pages`]), as a parse's are.
///
/// # Errors
/// `UnexpectedEof` when the file ends first (what was read is consumed, as `read_exact` leaves
/// it unspecified), `InvalidInput` when `len` values do not fit in memory's address space, or the
/// `read` error.
pub fn read_array<T: crate::Pod>(reader: &mut io::BufReader<File>, len: usize) -> io::Result<Vec<T>> {
    use io::BufRead as _;
    use std::mem::MaybeUninit;
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "array too large"))?;
    let mut v: Vec<T> = Vec::with_capacity(len);
    crate::advise_huge_pages(&v);
    let spare = v.spare_capacity_mut();
    // SAFETY: `spare` is at least `len` elements of `T`, `bytes` bytes, exclusively borrowed for
    // the view's lifetime; `MaybeUninit<u8>` has alignment 1 and no validity requirement, so any
    // bytes (or none) may be written through the view.
    let dst: &mut [MaybeUninit<u8>] = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), bytes) };
    let buffered = reader.buffer();
    let mut filled = buffered.len().min(bytes);
    for (d, &s) in dst[..filled].iter_mut().zip(buffered) {
        d.write(s);
    }
    reader.consume(filled);
    // The reader's buffer is empty whenever more is needed, so reading the file directly keeps
    // the reader's position right.
    while filled < bytes {
        match rustix::io::read(reader.get_ref(), &mut dst[filled..]) {
            Ok(([], _)) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok((init, _)) => filled += init.len(),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // SAFETY: all `bytes` bytes of the first `len` elements were written above, and every byte
    // pattern is a valid `T` (`T: Pod`).
    unsafe { v.set_len(len) };
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #15: a file swapped for a FIFO after the dataset's files were listed blocked `open`.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("mbd-sys-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("data.ctf");
        let _ = std::fs::remove_file(&fifo);
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).expect("mkfifo");
        let e = open_regular(&fifo).expect_err("a FIFO");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = open_regular(&dir).expect_err("a directory");
        assert!(e.to_string().contains("a directory"), "{e}");
        let file = dir.join("f");
        std::fs::write(&file, b"x").expect("write");
        let mut s = String::new();
        std::io::Read::read_to_string(&mut open_regular(&file).expect("a file"), &mut s).expect("read");
        assert_eq!(s, "x");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn arrays_are_read_across_the_buffer_and_the_file_and_a_short_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("mbd-sys-array-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("a");
        let values: Vec<u64> = (0..10_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let mut bytes = vec![7u8, 9, 11];
        bytes.extend_from_slice(crate::as_bytes(&values));
        bytes.extend_from_slice(&[1, 2, 3, 4]);
        std::fs::write(&path, &bytes).expect("write");
        // A small buffer: the first array comes partly from it, partly from the file.
        let mut r = io::BufReader::with_capacity(64, File::open(&path).expect("open"));
        let mut head = [0u8; 3];
        io::Read::read_exact(&mut r, &mut head).expect("head");
        assert_eq!(head, [7, 9, 11]);
        let got: Vec<u64> = read_array(&mut r, values.len()).expect("array");
        assert_eq!(got, values);
        let small: Vec<u8> = read_array(&mut r, 2).expect("two bytes");
        assert_eq!(small, [1, 2]);
        let e = read_array::<f32>(&mut r, 1).expect_err("two bytes are left, four are asked for");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = read_array::<u64>(&mut r, usize::MAX).expect_err("too large");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
