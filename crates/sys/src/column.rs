//! A column of plain numbers that is either owned (a `Vec`, what a parse writes) or a range of a
//! read-only mapping of a persisted parsed-chunk file (what a read from the persisted cache
//! gives): the gather reads both as `&[T]`.
//!
//! Mapping an entry instead of copying it into fresh memory saves the copy and, more, the first
//! touch of that memory, which on a virtual machine whose host takes freed memory back costs more
//! than the copy itself (docs/benchmarks.md). The pages are the page cache's, shared by every
//! reader, and the kernel may drop them under memory pressure and read them again on use.

use std::fs::File;
use std::ptr::NonNull;
use std::sync::Arc;

use rustix::mm::{Advice, MapFlags, ProtFlags};

use crate::Pod;

/// A whole regular file mapped read-only and private, populated at once; unmapped when the last
/// [`Column`] into it is dropped.
///
/// The caller must map only files that nobody writes in place or truncates while they are mapped
/// (the persisted parsed-chunk cache: entries in a private `0700` directory, written to a new file
/// and renamed into place, never modified after). A file truncated under a mapping makes reading
/// its lost pages fault (`SIGBUS`), and bytes written into it in place change the values read.
pub struct FileMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only memory owned by this value; moving it to another thread moves
// the ownership.
unsafe impl Send for FileMapping {}
// SAFETY: `&FileMapping` only gives out `&[u8]` of read-only memory.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps the first `len` bytes of `file` (its whole length, as the caller checked) and has the
    /// kernel populate the page tables with them, reading what is not in the page cache: an I/O
    /// error surfaces here as an error, not later as a fault in the reader.
    ///
    /// # Errors
    /// `InvalidInput` for an empty mapping; the `mmap` or `madvise(MADV_POPULATE_READ)` error (a
    /// kernel older than 5.14 without that advice is not an error: pages then fault in on first
    /// use).
    pub fn map(file: &File, len: usize) -> std::io::Result<Self> {
        // Past the file's end a mapping faults when read: refused here, whatever the kernel's
        // populate says (one older than 5.14 says nothing).
        if len == 0 || u64::try_from(len).map_or(true, |l| l > file.metadata().map_or(0, |m| m.len())) {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh mapping chosen by the kernel (null hint) overlaps no existing Rust
        // object. The file's contents are not changed under the mapping by the contract above, so
        // the bytes read through it stay what they were (and `Pod` values are valid for any bytes).
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ, MapFlags::PRIVATE, file, 0) }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(std::io::ErrorKind::InvalidInput)?;
        let map = Self { ptr, len };
        if crate::huge::huge_pages() {
            // Pages not in the page cache are then read ahead into 2 MiB folios, which the
            // mapping maps as huge pages (as those of entries written in 2 MiB pieces).
            // SAFETY: the range is exactly the mapping made above, owned by `map`;
            // `MADV_HUGEPAGE` changes how the kernel backs it, never its contents or validity.
            if let Err(e) = unsafe { rustix::mm::madvise(ptr.as_ptr().cast(), len, Advice::LinuxHugepage) } {
                tracing::trace!(error = %e, "MADV_HUGEPAGE declined for a file mapping");
            }
        }
        // SAFETY: the range is exactly the mapping made above, owned by `map`; the advice only
        // reads the file's pages in and maps them, never changing contents or validity.
        match unsafe { rustix::mm::madvise(ptr.as_ptr().cast(), len, Advice::LinuxPopulateRead) } {
            Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(map),
            Err(e) => Err(e.into()),
        }
    }

    /// The mapped bytes.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live read-only mapping owned by `self` (unmapped only in
        // `drop`); the lifetime is tied to `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Whether at least half of the mapping is mapped with huge pages (`FilePmdMapped` of its
    /// entry in `/proc/self/smaps`): the page cache holds the file in 2 MiB folios (written in
    /// 2 MiB pieces, or read ahead under `MADV_HUGEPAGE`) and the kernel and filesystem map such
    /// folios whole. `None` when `/proc/self/smaps` cannot say. Reads the process's whole
    /// `smaps` (milliseconds for a daemon's mappings): for background work, not a hot path.
    #[must_use]
    pub fn huge_page_backed(&self) -> Option<bool> {
        Some(self.smaps_bytes("FilePmdMapped:")?.saturating_mul(2) >= self.len)
    }

    /// Bytes of the mapping resident in this process (`Rss` of its entry in `/proc/self/smaps`);
    /// `None` when that cannot be read. Reads the whole `smaps`, as [`Self::huge_page_backed`].
    #[must_use]
    pub fn resident_bytes(&self) -> Option<usize> {
        self.smaps_bytes("Rss:")
    }

    /// A size field (`kB`) of this mapping's entry in `/proc/self/smaps`, in bytes.
    fn smaps_bytes(&self, name: &str) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let start = format!("{:x}-", self.ptr.as_ptr() as usize);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        lines.next()?;
        // The mapping's fields end with its `VmFlags` line.
        let field = lines.take_while(|l| !l.starts_with("VmFlags")).find_map(|l| l.strip_prefix(name))?;
        let kib: usize = field.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib.saturating_mul(1024))
    }

    /// Bytes mapped.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: an empty mapping is refused.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned; no reference into the mapping
        // outlives `self` (every `Column` into it holds an `Arc` of it).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!(error = %e, "munmap of a persisted parsed chunk failed");
        }
    }
}

impl std::fmt::Debug for FileMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileMapping").field("len", &self.len).finish_non_exhaustive()
    }
}

/// Plain numbers, owned or mapped; reads as a slice.
#[derive(Clone)]
pub struct Column<T: Pod>(Repr<T>);

