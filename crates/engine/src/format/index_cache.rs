//! The on-disk index cache.
//!
//! One file per (data file, index options) under `state_dir/index/`, named by a hash of the
//! canonical data path and the options fingerprint. Layout (little-endian):
//!
//! ```text
//! magic  b"MBDINDEX"          8 bytes
//! version u32 = 5
//! path_len u32, path bytes    the canonical data path (guards against hash collisions)
//! opts_len u32, opts bytes    CtfIndexOptions::fingerprint()
//! size u64, mtime_secs i64, mtime_nanos u32,
//! ctime_secs i64, ctime_nanos u32, dev u64, ino u64    of the data file when indexed
//! digest u32                  CRC-32 of the content (FileIndex::digest)
//! count u64
//! columns u8                  which columns the records hold (`Columns::bits`)
//! first_offset u64            the first sequence's offset
//! count × { size u32, [offset u64], [samples u32], [line u64], [key u64] }
//! checksum u64                CRC-64/NVME over everything before it
//! ```
//!
//! A record holds the columns the index keeps ([`crate::format::Sequences`]): a file of one-line
//! sequences without gaps costs 4 bytes a sequence on disk, one that needs every column 32. A file
//! indexed by its chunks alone ([`crate::format::line_chunks`]; its fingerprint names the chunk
//! size) has the columns byte `0x10`, and after `first_offset` its chunk size, their number and
//! each chunk's end and line count (u64 each): 16 bytes a chunk, whatever its lines.
//!
//! A cache is used only if every field matches the data file as it is now ([`FileStamp`]: size,
//! modification and status-change times, device and inode); anything else — another version, a
//! truncated or corrupt file, a file rewritten (even with its mtime restored) or replaced by
//! another of the same size and mtime — makes the caller rebuild. A cache is read only if it is a regular file (not a symbolic link) owned by this
//! process's user and not writable by group or others ([`state_file::open_trusted`]): the checksum
//! guards against damage, not against someone who can recompute it. Writes go through
//! [`state_file::write_replacing_unsynced`] into `state_dir/index/`, a private directory
//! ([`state_file::private_subdir`], `0700`): a temporary file (`0600`, `O_CREAT|O_EXCL`) renamed
//! over the cache, so a reader sees the old cache or the whole new one. It is not fsynced: after a
//! crash of the machine the file may be short or hold other bytes, which its checksum (verified
//! before anything in it is used) turns into a rebuild — and the fsyncs were 15 ms of a
//! 890,000-record file's 100 ms index pass, on the path to its first minibatch.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::index::{Columns, FileIndex, LineChunks, SequenceDesc, Sequences};
use crate::format::line_chunks::fingerprint_suffix;
use crate::hash::Fnv1a;
use crate::state_file;

/// The checksum of a cache file's body: CRC-64/NVME, folded with carry-less multiplies (gigabytes
/// a second; the FNV-1a of earlier versions went a byte at a time, a third of writing the cache
/// of a 4.5 M-line file and as much of loading it).
#[must_use]
pub fn checksum(body: &[u8]) -> u64 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, body)
}

fn checksum_digest() -> crc_fast::Digest {
    crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme)
}

mod stamp;
mod tidy;

pub use stamp::{settle, unix_now_nanos, FileStamp, MAX_SETTLE_WAIT, SETTLED_FINE, SETTLED_SECS};
pub use tidy::remove_orphans;

const MAGIC: &[u8; 8] = b"MBDINDEX";
/// 2: the file's status-change time, device and inode, and the content's digest. 3: records of
/// the columns the index keeps, not of every field. 4: the checksum is CRC-64/NVME. 5: a file of
/// one-line sequences indexed by its chunks alone is stored as them ([`LINE_CHUNKS`]).
pub const VERSION: u32 = 5;
/// The columns byte of an index of chunks alone ([`crate::format::Sequences::of_line_chunks`]).
const LINE_CHUNKS: u8 = 0x10;
/// The largest record: every column.
const RECORD_BYTES: usize = 32;
/// The subdirectory of `state_dir` that holds index caches.
pub const INDEX_DIR: &str = "index";

/// The cache file for `stamp` and `fingerprint` under `state_dir`.
#[must_use]
pub fn cache_path(state_dir: &Path, stamp: &FileStamp, fingerprint: &str) -> PathBuf {
    let mut key = stamp.path.as_os_str().as_encoded_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(fingerprint.as_bytes());
    let name = stamp.path.file_name().map_or(String::new(), |n| state_file::short_name(&n.to_string_lossy(), 48));
    state_dir.join(INDEX_DIR).join(format!("{name}.{:016x}.idx", Fnv1a::of(&key)))
}

