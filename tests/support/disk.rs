//! A small file system that can be filled up: a tmpfs mounted for one test (the suite runs as
//! root, as CI does), to make the daemon's writes fail with `ENOSPC` for real.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A tmpfs of `size` (a `mount -o size=` value) mounted at a directory, unmounted on drop.
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    /// Mounts a tmpfs of 1 MiB at `at` (created if missing).
    pub fn mount(at: &Path) -> Self {
        Self::mount_sized(at, "1m")
    }

    /// Mounts a tmpfs of `size` at `at` (created if missing).
    pub fn mount_sized(at: &Path, size: &str) -> Self {
        assert_eq!(rustix::process::geteuid().as_raw(), 0, "this test mounts a small tmpfs: run the suite as root");
        std::fs::create_dir_all(at).expect("mount point");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(at)
            .status()
            .expect("run mount")
            .success();
        assert!(ok, "mount a tmpfs at {}", at.display());
        Self(at.to_owned())
    }

    /// Fills what is left with a file; returns its path (remove it to free the space).
    pub fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
