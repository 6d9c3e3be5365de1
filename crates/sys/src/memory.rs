//! Where a ring's bytes live. [`SlotMemory`] is the one concept; [`MemfdMemory`] is the real
//! backend (a sealed `memfd` mapped shared), [`LocalMemory`] the process-local one for unit
//! tests. [`ReadOnlyMapping`] is the client's side: a received memfd mapped read-only after its
//! seals are checked.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Creating or mapping shared memory failed.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("{call}: {source}")]
    Sys {
        /// Which call.
        call: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The memfd is not sealed against resizing, so a mapping could fault.
    #[error("the shared-memory file is not sealed against shrinking (seals {0:#x})")]
    NotSealed(u32),
    /// The memfd is smaller than the ring it should hold.
    #[error("the shared-memory file has {actual} bytes, expected at least {expected}")]
    TooSmall {
        /// Bytes found.
        actual: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// A size that does not fit the address space.
    #[error("size {0} does not fit in memory")]
    Size(u64),
}

fn sys(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |e| ShmError::Sys { call, source: e.into() }
}

/// The bytes of a ring. Implementations guarantee `bytes().len()` never changes.
pub trait SlotMemory: Send {
    /// All bytes, read-only.
    fn bytes(&self) -> &[u8];
    /// All bytes, writable (the writer's side).
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// A 64-byte aligned block, so that heap-backed rings align tensors as memfd ones do.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; 64]);

/// Process-local ring memory (tests): a zeroed, 64-byte aligned heap buffer.
pub struct LocalMemory {
    blocks: Vec<Block>,
    len: usize,
}

impl LocalMemory {
    /// `len` zero bytes.
    #[must_use]
    pub fn new(len: usize) -> Self {
        Self { blocks: vec![Block([0; 64]); len.div_ceil(64)], len }
    }
}

impl SlotMemory for LocalMemory {
    fn bytes(&self) -> &[u8] {
        let all: &[[u8; 64]] = Block::as_arrays(&self.blocks);
        &all.as_flattened()[..self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let all: &mut [[u8; 64]] = Block::as_arrays_mut(&mut self.blocks);
        &mut all.as_flattened_mut()[..len]
    }
}

impl Block {
    fn as_arrays(b: &[Block]) -> &[[u8; 64]] {
        // SAFETY: `Block` is `repr(C)` around `[u8; 64]` with size 64 (alignment only adds no
        // padding because the size is already a multiple of 64), so the layouts are identical;
        // the length and lifetime are those of `b`.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<[u8; 64]>(), b.len()) }
    }
    fn as_arrays_mut(b: &mut [Block]) -> &mut [[u8; 64]] {
        // SAFETY: as in `as_arrays`; the exclusive borrow of `b` is carried over.
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<[u8; 64]>(), b.len()) }
    }
}

/// Equal, disjoint regions of a [`SlotMemory`] — a ring's slots — that several threads write at
/// once, each region by one writer at a time: [`SharedSlots::write`] claims a region for the
/// length of a call and refuses a region another thread is writing. Nothing else reaches the
/// memory while it is shared (it is dropped with this value).
pub struct SharedSlots<M: SlotMemory> {
    /// Boxed, so that its bytes stay where `base` points whatever the memory type; reached only
    /// through `base` while shared.
    memory: Box<M>,
    base: NonNull<u8>,
    offset: usize,
    size: usize,
    busy: Box<[std::sync::atomic::AtomicBool]>,
}

// SAFETY: the memory is owned (`M: Send`, as every `SlotMemory`); moving this value moves that
// ownership, and the regions are reached only through `write`.
unsafe impl<M: SlotMemory> Send for SharedSlots<M> {}
// SAFETY: through `&SharedSlots` a region is reached only by `write`, which holds the region's
// `busy` flag (taken by compare-and-swap, released after the call) while its `&mut [u8]` lives:
// no two references to the same bytes exist at once, and regions do not overlap.
unsafe impl<M: SlotMemory> Sync for SharedSlots<M> {}

impl<M: SlotMemory> SharedSlots<M> {
    /// `count` regions of `size` bytes each, the first at byte `offset` of `memory`; `None` if
    /// they do not fit in it.
    #[must_use]
    pub fn new(memory: M, offset: usize, size: usize, count: usize) -> Option<Self> {
        let mut memory = Box::new(memory);
        let bytes = memory.bytes_mut();
        let end = size.checked_mul(count)?.checked_add(offset)?;
        if end > bytes.len() {
            return None;
        }
        let base = NonNull::new(bytes.as_mut_ptr())?;
        let busy = (0..count).map(|_| std::sync::atomic::AtomicBool::new(false)).collect();
        Some(Self { memory, base, offset, size, busy })
    }

    /// The memory back, no longer shared (no region can be written: `self` is gone).
    #[must_use]
    pub fn into_inner(self) -> M {
        *self.memory
    }

    /// Calls `f` with region `k`, claimed for the call; `None` (and `f` not called) if there is
    /// no region `k` or another thread is writing it now.
    pub fn write<R>(&self, k: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        use std::sync::atomic::{AtomicBool, Ordering};
        /// Gives the region back when the call ends, even by a panic.
        struct Claim<'a>(&'a AtomicBool);
        impl Drop for Claim<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let flag = self.busy.get(k)?;
        flag.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        let _claim = Claim(flag);
        // SAFETY: `offset + (k + 1) * size <= len` (checked in `new`, `k < count`), so the region
        // lies inside the memory `base` points to, which `self` owns (boxed: it does not move) and
        // keeps alive; the claim makes this the only reference to these bytes (see `Sync`) until
        // `_claim` is dropped, after `f` returned and the slice with it.
        let region =
            unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(self.offset + k * self.size), self.size) };
        Some(f(region))
    }
}