/// A writer (or reader) that hashes every byte that passes through it.
struct Hashing<T> {
    inner: T,
    hash: crc_fast::Digest,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Bytes of records [`encode`] gathers before it writes them, and [`decode`] reads at once.
const BLOCK_BYTES: usize = 64 << 10;

/// Writes `block` once it holds [`BLOCK_BYTES`], and empties it.
fn write_when_full(w: &mut impl Write, block: &mut Vec<u8>) -> std::io::Result<()> {
    if block.len() >= BLOCK_BYTES {
        w.write_all(block)?;
        block.clear();
    }
    Ok(())
}

/// Writes the cache file's bytes to `out` a buffer at a time: what the index pass holds in
/// memory is the index, not the index twice.
fn encode(out: &mut dyn Write, stamp: &FileStamp, fingerprint: &str, index: &FileIndex) -> std::io::Result<()> {
    let mut w = Hashing { inner: std::io::BufWriter::with_capacity(1 << 16, out), hash: checksum_digest() };
    let path = stamp.path.as_os_str().as_encoded_bytes();
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    for field in [path, fingerprint.as_bytes()] {
        w.write_all(&u32::try_from(field.len()).unwrap_or(u32::MAX).to_le_bytes())?;
        w.write_all(field)?;
    }
    w.write_all(&stamp.version_bytes())?;
    w.write_all(&index.digest.to_le_bytes())?;
    w.write_all(&(index.sequences.len() as u64).to_le_bytes())?;
    if let Some(lc) = index.sequences.line_chunks() {
        // A file indexed by its chunks alone: their ends and line counts.
        w.write_all(&[LINE_CHUNKS])?;
        for v in [lc.first_offset, lc.chunk_size, lc.chunks.len() as u64] {
            w.write_all(&v.to_le_bytes())?;
        }
        for &(end, lines) in &lc.chunks {
            w.write_all(&end.to_le_bytes())?;
            w.write_all(&lines.to_le_bytes())?;
        }
        let sum = w.hash.finalize();
        w.inner.write_all(&sum.to_le_bytes())?;
        return w.inner.flush();
    }
    let columns = index.sequences.columns();
    w.write_all(&[columns.bits()])?;
    let first = index.sequences.iter().next().map_or(0, |s| s.offset);
    w.write_all(&first.to_le_bytes())?;
    // The records a block at a time: one write (and one call into the hash) per block, not per
    // sequence (a file of millions of short lines spent a seventh of its index pass there).
    let mut block = Vec::with_capacity(BLOCK_BYTES + RECORD_BYTES);
    if columns == Columns::default() {
        // Sizes alone (sequences that follow each other, one sample each, keyed by line: every
        // deepx file and most text): read from their column without making each sequence.
        for size in index.sequences.sizes() {
            block.extend_from_slice(&size.to_le_bytes());
            write_when_full(&mut w, &mut block)?;
        }
    } else {
        encode_records(&mut w, index, columns, &mut block)?;
    }
    w.write_all(&block)?;
    let sum = w.hash.finalize();
    w.inner.write_all(&sum.to_le_bytes())?;
    w.inner.flush()
}

/// The records of every column `columns` names, written a block at a time (the last, partial
/// block is left in `block`).
fn encode_records(w: &mut impl Write, index: &FileIndex, columns: Columns, block: &mut Vec<u8>) -> std::io::Result<()> {
    for s in index.sequences.iter() {
        block.extend_from_slice(&s.size.to_le_bytes());
        if columns.offsets {
            block.extend_from_slice(&s.offset.to_le_bytes());
        }
        if columns.samples {
            block.extend_from_slice(&s.samples.to_le_bytes());
        }
        if columns.lines {
            block.extend_from_slice(&s.line.to_le_bytes());
        }
        if columns.keys {
            block.extend_from_slice(&s.key.to_le_bytes());
        }
        write_when_full(w, block)?;
    }
    Ok(())
}

/// Why a cache was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// No cache file.
    Absent,
    /// A cache exists but does not describe the data file as it is now, or is damaged.
    Stale(&'static str),
}

/// Longest path or fingerprint field read from a cache file (a damaged length must not become
/// an allocation).
const MAX_FIELD_BYTES: usize = 1 << 16;

/// The body of a cache file (everything before the checksum), read a buffer at a time and
/// hashed as it goes.
struct BodyReader<R: Read> {
    r: Hashing<std::io::BufReader<R>>,
    left: u64,
}

const TRUNCATED: Miss = Miss::Stale("truncated");

impl<R: Read> BodyReader<R> {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), Miss> {
        self.left = self.left.checked_sub(buf.len() as u64).ok_or(TRUNCATED)?;
        self.r.read_exact(buf).map_err(|_| TRUNCATED)
    }
    fn u32(&mut self) -> Result<u32, Miss> {
        let mut b = [0u8; 4];
        self.fill(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, Miss> {
        let mut b = [0u8; 8];
        self.fill(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    /// A length-prefixed field.
    fn field(&mut self) -> Result<Vec<u8>, Miss> {
        let n = self.u32()? as usize;
        if n > MAX_FIELD_BYTES {
            return Err(Miss::Stale("malformed"));
        }
        let mut v = vec![0u8; n];
        self.fill(&mut v)?;
        Ok(v)
    }
    /// Hashes what is left of the body, then reads and compares the checksum.
    fn verify(mut self) -> Result<(), Miss> {
        let left = self.left;
        if std::io::copy(&mut (&mut self.r).take(left), &mut std::io::sink()).map_err(|_| TRUNCATED)? != left {
            return Err(TRUNCATED);
        }
        let mut sum = [0u8; 8];
        self.r.inner.read_exact(&mut sum).map_err(|_| TRUNCATED)?;
        if u64::from_le_bytes(sum) == self.r.hash.finalize() {
            Ok(())
        } else {
            Err(Miss::Stale("checksum mismatch"))
        }
    }
}

/// Reads a cache file of `len` bytes from `r` a buffer at a time, checking it against `stamp`
/// and `fingerprint`. The checksum is verified before any other verdict, so a damaged file is
/// always reported as such; the sequences are kept only while everything before them matched.
fn decode(
    r: impl Read,
    len: u64,
    stamp: &FileStamp,
    fingerprint: &str,
    file: &Arc<Path>,
    max_sequences: u64,
) -> Result<FileIndex, Miss> {
    if len < 8 + 8 {
        return Err(TRUNCATED);
    }
    let mut body = BodyReader {
        r: Hashing { inner: std::io::BufReader::with_capacity(1 << 16, r), hash: checksum_digest() },
        left: len - 8,
    };
    // The first problem found; reading goes on to the checksum.
    let mut problem: Option<&'static str> = None;
    let mut magic = [0u8; 8];
    body.fill(&mut magic)?;
    if &magic != MAGIC {
        problem.get_or_insert("not an index cache");
    }
    if body.u32()? != VERSION {
        problem.get_or_insert("other cache version");
    }
    if body.field()? != stamp.path.as_os_str().as_encoded_bytes() {
        problem.get_or_insert("other data file");
    }
    if body.field()? != fingerprint.as_bytes() {
        problem.get_or_insert("other index options");
    }
    let mut version = [0u8; FileStamp::VERSION_BYTES];
    body.fill(&mut version)?;
    let recorded = FileStamp::from_version_bytes(stamp.path.clone(), &version);
    if !recorded.same_version(stamp) {
        problem.get_or_insert("data file changed (size, times, or another file)");
    }
    let digest = body.u32()?;
    let count = body.u64()?;
    if count > max_sequences {
        problem.get_or_insert(TOO_MANY_SEQUENCES);
    }
    let mut sequences = Sequences::default();
    let mut bits = [0u8; 1];
    body.fill(&mut bits)?;
    if bits[0] == LINE_CHUNKS {
        let (first_offset, chunk_size, n) = (body.u64()?, body.u64()?, body.u64()?);
        // Only where the fingerprint asked for chunks of this size: no other reader can use them.
        let asked = fingerprint.ends_with(&fingerprint_suffix(chunk_size));
        if n.checked_mul(16) != Some(body.left) || !asked {
            problem.get_or_insert("malformed");
        }
        let mut lc = LineChunks { chunk_size, first_offset, chunks: Vec::new() };
        for _ in 0..if problem.is_none() { n } else { 0 } {
            lc.chunks.push((body.u64()?, body.u64()?));
        }
        if problem.is_none() && !lc.tile(stamp.size, count) {
            problem.get_or_insert("malformed");
        }
        body.verify()?;
        lc.chunks.shrink_to_fit();
        let sequences = Sequences::of_line_chunks(lc);
        return match problem {
            Some(why) => Err(Miss::Stale(why)),
            None => Ok(FileIndex { path: file.clone(), size: stamp.size, digest, sequences }),
        };
    }
    let columns = Columns::from_bits(bits[0]).unwrap_or_else(|| {
        problem.get_or_insert("malformed");
        Columns::default()
    });
    let first_offset = body.u64()?;
    let record_bytes = columns.record_bytes();
    // The end of the previous sequence: sequences follow each other in the file without overlap
    // (the chunks, the reads and the remote ranges are computed from them).
    let mut end = 0u64;
    if count.checked_mul(record_bytes as u64) == Some(body.left) {
        if problem.is_none() {
            sequences = Sequences::with_capacity(usize::try_from(count).map_err(|_| Miss::Stale("malformed"))?);
        }
        // The records a block at a time: one read (and one call into the checksum, whose
        // set-up is not for 4 bytes) per block.
        let per_block = (BLOCK_BYTES / record_bytes) as u64;
        let mut block = vec![0u8; usize::try_from(count.min(per_block)).unwrap_or(0) * record_bytes];
        let mut i = 0u64;
        while i < count {
            let n = (count - i).min(per_block);
            let bytes = &mut block[..usize::try_from(n).unwrap_or(0) * record_bytes];
            body.fill(bytes)?;
            if problem.is_none() {
                for (j, rec) in (i..).zip(bytes.chunks_exact(record_bytes)) {
                    let pushed = decode_record(rec, columns, j, first_offset, stamp.size, &mut end, &mut sequences);
                    if let Err(why) = pushed {
                        problem.get_or_insert(why);
                        break;
                    }
                }
            }
            i += n;
        }
    } else {
        problem.get_or_insert("malformed");
    }
    body.verify()?;
    // What the dataset keeps is what its budget counts (`Sequences::footprint`).
    sequences.shrink_to_fit();
    match problem {
        Some(why) => Err(Miss::Stale(why)),
        None => Ok(FileIndex { path: file.clone(), size: stamp.size, digest, sequences }),
    }
}

/// Record `i` (`rec`, of the columns `columns`) pushed to `sequences`; `end` is where the
/// previous sequence ended, and becomes where this one does.
fn decode_record(
    rec: &[u8],
    columns: Columns,
    i: u64,
    first_offset: u64,
    file_size: u64,
    end: &mut u64,
    sequences: &mut Sequences,
) -> Result<(), &'static str> {
    let mut at = 0usize;
    let mut take = |n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&rec[at..at + n]);
        at += n;
        u64::from_le_bytes(b)
    };
    let size = u32::try_from(take(4)).unwrap_or(0);
    let offset = if columns.offsets {
        take(8)
    } else if i == 0 {
        first_offset
    } else {
        *end
    };
    let samples = if columns.samples { u32::try_from(take(4)).unwrap_or(0) } else { 1 };
    let line = if columns.lines { take(8) } else { i };
    let key = if columns.keys { take(8) } else { line };
    if samples == 0 || size == 0 || offset < *end || offset.saturating_add(u64::from(size)) > file_size {
        return Err("malformed");
    }
    *end = offset + u64::from(size);
    sequences.push(SequenceDesc { key, offset, line, size, samples });
    Ok(())
}

/// Loads the cached index of `file` if it is valid for `stamp` and `fingerprint`.
///
/// # Errors
/// Why it was not used; the caller rebuilds.
/// A cache of more than `max_sequences` sequences is not read (the index pass then stops at the
/// sequence past the limit, with its place).
pub fn load(
    state_dir: &Path,
    stamp: &FileStamp,
    fingerprint: &str,
    file: &Arc<Path>,
    max_sequences: u64,
) -> Result<FileIndex, Miss> {
    let path = cache_path(state_dir, stamp, fingerprint);
    let f = match state_file::open_trusted(&path) {
        Ok((f, _)) => f,
        Err(e) if state_file::is_untrusted(&e) => {
            return Err(Miss::Stale("not a private file of this user (owner, mode or symbolic link)"));
        }
        Err(_) => return Err(Miss::Absent),
    };
    let len = f.metadata().map_err(|_| Miss::Absent)?.len();
    if too_long(len, stamp, fingerprint, max_sequences) {
        return Err(TOO_MANY);
    }
    // The modification time says when the cache was last used ([`remove_orphans`] keeps the
    // caches of objects used within OBJECT_CACHE_GRACE); best effort.
    let touch = f.try_clone().ok();
    let index = decode(f, len, stamp, fingerprint, file, max_sequences)?;
    if let Some(t) = touch {
        let _ = t.set_modified(std::time::SystemTime::now());
    }
    Ok(index)
}

/// Why a cache of more sequences than the limit is not used.
const TOO_MANY_SEQUENCES: &str = "more sequences than the index may hold within the memory limit";
const TOO_MANY: Miss = Miss::Stale(TOO_MANY_SEQUENCES);

/// Whether a cache file of `len` bytes holds more than `max_sequences` sequences, from its length
/// alone (so that a huge one is not read to find out).
fn too_long(len: u64, stamp: &FileStamp, fingerprint: &str, max_sequences: u64) -> bool {
    len > max_encoded_len(stamp, fingerprint, max_sequences)
}

/// The largest cache file (or shared index) of `max_sequences` sequences for `stamp` and
/// `fingerprint`: what a download of one may hold.
#[must_use]
pub fn max_encoded_len(stamp: &FileStamp, fingerprint: &str, max_sequences: u64) -> u64 {
    // Magic, version, the two fields' lengths, the stamp's version, the digest, the sequence
    // count, the columns, the first offset, the checksum.
    let fixed = (8 + 4 + 4 + 4 + FileStamp::VERSION_BYTES + 4 + 8 + 1 + 8 + 8) as u64;
    (fixed + stamp.path.as_os_str().len() as u64 + fingerprint.len() as u64)
        .saturating_add(max_sequences.saturating_mul(RECORD_BYTES as u64))
}

/// The bytes of a cache file for `index` (what a shared index in object storage holds).
///
/// # Errors
/// None in practice (writes to memory).
pub fn encode_to_vec(stamp: &FileStamp, fingerprint: &str, index: &FileIndex) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    encode(&mut out, stamp, fingerprint, index)?;
    Ok(out)
}

