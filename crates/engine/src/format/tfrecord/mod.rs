//! TensorFlow's TFRecord files, read as TensorFlow's `TFRecordReader` reads them: each record is
//! a little-endian `u64` length, the masked CRC-32C of those eight bytes, the data, and the masked
//! CRC-32C of the data. Every record is a sequence of one sample whose key is its 0-based record
//! number (the `line` of error locations counts records from 1) and whose bytes are the whole
//! frame, so CNTK's chunk rule cuts between records.
//!
//! * The index pass reads each record's header and footer ([`fn@scan`]): it checks every length's
//!   CRC (a damaged length would send every later record astray) and a file that ends inside a
//!   frame, naming the byte offset of the frame; both are fatal, as TensorFlow refuses such a
//!   file. From a local file it skips the data of records larger than a page; a stream is read
//!   through. The headers and footers — each record's length and its data's CRC-32C — feed the
//!   digest every format's index carries (the dataset's identity, which resumes check).
//! * A large local file is indexed in parts on every parser thread: each part starts where a
//!   record seems to start (a length whose CRC matches, and the next few after it), and the guess
//!   is proven when the part before ends exactly there; a part that does not, or fails, makes the
//!   one-thread pass run. The index is the same bytes either way.
//! * The data's CRC is checked when the record is decoded ([`frame_data`]): a mismatch is a
//!   malformed record, charged to `max_errors` with the file, record and offset (TensorFlow
//!   fails the read there).
//! * A GZIP TFRecord file (TensorFlow's `compression_type="GZIP"`) is decompressed once into
//!   `state_dir` and read from the copy, as the deepx formats' `.gz` inputs are
//!   ([`crate::format::inflate`]); so is a ZLIB file, which the dataset names (`compression =
//!   "zlib"`).
//!
//! The records' payload is decoded by a record decoder: [`example`] for `tf.train.Example`.

pub mod example;
mod scan;
mod wire;

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::format::errors::{DataError, ErrorKind, Locate, Location, Malformed};
use crate::format::index::FileIndex;
use crate::format::parts;
use crate::options::IndexLimits;
use scan::{scan, FileAt, Scanned, Through};

/// Bytes before a record's data: its length and the length's masked CRC.
pub const HEADER_BYTES: usize = 12;
/// Bytes after a record's data: the data's masked CRC.
pub const FOOTER_BYTES: usize = 4;

/// The index cache key of TFRecord files.
#[must_use]
pub fn fingerprint() -> String {
    // v2: the digest is of the records' headers and footers (v1: of every byte).
    "tfrecord;v2".to_owned()
}

/// TensorFlow's masked CRC-32C (Castagnoli) of `data`: the CRC rotated right by 15 bits plus
/// `0xa282ead8`.
#[must_use]
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// CRC-32C (Castagnoli, reflected, as iSCSI and TensorFlow compute it).
#[must_use]
pub fn crc32c(data: &[u8]) -> u32 {
    if data.len() <= SHORT_CRC_BYTES {
        if let Some(crc) = minibatchd_sys::crc32c::crc32c_hw(data) {
            return crc;
        }
    }
    // The iSCSI algorithm is CRC-32C; its 32-bit value is the u64's low half.
    #[allow(clippy::cast_possible_truncation)]
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32;
    crc
}

/// Inputs up to this long go through the CPU's `crc32` instruction one word at a time
/// ([`minibatchd_sys::crc32c::crc32c_hw`]): `crc_fast`'s folding set-up and final reduction
/// cost more than such a record's bytes (a tenth of the decode of records of 64 floats).
const SHORT_CRC_BYTES: usize = 1024;

/// Reads and indexes `data` (named `path` in errors and in the result), within `limits`;
/// `progress` gets the bytes read so far.
///
/// # Errors
/// I/O errors, a damaged length, a file that ends inside a record, a gzip file, a record larger
/// than `limits.max_sequence_bytes`, and more records than the limits allow — each naming the
/// file, the record and its byte offset.
pub fn index_file(
    data: &Path,
    path: Arc<Path>,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let file = minibatchd_sys::files::open_regular(data).map_err(|e| DataError::io(&path, e))?;
    let size = file.metadata().map_err(|e| DataError::io(&path, e))?.len();
    if let Some(index) = index_in_parts(&file, &path, size, limits, threads, progress)? {
        return Ok(index);
    }
    let scanned = scan(&mut FileAt::new(&file, 0, None), &path, 0, limits, progress)?;
    Ok(into_index(scanned, path, size))
}

