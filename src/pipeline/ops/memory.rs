//! Memory: process and host figures from `sysinfo`, and the host-memory guard.
//!
//! `memory_limit_bytes` bounds what the daemon itself holds (chunk cache + rings; see
//! `session::Registry`). The host can still run short because of everything else on the node
//! (trainers, page cache pressure). When `sysinfo` reports `MemAvailable` below
//! `host_memory_reserve_bytes`, [`HostGuard`] first caps the chunk cache below what it holds by
//! the shortfall (the cache evicts chunks no session holds, prefetch stops) and only when that
//! cannot cover the shortfall — the cache has too little it may drop — are new sessions refused
//! (`resource_exhausted`, naming the host). While the host is short the cap keeps following the
//! cache down; once it is not, the cap grows back by the headroom above the reserve per sample
//! and disappears when it reaches the limit, so the cache does not bounce back at once.
//!
//! [`HostGuard`] is plain logic, tested here; the housekeeping thread (`ops`) samples and applies.

use sysinfo::{MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// How often the housekeeping thread samples memory.
pub const MEMORY_SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// One memory sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemorySample {
    /// Host total.
    pub host_total: u64,
    /// Host `MemAvailable`.
    pub host_available: u64,
    /// The daemon's resident set.
    pub process_resident: u64,
    /// The daemon's virtual size.
    pub process_virtual: u64,
}

/// Samples the host and this process through `sysinfo`.
pub struct Sampler {
    system: System,
    pid: Option<Pid>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").field("pid", &self.pid).finish_non_exhaustive()
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Self::new()
    }
}

impl Sampler {
    /// A sampler for this process.
    #[must_use]
    pub fn new() -> Self {
        Self { system: System::new(), pid: sysinfo::get_current_pid().ok() }
    }

    /// Takes a sample (reads `/proc/meminfo` and this process's status).
    pub fn sample(&mut self) -> MemorySample {
        self.system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        let mut s = MemorySample {
            host_total: self.system.total_memory(),
            host_available: self.system.available_memory(),
            ..MemorySample::default()
        };
        if let Some(pid) = self.pid {
            self.system.refresh_processes_specifics(
                ProcessesToUpdate::Some(&[pid]),
                false,
                ProcessRefreshKind::nothing().with_memory(),
            );
            if let Some(p) = self.system.process(pid) {
                s.process_resident = p.memory();
                s.process_virtual = p.virtual_memory();
            }
        }
        s
    }
}

/// What the guard decided for one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostVerdict {
    /// `reserve − available`, 0 when the host is not short.
    pub shortfall: u64,
    /// Cap on the chunk cache's budget (`u64::MAX`: none).
    pub cache_cap: u64,
    /// Refuse new sessions: shrinking the cache cannot cover the shortfall.
    pub refuse: bool,
}

/// The host-memory guard's state: the cache cap it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostGuard {
    cap: u64,
    /// The `memory_limit_bytes` last said to be above the host's memory.
    told_over_host: u64,
}

impl Default for HostGuard {
    fn default() -> Self {
        Self { cap: u64::MAX, told_over_host: 0 }
    }
}

impl HostGuard {
    /// Whether to say now that `limit` is above the host's memory (`host_total`, 0 when unknown):
    /// once per limit, at the start or at the reload that set it. The daemon admits what the limit
    /// allows, so such a limit lets sessions reserve memory the host does not have.
    pub fn tell_limit_over_host(&mut self, limit: u64, host_total: u64) -> bool {
        if host_total == 0 || limit <= host_total {
            self.told_over_host = 0;
            return false;
        }
        std::mem::replace(&mut self.told_over_host, limit) != limit
    }