/// The index in `bytes` (a cache file's content) if it is whole and describes `stamp` with
/// `fingerprint`, and holds at most `max_sequences` sequences.
///
/// # Errors
/// Why it cannot be used.
pub fn decode_bytes(
    bytes: &[u8],
    stamp: &FileStamp,
    fingerprint: &str,
    file: &Arc<Path>,
    max_sequences: u64,
) -> Result<FileIndex, Miss> {
    let len = bytes.len() as u64;
    if too_long(len, stamp, fingerprint, max_sequences) {
        return Err(TOO_MANY);
    }
    decode(bytes, len, stamp, fingerprint, file, max_sequences)
}

/// Writes the cache atomically for readers and privately into `state_dir/index/`: temporary file
/// (`0600`), renamed over the cache; not fsynced (the module's documentation says why).
///
/// # Errors
/// I/O errors, or a state directory of another user ([`state_file::private_subdir`]); the caller
/// logs them and goes on without a cache.
pub fn store(state_dir: &Path, stamp: &FileStamp, fingerprint: &str, index: &FileIndex) -> std::io::Result<PathBuf> {
    let path = cache_path(state_dir, stamp, fingerprint);
    state_file::private_subdir(state_dir, INDEX_DIR)?;
    state_file::write_replacing_unsynced(&path, &mut |out| encode(out, stamp, fingerprint, index))?;
    Ok(path)
}

