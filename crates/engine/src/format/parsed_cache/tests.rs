use std::os::unix::fs::PermissionsExt as _;

use super::entry::{HEADER_BYTES, MAP_AT_LEAST, WRITE_PIECE};
use super::*;
use crate::format::chunk::{Indices, StreamData, StreamKind, StreamValues, Values};
use std::io::Write;

fn specs() -> Vec<StreamSpec> {
    vec![
        StreamSpec { name: "x".into(), kind: StreamKind::Dense, dim: 3 },
        StreamSpec { name: "s".into(), kind: StreamKind::SparseI32, dim: 10 },
        StreamSpec { name: "id".into(), kind: StreamKind::SparseU64, dim: 0 },
        StreamSpec { name: "u".into(), kind: StreamKind::Strings, dim: 0 },
        StreamSpec { name: "id32".into(), kind: StreamKind::SparseU64, dim: 0 },
    ]
}

/// Two sequences (2 and 1 samples) in every kind of stream, in f32 (deepx ids both as `u64` and
/// kept in 32 bits).
fn chunk(n: usize) -> ParsedChunk {
    ParsedChunk {
        chunk: n,
        num_sequences: 2,
        malformed: Vec::new(),
        streams: vec![
            StreamData::new(
                vec![0, 2, 3],
                StreamValues::Dense {
                    dim: 3,
                    values: Values::F32(vec![1.0, -2.5, 3.25, 4.0, 5.0, 6.0, f32::MIN_POSITIVE, -0.0, 1e30].into()),
                },
            ),
            StreamData::new(
                vec![0, 2, 3],
                StreamValues::Sparse {
                    sample_offsets: vec![0, 2, 2, 3],
                    indices: Indices::I32(vec![9, 0, 4].into()),
                    values: Values::F32(vec![0.5, 0.25, 7.0].into()),
                },
            ),
            StreamData::new(
                vec![0, 1, 3],
                StreamValues::Sparse {
                    sample_offsets: vec![0, 1, 1, 2],
                    indices: Indices::U64(vec![u64::MAX, 12].into()),
                    values: Values::F32(vec![1.0, 2.0].into()),
                },
            ),
            StreamData::new(
                vec![0, 2, 3],
                StreamValues::Strings { offsets: vec![0, 3, 3, 8], bytes: b"abcdefgh".to_vec() },
            ),
            StreamData::new(
                vec![0, 2, 3],
                StreamValues::Sparse {
                    sample_offsets: vec![0, 1, 3, 3],
                    indices: Indices::U32(vec![u32::MAX, 0, 5].into()),
                    values: Values::F32(vec![1.0, 2.0, 3.0].into()),
                },
            ),
        ],
    }
}

const ID: u64 = 0x1234_5678_9abc_def0;

fn open(dir: &Path, limit: u64) -> ParsedCache {
    ParsedCache::open(dir, limit).expect("open")
}

fn get(c: &ParsedCache, chunk: usize) -> Option<ParsedChunk> {
    c.get(ID, chunk, 2, &specs(), Precision::Float32)
}

#[test]
fn round_trip_is_bit_identical_for_every_kind_of_stream() {
    let d = tempfile::tempdir().expect("tmp");
    let c = open(&d.path().join("parsed"), 1 << 20);
    assert_eq!(get(&c, 7), None);
    c.put(ID, &chunk(7));
    let back = get(&c, 7).expect("hit");
    assert_eq!(back, chunk(7));
    // -0.0 == 0.0 for PartialEq: compare the bits too.
    let bits = |p: &ParsedChunk| match &p.streams[0].data {
        StreamValues::Dense { values: Values::F32(v), .. } => v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        _ => unreachable!(),
    };
    assert_eq!(bits(&back), bits(&chunk(7)));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.writes, s.entries), (1, 1, 1, 1));
    assert_eq!(s.bytes, encoded_len(&chunk(7)));
    let mode = std::fs::metadata(c.dir()).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn float64_round_trips_and_is_not_served_as_float32() {
    let d = tempfile::tempdir().expect("tmp");
    let c = open(d.path(), 1 << 20);
    let mut x = chunk(1);
    x.streams.truncate(1);
    x.streams[0].data =
        StreamValues::Dense { dim: 3, values: Values::F64((0..9).map(|i| f64::from(i) / 3.0).collect()) };
    c.put(ID, &x);
    let spec = &specs()[..1];
    assert_eq!(c.get(ID, 1, 2, spec, Precision::Float64), Some(x.clone()));
    assert_eq!(c.get(ID, 1, 2, spec, Precision::Float32), None);
}

