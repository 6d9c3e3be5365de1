//! A column of plain numbers that is either owned (a `Vec`, what a parse writes) or a range of a
//! read-only mapping of a parsed cache entry (what a read from the parsed cache
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
/// Guarded by a read lease ([`crate::lease`]): the file is mapped only while this process holds
/// one, so nobody is writing it when it is mapped, and another process that later opens it for
/// writing or truncates it waits until the mapping has been moved into this process's own memory
/// ([`FileMapping::detach`]). A truncation can therefore never make a read fault (`SIGBUS`), nor
/// a write change the bytes read.
pub struct FileMapping {
    ptr: NonNull<u8>,
    len: usize,
    /// The file, holding the lease, while the mapping is the file's; `None` once detached.
    lease: std::sync::Mutex<Option<File>>,
    /// Whether the mapping, and the memory it is detached into (later, maybe after a reload
    /// changed it), are advised huge pages.
    huge: crate::HugePages,
}

// SAFETY: the mapping is read-only memory owned by this value; moving it to another thread moves
// the ownership.
unsafe impl Send for FileMapping {}
// SAFETY: `&FileMapping` only gives out `&[u8]` of read-only memory, whose bytes never change
// (`detach` replaces the pages with equal ones); the lease is behind a mutex.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Takes a read lease on `file` (opened read-only), maps its first `len` bytes (its whole
    /// length, as the caller checked) and has the kernel populate the page tables with them,
    /// reading what is not in the page cache: an I/O error surfaces here as an error, not later
    /// as a fault in the reader. The mapping holds `file` while it is the file's. It follows
    /// `huge`: advised huge pages when it is on now, and so is the memory
    /// [`FileMapping::detach`] moves it into when it is on then.
    ///
    /// # Errors
    /// `InvalidInput` for an empty mapping or one past the file's end; the lease's error when the
    /// file cannot be guarded ([`crate::lease`]: the caller reads it instead); the `mmap` or
    /// `madvise(MADV_POPULATE_READ)` error (a kernel older than 5.14 without that advice is not
    /// an error: pages then fault in on first use).
    pub fn map(file: File, len: usize, huge: &crate::HugePages) -> std::io::Result<Arc<Self>> {
        // Leased first: from here no one can be writing the file, so what is mapped (and checked
        // by the caller) is what is read until the mapping goes.
        crate::lease::take(&file)?;
        // Past the file's end a mapping faults when read: refused here, whatever the kernel's
        // populate says (one older than 5.14 says nothing).
        if len == 0 || u64::try_from(len).map_or(true, |l| l > file.metadata().map_or(0, |m| m.len())) {
            crate::lease::release(&file);
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh mapping chosen by the kernel (null hint) overlaps no existing Rust
        // object. Under the lease nobody writes or truncates the file while it is mapped (a
        // writer waits until `detach` has moved the pages into memory of our own), so the bytes
        // read through it stay what they were (and `Pod` values are valid for any bytes).
        let mapped =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ, MapFlags::PRIVATE, &file, 0) };
        let Some(ptr) = mapped.ok().and_then(|p| NonNull::new(p.cast::<u8>())) else {
            crate::lease::release(&file);
            return Err(mapped.err().map_or_else(|| std::io::ErrorKind::InvalidInput.into(), Into::into));
        };
        let map = Arc::new(Self { ptr, len, lease: std::sync::Mutex::new(Some(file)), huge: huge.clone() });
        // Watched from here, before the populate reads the file in (seconds for a large one from
        // disk): a writer that comes meanwhile breaks the lease once, and its one SIGIO must find
        // the mapping.
        crate::lease::guard(&map);
        if huge.enabled() {
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
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
        // A break that came before the watch began: moved into memory now.
        if map.lease_broken() {
            map.detach()?;
        }
        Ok(map)
    }

    fn lease(&self) -> std::sync::MutexGuard<'_, Option<File>> {
        self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the mapping is still the file's (not yet [`FileMapping::detach`]ed).
    #[must_use]
    pub fn is_file_backed(&self) -> bool {
        self.lease().is_some()
    }

    /// Whether another process is waiting to write or truncate the file (its lease is being
    /// broken).
    pub(crate) fn lease_broken(&self) -> bool {
        self.lease().as_ref().is_some_and(crate::lease::broken)
    }

    /// Moves the mapping into anonymous memory of this process's own — the same bytes at the same
    /// addresses, in one step (`mremap`) — then releases the file and its lease: whatever is
    /// done to the file afterwards does not reach the mapping. Readers may read meanwhile: they
    /// see the same bytes before and after. Does nothing once detached.
    ///
    /// # Errors
    /// The `mmap`, `mprotect` or `mremap` error; the mapping then stays the file's, leased.
    pub fn detach(&self) -> std::io::Result<()> {
        let mut lease = self.lease();
        let Some(file) = lease.as_ref() else { return Ok(()) };
        // SAFETY: a fresh anonymous mapping chosen by the kernel, overlapping nothing.
        let copy = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                self.len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        if self.huge.enabled() {
            // SAFETY: exactly the fresh mapping above; the advice only changes its backing.
            let _ = unsafe { rustix::mm::madvise(copy, self.len, Advice::LinuxHugepage) };
        }
        // SAFETY: `copy` is `len` writable bytes of our own; `ptr..ptr+len` is the file mapping,
        // readable, and its bytes cannot change or vanish while we hold the lease (the writer
        // waiting for it is blocked in the kernel).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), copy.cast::<u8>(), self.len) };
        // SAFETY: `copy`/`len` is the anonymous mapping made above, which nothing else uses. Then
        // `mremap` moves it onto `ptr`, replacing the file mapping there in one step (the kernel
        // unmaps the old range and maps the new pages under one lock): a concurrent reader sees
        // the file's page or the copy's, which hold the same bytes. `ptr`/`len` stay this
        // mapping's (unmapped in `drop`).
        let moved = unsafe {
            rustix::mm::mprotect(copy, self.len, rustix::mm::MprotectFlags::READ)
                .map_err(std::io::Error::from)
                .and_then(|()| {
                    let to = libc::mremap(
                        copy,
                        self.len,
                        self.len,
                        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                        self.ptr.as_ptr().cast::<libc::c_void>(),
                    );
                    if to == libc::MAP_FAILED {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(())
                    }
                })
        };
        if let Err(e) = moved {
            // SAFETY: the copy, not moved: ours alone.
            let _ = unsafe { rustix::mm::munmap(copy, self.len) };
            return Err(e);
        }
        crate::lease::release(file);
        *lease = None;
        Ok(())
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

impl crate::lease::Guarded for FileMapping {
    fn lease_broken(&self) -> bool {
        FileMapping::lease_broken(self)
    }

    fn detach(&self) -> std::io::Result<()> {
        FileMapping::detach(self)
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned; no reference into the mapping
        // outlives `self` (every `Column` into it holds an `Arc` of it).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!(error = %e, "munmap of a persisted parsed chunk failed");
        }
        // Unmapped first: the lease (and the file) go only once nothing can read the file's pages.
        if let Some(file) = self.lease().take() {
            crate::lease::release(&file);
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
    /// once, advised huge pages (the copy is made for them: a caller whose setting is off has no
    /// reason to copy). An owned column stays as it is.
    pub fn own(&mut self) {
        if self.is_mapped() {
            let copy = crate::copy_from_bytes(crate::as_bytes(self.as_slice()), true);
            self.0 = Repr::Owned(copy.unwrap_or_else(|| self.as_slice().to_vec()));
        }
    }
}

impl<T: Pod> Drop for Column<T> {
    fn drop(&mut self) {
        // Freed first, then counted: the count may trim the heaps, which must find it free.
        if let Repr::Owned(v) = &mut self.0 {
            let bytes = v.capacity() * std::mem::size_of::<T>();
            drop(std::mem::take(v));
            crate::memory::freed_into_heaps(bytes);
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

    /// A read-only handle on a new file holding `bytes` (unlinked: the crate has no `tempfile`
    /// dependency).
    fn file_of(bytes: &[u8]) -> File {
        let (path, f) = named_file_of(bytes);
        std::fs::remove_file(&path).expect("unlink");
        f
    }

    /// A new file holding `bytes` under a name of its own, and a read-only handle on it (a
    /// mapping's lease needs one: no descriptor open for writing).
    fn named_file_of(bytes: &[u8]) -> (std::path::PathBuf, File) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "minibatchd-column-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let mut w = std::fs::File::create(&path).expect("create");
        w.write_all(bytes).expect("write");
        drop(w);
        (path.clone(), File::open(&path).expect("open"))
    }

    #[test]
    fn a_mapped_column_reads_the_files_values_and_outlives_its_file_handle() {
        let values: Vec<u64> = (0..1000).map(|i| i * 3 + 1).collect();
        let f = file_of(crate::as_bytes(&values));
        let map = FileMapping::map(f, values.len() * 8, &crate::HugePages::default()).expect("map");
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
        let map = FileMapping::map(file_of(&[7u8; 64]), 64, &crate::HugePages::default()).expect("map");
        assert!(Column::<u64>::mapped(&map, 0, 8).is_some());
        assert!(Column::<u64>::mapped(&map, 8, 8).is_none(), "past the end");
        assert!(Column::<u64>::mapped(&map, 4, 1).is_none(), "misaligned for u64");
        assert!(Column::<u32>::mapped(&map, 4, 1).is_some());
        assert!(Column::<u64>::mapped(&map, usize::MAX - 3, 1).is_none(), "overflow");
        assert!(Column::<u8>::mapped(&map, 64, 0).is_some(), "an empty range at the end");
        assert!(FileMapping::map(file_of(&[7u8; 64]), 0, &crate::HugePages::default()).is_err());
        assert!(
            FileMapping::map(file_of(&[7u8; 64]), 65, &crate::HugePages::default()).is_err(),
            "past the file's end"
        );
    }

    /// `FilePmdMapped` is found for the mapping itself (not another one): a small file mapping
    /// has none.
    #[test]
    fn a_small_mapping_is_not_huge_page_backed() {
        let map = FileMapping::map(file_of(&[1u8; 8192]), 8192, &crate::HugePages::default()).expect("map");
        assert_eq!(map.huge_page_backed(), Some(false));
    }

    /// Runs `cmd` (a shell command on `path`) in another process until it succeeds: its open for
    /// writing blocks in the kernel until the mapping's lease is released, which the lease thread
    /// does after moving the mapping into memory — or, opened non-blocking (coreutils' `truncate`
    /// does), fails with `EAGAIN` until then.
    fn other_process(cmd: &str, path: &std::path::Path) {
        let start = std::time::Instant::now();
        while !std::process::Command::new("sh")
            .args(["-c", cmd, "sh"])
            .arg(path)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run sh")
            .success()
        {
            assert!(start.elapsed() < std::time::Duration::from_secs(30), "{cmd} never succeeded");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Issue 36, finding 4: an entry truncated while mapped killed the whole daemon (`SIGBUS`),
    /// and one overwritten in place was served wrong. Under its lease, the truncation and the
    /// write wait until the mapping is the process's own; it reads the bytes it was mapped with.
    #[test]
    fn a_mapped_file_truncated_or_overwritten_by_another_process_keeps_its_bytes() {
        let values: Vec<u64> = (0..(3 << 18)).map(|i| i * 7 + 3).collect(); // 6 MiB
        let bytes = crate::as_bytes(&values);
        for cmd in
            ["truncate -s 0 \"$1\"", "printf 'XXXXXXXXXXXXXXXX' | dd of=\"$1\" bs=4096 seek=1 conv=notrunc 2>/dev/null"]
        {
            let (path, f) = named_file_of(bytes);
            let map = FileMapping::map(f, bytes.len(), &crate::HugePages::default()).expect("map");
            let col = Column::<u64>::mapped(&map, 0, values.len()).expect("column");
            assert!(map.is_file_backed());
            let before = crate::lease::revoked();
            other_process(cmd, &path);
            assert!(!map.is_file_backed(), "{cmd}: moved into memory before the other process went on");
            // The lease thread counts a revocation right after the move, which the other
            // process may already have gone on from: wait for the count (at most a second).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while crate::lease::revoked() <= before && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(crate::lease::revoked() > before);
            // No SIGBUS, and the values the mapping was made with.
            assert!(col.iter().copied().eq(values.iter().copied()), "{cmd}: the values changed");
            let on_disk = std::fs::read(&path).expect("read");
            assert_ne!(on_disk, bytes, "{cmd}: the other process did change the file");
            std::fs::remove_file(&path).expect("rm");
        }
    }

    /// A file open for writing (here by this very process) cannot be leased, so it is not
    /// mapped: the caller reads it instead.
    #[test]
    fn a_file_open_for_writing_is_not_mapped() {
        let (path, f) = named_file_of(&[5u8; 8192]);
        let writer = std::fs::OpenOptions::new().write(true).open(&path).expect("open for writing");
        let e =
            FileMapping::map(f, 8192, &crate::HugePages::default()).expect_err("no lease while a writer has it open");
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
        drop(writer);
        let map = FileMapping::map(File::open(&path).expect("open"), 8192, &crate::HugePages::default())
            .expect("mapped once the writer is gone");
        assert_eq!(map.bytes(), &[5u8; 8192][..]);
        std::fs::remove_file(&path).expect("rm");
    }
}
