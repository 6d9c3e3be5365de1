//! `shm::return_large_frees_to_the_kernel`: freed parsed-chunk-sized blocks leave the RSS.
//!
//! A test binary of its own, with one test: it reads the process's RSS, which other tests
//! running beside it in the same process would move.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

/// Resident bytes of this process (`VmRSS` of `/proc/self/status`).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    kib << 10
}

#[test]
fn large_freed_blocks_leave_the_process() {
    assert!(minibatchd_sys::return_large_frees_to_the_kernel(), "glibc accepts the threshold");
    // Blocks of a parsed chunk's size (under glibc's 32 MiB ceiling), two alive at a time so a
    // freed one is not simply the top of the heap. Without the fixed threshold, freeing the
    // first raises glibc's threshold and the later ones stay resident after they are freed.
    let mut older = vec![1u8; 16 << 20];
    for round in 0..6u8 {
        let v = vec![round + 2; 16 << 20];
        let before = rss_bytes();
        drop(std::hint::black_box(std::mem::replace(&mut older, v)));
        let after = rss_bytes();
        assert!(
            before.saturating_sub(after) >= 12 << 20,
            "round {round}: a freed 16 MiB block stayed resident: {before} -> {after}"
        );
    }
}
