//! What a failed decompression or copy says: the cause, and what to change.

use std::path::Path;

use crate::format::errors::DataError;
use crate::format::index_cache::FileStamp;
use crate::options::{InflateBound, InflateLimits, INFLATE_RATIO_GRACE_BYTES};

/// A decompression error `e` of a local `source` (recorded as `stamp`) that changed while it was
/// read says so: the data was not corrupt, it moved under the reader (found by a probe: a `.gz`
/// rewritten in place during its decompression was called a corrupt gzip stream).
pub(super) fn changed_meanwhile(source: &Path, stamp: &FileStamp, e: DataError) -> DataError {
    if stamp.ino == 0 {
        return e; // an object's stamp (its ETag): `remote` says when it changed
    }
    match FileStamp::of(source) {
        Ok(now) if now != *stamp => DataError::Dataset(format!(
            "{}: the file changed while it was being decompressed (its size, times or inode are not those it had \
             when the read began), so what was read is neither version: {e}. Open it again once it is written",
            source.display()
        )),
        _ => e,
    }
}

/// `source`'s copy cannot be written into `dir`: the advice follows the cause (found by a probe:
/// a full disk was told to change the directory's owner).
pub(super) fn cannot_write(source: &Path, dir: &Path, state_dir: &Path, e: &std::io::Error) -> DataError {
    if e.kind() == std::io::ErrorKind::IsADirectory {
        // Found by a probe: an empty directory at the copy's name was told to change owners.
        return DataError::Dataset(format!(
            "{}: cannot write its decompressed copy into {}: {e}. A directory is in the copy's place there (the \
             daemon writes only files into state_dir/inflated/): remove it",
            source.display(),
            dir.display()
        ));
    }
    if e.kind() == std::io::ErrorKind::FileTooLarge {
        return DataError::Dataset(format!(
            "{}: cannot write its decompressed copy into {}: {e}. The process's file-size limit (`ulimit -f`, \
             systemd's LimitFSIZE=) is below the copy's size: raise it for minibatchd",
            source.display(),
            dir.display()
        ));
    }
    if matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded) {
        return DataError::Dataset(format!(
            "{}: cannot write its decompressed copy into {}: {e}. A gzip input is read through a copy in \
             state_dir/inflated/: free space on the file system of {} (the copies no dataset reads are removed \
             within the hour; daemon.max_inflated_bytes bounds them), or move daemon.state_dir to one with room",
            source.display(),
            dir.display(),
            state_dir.display()
        ));
    }
    DataError::Dataset(format!(
        "{}: cannot write its decompressed copy into {}: {e}. A gzip input is read through a copy in \
         state_dir/inflated/, a private directory of the user running minibatchd (never a shared temporary \
         directory): set daemon.state_dir (or MINIBATCHD__DAEMON__STATE_DIR) to a directory this user owns, or \
         run as the user that owns {}",
        source.display(),
        dir.display(),
        state_dir.display()
    ))
}

/// `source` decompresses to more than `allowed` bytes.
pub(super) fn over_limit(
    source: &Path,
    stamp: &FileStamp,
    limits: &InflateLimits,
    allowed: u64,
    bound: InflateBound,
) -> DataError {
    DataError::Dataset(match bound {
        InflateBound::Bytes => format!(
            "{}: decompresses to more than daemon.max_inflated_bytes ({allowed} bytes); the partial copy was \
             removed. If the file is genuine, raise daemon.max_inflated_bytes",
            source.display()
        ),
        InflateBound::Ratio => format!(
            "{}: decompresses to more than daemon.max_inflate_ratio ({}× its compressed size of {} bytes, at least \
             {INFLATE_RATIO_GRACE_BYTES} bytes: {allowed} bytes), the mark of a gzip bomb; the partial copy was \
             removed. If the file is genuine, raise daemon.max_inflate_ratio",
            source.display(),
            limits.max_ratio,
            stamp.size
        ),
    })
}