/// A shared mapping of `len` bytes, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving it to another thread moves the
// ownership. Shared references only read it (see `ReadOnlyMapping`).
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` only gives out `&[u8]`.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<Self, ShmError> {
        let prot = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        // Not populated, neither side: the daemon makes a slot's pages as it fills them, and a
        // client's first read of a slot maps its written pages in a few faults (fault-around).
        // Populating a client's view would make every page of the ring at `open` — 64 MiB zeroed
        // for the default ring, tens of milliseconds before the first minibatch.
        let flags = MapFlags::SHARED;
        // SAFETY: a fresh mapping chosen by the kernel (null hint) overlaps no existing Rust
        // object; `fd` is a sealed memfd of at least `len` bytes (checked by both callers), so
        // every byte of the mapping is backed and cannot be truncated away.
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) }.map_err(sys("mmap"))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(ShmError::Size(len as u64))?;
        Ok(Self { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live mapping owned by `self` (unmapped only in `drop`).
        // Another process may write slots that this one does not currently own; the protocol
        // (ready/release over the socket) orders those writes before this side reads a slot.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the mapping is writable (only `MemfdMemory` creates writable
        // mappings) and `&mut self` makes this the only reference from this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned; no reference into the mapping
        // outlives `self` (all accessors borrow `self`).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!(error = %e, "munmap failed");
        }
    }
}

/// Ring memory in a sealed memfd, mapped shared and writable: the daemon's side.
pub struct MemfdMemory {
    fd: OwnedFd,
    map: Mapping,
}

impl MemfdMemory {
    /// Creates a memfd named `name` of `len` bytes, maps it, then seals it against shrinking,
    /// growing, writes other than through this mapping (`F_SEAL_FUTURE_WRITE`, Linux 5.1+: a
    /// client that got the descriptor can neither map it writable, nor write or punch holes in
    /// it; found by a probe, which did all three) and further sealing.
    ///
    /// # Errors
    /// [`ShmError::Sys`] if a system call fails (e.g. out of memory for the tmpfs).
    pub fn create(name: &str, len: u64) -> Result<Self, ShmError> {
        let size = usize::try_from(len).map_err(|_| ShmError::Size(len))?;
        let fd =
            rustix::fs::memfd_create(crate::files::memfd_name(name), MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .map_err(sys("memfd_create"))?;
        rustix::fs::ftruncate(&fd, len).map_err(sys("ftruncate"))?;
        // Mapped writable first: the write seal leaves mappings made before it writable.
        let map = Mapping::map(fd.as_fd(), size, true)?;
        let seals = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
        match rustix::fs::fcntl_add_seals(&fd, seals | SealFlags::FUTURE_WRITE) {
            Ok(()) => {}
            // A kernel before 5.1 knows no such seal: the client's read-only mapping then rests on
            // the client.
            Err(rustix::io::Errno::INVAL) => {
                rustix::fs::fcntl_add_seals(&fd, seals).map_err(sys("fcntl(F_ADD_SEALS)"))?;
            }
            Err(e) => return Err(sys("fcntl(F_ADD_SEALS)")(e)),
        }
        Ok(Self { fd, map })
    }

    /// The memfd, to pass to the client.
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl SlotMemory for MemfdMemory {
    fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.bytes_mut()
    }
}

/// A received ring memfd mapped read-only: the client's side.
pub struct ReadOnlyMapping {
    _fd: OwnedFd,
    map: Mapping,
}

impl ReadOnlyMapping {
    /// Checks that `fd` is sealed against shrinking and holds at least `len` bytes, then maps it.
    ///
    /// # Errors
    /// [`ShmError::NotSealed`], [`ShmError::TooSmall`] or a failed system call.
    pub fn map(fd: OwnedFd, len: u64) -> Result<Self, ShmError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(sys("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(ShmError::NotSealed(seals.bits()));
        }
        let actual = rustix::fs::fstat(&fd).map_err(sys("fstat"))?.st_size;
        let actual = u64::try_from(actual).unwrap_or(0);
        if actual < len {
            return Err(ShmError::TooSmall { actual, expected: len });
        }
        let size = usize::try_from(len).map_err(|_| ShmError::Size(len))?;
        let map = Mapping::map(fd.as_fd(), size, false)?;
        Ok(Self { _fd: fd, map })
    }

    /// The mapped bytes.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }
}

/// Heap blocks at least this large get a mapping of their own from glibc's malloc.
pub const OWN_MAPPING_THRESHOLD: usize = 4 << 20;

/// Makes the allocator give large blocks back to the kernel when they are freed.
///
/// Parsed chunks are tens of MiB, and the cache frees them when it evicts. glibc's malloc maps
/// such blocks on their own at first, but after the first such free it raises its mapping
/// threshold (up to 32 MiB) and serves later blocks from its heaps, where a freed block stays
/// in the process: after some eviction churn the daemon's RSS was far above what its cache
/// held, and near it with this set (`docs/benchmarks.md` has the figures).
/// Fixing the threshold at [`OWN_MAPPING_THRESHOLD`] keeps the RSS near what the cache counts,
/// so a systemd `MemoryMax` a little above the limit is safe. Returns whether the allocator took
/// it (always false where the C library is not glibc).
///
/// Call it first thing in `main`, before any thread starts (glibc documents `mallopt` as unsafe
/// to race with allocator initialisation).
#[allow(clippy::must_use_candidate)] // informational: the daemon goes on the same either way, so ignoring it is fine
pub fn return_large_frees_to_the_kernel() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let threshold = libc::c_int::try_from(OWN_MAPPING_THRESHOLD).unwrap_or(libc::c_int::MAX);
        // SAFETY: `mallopt` takes two integers and changes allocator policy only; it touches no
        // memory of ours. `M_MMAP_THRESHOLD` with a value below glibc's maximum (32 MiB) is a
        // documented, valid setting. Called from `main` before any other thread exists.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, threshold) };
        ok == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Bytes of blocks under [`OWN_MAPPING_THRESHOLD`] freed into the allocator's heaps since they
/// were last trimmed. The heaps are the process's, so this count is too.
static FREED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many bytes freed into the heaps start a trim ([`freed_into_heaps`]).
pub const TRIM_AFTER_FREED: usize = 8 << 20;

/// Notes that a block of `bytes` was freed; once blocks under [`OWN_MAPPING_THRESHOLD`] add up to
/// [`TRIM_AFTER_FREED`] since the last trim, trims the heaps ([`trim_heaps`]) on the calling
/// thread. Call it after the block is freed.
///
/// A periodic trim alone left a cold pass over chunks of 2 MiB at twice `memory_limit_bytes`:
/// the chunks the cache evicted went back to the heaps, while the chunks that replaced them were
/// read from the parsed cache as mappings, which reuse none of that memory (a probe: 201 MiB of
/// RSS under a limit of 100 MiB, 124 MiB of it anonymous).
pub fn freed_into_heaps(bytes: usize) {
    use std::sync::atomic::Ordering;
    if bytes == 0 || bytes >= OWN_MAPPING_THRESHOLD {
        return;
    }
    let before = FREED.fetch_add(bytes, Ordering::Relaxed);
    if before.saturating_add(bytes) >= TRIM_AFTER_FREED && FREED.swap(0, Ordering::Relaxed) >= TRIM_AFTER_FREED {
        let _ = trim_heaps();
    }
}

/// Gives the free pages of the allocator's heaps back to the kernel (glibc's `malloc_trim`).
///
/// Blocks under [`OWN_MAPPING_THRESHOLD`] — the parsed columns of chunks of a few MiB — come from
/// glibc's heaps, one per thread that allocates; a column freed by another thread (the cache
/// evicting it) leaves its pages in that heap, where only that heap's next allocations reuse
/// them. Under churn (sessions letting go of their windows and loading them again) that kept tens
/// of MiB beyond what the cache counted. Called periodically: it walks the heaps (well under a
/// millisecond for the daemon's). Returns whether any memory was released (always false where the
/// C library is not glibc).
#[allow(clippy::must_use_candidate)] // informational
pub fn trim_heaps() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        FREED.store(0, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `malloc_trim` takes the allocator's own locks and releases only free pages; it
        // touches no memory that is allocated.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_is_sealed_and_shared_between_mappings() {
        let mut m = MemfdMemory::create("minibatchd-test", 8192).expect("memfd");
        m.bytes_mut()[100] = 42;
        let dup = m.fd().try_clone_to_owned().expect("dup");
        assert!(rustix::fs::ftruncate(&dup, 4096).is_err(), "shrinking must be refused");
        assert!(rustix::fs::ftruncate(&dup, 1 << 20).is_err(), "growing must be refused");
        // Nobody else writes it: no writable mapping, no write, no hole punched (Linux 5.1+; an
        // older kernel has only the other seals).
        if !rustix::fs::fcntl_get_seals(&dup).expect("seals").contains(SealFlags::FUTURE_WRITE) {
            return;
        }
        let writable = unsafe {
            // SAFETY: a fresh mapping chosen by the kernel, unmapped below if it is made at all.
            rustix::mm::mmap(std::ptr::null_mut(), 8192, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &dup, 0)
        };
        if let Ok(p) = writable {
            // SAFETY: the mapping just made, of 8192 bytes.
            let _ = unsafe { rustix::mm::munmap(p, 8192) };
            panic!("a writable mapping of the ring was made");
        }
        assert!(rustix::io::pwrite(&dup, b"x", 100).is_err(), "a write must be refused");
        let punch = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        assert!(rustix::fs::fallocate(&dup, punch, 0, 8192).is_err(), "a hole must be refused");
        let ro = ReadOnlyMapping::map(dup, 8192).expect("map");
        assert_eq!(ro.bytes()[100], 42);
        m.bytes_mut()[101] = 7;
        assert_eq!(ro.bytes()[101], 7);
    }

    /// A name longer than `memfd_create` takes, cut anywhere in a character, still makes a ring.
    #[test]
    fn a_long_name_is_cut_to_what_memfd_create_takes() {
        for name in ["d".repeat(300), format!("{}é", "d".repeat(248))] {
            let m = MemfdMemory::create(&name, 4096).expect("memfd");
            assert_eq!(m.bytes().len(), 4096);
            assert!(crate::files::anonymous_file(&name).is_ok());
        }
    }

    #[test]
    fn unsealed_or_short_files_are_refused() {
        let fd = rustix::fs::memfd_create("plain", MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&fd, 4096).expect("size");
        assert!(matches!(ReadOnlyMapping::map(fd, 4096), Err(ShmError::NotSealed(_))));
        let m = MemfdMemory::create("short", 4096).expect("memfd");
        let dup = m.fd().try_clone_to_owned().expect("dup");
        assert!(matches!(ReadOnlyMapping::map(dup, 8192), Err(ShmError::TooSmall { .. })));
    }

    #[test]
    fn shared_slots_are_written_by_several_threads_one_writer_per_slot() {
        let shared = SharedSlots::new(LocalMemory::new(64 + 4 * 100), 64, 100, 4).expect("fits");
        assert!(SharedSlots::new(LocalMemory::new(64 + 4 * 100), 65, 100, 4).is_none(), "one byte past the end");
        assert!(shared.write(4, |_| ()).is_none(), "no slot 4");
        std::thread::scope(|s| {
            for k in 0..4u8 {
                let shared = &shared;
                s.spawn(move || {
                    for _ in 0..1000 {
                        shared.write(usize::from(k), |b| b.fill(k + 1)).expect("each thread its own slot");
                    }
                });
            }
        });
        // A slot being written is refused to a second writer.
        let inner = shared.write(2, |b| {
            assert!(b.iter().all(|&x| x == 3));
            shared.write(2, |_| ()).is_none()
        });
        assert_eq!(inner, Some(true));
        assert_eq!(shared.write(2, |b| b.len()), Some(100), "and free again after");
        let memory = shared.into_inner();
        let whole = memory.bytes();
        assert!(whole[..64].iter().all(|&x| x == 0), "the bytes before the first slot are untouched");
        for k in 0..4 {
            let expected = u8::try_from(k + 1).expect("small");
            assert!(whole[64 + 100 * k..][..100].iter().all(|&x| x == expected), "slot {k}");
        }
    }

    #[test]
    fn local_memory_is_aligned() {
        let mut m = LocalMemory::new(1000);
        assert_eq!(m.bytes().len(), 1000);
        assert_eq!(m.bytes_mut().as_ptr().align_offset(64), 0);
    }
}