    /// Judges one sample: host `available` memory against `reserve` (0 disables the guard), with
    /// the cache holding `cache_bytes` of which `evictable` no session holds, under `limit`.
    pub fn judge(&mut self, available: u64, reserve: u64, cache_bytes: u64, evictable: u64, limit: u64) -> HostVerdict {
        if reserve == 0 {
            self.cap = u64::MAX;
            return HostVerdict { shortfall: 0, cache_cap: u64::MAX, refuse: false };
        }
        if available < reserve {
            let shortfall = reserve - available;
            self.cap = self.cap.min(cache_bytes).saturating_sub(shortfall);
            return HostVerdict { shortfall, cache_cap: self.cap, refuse: shortfall > evictable };
        }
        if self.cap != u64::MAX {
            let headroom = available - reserve;
            let grown = self.cap.max(cache_bytes).saturating_add(headroom);
            self.cap = if grown >= limit { u64::MAX } else { grown };
        }
        HostVerdict { shortfall: 0, cache_cap: self.cap, refuse: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_limit_above_the_hosts_memory_is_told_once_per_limit() {
        let mut g = HostGuard::default();
        assert!(!g.tell_limit_over_host(8 << 30, 16 << 30));
        assert!(!g.tell_limit_over_host(8 << 30, 0), "host unknown");
        assert!(g.tell_limit_over_host(32 << 30, 16 << 30));
        assert!(!g.tell_limit_over_host(32 << 30, 16 << 30), "told already");
        assert!(g.tell_limit_over_host(64 << 30, 16 << 30), "a reload raised it");
        assert!(!g.tell_limit_over_host(8 << 30, 16 << 30));
        assert!(g.tell_limit_over_host(64 << 30, 16 << 30), "above again");
    }

    #[test]
    fn the_cache_shrinks_before_sessions_are_refused() {
        let mut g = HostGuard::default();
        // Plenty of memory: no cap.
        assert_eq!(
            g.judge(8000 * MIB, 512 * MIB, 300 * MIB, 300 * MIB, 1000 * MIB),
            HostVerdict { shortfall: 0, cache_cap: u64::MAX, refuse: false }
        );
        // 100 MiB short, 300 MiB of evictable cache: the cache gives it up; nothing is refused.
        let v = g.judge(412 * MIB, 512 * MIB, 300 * MIB, 300 * MIB, 1000 * MIB);
        assert_eq!(v, HostVerdict { shortfall: 100 * MIB, cache_cap: 200 * MIB, refuse: false });
        // Still short by 50 after that: the cap follows down.
        let v = g.judge(462 * MIB, 512 * MIB, 200 * MIB, 200 * MIB, 1000 * MIB);
        assert_eq!((v.cache_cap, v.refuse), (150 * MIB, false));
        // Short by more than the cache can give: refuse new sessions.
        let v = g.judge(100 * MIB, 512 * MIB, 150 * MIB, 20 * MIB, 1000 * MIB);
        assert_eq!((v.shortfall, v.cache_cap, v.refuse), (412 * MIB, 0, true));
    }

    #[test]
    fn the_cap_grows_back_by_the_headroom_then_disappears() {
        let mut g = HostGuard::default();
        g.judge(0, 100 * MIB, 50 * MIB, 50 * MIB, 1000 * MIB);
        let v = g.judge(400 * MIB, 100 * MIB, 0, 0, 1000 * MIB);
        assert_eq!(v, HostVerdict { shortfall: 0, cache_cap: 300 * MIB, refuse: false });
        let v = g.judge(900 * MIB, 100 * MIB, 300 * MIB, 300 * MIB, 1000 * MIB);
        assert_eq!(v.cache_cap, u64::MAX, "past the limit the cap is gone");
        // A reserve of 0 disables the guard.
        assert_eq!(g.judge(0, 0, 10, 0, 100).cache_cap, u64::MAX);
    }

    #[test]
    fn sysinfo_reports_this_process_and_the_host() {
        let s = Sampler::new().sample();
        assert!(s.host_total > 0 && s.host_available <= s.host_total, "{s:?}");
        assert!(s.process_resident > 0, "{s:?}");
    }
}