/// What [`remove_orphans`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Cache files removed.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Some were left for another time: the directory was in use (see
    /// [`crate::format::inflate::remove_unused`]).
    pub busy: bool,
}

/// How long the cache of a file or object that no opened dataset reads is kept after its last use
/// (written, or loaded: [`load`] sets its modification time): a day, so that a dataset being
/// opened, one that failed to open for a while, or `minibatchd index` run ahead of a
/// configuration change do not lose theirs.
pub const OBJECT_CACHE_GRACE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Found by a hostile probe: an object of a 900-byte key named its index cache after it, a
    /// file name past 255 bytes that could not be written, so the object was indexed again on
    /// every run. Long names are cut; the hash beside them tells them apart.
    #[test]
    fn a_long_object_key_names_a_cache_file_that_can_be_written() {
        let key = "k".repeat(900);
        let stamp = FileStamp { path: format!("s3://bucket/{key}").into(), size: 1, ..FileStamp::default() };
        let path = cache_path(Path::new("/state"), &stamp, "fp");
        let name = path.file_name().expect("a name").len();
        assert!(name <= 255, "{name} bytes");
        let other = FileStamp { path: format!("s3://bucket/{key}x").into(), size: 1, ..FileStamp::default() };
        assert_ne!(cache_path(Path::new("/state"), &other, "fp"), path);
        let short = FileStamp { path: "/data/train.ctf".into(), ..FileStamp::default() };
        assert!(cache_path(Path::new("/s"), &short, "fp").to_string_lossy().starts_with("/s/index/train.ctf."));
    }

    /// The stored version is little-endian size, mtime, ctime, device, inode, and reads back
    /// as it was (the layout of the index cache and the inflate sidecar, version 2).
    #[test]
    fn a_stamps_version_bytes_read_back_in_their_layout() {
        let stamp = FileStamp {
            path: PathBuf::from("/x"),
            size: 1,
            mtime_secs: -2,
            mtime_nanos: 3,
            ctime_secs: 4,
            ctime_nanos: 5,
            dev: 6,
            ino: u64::MAX,
        };
        let bytes = stamp.version_bytes();
        assert_eq!(bytes[..8], 1u64.to_le_bytes());
        assert_eq!(bytes[8..16], (-2i64).to_le_bytes());
        assert_eq!(bytes[16..20], 3u32.to_le_bytes());
        assert_eq!(bytes[20..28], 4i64.to_le_bytes());
        assert_eq!(bytes[28..32], 5u32.to_le_bytes());
        assert_eq!(bytes[32..40], 6u64.to_le_bytes());
        assert_eq!(bytes[40..], u64::MAX.to_le_bytes());
        assert_eq!(FileStamp::from_version_bytes(PathBuf::from("/x"), &bytes), stamp);
    }

    #[test]
    fn orphans_are_removed_and_the_caches_of_files_in_use_kept() {
        let (dir, data, stamp, index) = setup();
        let state = dir.path().join("state");
        let kept = store(&state, &stamp, "opts", &index).expect("store");
        let other_options = store(&state, &stamp, "other", &index).expect("store");
        let gone_data = dir.path().join("rotated.ctf");
        fs::write(&gone_data, "|a 3\n").expect("write");
        let gone = store(&state, &FileStamp::of(&gone_data).expect("stamp"), "opts", &index).expect("store");
        fs::remove_file(&gone_data).expect("rm");
        let idx = state.join(INDEX_DIR);
        // Not a cache of this version; a crashed writer's temporary file (no such pid); a file of
        // another kind, left alone.
        fs::write(idx.join("junk.idx"), b"not an index").expect("write");
        fs::write(idx.join(".x.idx.4294967.0.tmp"), b"partial").expect("write");
        fs::write(idx.join("notes.txt"), b"keep").expect("write");
        let live_temp = idx.join(format!(".y.idx.{}.0.tmp", std::process::id()));
        fs::write(&live_temp, b"being written").expect("write");
        // Objects: one a dataset reads, one used recently, one neither (its last use two days
        // ago, past the grace).
        let object = |url: &str| {
            let stamp = FileStamp { path: url.into(), size: stamp.size, mtime_secs: 1, ..FileStamp::default() };
            store(&state, &stamp, "opts", &index).expect("store")
        };
        let (read, recent, rotated) =
            (object("s3://bucket/read.ctf"), object("s3://bucket/recent.ctf"), object("s3://bucket/rotated.ctf"));
        let long_ago = std::time::SystemTime::now() - 2 * OBJECT_CACHE_GRACE;
        for p in [&read, &rotated] {
            fs::File::options().write(true).open(p).and_then(|f| f.set_modified(long_ago)).expect("set mtime");
        }
        // Local files that exist: one a dataset reads (with two sets of options, both idle past
        // the grace: kept), one no dataset reads, used recently (kept), one neither (removed).
        for p in [&kept, &other_options] {
            fs::File::options().write(true).open(p).and_then(|f| f.set_modified(long_ago)).expect("set mtime");
        }
        let local = |name: &str| {
            let data = dir.path().join(name);
            fs::write(&data, "|a 3\n").expect("write");
            store(&state, &FileStamp::of(&data).expect("stamp"), "opts", &index).expect("store")
        };
        let (unread_recent, unread_idle) = (local("recent.ctf"), local("idle.ctf"));
        fs::File::options().write(true).open(&unread_idle).and_then(|f| f.set_modified(long_ago)).expect("set mtime");
        let in_use = |p: &Path| p == Path::new("s3://bucket/read.ctf") || p == data;
        let removed = remove_orphans(&state, &in_use);
        assert_eq!(removed.files, 5, "{removed:?}");
        for p in [&kept, &other_options, &live_temp, &idx.join("notes.txt"), &read, &recent, &unread_recent] {
            assert!(p.exists(), "{} removed", p.display());
        }
        for p in [&gone, &idx.join("junk.idx"), &idx.join(".x.idx.4294967.0.tmp"), &rotated, &unread_idle] {
            assert!(!p.exists(), "{} kept", p.display());
        }
        assert_eq!(remove_orphans(&state, &in_use), Removed::default(), "nothing more the second time");
        // Loading a cache marks its use: an object's cache idle past the grace is kept once read.
        fs::File::options().write(true).open(&read).and_then(|f| f.set_modified(long_ago)).expect("set mtime");
        let stamp =
            FileStamp { path: "s3://bucket/read.ctf".into(), size: stamp.size, mtime_secs: 1, ..FileStamp::default() };
        let name: Arc<Path> = Arc::from(Path::new("s3://bucket/read.ctf"));
        load(&state, &stamp, "opts", &name, u64::MAX).expect("the cache loads");
        assert_eq!(remove_orphans(&state, &|p: &Path| p == data), Removed::default(), "a cache just read was removed");
        // The file a dataset reads rewritten: its caches index a version that is gone, whatever
        // their options, and go (found by a probe).
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&data, "|a 1\n|a 2\n|a 3\n").expect("rewrite");
        let fresh = store(&state, &FileStamp::of(&data).expect("stamp"), "new", &index).expect("store");
        let removed = remove_orphans(&state, &|p: &Path| p == data);
        assert_eq!(removed.files, 2, "{removed:?}");
        assert!(!kept.exists() && !other_options.exists() && fresh.exists());
    }

    fn setup() -> (tempfile::TempDir, PathBuf, FileStamp, FileIndex) {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("d.ctf");
        fs::write(&data, "|a 1\n|a 2\n").expect("write");
        let stamp = FileStamp::of(&data).expect("stamp");
        let file: Arc<Path> = Arc::from(data.as_path());
        let index = FileIndex {
            path: file,
            size: stamp.size,
            digest: 0x1234_5678,
            sequences: [
                SequenceDesc { key: 0, offset: 0, line: 0, size: 5, samples: 1 },
                SequenceDesc { key: 1, offset: 5, line: 1, size: 5, samples: 1 },
            ]
            .into_iter()
            .collect(),
        };
        (dir, data, stamp, index)
    }

    #[test]
    fn round_trip() {
        let (dir, _data, stamp, index) = setup();
        store(dir.path(), &stamp, "opts", &index).expect("store");
        assert_eq!(load(dir.path(), &stamp, "opts", &index.path, u64::MAX), Ok(index));
    }

    /// Version 3 keeps the columns the index keeps: every combination reads back as it was, and a
    /// file of contiguous one-sample sequences costs 4 bytes a sequence on disk.
    #[test]
    fn every_combination_of_columns_round_trips_and_contiguous_lines_cost_their_sizes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("d.txt");
        fs::write(&data, vec![b'x'; 10_000]).expect("write");
        let stamp = FileStamp::of(&data).expect("stamp");
        for bits in 0u8..16 {
            let c = Columns::from_bits(bits).expect("four bits");
            let sequences: Sequences = (0..100u64)
                .map(|i| SequenceDesc {
                    offset: 3 + i * (7 + u64::from(c.offsets)),
                    size: 7,
                    samples: if c.samples && i == 50 { 3 } else { 1 },
                    line: if c.lines { 2 * i } else { i },
                    key: if c.keys {
                        1000 + i
                    } else if c.lines {
                        2 * i
                    } else {
                        i
                    },
                })
                .collect();
            assert_eq!(sequences.columns(), c);
            let index = FileIndex { path: Arc::from(data.as_path()), size: stamp.size, digest: 7, sequences };
            let bytes = encode_to_vec(&stamp, "opts", &index).expect("encode");
            let fixed = max_encoded_len(&stamp, "opts", 0);
            assert_eq!(bytes.len() as u64, fixed + 100 * c.record_bytes() as u64, "columns {c:?}");
            assert_eq!(decode_bytes(&bytes, &stamp, "opts", &index.path, u64::MAX), Ok(index), "columns {c:?}");
        }
        assert_eq!(Columns::default().record_bytes(), 4);
        assert_eq!(Columns::from_bits(16), None);
    }

    #[test]
    fn other_options_or_changed_file_are_misses() {
        let (dir, data, stamp, index) = setup();
        store(dir.path(), &stamp, "opts", &index).expect("store");
        assert_eq!(load(dir.path(), &stamp, "other", &index.path, u64::MAX), Err(Miss::Absent));
        fs::write(&data, "|a 1\n|a 2\n|a 3\n").expect("rewrite");
        let changed = FileStamp::of(&data).expect("stamp");
        // The same cache name (path + options), but the size no longer matches.
        assert_eq!(
            load(dir.path(), &changed, "opts", &index.path, u64::MAX),
            Err(Miss::Stale("data file changed (size, times, or another file)"))
        );
    }

    /// Issue 36: a data file replaced by another of the same size and modification time (a new
    /// inode), or rewritten in place with its modification time set back (a new status-change
    /// time), reused the cache of the old one: new bytes cut at the old sequence boundaries.
    #[test]
    fn a_file_replaced_or_rewritten_with_its_size_and_mtime_kept_is_a_miss() {
        let (dir, data, stamp, index) = setup();
        store(dir.path(), &stamp, "opts", &index).expect("store");
        let mtime = fs::metadata(&data).and_then(|m| m.modified()).expect("mtime");
        // Replaced: another file (same size) renamed over it, its mtime set to the old one.
        let other = dir.path().join("other.ctf");
        fs::write(&other, "|a 7\n|a 8\n").expect("write");
        fs::File::options().write(true).open(&other).and_then(|f| f.set_modified(mtime)).expect("set mtime");
        fs::rename(&other, &data).expect("replace");
        let replaced = FileStamp::of(&data).expect("stamp");
        assert_eq!(
            (replaced.size, replaced.mtime_secs, replaced.mtime_nanos),
            (stamp.size, stamp.mtime_secs, stamp.mtime_nanos)
        );
        assert!(!replaced.same_version(&stamp));
        assert_eq!(replaced.change(&stamp), "replaced by another file");
        assert!(matches!(load(dir.path(), &replaced, "opts", &index.path, u64::MAX), Err(Miss::Stale(_))));
        // Rewritten in place, mtime set back: the same inode, a newer ctime.
        store(dir.path(), &replaced, "opts", &index).expect("store");
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&data, "|a 5\n|a 6\n").expect("rewrite");
        fs::File::options().write(true).open(&data).and_then(|f| f.set_modified(mtime)).expect("set mtime");
        let rewritten = FileStamp::of(&data).expect("stamp");
        assert_eq!(
            (rewritten.dev, rewritten.ino, rewritten.mtime_secs),
            (replaced.dev, replaced.ino, replaced.mtime_secs)
        );
        assert!(rewritten.change(&replaced).contains("status-change time"), "{}", rewritten.change(&replaced));
        assert!(matches!(load(dir.path(), &rewritten, "opts", &index.path, u64::MAX), Err(Miss::Stale(_))));
    }

    /// A file indexed by its chunks alone is stored as them and read back the same; chunks that
    /// do not follow each other to the file's end, or whose lines do not add up, are refused
    /// even under a valid checksum, and so is a count over the limit.
    #[test]
    fn an_index_of_chunks_alone_round_trips_and_a_malformed_one_is_refused() {
        use crate::format::index::LineChunks;
        const FP: &str = "opts;line-chunks=5";
        let (dir, _data, stamp, index) = setup();
        // `|a 1\n|a 2\n`: two chunks of a line each.
        let chunks = |chunks: Vec<(u64, u64)>| FileIndex {
            sequences: Sequences::of_line_chunks(LineChunks { chunk_size: 5, first_offset: 0, chunks }),
            ..index.clone()
        };
        let good = chunks(vec![(5, 1), (10, 1)]);
        let path = store(dir.path(), &stamp, FP, &good).expect("store");
        assert!(fs::metadata(&path).expect("meta").len() < 200, "a few bytes a chunk");
        assert_eq!(load(dir.path(), &stamp, FP, &good.path, u64::MAX), Ok(good.clone()));
        assert_eq!(load(dir.path(), &stamp, FP, &good.path, 1), Err(Miss::Stale(TOO_MANY_SEQUENCES)));
        for bad in [vec![(5, 1), (5, 1)], vec![(5, 1), (9, 1)], vec![(5, 0), (10, 2)], vec![(11, 2)]] {
            let bytes = encode_to_vec(&stamp, FP, &chunks(bad.clone())).expect("encode");
            assert_eq!(
                decode_bytes(&bytes, &stamp, FP, &good.path, u64::MAX),
                Err(Miss::Stale("malformed")),
                "{bad:?}"
            );
        }
        // Where no index of chunks of that size was asked for (another reader, another size).
        for other in ["opts", "opts;line-chunks=6"] {
            let bytes = encode_to_vec(&stamp, other, &good).expect("encode");
            assert_eq!(
                decode_bytes(&bytes, &stamp, other, &good.path, u64::MAX),
                Err(Miss::Stale("malformed")),
                "{other}"
            );
        }
        let mut bytes = fs::read(&path).expect("read");
        let at = bytes.len() - 12;
        bytes[at] ^= 1;
        assert_eq!(decode_bytes(&bytes, &stamp, FP, &good.path, u64::MAX), Err(Miss::Stale("checksum mismatch")));
    }

    #[test]
    fn corrupt_cache_is_never_trusted() {
        let (dir, _data, stamp, index) = setup();
        let path = store(dir.path(), &stamp, "opts", &index).expect("store");
        let mut bytes = fs::read(&path).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        fs::write(&path, &bytes).expect("write");
        assert_eq!(load(dir.path(), &stamp, "opts", &index.path, u64::MAX), Err(Miss::Stale("checksum mismatch")));
        fs::write(&path, &bytes[..10]).expect("truncate");
        assert!(matches!(load(dir.path(), &stamp, "opts", &index.path, u64::MAX), Err(Miss::Stale(_))));
    }

    /// A cache whose checksum holds (anyone who can write it can recompute it) but whose
    /// sequences go backwards or overlap is refused: the chunks computed from it ended before they
    /// started (a wrapped length, a capacity-overflow panic), or read the same bytes twice. So is
    /// one of more sequences than the limit, to the sequence (the size estimate alone let one more
    /// through, and the next file's budget wrapped around).
    #[test]
    fn a_cache_of_sequences_out_of_order_or_over_the_limit_is_refused() {
        let (dir, _data, stamp, index) = setup();
        let mut reversed: Vec<SequenceDesc> = index.sequences.iter().collect();
        reversed.reverse();
        let swapped = FileIndex { sequences: reversed.into_iter().collect(), ..index.clone() };
        let bytes = encode_to_vec(&stamp, "opts", &swapped).expect("encode");
        assert_eq!(decode_bytes(&bytes, &stamp, "opts", &index.path, u64::MAX), Err(Miss::Stale("malformed")));
        let mut seqs: Vec<SequenceDesc> = index.sequences.iter().collect();
        seqs[1].offset = 4;
        let overlapping = FileIndex { sequences: seqs.into_iter().collect(), ..index.clone() };
        let bytes = encode_to_vec(&stamp, "opts", &overlapping).expect("encode");
        assert_eq!(decode_bytes(&bytes, &stamp, "opts", &index.path, u64::MAX), Err(Miss::Stale("malformed")));
        let bytes = encode_to_vec(&stamp, "opts", &index).expect("encode");
        assert_eq!(decode_bytes(&bytes, &stamp, "opts", &index.path, 2), Ok(index.clone()));
        assert_eq!(
            decode_bytes(&bytes, &stamp, "opts", &index.path, 1),
            Err(Miss::Stale("more sequences than the index may hold within the memory limit"))
        );
        store(dir.path(), &stamp, "opts", &index).expect("store");
        assert!(load(dir.path(), &stamp, "opts", &index.path, 1).is_err());
    }

    /// Issue #15: under `UMask=0007` the index directory and its files were group-writable, so a
    /// group member could rewrite a cache (recomputing its checksum).
    #[test]
    fn a_cache_others_could_write_is_never_trusted() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (dir, _data, stamp, index) = setup();
        let idx_dir = dir.path().join(INDEX_DIR);
        fs::create_dir(&idx_dir).expect("mkdir");
        fs::set_permissions(&idx_dir, fs::Permissions::from_mode(0o770)).expect("chmod");
        let path = store(dir.path(), &stamp, "opts", &index).expect("store");
        let mode = |p: &Path| fs::symlink_metadata(p).expect("stat").mode() & 0o7777;
        assert_eq!((mode(&idx_dir), mode(&path)), (0o700, 0o600));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o660)).expect("chmod");
        assert!(
            matches!(load(dir.path(), &stamp, "opts", &index.path, u64::MAX), Err(Miss::Stale(why)) if why.contains("private"))
        );
        // A link to a valid cache is not followed either.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        let real = path.with_extension("real");
        fs::rename(&path, &real).expect("mv");
        std::os::unix::fs::symlink(&real, &path).expect("symlink");
        assert!(matches!(load(dir.path(), &stamp, "opts", &index.path, u64::MAX), Err(Miss::Stale(_))));
        // Storing again replaces the link with a private file.
        store(dir.path(), &stamp, "opts", &index).expect("store");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(load(dir.path(), &stamp, "opts", &index.path, u64::MAX), Ok(index));
    }
}