/// Headers that must follow a candidate cut, where the window holds them, for it to be taken.
const CUT_CHAIN: usize = 4;

/// The first place at or after `at` (within [`parts::MAX_CUT_WALK`]) where a record seems to
/// start: a length whose CRC matches, followed by [`CUT_CHAIN`] more such headers (or the end of
/// the file) — a guess, which the pass in parts proves: the part before must end exactly there.
fn next_frame(file: &std::fs::File, at: u64, size: u64, largest: u64) -> std::io::Result<Option<u64>> {
    let window = parts::read_window(file, at, parts::MAX_CUT_WALK + HEADER_BYTES)?;
    let valid = |p: usize| -> Option<u64> {
        let head = window.get(p..p + HEADER_BYTES)?;
        let len_bytes: [u8; 8] = head[..8].try_into().ok()?;
        let frame = u64::from_le_bytes(len_bytes).checked_add((HEADER_BYTES + FOOTER_BYTES) as u64)?;
        let crc = u32::from_le_bytes(head[8..12].try_into().ok()?);
        (masked_crc32c(&len_bytes) == crc && frame <= largest && at + p as u64 + frame <= size).then_some(frame)
    };
    'candidates: for p in 0..window.len().saturating_sub(HEADER_BYTES) {
        let Some(mut frame) = valid(p) else { continue };
        let mut q = p;
        for _ in 0..CUT_CHAIN {
            q += usize::try_from(frame).unwrap_or(usize::MAX);
            if at + q as u64 == size || q + HEADER_BYTES > window.len() {
                break;
            }
            match valid(q) {
                Some(f) => frame = f,
                None => continue 'candidates,
            }
        }
        return Ok(Some(at + p as u64));
    }
    Ok(None)
}

/// [`index_file`]'s pass in parts on `threads` threads: each part from a guessed record start
/// ([`next_frame`]) to the next, read on its own thread; the guess is proven when the part before
/// ends exactly on it. `None` when the file is too small for parts, no guess was found, or a part
/// failed or did not end on its successor's start (the one-thread pass then runs, and reports
/// any error as it always does).
///
/// # Errors
/// I/O errors finding the cuts, and a limit the merged index exceeds.
fn index_in_parts(
    file: &std::fs::File,
    path: &Arc<Path>,
    size: u64,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<Option<FileIndex>, DataError> {
    let n = parts::parts_for(size, threads);
    if n < 2 {
        return Ok(None);
    }
    let largest = limits.largest_sequence();
    let cuts = parts::cuts_where(file, size, n, |f, at| next_frame(f, at, size, largest))
        .map_err(|e| DataError::io(path, e))?;
    if cuts.is_empty() {
        return Ok(None);
    }
    let share = parts::part_limits(limits, cuts.len() + 1);
    let starts: Vec<u64> = std::iter::once(0).chain(cuts.iter().copied()).collect();
    let ends: Vec<Option<u64>> = cuts.iter().copied().map(Some).chain(std::iter::once(None)).collect();
    let done: Vec<std::sync::atomic::AtomicU64> = starts.iter().map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
    let run = |i: usize, report: &mut dyn FnMut(u64)| {
        let mut source = FileAt::new(file, starts[i], ends[i]);
        scan(&mut source, path, starts[i], share, &mut |b| {
            done[i].store(b, std::sync::atomic::Ordering::Relaxed);
            report(b);
        })
        .ok()
        .filter(|s| ends[i].is_none_or(|end| s.end == end))
    };
    let scanned: Vec<Option<Scanned>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..starts.len()).map(|i| scope.spawn(move || run(i, &mut |_| {}))).collect();
        let total = || done.iter().map(|d| d.load(std::sync::atomic::Ordering::Relaxed)).sum::<u64>();
        let mut all = vec![run(0, &mut |_| progress(total()))];
        all.extend(handles.into_iter().map(|h| h.join().ok().flatten()));
        progress(total());
        all
    });
    let Some(scanned) = scanned.into_iter().collect::<Option<Vec<Scanned>>>() else { return Ok(None) };
    let mut crc = crc32fast::Hasher::new();
    for s in &scanned {
        // Each part's digest is of its records' headers and footers.
        let digested = s.records * (HEADER_BYTES + FOOTER_BYTES) as u64;
        crc.combine(&crc32fast::Hasher::new_with_initial_len(s.crc, digested));
    }
    let end = scanned.last().map_or(0, |s| s.end);
    let found = scanned.into_iter().map(|s| (s.sequences, s.records)).collect();
    let sequences = parts::merge(found, true, &limits, path)?;
    Ok(Some(FileIndex { path: path.clone(), size: size.max(end), digest: crc.finalize(), sequences }))
}

