//! Which version of a data file an index was built from ([`FileStamp`]: size, times, device and
//! inode): what the index cache, the decompressed copies, the persisted parsed chunks and every
//! read check a file against, so a type of its own beside the cache file's format.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::hash::Fnv1a;

/// How long a version with one-second timestamps must have stood unchanged for what is built from
/// it to be kept ([`FileStamp::settled_by`]).
pub const SETTLED_SECS: i64 = 2;

/// The same with finer timestamps: twice the longest tick of a kernel's coarse clock.
pub const SETTLED_FINE: std::time::Duration = std::time::Duration::from_millis(20);

/// The longest [`settle`] waits for a file to stop changing: past the longest window.
pub const MAX_SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(SETTLED_SECS.unsigned_abs() + 1);

/// The version of a file to index: `stamp` once it is settled ([`FileStamp::settled_by`] `now()`),
/// else — after waiting out its window (`sleep`) — the file's version then (`restat`), again
/// while it keeps changing, for at most [`MAX_SETTLE_WAIT`] in all. An
/// index built from a settled version sees every later write (the stamp changes with it); one
/// built from a younger version cannot see another write in the same tick of the file system's
/// clock, and read the new bytes at the old offsets under the old fingerprints (found by a probe:
/// 17 of 20 minibatches). A file still changing at the bound, or dated ahead of this clock (a
/// network file system's server), is indexed as it is (unsettled: not kept for other runs).
///
/// # Errors
/// `restat`'s.
pub fn settle(
    mut stamp: FileStamp,
    now: &mut dyn FnMut() -> i128,
    sleep: &mut dyn FnMut(std::time::Duration),
    restat: &mut dyn FnMut() -> std::io::Result<FileStamp>,
) -> std::io::Result<FileStamp> {
    let mut waited = std::time::Duration::ZERO;
    loop {
        let Some(left) = stamp.unsettled_for(now()) else { return Ok(stamp) };
        if waited + left > MAX_SETTLE_WAIT {
            return Ok(stamp);
        }
        sleep(left);
        waited += left;
        stamp = restat()?;
    }
}

/// The wall clock in nanoseconds since the Unix epoch (the clock file times are set from).
#[must_use]
pub fn unix_now_nanos() -> i128 {
    std::time::SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos().try_into().unwrap_or(i128::MAX))
}

/// Which data file, and which version of it: what the index cache, the decompressed copies, the
/// persisted parsed chunks and every read check a data file against. A file is the same only if
/// all of it is: its size, its modification time, its status-change time (`st_ctime`: set by the
/// kernel on every write, rename, `chmod` or link, and never settable by users — so a file
/// rewritten with its mtime restored, as `cp -p`, `rsync -t`, `tar --mtime` and
/// `SOURCE_DATE_EPOCH` builds do, still differs), and its device and inode (another file put
/// under the same path differs). An object in object storage has its ETag in place of the times,
/// and no device or inode (0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileStamp {
    /// Canonical path (or an object's URL).
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime_secs: i64,
    /// Sub-second part of the modification time.
    pub mtime_nanos: u32,
    /// Status-change time, seconds since the epoch.
    pub ctime_secs: i64,
    /// Sub-second part of the status-change time.
    pub ctime_nanos: u32,
    /// The device holding the file.
    pub dev: u64,
    /// The file's inode.
    pub ino: u64,
}

/// What an object's URL starts with (`remote::SCHEME`, which this module may not name: the
/// remote module builds on this one).
const OBJECT_SCHEME: &[u8] = b"s3://";

impl FileStamp {
    /// Stats `path` now.
    ///
    /// # Errors
    /// I/O errors from `canonicalize` or `metadata`.
    pub fn of(path: &Path) -> std::io::Result<Self> {
        let canonical = fs::canonicalize(path)?;
        let meta = fs::metadata(&canonical)?;
        Ok(Self::from_meta(canonical, &meta))
    }