#[test]
fn another_identity_chunk_shape_or_stream_is_a_miss() {
    let d = tempfile::tempdir().expect("tmp");
    let c = open(d.path(), 1 << 20);
    let mut wrong_dim = specs();
    wrong_dim[0].dim = 4;
    let mut wrong_kind = specs();
    wrong_kind[2].kind = StreamKind::SparseI32;
    // 32-bit deepx ids asked for as CTF indices (below a dimension they all are below).
    let mut narrow_as_ctf = specs();
    narrow_as_ctf[4] = StreamSpec { name: "id32".into(), kind: StreamKind::SparseI32, dim: usize::MAX };
    let mut ctf_as_ids = specs();
    ctf_as_ids[1].kind = StreamKind::SparseU64;
    let mut small_bound = specs();
    small_bound[1].dim = 9; // index 9 is no longer below the dimension
    for (id, n, seqs, s) in [
        (ID + 1, 3, 2, specs()),
        (ID, 4, 2, specs()),
        (ID, 3, 3, specs()),
        (ID, 3, 2, wrong_dim),
        (ID, 3, 2, wrong_kind),
        (ID, 3, 2, narrow_as_ctf),
        (ID, 3, 2, ctf_as_ids),
        (ID, 3, 2, small_bound),
        (ID, 3, 2, specs()[..3].to_vec()),
    ] {
        c.put(ID, &chunk(3));
        assert_eq!(c.get(id, n, seqs, &s, Precision::Float32), None, "{id:x} {n} {seqs} {s:?}");
    }
    c.put(ID, &chunk(3));
    assert_eq!(get(&c, 3), Some(chunk(3)));
}

#[test]
fn every_corrupted_byte_and_every_truncation_is_refused_and_removed() {
    let d = tempfile::tempdir().expect("tmp");
    let c = open(d.path(), 1 << 20);
    c.put(ID, &chunk(0));
    let path = d.path().join(ParsedCache::name(ID, 0));
    let good = std::fs::read(&path).expect("read");
    for i in 0..good.len() {
        for flip in [0x01u8, 0x80] {
            let mut bad = good.clone();
            bad[i] ^= flip;
            std::fs::write(&path, &bad).expect("write");
            assert_eq!(get(&c, 0), None, "byte {i} ^ {flip:#x} was served");
            assert!(!path.exists(), "byte {i}: the unusable entry was kept");
        }
    }
    for len in 0..good.len() {
        std::fs::write(&path, &good[..len]).expect("write");
        assert_eq!(get(&c, 0), None, "truncated to {len} bytes was served");
    }
    let mut longer = good.clone();
    longer.push(0);
    std::fs::write(&path, &longer).expect("write");
    assert_eq!(get(&c, 0), None);
    std::fs::write(&path, &good).expect("write");
    assert_eq!(get(&c, 0), Some(chunk(0)));
    assert!(c.stats().rejected >= 2 * good.len() as u64);
    // An entry larger than the cache's bound was never written by it: refused before its header
    // can size anything (the same bytes are served by a cache whose bound holds them).
    let small = open(d.path(), good.len() as u64 - 1);
    std::fs::write(&path, &good).expect("write after the small cache opened");
    assert_eq!(get(&small, 0), None);
    assert!(!path.exists(), "the oversized entry was kept");
}