#[derive(Clone)]
enum Repr<T: Pod> {
    Owned(Vec<T>),
    /// `len` values at byte `start` of the mapping (checked in bounds and aligned).
    Mapped {
        map: Arc<FileMapping>,
        start: usize,
        len: usize,
    },
}

impl<T: Pod> Column<T> {
    /// `len` values of `T` at byte `start` of `map`, if they lie inside it and are aligned for
    /// `T` (the mapping starts on a page).
    #[must_use]
    pub fn mapped(map: &Arc<FileMapping>, start: usize, len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let end = start.checked_add(bytes)?;
        if end > map.len {
            return None;
        }
        // In bounds, so the address does not overflow.
        let aligned = (map.ptr.as_ptr() as usize + start).is_multiple_of(std::mem::align_of::<T>());
        aligned.then(|| Self(Repr::Mapped { map: Arc::clone(map), start, len }))
    }

    /// The values.
    #[inline]
    #[must_use]
    pub fn as_slice(&self) -> &[T] {
        match &self.0 {
            Repr::Owned(v) => v,
            Repr::Mapped { map, start, len } => {
                // SAFETY: `mapped` checked that `len` values from byte `start` lie inside the
                // mapping and are aligned for `T`; the mapping lives as long as the `Arc` held
                // here, the lifetime is tied to `self`, and every byte pattern is a valid `T`
                // (`T: Pod`).
                unsafe { std::slice::from_raw_parts(map.ptr.as_ptr().add(*start).cast::<T>(), *len) }
            }
        }
    }

    /// Whether the values are a mapped file's.
    #[must_use]
    pub fn is_mapped(&self) -> bool {
        self.mapping().is_some()
    }

    /// The mapping the values are read from, if they are a mapped file's.
    #[must_use]
    pub fn mapping(&self) -> Option<&Arc<FileMapping>> {
        match &self.0 {
            Repr::Mapped { map, .. } => Some(map),
            Repr::Owned(_) => None,
        }
    }

    /// Gives back what an owned vector over-allocated (nothing to do for a mapping).
    pub fn shrink_to_fit(&mut self) {
        if let Repr::Owned(v) = &mut self.0 {
            v.shrink_to_fit();
        }
    }

    /// Puts a mapped column's values in memory of this process's own: a new vector, written
    /// once, huge pages advised as a parse's columns. An owned column stays as it is.
    pub fn own(&mut self) {
        if self.is_mapped() {
            let copy = crate::copy_from_bytes(crate::as_bytes(self.as_slice()));
            self.0 = Repr::Owned(copy.unwrap_or_else(|| self.as_slice().to_vec()));
        }
    }
}

impl<T: Pod> std::ops::Deref for Column<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Pod> From<Vec<T>> for Column<T> {
    fn from(v: Vec<T>) -> Self {
        Self(Repr::Owned(v))
    }
}

impl<T: Pod> FromIterator<T> for Column<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self(Repr::Owned(iter.into_iter().collect()))
    }
}

impl<T: Pod> Default for Column<T> {
    fn default() -> Self {
        Self(Repr::Owned(Vec::new()))
    }
}

impl<T: Pod + PartialEq> PartialEq for Column<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: Pod + Eq> Eq for Column<T> {}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for Column<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> File {
        let mut f = tempfile_in_target();
        f.write_all(bytes).expect("write");
        f
    }

    /// An unlinked temporary file (the crate has no `tempfile` dependency).
    fn tempfile_in_target() -> File {
        let path = std::env::temp_dir().join(format!(
            "minibatchd-column-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("open");
        std::fs::remove_file(&path).expect("unlink");
        f
    }

    #[test]
    fn a_mapped_column_reads_the_files_values_and_outlives_its_file_handle() {
        let values: Vec<u64> = (0..1000).map(|i| i * 3 + 1).collect();
        let f = file_of(crate::as_bytes(&values));
        let map = Arc::new(FileMapping::map(&f, values.len() * 8).expect("map"));
        drop(f);
        let col = Column::<u64>::mapped(&map, 8, 10).expect("in bounds and aligned");
        drop(map);
        assert!(col.is_mapped());
        assert_eq!(&col[..], &values[1..11]);
        assert_eq!(col, Column::from(values[1..11].to_vec()));
        let mut owned = col.clone();
        owned.own();
        assert!(!owned.is_mapped());
        assert_eq!(owned, col);
    }

    #[test]
    fn out_of_bounds_or_misaligned_ranges_are_refused() {
        let f = file_of(&[7u8; 64]);
        let map = Arc::new(FileMapping::map(&f, 64).expect("map"));
        assert!(Column::<u64>::mapped(&map, 0, 8).is_some());
        assert!(Column::<u64>::mapped(&map, 8, 8).is_none(), "past the end");
        assert!(Column::<u64>::mapped(&map, 4, 1).is_none(), "misaligned for u64");
        assert!(Column::<u32>::mapped(&map, 4, 1).is_some());
        assert!(Column::<u64>::mapped(&map, usize::MAX - 3, 1).is_none(), "overflow");
        assert!(Column::<u8>::mapped(&map, 64, 0).is_some(), "an empty range at the end");
        assert!(FileMapping::map(&f, 0).is_err());
        assert!(FileMapping::map(&f, 65).is_err(), "past the file's end");
    }

    /// `FilePmdMapped` is found for the mapping itself (not another one): a small file mapping
    /// has none.
    #[test]
    fn a_small_mapping_is_not_huge_page_backed() {
        let f = file_of(&[1u8; 8192]);
        let map = FileMapping::map(&f, 8192).expect("map");
        assert_eq!(map.huge_page_backed(), Some(false));
    }
}