/// [`index_file`] of the `size` bytes `reader` yields.
///
/// # Errors
/// As [`index_file`].
pub fn index_reader(
    reader: impl Read,
    path: Arc<Path>,
    size: u64,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let scanned = scan(&mut Through::new(reader, 0), &path, 0, limits, progress)?;
    Ok(into_index(scanned, path, size))
}

/// The index of a whole file, `size` bytes as its metadata said, from its one scan.
fn into_index(scanned: Scanned, path: Arc<Path>, size: u64) -> FileIndex {
    let mut sequences = scanned.sequences;
    sequences.shrink_to_fit();
    FileIndex { path, size: size.max(scanned.end), digest: scanned.crc, sequences }
}

/// The data length and whole frame size of the record whose header is `head` (record `record`,
/// 0-based), or what is wrong with it.
fn frame_of(head: &[u8], record: u64, limits: IndexLimits) -> Result<(u64, u64), String> {
    let len_bytes: [u8; 8] = head[..8].try_into().unwrap_or_default();
    let len = u64::from_le_bytes(len_bytes);
    let want = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default());
    if masked_crc32c(&len_bytes) != want {
        if record == 0 && head.starts_with(&crate::format::inflate::GZIP_MAGIC) {
            return Err("the file holds a gzip stream inside: a GZIP TFRecord file is one gzip stream from its \
                        first byte (TensorFlow's compression_type=\"GZIP\")"
                .into());
        }
        return Err(format!(
            "corrupted record {}: the CRC of its length does not match (a damaged or misaligned TFRecord file)",
            record + 1
        ));
    }
    let frame = len.saturating_add((HEADER_BYTES + FOOTER_BYTES) as u64);
    let largest = limits.largest_sequence();
    if frame > largest {
        return Err(format!(
            "record {} of {len} bytes exceeds the largest allowed, {largest} bytes ({})",
            record + 1,
            crate::options::largest_sequence_why()
        ));
    }
    Ok((len, frame))
}

/// The data of the record whose whole frame is `frame` (as the index found it), its CRC checked;
/// a mismatch (or a frame whose length is not the one indexed) is a malformed record at `at`.
///
/// # Errors
/// The malformed record.
pub fn frame_data<'a>(frame: &'a [u8], at: &impl Locate) -> Result<&'a [u8], Malformed> {
    let bad = |message: String| Malformed { kind: ErrorKind::BadRecord, at: at.location(), message };
    if frame.len() < HEADER_BYTES + FOOTER_BYTES {
        return Err(bad(format!("a record frame of {} bytes is shorter than a header and a footer", frame.len())));
    }
    let len = u64::from_le_bytes(frame[..8].try_into().unwrap_or_default());
    let data = &frame[HEADER_BYTES..frame.len() - FOOTER_BYTES];
    if len != data.len() as u64 {
        return Err(bad(format!(
            "the record's length is {len}, not the {} bytes indexed (the file changed?)",
            data.len()
        )));
    }
    let want = u32::from_le_bytes(frame[frame.len() - FOOTER_BYTES..].try_into().unwrap_or_default());
    if masked_crc32c(data) != want {
        // At the data's offset, as TensorFlow names it ("corrupted record at N").
        let record = at.location();
        let message = format!(
            "corrupted record {}: the CRC of its {} bytes of data (from this offset) does not match",
            record.line,
            data.len()
        );
        let at = Location { offset: record.offset + HEADER_BYTES as u64, ..record };
        return Err(Malformed { kind: ErrorKind::BadRecord, at, message });
    }
    Ok(data)
}

/// Whether `head` (a file's first bytes) starts with a TFRecord header whose length CRC holds:
/// such a file is a plain TFRecord file even when its first two bytes happen to be gzip's magic
/// (a first record of 35,615 bytes, or any length with those low bytes), which gzip data almost
/// never is (the CRC holds by chance once in 2^32).
#[must_use]
pub fn starts_with_frame(head: &[u8]) -> bool {
    let (Some(len), Some(crc)) = (head.get(..8), head.get(8..12)) else { return false };
    crc.try_into().is_ok_and(|c: [u8; 4]| u32::from_le_bytes(c) == masked_crc32c(len))
}