#[test]
fn an_entry_others_could_write_or_a_link_is_never_read() {
    let d = tempfile::tempdir().expect("tmp");
    let c = open(d.path(), 1 << 20);
    c.put(ID, &chunk(0));
    let path = d.path().join(ParsedCache::name(ID, 0));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).expect("chmod");
    assert_eq!(get(&c, 0), None);
    c.put(ID, &chunk(0));
    let elsewhere = d.path().join("elsewhere.bin");
    std::fs::rename(&path, &elsewhere).expect("mv");
    std::os::unix::fs::symlink(&elsewhere, &path).expect("ln");
    assert_eq!(get(&c, 0), None);
}

#[test]
fn the_directory_stays_within_its_bound_least_recently_used_out() {
    let d = tempfile::tempdir().expect("tmp");
    let one = encoded_len(&chunk(0));
    let c = open(d.path(), 3 * one);
    for n in 0..3 {
        c.put(ID, &chunk(n));
    }
    assert!(get(&c, 0).is_some()); // 0 is now the most recent: 1 goes first
    c.put(ID, &chunk(3));
    assert_eq!(get(&c, 1), None);
    for n in [0, 2, 3] {
        assert!(get(&c, n).is_some(), "chunk {n}");
    }
    let on_disk: u64 =
        std::fs::read_dir(d.path()).expect("ls").map(|e| e.expect("entry").metadata().expect("stat").len()).sum();
    assert!(on_disk <= 3 * one, "{on_disk} bytes on disk, bound {}", 3 * one);
    assert_eq!(c.stats().evictions, 1);

    // A restart with a smaller bound counts what is there and evicts down to it; a larger entry
    // than the bound is not written at all.
    drop(c);
    std::fs::write(d.path().join(".x.mbp.999999999.0.tmp"), b"left by a crashed writer").expect("write");
    let c = open(d.path(), one);
    assert_eq!(c.stats().entries, 1);
    assert!(!d.path().join(".x.mbp.999999999.0.tmp").exists());
    let small = open(&d.path().join("small"), one - 1);
    small.put(ID, &chunk(0));
    assert_eq!(small.stats().entries, 0);
}

