//! Durable file writes: temporary file → fsync → rename → fsync of the directory, so readers see
//! either the old content or the new, never a torn file, even across a crash. Used for index
//! caches and daemon checkpoints.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes` atomically and durably.
///
/// # Errors
/// Any I/O error; on error the previous content of `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("state.json");
        write_atomic(&p, b"one").expect("first");
        write_atomic(&p, b"two").expect("second");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}