/// A TFRecord frame around `data` (for tests and tools that write records).
#[must_use]
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + HEADER_BYTES + FOOTER_BYTES);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::index::SequenceDesc;

    fn index(bytes: &[u8]) -> Result<FileIndex, DataError> {
        index_reader(bytes, Arc::from(Path::new("t.tfrecord")), bytes.len() as u64, IndexLimits::UNBOUNDED, &mut |_| {})
    }

    #[test]
    fn the_masked_crc_is_tensorflows() {
        // CRC-32C check value (RFC 3720's "123456789").
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        // The frame TensorFlow writes for the record "abc" (tf.io.TFRecordWriter).
        let f = frame(b"abc");
        assert_eq!(&f[..8], &3u64.to_le_bytes());
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }

    #[test]
    fn records_are_sequences_of_their_whole_frames() {
        let mut bytes = frame(b"abc");
        bytes.extend(frame(b""));
        bytes.extend(frame(&[7u8; 1000]));
        let idx = index(&bytes).expect("index");
        let seqs: Vec<_> = idx.sequences.iter().map(|s| (s.key, s.offset, s.size)).collect();
        assert_eq!(seqs, vec![(0, 0, 19), (1, 19, 16), (2, 35, 1016)]);
        // The digest is of the headers and footers, in order.
        let framing: Vec<u8> = [(0usize, 19usize), (19, 16), (35, 1016)]
            .iter()
            .flat_map(|&(at, size)| bytes[at..at + 12].iter().chain(&bytes[at + size - 4..at + size]).copied())
            .collect();
        assert_eq!(idx.digest, crc32fast::hash(&framing));
        let at = Location { file: Arc::from(Path::new("t")), line: 1, offset: 0 };
        assert_eq!(frame_data(&bytes[..19], &at).expect("data"), b"abc");
    }

    #[test]
    fn damaged_and_truncated_files_are_errors_naming_the_record_and_offset() {
        let mut bytes = frame(b"abc");
        bytes.extend(frame(b"defg"));
        let mut flipped = bytes.clone();
        flipped[19 + 2] ^= 1; // the second record's length
        let e = index(&flipped).expect_err("a damaged length").to_string();
        assert!(e.contains("t.tfrecord:2: byte offset 19") && e.contains("corrupted record 2"), "{e}");
        let cut = &bytes[..bytes.len() - 2];
        let e = index(cut).expect_err("a cut tail").to_string();
        assert!(e.contains("t.tfrecord:2: byte offset 19") && e.contains("ends inside record 2"), "{e}");
        assert!(e.contains("4 bytes of data declared, all of them there, but 2 of the footer's 4 bytes"), "{e}");
        let e = index(&bytes[..bytes.len() - 6]).expect_err("a cut record").to_string();
        assert!(e.contains("4 bytes of data declared, 2 of them missing, and the 4-byte footer"), "{e}");
        let e = index(&bytes[..25]).expect_err("a cut header").to_string();
        assert!(e.contains("ends inside record 2's header"), "{e}");
        // A flipped data byte passes the index and fails the record's decode.
        let mut data_flip = bytes.clone();
        data_flip[12] ^= 0x40;
        let idx = index(&data_flip).expect("index: data CRCs are checked on decode");
        let at = Location { file: Arc::from(Path::new("t")), line: 1, offset: 0 };
        let s = idx.sequences.get(0);
        let m = frame_data(&data_flip[..s.size as usize], &at).expect_err("bad data CRC");
        assert!(m.message.contains("corrupted record 1"), "{m}");
    }

    /// The digest (the dataset's identity) tells valid records of other content apart — at the
    /// same lengths, by their data's CRC-32C in the footers —, and it is the same for data
    /// damaged under a stale footer, which the record's decode refuses instead.
    #[test]
    fn the_digest_tells_other_content_apart() {
        let a: Vec<u8> = [frame(b"abc"), frame(b"defg")].concat();
        let b: Vec<u8> = [frame(b"abd"), frame(b"defg")].concat();
        assert_eq!(a.len(), b.len());
        assert_ne!(index(&a).expect("a").digest, index(&b).expect("b").digest);
        let mut damaged = a.clone();
        damaged[13] ^= 1;
        assert_eq!(index(&damaged).expect("damaged").digest, index(&a).expect("a").digest);
        let at = Location { file: Arc::from(Path::new("t")), line: 1, offset: 0 };
        assert!(frame_data(&damaged[..19], &at).is_err(), "the decode refuses it");
    }

    #[test]
    fn a_gzip_file_is_named_as_such() {
        let mut bytes = vec![0x1f, 0x8b, 8, 0];
        bytes.extend([0u8; 20]);
        let e = index(&bytes).expect_err("gzip").to_string();
        assert!(e.contains("a gzip stream inside"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..proptest::prelude::ProptestConfig::default() })]

        /// No file makes the index pass panic; what it indexes are whole frames that pass their
        /// length's CRC, end to end.
        #[test]
        fn hostile_files_never_panic(
            records in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 0..6),
            flip in proptest::option::of((0usize..400, 0u8..8)),
            cut in proptest::option::of(0usize..400),
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..30),
        ) {
            let mut bytes: Vec<u8> = records.iter().flat_map(|r| frame(r)).collect();
            if let Some((at, bit)) = flip {
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= 1 << bit;
                }
            }
            if let Some(cut) = cut {
                bytes.truncate(cut);
            }
            bytes.extend(noise);
            if let Ok(idx) = index(&bytes) {
                let mut next = 0;
                for s in idx.sequences.iter() {
                    proptest::prop_assert_eq!(s.offset, next);
                    next += u64::from(s.size);
                }
                proptest::prop_assert_eq!(next, bytes.len() as u64);
            }
        }
    }

    /// `bytes` written to a file, indexed on `threads` threads, as a comparable value.
    fn index_on(bytes: &[u8], threads: usize) -> Result<(Vec<SequenceDesc>, u32, u64), String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.tfrecord");
        std::fs::write(&p, bytes).expect("write");
        let mut last = 0;
        let idx = index_file(&p, Arc::from(Path::new("t")), IndexLimits::UNBOUNDED, threads, &mut |b| last = b)
            .map_err(|e| e.to_string())?;
        assert_eq!(last, bytes.len() as u64, "progress ends at the file's size");
        Ok((idx.sequences.iter().collect(), idx.digest, idx.size))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..proptest::prelude::ProptestConfig::default() })]

        /// A file indexed in parts gives the one-thread index, or its error — also when records
        /// hold whole records in their data (headers a cut could take for a record's start) and
        /// when the file is damaged.
        #[test]
        fn an_index_in_parts_is_the_one_thread_index(
            records in proptest::collection::vec((proptest::collection::vec(proptest::prelude::any::<u8>(), 0..60), 0u8..4), 1..40),
            flip in proptest::option::of((0usize..3000, 0u8..8)),
            cut in proptest::option::of(0usize..3000),
            threads in 2usize..6,
        ) {
            let mut bytes = Vec::new();
            for (data, nest) in &records {
                // Some records hold framed records: false starts for the cuts.
                let mut payload = data.clone();
                for _ in 0..*nest {
                    payload = frame(&payload);
                }
                bytes.extend(frame(&payload));
            }
            if let Some((at, bit)) = flip {
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= 1 << bit;
                }
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.max(1));
            }
            proptest::prop_assert_eq!(index_on(&bytes, 1), index_on(&bytes, threads));
            proptest::prop_assert_eq!(index_on(&bytes, 1), index_stream(&bytes));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..proptest::prelude::ProptestConfig::default() })]

        /// Records larger than a page, whose data a local file's pass skips (reading each footer
        /// and the next header at their offsets), give the index of a pass that reads every
        /// byte — or its error, with the same record, offset and count of missing bytes — also
        /// with a damaged length or a tail cut anywhere.
        #[test]
        fn skipping_the_data_of_large_records_gives_the_index_of_reading_them(
            sizes in proptest::collection::vec(proptest::sample::select(vec![0usize, 3, 4090, 5000, 70_000, 300_000]), 1..8),
            flip in proptest::option::of((0usize..700_000, 0u8..8)),
            cut in proptest::option::of(0usize..700_000),
            threads in 1usize..4,
        ) {
            let mut bytes: Vec<u8> = Vec::new();
            for (i, size) in sizes.iter().enumerate() {
                bytes.extend(frame(&vec![u8::try_from(i % 251).unwrap_or(0); *size]));
            }
            if let Some((at, bit)) = flip {
                let at = at % bytes.len();
                bytes[at] ^= 1 << bit;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.max(1));
            }
            proptest::prop_assert_eq!(index_on(&bytes, threads), index_stream(&bytes));
        }
    }

    /// The bytes this thread has read through system calls so far (Linux's per-thread I/O
    /// accounting).
    fn bytes_read_by_this_thread() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").expect("/proc/thread-self/io");
        io.lines().find_map(|l| l.strip_prefix("rchar: ")).and_then(|v| v.trim().parse().ok()).expect("rchar")
    }

    /// A local file's pass reads the headers and footers, not the data: 16 records of 1 MiB are
    /// indexed reading a few pages each (a pass that read every byte would read all 16 MiB).
    #[test]
    fn a_local_files_pass_skips_the_data_of_large_records() {
        let record = vec![5u8; 1 << 20];
        let bytes: Vec<u8> = (0..16).flat_map(|_| frame(&record)).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.tfrecord");
        std::fs::write(&p, &bytes).expect("write");
        let before = bytes_read_by_this_thread();
        let idx = index_file(&p, Arc::from(Path::new("t")), IndexLimits::UNBOUNDED, 1, &mut |_| {}).expect("index");
        let read = bytes_read_by_this_thread() - before;
        assert_eq!(idx.sequences.len(), 16);
        assert!(read < 1 << 20, "{read} bytes read for {} bytes of file", bytes.len());
    }

    /// A reader that gives at most a few bytes a call, as a network stream may.
    struct Dribble<'a>(&'a [u8], usize);

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.1 = self.1 % 7 + 1;
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..proptest::prelude::ProptestConfig::default() })]

        /// A stream that comes a few bytes at a time gives the index of one read whole.
        #[test]
        fn a_stream_in_small_pieces_gives_the_same_index(
            sizes in proptest::collection::vec(0usize..600, 1..30),
            cut in proptest::option::of(0usize..10_000),
        ) {
            let mut bytes: Vec<u8> = sizes.iter().flat_map(|n| frame(&vec![7u8; *n])).collect();
            if let Some(cut) = cut {
                bytes.truncate(cut);
            }
            let name: Arc<Path> = Arc::from(Path::new("t"));
            let whole = index_reader(&bytes[..], name.clone(), bytes.len() as u64, IndexLimits::UNBOUNDED, &mut |_| {})
                .map_err(|e| e.to_string());
            let pieces = index_reader(Dribble(&bytes, 0), name, bytes.len() as u64, IndexLimits::UNBOUNDED, &mut |_| {})
                .map_err(|e| e.to_string());
            proptest::prop_assert_eq!(whole, pieces);
        }
    }

    /// [`index_stream`]'s index of `bytes`, as [`index_on`] gives it.
    fn index_stream(bytes: &[u8]) -> Result<(Vec<SequenceDesc>, u32, u64), String> {
        let name: Arc<Path> = Arc::from(Path::new("t"));
        let idx = index_reader(bytes, name, bytes.len() as u64, IndexLimits::UNBOUNDED, &mut |_| {})
            .map_err(|e| e.to_string())?;
        Ok((idx.sequences.iter().collect(), idx.digest, idx.size))
    }

    /// The pass in parts runs on a clean file (it is not the one-thread pass under another name).
    #[test]
    fn a_clean_file_is_indexed_in_parts() {
        let bytes: Vec<u8> = (0..200u32).flat_map(|i| frame(&i.to_le_bytes().repeat(3))).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.tfrecord");
        std::fs::write(&p, &bytes).expect("write");
        let file = std::fs::File::open(&p).expect("open");
        let name: Arc<Path> = Arc::from(Path::new("t"));
        let parts = index_in_parts(&file, &name, bytes.len() as u64, IndexLimits::UNBOUNDED, 4, &mut |_| {})
            .expect("no error")
            .expect("indexed in parts");
        let one =
            index_reader(&bytes[..], name, bytes.len() as u64, IndexLimits::UNBOUNDED, &mut |_| {}).expect("index");
        assert_eq!(parts, one);
    }

    #[test]
    fn an_empty_file_has_no_record() {
        assert!(index(b"").expect("empty").sequences.is_empty());
    }
}