/// Writes from several threads at once stay within the bound together (found by a probe: `index
/// --parsed` passed it by about an entry, each writer making room for its own entry alone).
#[test]
fn writes_at_once_stay_within_the_bound_together() {
    let d = tempfile::tempdir().expect("tmp");
    let one = encoded_len(&chunk(0));
    let c = open(d.path(), 3 * one + one / 2);
    let most = std::sync::atomic::AtomicU64::new(0);
    let together = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (c, most, together) = (&c, &most, &together);
            s.spawn(move || {
                for n in 0..50 {
                    together.wait();
                    c.put(ID, &chunk(t * 50 + n));
                    most.fetch_max(c.stats().bytes, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let most = most.into_inner();
    assert!(most <= c.limit(), "{most} bytes in entries at once, bound {}", c.limit());
    let on_disk: u64 =
        std::fs::read_dir(d.path()).expect("ls").map(|e| e.expect("entry").metadata().expect("stat").len()).sum();
    assert!(on_disk <= c.limit(), "{on_disk} bytes on disk, bound {}", c.limit());
    assert!(c.stats().bytes <= c.limit() && c.stats().entries >= 1, "{:?}", c.stats());
}

/// Records the length of every `write` it is handed.
struct Writes {
    bytes: Vec<u8>,
    sizes: Vec<usize>,
}

impl Write for Writes {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sizes.push(buf.len());
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn columns_larger_than_a_write_piece_go_out_a_piece_at_a_time_and_read_back_whole() {
    // A dense column of 3.5 pieces (and an odd tail), beside the small streams.
    let mut big = chunk(3);
    let n = (WRITE_PIECE * 7 / 2 + 12) / 4 / 3 * 3;
    let samples = n / 3;
    #[allow(clippy::cast_precision_loss)] // small integers, exact in f32
    let values: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 - 500.0).collect();
    big.num_sequences = 2;
    big.streams[0] =
        StreamData::new(vec![0, 1, samples], StreamValues::Dense { dim: 3, values: Values::F32(values.into()) });
    let mut out = Writes { bytes: Vec::new(), sizes: Vec::new() };
    encode(&mut out, ID, &big).expect("encode");
    assert_eq!(out.bytes.len() as u64, encoded_len(&big));
    let (last, whole) = out.sizes.split_last().expect("writes");
    assert!(whole.iter().all(|&s| s == WRITE_PIECE), "every write but the last is one whole piece: {:?}", out.sizes);
    assert!(*last <= WRITE_PIECE && !whole.is_empty(), "{:?}", out.sizes);
    // And the entry reads back whole through the cache.
    let d = tempfile::tempdir().expect("tmp");
    let c = open(&d.path().join("parsed"), 1 << 30);
    c.put(ID, &big);
    assert_eq!(get(&c, 3), Some(big));
}

/// A chunk of `n` float64 samples in a dense stream and a sparse one whose 32-bit ids come in an
/// odd number, so that the float64 values after them are not 8-byte aligned in the entry.
fn large_f64_chunk(n: usize) -> (ParsedChunk, Vec<StreamSpec>) {
    #[allow(clippy::cast_precision_loss)] // small integers, exact
    let dense: Vec<f64> = (0..n * 2).map(|i| i as f64 * 0.5 - 7.0).collect();
    let entries = n | 1;
    #[allow(clippy::cast_possible_truncation)] // small
    let ids: Vec<u32> = (0..entries).map(|i| (i * 7919) as u32).collect();
    #[allow(clippy::cast_precision_loss)]
    let sparse: Vec<f64> = (0..entries).map(|i| -(i as f64)).collect();
    let mut sample_offsets: Vec<usize> = (0..=n).collect();
    *sample_offsets.last_mut().expect("n > 0") = entries;
    let chunk = ParsedChunk {
        chunk: 5,
        num_sequences: 2,
        malformed: Vec::new(),
        streams: vec![
            StreamData::new(vec![0, 1, n], StreamValues::Dense { dim: 2, values: Values::F64(dense.into()) }),
            StreamData::new(
                vec![0, 1, n],
                StreamValues::Sparse {
                    sample_offsets,
                    indices: Indices::U32(ids.into()),
                    values: Values::F64(sparse.into()),
                },
            ),
        ],
    };
    let specs = vec![
        StreamSpec { name: "x".into(), kind: StreamKind::Dense, dim: 2 },
        StreamSpec { name: "id".into(), kind: StreamKind::SparseU64, dim: 0 },
    ];
    (chunk, specs)
}

/// The "opened with mmap and gathered from directly": a large entry's columns are the
/// mapped file's bytes (those aligned for their type; a misaligned one is copied), equal bit for
/// bit to what was written, and stay readable after the entry is evicted from disk.
#[test]
fn a_large_entry_is_served_from_its_mapping_and_outlives_its_eviction() {
    let (big, specs) = large_f64_chunk(200_001);
    let d = tempfile::tempdir().expect("tmp");
    let dir = d.path().join("parsed");
    let c = open(&dir, 1 << 30);
    c.put(ID, &big);
    assert!(encoded_len(&big) >= MAP_AT_LEAST);
    let back = c.get(ID, 5, 2, &specs, Precision::Float64).expect("hit");
    assert_eq!(back, big);
    assert_eq!((c.stats().hits, c.stats().mapped), (1, 1));
    let StreamValues::Dense { values: Values::F64(dense), .. } = &back.streams[0].data else { panic!("dense f64") };
    assert!(dense.is_mapped(), "the dense column is read from the mapping");
    let StreamValues::Sparse { indices: Indices::U32(ids), values: Values::F64(sparse), .. } = &back.streams[1].data
    else {
        panic!("sparse")
    };
    assert!(ids.is_mapped());
    assert!(!sparse.is_mapped(), "after an odd number of 32-bit ids the float64 values are misaligned: copied");
    // The chunk counts what it holds: its whole mapping (the checksum read every page in, and
    // offsets share huge pages with the columns) and the copies made from it.
    let map = dense.mapping().expect("mapped");
    let copies = back.streams.iter().map(StreamData::size_bytes).sum::<usize>();
    assert!(copies >= sparse.len() * 8, "the misaligned values are counted as copies");
    assert_eq!(back.size_bytes(), copies + map.len() + std::mem::size_of::<ParsedChunk>());
    if let Some(resident) = map.resident_bytes() {
        assert!(resident <= map.len().next_multiple_of(4096), "{resident} B resident of a {} B mapping", map.len());
    }
    // The entry removed from disk (an eviction) and another written under its name: the chunk
    // already served keeps its values.
    std::fs::remove_file(dir.join(entry_name(ID, 5))).expect("evict");
    let (other, _) = large_f64_chunk(200_003);
    c.put(ID, &ParsedChunk { chunk: 5, ..other });
    assert_eq!(back, big);
    // Small entries are read, not mapped.
    c.put(ID, &chunk(7));
    let small = get(&c, 7).expect("hit");
    assert_eq!((c.stats().hits, c.stats().mapped), (2, 1), "a small entry is a hit, not mapped");
    let StreamValues::Dense { values: Values::F32(v), .. } = &small.streams[0].data else { panic!("dense f32") };
    assert!(!v.is_mapped());
}

/// Issue 36, finding 4: an entry truncated while mapped killed the whole daemon (`SIGBUS`), and
/// one overwritten in place was served wrong. Another process's truncation or write now waits
/// until the chunk's mapping is the process's own memory: the chunk served keeps its values, and
/// the entry, changed on disk, is refused at its next read and parsed again.
#[test]
fn an_entry_truncated_or_overwritten_while_mapped_changes_nothing_served_and_is_refused_after() {
    let (big, specs) = large_f64_chunk(200_001);
    let d = tempfile::tempdir().expect("tmp");
    let dir = d.path().join("parsed");
    let c = open(&dir, 1 << 30);
    let path = dir.join(entry_name(ID, 5));
    for cmd in [
        "truncate -s 4096 \"$1\"",
        "head -c 65536 /dev/urandom | dd of=\"$1\" bs=4096 seek=16 conv=notrunc 2>/dev/null",
    ] {
        c.put(ID, &big);
        let back = c.get(ID, 5, 2, &specs, Precision::Float64).expect("hit");
        let StreamValues::Dense { values: Values::F64(dense), .. } = &back.streams[0].data else { panic!("dense") };
        let map = dense.mapping().expect("mapped").clone();
        assert!(map.is_file_backed());
        let start = std::time::Instant::now();
        // Coreutils' `truncate` opens non-blocking: refused until the lease is released.
        while !std::process::Command::new("sh")
            .args(["-c", cmd, "sh"])
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("sh")
            .success()
        {
            assert!(start.elapsed() < std::time::Duration::from_secs(30), "{cmd} never went through");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!map.is_file_backed(), "{cmd}: the mapping was moved into memory first");
        assert_eq!(back, big, "{cmd}: the chunk served is unchanged");
        let rejected = c.stats().rejected;
        assert!(c.get(ID, 5, 2, &specs, Precision::Float64).is_none(), "{cmd}: the changed entry is not served");
        assert_eq!(c.stats().rejected, rejected + 1);
        assert!(!path.exists(), "{cmd}: and removed");
    }
}

/// Flips a bit of the first dense value of `path` in place (same length, same inode: only the
/// checksum can tell) and sets its modification time an hour back, so that the change shows in
/// the file's times whatever the clock's grain.
fn corrupt_in_place(path: &Path) {
    use std::os::unix::fs::FileExt as _;
    let mut bytes = std::fs::read(path).expect("read");
    // The header, the first stream's six words and its three sequence offsets.
    let at = usize::try_from(HEADER_BYTES).expect("small") + 6 * 8 + 3 * 8 + 1;
    bytes[at] ^= 0x40;
    let f = std::fs::OpenOptions::new().write(true).open(path).expect("open for writing");
    f.write_all_at(&bytes, 0).expect("write");
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    f.set_modified(hour_ago).expect("set mtime");
}

#[test]
fn a_settled_entry_is_checksummed_once_and_again_once_it_changes() {
    let d = tempfile::tempdir().expect("tmp");
    let mut c = open(&d.path().join("parsed"), 1 << 20);
    // Every version has settled by this clock.
    c.clock = || i64::MAX / 2;
    c.put(ID, &chunk(3));
    assert_eq!(get(&c, 3), Some(chunk(3)));
    assert_eq!(get(&c, 3), Some(chunk(3)));
    assert_eq!(get(&c, 3), Some(chunk(3)));
    let s = c.stats();
    assert_eq!((s.hits, s.checksums, s.rejected), (3, 1, 0), "{s:?}");
    // A write in place is a new version: checked again, refused, parsed again.
    corrupt_in_place(&d.path().join("parsed").join(ParsedCache::name(ID, 3)));
    assert_eq!(get(&c, 3), None);
    let s = c.stats();
    assert_eq!((s.checksums, s.rejected), (2, 1), "{s:?}");
    // Written again (a replacement): checked at its first read.
    c.put(ID, &chunk(3));
    assert_eq!(get(&c, 3), Some(chunk(3)));
    assert_eq!(c.stats().checksums, 3);
}

#[test]
fn an_entry_changed_within_the_last_seconds_is_checksummed_at_every_read() {
    let d = tempfile::tempdir().expect("tmp");
    let c = open(&d.path().join("parsed"), 1 << 20);
    c.put(ID, &chunk(4));
    for _ in 0..3 {
        assert_eq!(get(&c, 4), Some(chunk(4)));
    }
    assert_eq!(c.stats().checksums, 3, "a version younger than STABLE_SECS is not trusted unchecked");
}

#[test]
fn a_version_settles_two_seconds_after_its_last_change() {
    let v = FileVersion { dev: 1, ino: 2, len: 3, mtime: (100, 0), ctime: (105, 999) };
    assert!(!v.settled_by(106));
    assert!(v.settled_by(107));
}

#[test]
fn the_entries_of_a_replaced_identity_are_removed_and_no_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = open(dir.path(), 1 << 30);
    let other = ID ^ 1;
    for n in 0..3 {
        c.put(ID, &chunk(n));
        c.put(other, &chunk(n));
    }
    let before = c.stats();
    assert_eq!(c.forget_identity(ID), 3);
    assert!(get(&c, 0).is_none(), "gone");
    assert!(c.get(other, 1, 2, &specs(), Precision::Float32).is_some(), "another identity's entry stays");
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 3, "its files removed");
    assert!(c.stats().bytes < before.bytes, "{:?} then {:?}", before, c.stats());
    assert_eq!(c.forget_identity(ID), 0);
    // A write that lands after the version was forgotten (its session still held the chunk) is
    // not kept, until a version with that identity opens again.
    c.put(ID, &chunk(0));
    assert!(get(&c, 0).is_none(), "a forgotten version's late write is not kept");
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 3, "nor left on disk");
    assert_eq!(c.stats().writes, before.writes, "nor counted as written");
    c.revive(ID);
    c.put(ID, &chunk(0));
    assert!(get(&c, 0).is_some(), "written again once revived");
}

/// Found by a probe: a parsed cache pointed at a directory of other files (by mistake) removed
/// `.x.tmp`, `foo.mbp` and `1234-5.mbp` there. Only names the cache makes are its own: entries
/// (`{identity:016x}-{chunk}.mbp`) and temporary files of dead writers.
#[test]
fn a_shared_directory_keeps_every_file_the_cache_did_not_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let foreign = [".x.tmp", "foo.mbp", "1234-5.mbp", "DEADBEEFDEADBEEF-0.mbp", "notes.txt", ".hidden"];
    for name in foreign {
        std::fs::write(dir.path().join(name), b"not the cache's").expect("write");
    }
    let one = encoded_len(&chunk(0));
    let c = open(dir.path(), one);
    for n in 0..3 {
        c.put(ID, &chunk(n));
    }
    assert_eq!(c.stats().entries, 1, "evicted down to its bound");
    assert_eq!(c.forget_identity(ID), 1);
    drop(c);
    let c = open(dir.path(), 0);
    assert_eq!(c.stats().entries, 0);
    for name in foreign {
        assert!(dir.path().join(name).exists(), "{name} was removed");
    }
}
