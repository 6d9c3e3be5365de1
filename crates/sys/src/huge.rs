//! Whether parsed-chunk buffers are backed by transparent huge pages (`[daemon] huge_pages`).
//!
//! Huge pages make a parse fault 512 times less often and the gather's random reads miss the TLB
//! less. They are on by default. They can cost more than they save where first touching memory
//! is slow for huge pages in particular: on a virtual machine whose memory balloon reports free
//! memory to its host (virtio free page reporting), the kernel reports free blocks of huge-page
//! size and up, the host takes their backing away, and a huge page made from them is backed again,
//! by the host, when first written. On the project's VM first touch with the advice was several
//! times slower than without; without it a cold sweep was faster, sweeps that reuse freed memory
//! slower, and a restart either, from one round of runs to the next (the figures are in
//! `docs/benchmarks.md`, "Huge pages and memory the host took back"): hence a setting, not a
//! rule.
//!
//! The setting is a [`HugePages`] handle that whoever opens datasets holds and hands on (the
//! daemon's catalog to each dataset, the parsed cache and the persister; `dump` and `index` their
//! own), not process state: two daemons' worth of datasets in one process (the tests) each follow
//! their own. The setting is read when a chunk's parse, a mapping or a copy begins.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes of a transparent huge page on `x86_64` and `aarch64` (4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// `[daemon] huge_pages`: whether buffers allocated from now on are advised huge pages. Clones
/// share one setting, so a reload that [`HugePages::set`]s it reaches every holder at once (for
/// chunks parsed from then on). On by default.
#[derive(Debug, Clone)]
pub struct HugePages(Arc<AtomicBool>);

impl HugePages {
    /// A setting of its own, `enabled` or not.
    #[must_use]
    pub fn new(enabled: bool) -> Self {
        Self(Arc::new(AtomicBool::new(enabled)))
    }

    /// Turns the advice on or off for every holder of this setting, for buffers allocated from
    /// now on.
    pub fn set(&self, enabled: bool) {
        self.0.store(enabled, Ordering::Relaxed);
    }

    /// Whether new buffers are advised huge pages now.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for HugePages {
    fn default() -> Self {
        Self::new(true)
    }
}

/// Asks the kernel to back the whole 2 MiB pages inside `v`'s allocation with transparent huge
/// pages (`MADV_HUGEPAGE`; THP is commonly in `madvise` mode), when `enabled` (the caller's
/// [`HugePages::enabled`]). Parsed chunks are tens of MiB, written once and then read at random
/// by the gather. A hint: when the kernel declines, nothing changes. Call it on a vector that has
/// its capacity and nothing written yet. Returns whether the range was advised.
#[allow(clippy::must_use_candidate)] // informational (tests); callers go on the same either way
pub fn advise_huge_pages<T>(v: &Vec<T>, enabled: bool) -> bool {
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < 2 * HUGE_PAGE || !enabled {
        return false;
    }
    let start = v.as_ptr() as usize;
    let first = start.next_multiple_of(HUGE_PAGE);
    let end = (start + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end <= first {
        return false;
    }
    // SAFETY: `[first, end)` lies inside `v`'s allocation (rounded inwards to whole huge pages),
    // which this process owns and keeps mapped while `v` lives. `MADV_HUGEPAGE` changes how the
    // kernel backs the range, never its contents, protection or validity, so no reference into
    // it, ours or anyone's, is affected.
    let advised =
        unsafe { rustix::mm::madvise(first as *mut std::ffi::c_void, end - first, rustix::mm::Advice::LinuxHugepage) };
    if let Err(e) = advised {
        tracing::trace!(error = %e, "MADV_HUGEPAGE declined");
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `VmFlags` of the mapping that holds `addr`, from `/proc/self/smaps`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some((a, b)) =
                range.and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)))
            {
                inside = (a..b).contains(&addr);
            } else if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.trim().to_owned();
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn the_setting_decides_whether_the_kernel_is_asked() {
        let small: Vec<u8> = Vec::with_capacity(HUGE_PAGE);
        assert!(!advise_huge_pages(&small, true), "less than two huge pages: never");
        let setting = HugePages::default();
        let holder = setting.clone();
        setting.set(false);
        assert!(!holder.enabled(), "clones share the setting");
        let off: Vec<u8> = Vec::with_capacity(16 * HUGE_PAGE);
        assert!(!advise_huge_pages(&off, holder.enabled()));
        assert!(!vm_flags(off.as_ptr() as usize + 8 * HUGE_PAGE).split(' ').any(|f| f == "hg"));
        setting.set(true);
        let on: Vec<u8> = Vec::with_capacity(16 * HUGE_PAGE);
        if advise_huge_pages(&on, holder.enabled()) {
            // The kernel keeps the advice as the mapping's `hg` flag (the middle of the buffer
            // lies in the advised range whatever the allocation's alignment).
            assert!(vm_flags(on.as_ptr() as usize + 8 * HUGE_PAGE).split(' ').any(|f| f == "hg"));
        } else {
            // Only a kernel without transparent huge pages declines.
            assert!(!std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists());
        }
        assert!(holder.enabled());
        assert!(!HugePages::new(false).enabled(), "a new setting is its own");
    }
}