    /// The stamp of the file whose metadata is `meta`, named `path`.
    #[must_use]
    pub fn from_meta(path: PathBuf, meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        let (mtime_secs, mtime_nanos) = match meta.modified().map(|m| m.duration_since(UNIX_EPOCH)) {
            Ok(Ok(d)) => (i64::try_from(d.as_secs()).unwrap_or(i64::MAX), d.subsec_nanos()),
            Ok(Err(e)) => (-i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX), e.duration().subsec_nanos()),
            Err(_) => (meta.mtime(), u32::try_from(meta.mtime_nsec()).unwrap_or(0)),
        };
        Self {
            path,
            size: meta.len(),
            mtime_secs,
            mtime_nanos,
            ctime_secs: meta.ctime(),
            ctime_nanos: u32::try_from(meta.ctime_nsec()).unwrap_or(0),
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    /// Whether this version had stood unchanged long enough before `now` ([`unix_now_nanos`],
    /// taken before the read that this stamp describes began) that no later write can leave its
    /// stamp as it is. A write within the same tick of the file system's clock as the change
    /// before it can leave every field as it was — "racily clean", as git calls it: on a file
    /// system of one-second timestamps (ext4 with 128-byte inodes, and others: both times' nanoseconds 0)
    /// for up to a second, so [`SETTLED_SECS`] there; elsewhere for one tick of the kernel's coarse
    /// clock (at most 10 ms at `HZ=100`), so [`SETTLED_FINE`] — except on Linux 6.13 and later
    /// on the file systems with multigrain timestamps (ext4, XFS, Btrfs, tmpfs), where a change
    /// after a `stat` always gets a time of its own (a network file system's server stamps its
    /// files by its own clock: never taken as unique). What is built from a
    /// younger version (an index, a decompressed copy) serves the process that built it, but is
    /// not kept for another to take by the stamp alone (found by a probe: an in-place rewrite in
    /// the second a file on such a file system was indexed was served stale by every later run).
    #[must_use]
    pub fn settled_by(&self, now: i128) -> bool {
        self.settles_at() <= now
    }

    /// How long after `now` ([`unix_now_nanos`]) this version becomes settled
    /// ([`Self::settled_by`]); `None` once it is.
    #[must_use]
    pub fn unsettled_for(&self, now: i128) -> Option<std::time::Duration> {
        let left = self.settles_at().saturating_sub(now);
        (left > 0).then(|| std::time::Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX)))
    }

    /// When this version becomes settled: its last change plus its file system's window. An
    /// object's version is its ETag, which names one content for good: settled from the start
    /// (found by a probe: the ETag's hash in place of the modification time read as a date in
    /// the future for half of all objects, whose decompressed copies were never kept).
    fn settles_at(&self) -> i128 {
        if self.path.as_os_str().as_encoded_bytes().starts_with(OBJECT_SCHEME) {
            return i128::MIN;
        }
        let at = |secs: i64, nanos: u32| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        let changed = at(self.mtime_secs, self.mtime_nanos).max(at(self.ctime_secs, self.ctime_nanos));
        let coarse = self.mtime_nanos == 0 && self.ctime_nanos == 0;
        let window = if coarse {
            i128::from(SETTLED_SECS) * 1_000_000_000
        } else if minibatchd_sys::files::change_times_are_unique(&self.path) {
            0
        } else {
            i128::try_from(SETTLED_FINE.as_nanos()).unwrap_or(i128::MAX)
        };
        changed.saturating_add(window)
    }

    /// Whether `other` is the same version of a file (the path aside).
    #[must_use]
    pub fn same_version(&self, other: &Self) -> bool {
        self.version_bytes() == other.version_bytes()
    }

    /// Bytes in [`Self::version_bytes`].
    pub const VERSION_BYTES: usize = 48;

    /// The version (size, mtime, ctime, device, inode; not the path) as the state directory's
    /// files store it: little-endian, in that order, each time as i64 seconds and u32 nanoseconds.
    #[must_use]
    pub fn version_bytes(&self) -> [u8; Self::VERSION_BYTES] {
        let mut out = [0u8; Self::VERSION_BYTES];
        let fields: [&[u8]; 7] = [
            &self.size.to_le_bytes(),
            &self.mtime_secs.to_le_bytes(),
            &self.mtime_nanos.to_le_bytes(),
            &self.ctime_secs.to_le_bytes(),
            &self.ctime_nanos.to_le_bytes(),
            &self.dev.to_le_bytes(),
            &self.ino.to_le_bytes(),
        ];
        let mut at = 0;
        for f in fields {
            out[at..at + f.len()].copy_from_slice(f);
            at += f.len();
        }
        out
    }

    /// The stamp named `path` whose version is `bytes` ([`Self::version_bytes`]).
    #[must_use]
    pub fn from_version_bytes(path: PathBuf, bytes: &[u8; Self::VERSION_BYTES]) -> Self {
        let mut at = 0;
        let mut take = |n: usize| {
            let field = &bytes[at..at + n];
            at += n;
            field
        };
        let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or_default());
        Self {
            path,
            size: u64_at(take(8)),
            mtime_secs: u64_at(take(8)).cast_signed(),
            mtime_nanos: u32_at(take(4)),
            ctime_secs: u64_at(take(8)).cast_signed(),
            ctime_nanos: u32_at(take(4)),
            dev: u64_at(take(8)),
            ino: u64_at(take(8)),
        }
    }

    /// Feeds the version (size, times, device and inode; not the path) to `h`.
    pub fn hash_version(&self, h: &mut Fnv1a) {
        h.u64(self.size);
        h.u64(self.mtime_secs.cast_unsigned());
        h.u64(u64::from(self.mtime_nanos));
        h.u64(self.ctime_secs.cast_unsigned());
        h.u64(u64::from(self.ctime_nanos));
        h.u64(self.dev);
        h.u64(self.ino);
    }

    /// What changed from `self` to `now`, in words (for errors and logs).
    #[must_use]
    pub fn change(&self, now: &Self) -> String {
        if (now.dev, now.ino) != (self.dev, self.ino) {
            "replaced by another file".to_owned()
        } else if now.size != self.size {
            format!("rewritten ({} bytes, {} when indexed)", now.size, self.size)
        } else if (now.mtime_secs, now.mtime_nanos) != (self.mtime_secs, self.mtime_nanos) {
            "rewritten in place (same size, another modification time)".to_owned()
        } else {
            "changed in place (same size and modification time, but a newer status-change time: rewritten \
             with its modification time set back, or its mode or links changed)"
                .to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version is settled once its last change is older than the window of its file system's
    /// timestamps: a second's worth and more with one-second timestamps (both nanoseconds 0),
    /// [`SETTLED_FINE`] with finer ones.
    #[test]
    fn a_version_settles_after_its_timestamps_window() {
        let s = 1_000_000_000i128;
        let coarse = FileStamp { mtime_secs: 100, ctime_secs: 100, ..FileStamp::default() };
        assert!(!coarse.settled_by(100 * s));
        assert!(!coarse.settled_by(101 * s + s / 2), "within the second after the change's second");
        assert!(coarse.settled_by(102 * s));
        let fine = FileStamp { mtime_secs: 100, mtime_nanos: 5, ctime_secs: 100, ctime_nanos: 7, ..coarse.clone() };
        let unique = minibatchd_sys::files::change_times_are_unique(&fine.path);
        let window = if unique { 0 } else { i128::try_from(SETTLED_FINE.as_nanos()).expect("small") };
        assert!(!fine.settled_by(100 * s + 6), "not before its change");
        assert!(window == 0 || !fine.settled_by(100 * s + 7 + window - 1));
        assert!(fine.settled_by(100 * s + 7 + window));
        // The later of the two times counts: a `chmod` (ctime only) is a change too.
        let chmod = FileStamp { ctime_secs: 200, ctime_nanos: 1, ..fine };
        assert!(!chmod.settled_by(150 * s));
        assert!(chmod.settled_by(200 * s + 1 + window));
    }

    /// Found by a probe: an object's stamp carries its ETag's hash in place of a time, which
    /// read as a date far ahead for half of all ETags; an object's version is settled at once.
    #[test]
    fn an_objects_version_is_settled_whatever_its_etag_hash() {
        for etag in ["\"a\"", "\"b\"", "\"c\"", "\"d\"", "\"e\"", "\"f\""] {
            let object = crate::remote::ObjectMeta { url: "s3://b/k.gz".into(), size: 10, etag: etag.into() };
            let stamp = crate::remote::shared_index_stamp(&object);
            assert!(stamp.settled_by(0) && stamp.unsettled_for(0).is_none(), "{stamp:?}");
        }
        let ahead = FileStamp { mtime_secs: i64::MAX / 2, path: "s3://b/k".into(), ..FileStamp::default() };
        assert!(ahead.settled_by(0));
        let local = FileStamp { path: "/data/k".into(), ..ahead };
        assert!(!local.settled_by(0), "a local file dated ahead is not");
        assert_eq!(OBJECT_SCHEME, crate::remote::SCHEME.as_bytes());
    }

    /// A clock that `sleep` moves, a file whose stamp `restat` gives, and what `settle` did.
    fn settle_with(
        stamp: FileStamp,
        start: i128,
        mut versions: impl FnMut(i128) -> FileStamp,
    ) -> (FileStamp, bool, i128) {
        let clock = std::cell::Cell::new(start);
        let got = settle(
            stamp,
            &mut || clock.get(),
            &mut |d| clock.set(clock.get() + i128::try_from(d.as_nanos()).expect("small")),
            &mut || Ok(versions(clock.get())),
        )
        .expect("no stat error");
        let settled = got.settled_by(clock.get());
        (got, settled, clock.get() - start)
    }

    /// A version younger than its window is waited out, then taken again: an index is built from
    /// what the file holds once no write can keep its stamp (one-second timestamps here, whose
    /// window does not depend on the kernel).
    #[test]
    fn a_young_version_is_waited_out_and_taken_again() {
        let s = 1_000_000_000i128;
        let coarse = FileStamp { size: 10, mtime_secs: 100, ctime_secs: 100, ..FileStamp::default() };
        // Settled already: no wait, no second look.
        let (got, settled, waited) = settle_with(coarse.clone(), 103 * s, |_| panic!("not looked at again"));
        assert_eq!((got, settled, waited), (coarse.clone(), true, 0));
        // Written at 100.x, looked at 100.4 s: settled at 102 s. A write in the same second left the
        // stamp as it was; what is returned is the file's version after the wait.
        let (got, settled, waited) = settle_with(coarse.clone(), 100 * s + 4 * s / 10, |_| coarse.clone());
        assert_eq!((got, settled, waited), (coarse.clone(), true, 16 * s / 10));
        // Written again during the wait: waited out again.
        let again = FileStamp { mtime_secs: 101, ctime_secs: 101, ..coarse.clone() };
        let (got, settled, waited) = settle_with(coarse.clone(), 100 * s + s / 2, |_| again.clone());
        assert_eq!((got.mtime_secs, settled, waited), (101, true, 5 * s / 2));
    }

    /// A file that goes on changing, or whose time is ahead of this clock, is not waited for past
    /// the bound: it is indexed as it is, unsettled.
    #[test]
    fn a_file_still_changing_or_dated_ahead_is_waited_for_at_most_the_bound() {
        let s = 1_000_000_000i128;
        let bound = i128::try_from(MAX_SETTLE_WAIT.as_nanos()).expect("small");
        let coarse = FileStamp { size: 10, mtime_secs: 100, ctime_secs: 100, ..FileStamp::default() };
        let (got, settled, waited) = settle_with(coarse.clone(), 100 * s, |now| {
            let secs = i64::try_from(now / s).expect("small");
            FileStamp { mtime_secs: secs, ctime_secs: secs, ..coarse.clone() }
        });
        assert!(!settled && waited <= bound && got.mtime_secs > 100, "{got:?} after {waited} ns");
        let ahead = FileStamp { mtime_secs: 1000, ctime_secs: 1000, ..coarse };
        let (got, settled, waited) = settle_with(ahead.clone(), 100 * s, |_| panic!("not waited for"));
        assert_eq!((got, settled, waited), (ahead, false, 0));
    }
}
