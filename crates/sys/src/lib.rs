//! minibatchd's audited `unsafe` code, and nothing else of consequence. **Every other crate of
//! the workspace has `#![forbid(unsafe_code)]`**, so this crate is the whole list to audit; each
//! `unsafe` block carries a `// SAFETY:` comment (`clippy::undocumented_unsafe_blocks` is denied).
//!
//! * byte views of plain numbers ([`Pod`], [`as_bytes`], [`as_bytes_mut`], [`cast_slice`]) and the
//!   cache [`prefetch`] hint — how the engine copies samples into a slot and how clients read them;
//! * [`simd`] — the CTF dense fast path's SSE2 byte classifier and its AVX2 window kernel
//!   (`#[target_feature]` calls, the kernel chosen at run time where the CPU has AVX2);
//! * [`memory`] — where a ring's bytes live: a sealed `memfd` mapped shared
//!   ([`memory::MemfdMemory`]), a heap buffer for tests ([`memory::LocalMemory`]), the client's
//!   read-only mapping ([`memory::ReadOnlyMapping`]), a ring's slots written by several threads
//!   at once, one writer per slot ([`memory::SharedSlots`]); `madvise(MADV_HUGEPAGE)` for parsed columns
//!   and glibc's `mallopt` tuning;
//! * [`mod@column`] — a persisted parsed chunk's columns read straight from a read-only mapping of
//!   its file ([`column::FileMapping`], [`column::Column`]), guarded by a read lease
//!   ([`lease`]: another process's write or truncation waits until the mapping is the process's
//!   own memory);
//! * [`fdpass`] — passing the memfd over the control socket (`SCM_RIGHTS`);
//! * [`crc32c`] — CRC-32C of short inputs with SSE 4.2's `crc32` instruction (TFRecord frames).
//! * [`signals`] — unblocking the signals the daemon handles (a blocked mask survives `exec`).
//!
//! Depends on no other crate of the workspace. What the bytes of a ring *mean* is
//! `minibatchd-shm`'s business.

pub mod column;
pub mod crc32c;
pub mod fdpass;
pub mod files;
pub mod huge;
pub mod lease;
pub mod memory;
pub mod signals;
pub mod simd;

pub use column::{Column, FileMapping};
pub use huge::{advise_huge_pages, HugePages};
pub use memory::{
    return_large_frees_to_the_kernel, LocalMemory, MemfdMemory, ReadOnlyMapping, SharedSlots, ShmError, SlotMemory,
};

/// This crate's result: creating or mapping shared memory fails with [`ShmError`].
pub type Result<T, E = ShmError> = std::result::Result<T, E>;

/// Plain data that may be viewed as bytes and read back from suitably aligned bytes: every bit
/// pattern is a valid value and the type has no padding.
///
/// # Safety
/// Implement only for primitive numeric types without padding bytes or invalid bit patterns.
pub unsafe trait Pod: Copy + 'static {}

// SAFETY: primitive numbers: no padding, every bit pattern valid.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for i64 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for usize {}
// SAFETY: as above.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for f64 {}

/// The bytes of a slice of plain numbers (native endianness, which the layout declares).
#[must_use]
pub fn as_bytes<T: Pod>(values: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so every byte of the slice is initialised; the length is
    // the slice's size in bytes; `u8` has alignment 1; the lifetime is tied to `values`.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

/// The bytes of a mutable slice of plain numbers, to be filled in place.
#[must_use]
pub fn as_bytes_mut<T: Pod>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; in addition every byte pattern written through the view is a valid
    // `T` (`T: Pod`), and the exclusive borrow of `values` is held for the view's lifetime.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

/// Asks the CPU to start loading `bytes` into its caches (a hint: no effect on results). Used
/// when gathering samples from random places of parsed chunks, a few sequences ahead of the copy,
/// so the cache misses overlap instead of stalling each copy in turn.
#[inline]
pub fn prefetch<T>(values: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = values.as_ptr().cast::<u8>();
        // One hint per 64-byte line, at most 16 lines (a row of 256 floats).
        for at in (0..std::mem::size_of_val(values).min(1024)).step_by(64) {
            // SAFETY: SSE is part of the x86_64 baseline; a prefetch never faults, reads nothing
            // architecturally and writes nothing; `at` stays inside `values`, so the pointer
            // arithmetic stays in bounds of one allocation.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(at).cast::<i8>()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}

/// Views `bytes` as a slice of `T`, if it is aligned for `T` and a whole number of `T`s long.
#[must_use]
pub fn cast_slice<T: Pod>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if bytes.len() - bytes.len() / size * size != 0 || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return None;
    }
    // SAFETY: alignment and length were checked just above; `T: Pod` accepts every bit pattern;
    // the lifetime is tied to `bytes`.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

/// The values of `T` whose bytes are `bytes` (any alignment), copied into a new vector written
/// once (no zeroing first); large vectors are backed by huge pages when `huge` says
/// ([`advise_huge_pages`]), as a parse's columns are. `None` unless `bytes` is a whole number of
/// `T`s.
#[must_use]
pub fn copy_from_bytes<T: Pod>(bytes: &[u8], huge: bool) -> Option<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    let len = bytes.len() / size;
    let mut v: Vec<T> = Vec::with_capacity(len);
    advise_huge_pages(&v, huge);
    // SAFETY: the vector's allocation holds at least `len` values, `bytes.len()` bytes, and does
    // not overlap `bytes` (it is new); a byte copy needs no alignment; all `len` values are then
    // initialised, and every byte pattern is a valid `T` (`T: Pod`).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len());
        v.set_len(len);
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_from_bytes_at_any_alignment() {
        let v: Vec<u64> = vec![1, u64::MAX, 7];
        let mut b = vec![0u8];
        b.extend_from_slice(as_bytes(&v));
        assert_eq!(copy_from_bytes::<u64>(&b[1..], true), Some(v));
        assert_eq!(copy_from_bytes::<u64>(&b[1..9], false).map(|x| x.len()), Some(1));
        assert!(copy_from_bytes::<u64>(&b[1..5], true).is_none(), "not a whole u64");
        assert_eq!(copy_from_bytes::<f32>(&[], true), Some(Vec::new()));
    }

    #[test]
    fn cast_round_trips_and_refuses_misalignment() {
        let v: Vec<f32> = vec![1.0, -2.5, f32::INFINITY];
        let b = as_bytes(&v);
        assert_eq!(b.len(), 12);
        assert_eq!(cast_slice::<f32>(b), Some(&v[..]));
        assert!(cast_slice::<f32>(&b[1..5]).is_none(), "misaligned");
        assert!(cast_slice::<f32>(&b[..5]).is_none());
    }
}
