//! Columns freed into the allocator's heaps go back to the kernel as they are freed, not at the
//! next periodic trim. In a test binary of its own: it reads the process's resident memory, which
//! other tests' threads would move.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use minibatchd_sys::Column;

/// The process's anonymous resident memory, in bytes.
fn rss_anon() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/self/status");
    kib << 10
}

#[test]
fn columns_freed_into_the_heaps_go_back_to_the_kernel_at_once() {
    // As the daemon's `main` does: blocks of 4 MiB and more get mappings of their own, so the
    // 1 MiB columns below come from a heap (a chunk of 2 MiB of text parses into such columns).
    assert!(minibatchd_sys::memory::return_large_frees_to_the_kernel());
    // On a thread of its own, as a parser thread: its own heap.
    std::thread::spawn(|| {
        const COLUMNS: usize = 64;
        let before = rss_anon();
        let mut columns = Vec::new();
        // A small block after each column keeps the freed columns from joining the heap's top,
        // which glibc's `free` shrinks by itself: they stay holes, as evicted chunks between
        // chunks still cached do.
        let mut pins = Vec::new();
        for i in 0..COLUMNS {
            let column: Column<u8> = vec![u8::try_from(i).expect("small"); 1 << 20].into();
            columns.push(column);
            pins.push(vec![0u8; 64]);
        }
        let held = rss_anon();
        assert!(held >= before + (60 << 20), "the columns were not resident: {before} B, then {held} B");
        drop(columns);
        let after = rss_anon();
        assert!(
            after < before + (16 << 20),
            "{} MiB of freed columns stayed resident (before {} MiB, held {} MiB, after {} MiB)",
            (after.saturating_sub(before)) >> 20,
            before >> 20,
            held >> 20,
            after >> 20
        );
        drop(pins);
    })
    .join()
    .expect("the test thread");
}
