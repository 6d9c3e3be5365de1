//! An entry of the parsed cache as bytes: its encoding ([`encode`]: header,
//! payload per stream, trailer — the layout in the parent module's documentation) and its
//! decoding ([`decode`]: every header field, length and offset checked before an array is
//! used, the checksum where the caller asks for it), mapping the arrays in place where the
//! kernel's page cache allows.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::Arc;

use minibatchd_sys::{as_bytes, as_bytes_mut, Column, FileMapping, Pod};

use super::{FileVersion, ParsedCache};
use crate::format::chunk::{Indices, ParsedChunk, StreamData, StreamKind, StreamSpec, StreamValues, Values};
use crate::options::Precision;

pub(super) const MAGIC: &[u8; 8] = b"MBDPARSD";
const END: &[u8; 4] = b"END1";
const VERSION: u32 = 1;
/// The layout word: native little-endian with 64-bit `usize` (the only layout written or read).
const LAYOUT_LE64: u32 = 1;
pub(super) const HEADER_BYTES: u64 = 8 + 4 + 4 + 8 * 5;
pub(super) const TRAILER_BYTES: u64 = 8;

const TAG_DENSE: u64 = 1;
const TAG_SPARSE: u64 = 2;
const TAG_STRINGS: u64 = 3;
const F64_BIT: u64 = 1 << 8;
const U64_INDICES_BIT: u64 = 1 << 9;
/// deepx feature ids stored in 32 bits ([`Indices::U32`]).
const U32_INDICES_BIT: u64 = 1 << 10;

/// The checksum an entry's trailer carries over its header and payload (CRC-32/ISO-HDLC), for
/// tools that build entries byte by byte (the fuzz target).
#[must_use]
pub fn checksum(header_and_payload: &[u8]) -> u32 {
    crc32fast::hash(header_and_payload)
}

/// The file name of chunk `chunk`'s entry for dataset identity `identity`.
#[must_use]
pub fn entry_name(identity: u64, chunk: usize) -> String {
    ParsedCache::name(identity, chunk)
}

pub(super) fn encoded_len(chunk: &ParsedChunk) -> u64 {
    let mut n = HEADER_BYTES + TRAILER_BYTES;
    for s in &chunk.streams {
        n += 48 + 8 * s.seq_offsets.len() as u64;
        n += match &s.data {
            StreamValues::Dense { values, .. } => values.size_bytes() as u64,
            StreamValues::Sparse { sample_offsets, indices, values } => {
                8 * sample_offsets.len() as u64 + indices.size_bytes() as u64 + values.size_bytes() as u64
            }
            StreamValues::Strings { offsets, bytes } => {
                8 * offsets.len() as u64 + (bytes.len() as u64).next_multiple_of(8)
            }
        };
    }
    n
}

/// Each `write` of an entry hands the file exactly this many bytes (the last one less), at offsets
/// that are multiples of it: the page cache then holds the entry in 2 MiB folios, and a mapping of
/// the entry ([`FileMapping`]) is backed by huge pages (`FilePmdMapped` in `smaps`), so the
/// gather's random reads from a mapped chunk miss the TLB as rarely as from a parsed one. With
/// smaller or unaligned writes the folios are smaller and a mapped sweep is slower. (On a VM whose
/// balloon reports free memory to its host, the larger folios cost the writer some system time;
/// `scripts/bench/write_sizes.py` measures it, and `docs/benchmarks.md` has the figures of both.)
pub(super) const WRITE_PIECE: usize = 2 << 20;

/// A writer that hands `inner` whole pieces of [`WRITE_PIECE`] bytes, and what is left at the end.
struct Pieces<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> Pieces<W> {
    fn new(inner: W) -> Self {
        Self { inner, buf: Vec::with_capacity(WRITE_PIECE) }
    }

    fn put(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = (WRITE_PIECE - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() == WRITE_PIECE {
                self.inner.write_all(&self.buf)?;
                self.buf.clear();
            }
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        self.inner.write_all(&self.buf)?;
        self.inner.flush()
    }
}

/// A writer that checksums what passes through it.
struct Crc<W: Write> {
    inner: Pieces<W>,
    crc: crc32fast::Hasher,
}

impl<W: Write> Crc<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.inner.put(bytes)
    }

    fn u64s(&mut self, v: &[u64]) -> io::Result<()> {
        self.put(as_bytes(v))
    }
}

pub(super) fn values_tag(v: &Values) -> u64 {
    match v {
        Values::F32(_) => 0,
        Values::F64(_) => F64_BIT,
    }
}

pub(super) fn values_bytes(v: &Values) -> &[u8] {
    match v {
        Values::F32(x) => as_bytes(x),
        Values::F64(x) => as_bytes(x),
    }
}

pub(super) fn encode(out: &mut dyn Write, identity: u64, chunk: &ParsedChunk) -> io::Result<()> {
    let mut w = Crc { inner: Pieces::new(out), crc: crc32fast::Hasher::new() };
    let payload = encoded_len(chunk) - HEADER_BYTES - TRAILER_BYTES;
    w.put(MAGIC)?;
    w.put(&VERSION.to_ne_bytes())?;
    w.put(&LAYOUT_LE64.to_ne_bytes())?;
    w.u64s(&[identity, chunk.chunk as u64, chunk.num_sequences as u64, chunk.streams.len() as u64, payload])?;
    for s in &chunk.streams {
        let n_seq = s.seq_offsets.len() as u64;
        match &s.data {
            StreamValues::Dense { dim, values } => {
                w.u64s(&[TAG_DENSE | values_tag(values), *dim as u64, n_seq, values.len() as u64, 0, 0])?;
                w.put(as_bytes(&s.seq_offsets))?;
                w.put(values_bytes(values))?;
            }
            StreamValues::Sparse { sample_offsets, indices, values } => {
                let (it, ilen, ibytes) = match indices {
                    Indices::I32(x) => (0, x.len(), as_bytes(x)),
                    Indices::U32(x) => (U32_INDICES_BIT, x.len(), as_bytes(x)),
                    Indices::U64(x) => (U64_INDICES_BIT, x.len(), as_bytes(x)),
                };
                w.u64s(&[
                    TAG_SPARSE | values_tag(values) | it,
                    0,
                    n_seq,
                    sample_offsets.len() as u64,
                    ilen as u64,
                    values.len() as u64,
                ])?;
                w.put(as_bytes(&s.seq_offsets))?;
                w.put(as_bytes(sample_offsets))?;
                w.put(ibytes)?;
                w.put(values_bytes(values))?;
            }
            StreamValues::Strings { offsets, bytes } => {
                w.u64s(&[TAG_STRINGS, 0, n_seq, offsets.len() as u64, bytes.len() as u64, 0])?;
                w.put(as_bytes(&s.seq_offsets))?;
                w.put(as_bytes(offsets))?;
                w.put(bytes)?;
                let pad = bytes.len().next_multiple_of(8) - bytes.len();
                w.put(&[0u8; 8][..pad])?;
            }
        }
    }
    let crc = w.crc.finalize();
    w.inner.put(&crc.to_ne_bytes())?;
    w.inner.put(END)?;
    w.inner.finish()
}

/// What the caller asks for: an entry must match all of it.
pub(super) struct Expect<'a> {
    pub(super) identity: u64,
    pub(super) chunk: usize,
    pub(super) num_sequences: usize,
    pub(super) streams: &'a [StreamSpec],
    pub(super) precision: Precision,
}

/// Entries this large and up are mapped (their columns read straight from the page cache);
/// smaller ones are read into memory, so that a cache of many small chunks does not hold a
/// mapping each.
pub(super) const MAP_AT_LEAST: u64 = 1 << 20;

/// An entry's bytes: a mapping of its file, or (small entries, or when mapping fails) a copy.
enum Bytes {
    Mapped(Arc<FileMapping>),
    Read(Vec<u8>),
}

impl Bytes {
    /// The entry's `len` bytes, and the version of its file once they are loaded (mapped
    /// under the lease, which holds writers off from then on, or read); a mapping advised huge
    /// pages as `huge` says.
    fn load(mut file: File, len: u64, huge: &minibatchd_sys::HugePages) -> Option<(Self, FileVersion)> {
        let size = usize::try_from(len).ok()?;
        if len >= MAP_AT_LEAST {
            match file.try_clone().and_then(|f| FileMapping::map(f, size, huge)) {
                Ok(map) => return Some((Self::Mapped(map), FileVersion::of(&file.metadata().ok()?))),
                // No lease (a file system without leases, the entry open for writing elsewhere),
                // too many mappings (`vm.max_map_count`) or no address space: read it instead.
                Err(e) => tracing::debug!(error = %e, "a persisted parsed chunk could not be mapped; read instead"),
            }
        }
        let mut v = Vec::with_capacity(size);
        (&mut file).take(len).read_to_end(&mut v).ok()?;
        (v.len() == size).then_some((Self::Read(v), FileVersion::of(&file.metadata().ok()?)))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m.bytes(),
            Self::Read(v) => v,
        }
    }
}

/// A cursor over an entry's payload that never reads past it.
struct Src<'a> {
    bytes: &'a Bytes,
    at: usize,
    end: usize,
    /// Whether copies are advised huge pages.
    huge: bool,
}

impl Src<'_> {
    /// The next `n` bytes.
    fn take(&mut self, n: u64) -> Option<std::ops::Range<usize>> {
        let n = usize::try_from(n).ok()?;
        let end = self.at.checked_add(n).filter(|&e| e <= self.end)?;
        let r = self.at..end;
        self.at = end;
        Some(r)
    }

    fn byte_len<T>(len: u64) -> Option<u64> {
        len.checked_mul(std::mem::size_of::<T>() as u64)
    }

    /// `len` values of `T`, copied (offsets, which the entry's checks read anyway).
    fn array<T: Pod>(&mut self, len: u64) -> Option<Vec<T>> {
        let r = self.take(Self::byte_len::<T>(len)?)?;
        minibatchd_sys::copy_from_bytes(&self.bytes.as_slice()[r], self.huge)
    }

    /// `len` values of `T`: the mapped bytes themselves when the entry is mapped and they are
    /// aligned for `T` (an odd number of 4-byte values before 8-byte ones is not), else a copy.
    fn column<T: Pod>(&mut self, len: u64) -> Option<Column<T>> {
        let r = self.take(Self::byte_len::<T>(len)?)?;
        if let Bytes::Mapped(map) = self.bytes {
            if let Some(c) = Column::mapped(map, r.start, usize::try_from(len).ok()?) {
                return Some(c);
            }
        }
        minibatchd_sys::copy_from_bytes(&self.bytes.as_slice()[r], self.huge).map(Column::from)
    }

    fn u64s<const N: usize>(&mut self) -> Option<[u64; N]> {
        let r = self.take(8 * N as u64)?;
        let mut v = [0u64; N];
        as_bytes_mut(&mut v).copy_from_slice(&self.bytes.as_slice()[r]);
        Some(v)
    }

    fn values(&mut self, f64: bool, len: u64) -> Option<Values> {
        Some(if f64 { Values::F64(self.column(len)?) } else { Values::F32(self.column(len)?) })
    }
}

/// Offsets that start at 0, never decrease and end at `end`.
pub(super) fn offsets_ok(o: &[usize], end: usize) -> bool {
    o.first() == Some(&0) && o.last() == Some(&end) && o.windows(2).all(|w| w[0] <= w[1])
}

/// The entry's chunk, the version of its file its bytes were loaded as, and whether its checksum
/// was checked: not when `checked_before` says that version's was ([`super::LruEntry::checked`]; asked
/// once, after the bytes are loaded, so that a write before the load is a new version). The
/// header and the arrays' structure are checked either way. The mapping and the columns copied
/// out of the entry are advised huge pages as `huge` says.
pub(super) fn decode(
    file: File,
    len: u64,
    want: &Expect<'_>,
    checked_before: &dyn Fn(&FileVersion) -> bool,
    huge: &minibatchd_sys::HugePages,
) -> Option<(ParsedChunk, FileVersion, bool)> {
    if !cfg!(all(target_endian = "little", target_pointer_width = "64")) {
        return None;
    }
    let payload_max = len.checked_sub(HEADER_BYTES + TRAILER_BYTES)?;
    let (bytes, loaded_as) = Bytes::load(file, len, huge)?;
    let checksum = !checked_before(&loaded_as);
    let all = bytes.as_slice();
    let (checked, trailer) = all.split_at(all.len().checked_sub(8)?); // TRAILER_BYTES
                                                                      // The checksum first: nothing is sized from an entry whose bytes are not what was written.
    if &trailer[4..] != END || (checksum && trailer[..4] != crc32fast::hash(checked).to_ne_bytes()) {
        return None;
    }
    let mut r = Src { bytes: &bytes, at: 0, end: checked.len(), huge: huge.enabled() };
    let magic = r.take(8)?;
    let words = r.take(8)?;
    let [identity, chunk, num_sequences, num_streams, payload] = r.u64s::<5>()?;
    let version = u32::from_ne_bytes(all[words.start..words.start + 4].try_into().ok()?);
    let layout = u32::from_ne_bytes(all[words.start + 4..words.end].try_into().ok()?);
    let header_ok = &all[magic] == MAGIC
        && version == VERSION
        && layout == LAYOUT_LE64
        && identity == want.identity
        && chunk == want.chunk as u64
        && num_sequences == want.num_sequences as u64
        && num_streams == want.streams.len() as u64
        && payload == payload_max;
    if !header_ok {
        return None;
    }
    let f64 = want.precision == Precision::Float64;
    let mut streams = Vec::with_capacity(want.streams.len());
    for spec in want.streams {
        let [tag, dim, n_seq, a, b, c] = r.u64s::<6>()?;
        if Some(n_seq) != num_sequences.checked_add(1) {
            return None;
        }
        let seq_offsets: Vec<usize> = r.array(n_seq)?;
        let samples = *seq_offsets.last()?;
        // The entries' offsets count one more than the samples (read from the file: no overflow).
        let entry_offsets = u64::try_from(samples).ok()?.checked_add(1)?;
        if !offsets_ok(&seq_offsets, samples) {
            return None;
        }
        let is_f64 = tag & F64_BIT != 0;
        let data = match (spec.kind, tag & 0xff) {
            (StreamKind::Dense, TAG_DENSE) if is_f64 == f64 && dim == spec.dim as u64 => {
                if a != (samples as u64).checked_mul(dim)? {
                    return None;
                }
                StreamValues::Dense { dim: spec.dim, values: r.values(f64, a)? }
            }
            (StreamKind::SparseI32 | StreamKind::SparseU64, TAG_SPARSE) if is_f64 == f64 => {
                let ids = tag & (U64_INDICES_BIT | U32_INDICES_BIT);
                let feature_ids = ids != 0;
                if ids == U64_INDICES_BIT | U32_INDICES_BIT
                    || feature_ids != (spec.kind == StreamKind::SparseU64)
                    || a != entry_offsets
                    || b != c
                {
                    return None;
                }
                let sample_offsets: Vec<usize> = r.array(a)?;
                if !offsets_ok(&sample_offsets, usize::try_from(b).ok()?) {
                    return None;
                }
                let indices = match ids {
                    U64_INDICES_BIT => Indices::U64(r.column(b)?),
                    U32_INDICES_BIT => Indices::U32(r.column(b)?),
                    _ => {
                        let ix: Column<i32> = r.column(b)?;
                        if ix.iter().any(|&i| usize::try_from(i).map_or(true, |i| i >= spec.dim)) {
                            return None;
                        }
                        Indices::I32(ix)
                    }
                };
                StreamValues::Sparse { sample_offsets, indices, values: r.values(f64, c)? }
            }
            (StreamKind::Strings, TAG_STRINGS) => {
                if a != entry_offsets {
                    return None;
                }
                let offsets: Vec<usize> = r.array(a)?;
                if !offsets_ok(&offsets, usize::try_from(b).ok()?) {
                    return None;
                }
                let bytes: Vec<u8> = r.array(b)?;
                r.take(b.next_multiple_of(8) - b)?;
                StreamValues::Strings { offsets, bytes }
            }
            _ => return None,
        };
        streams.push(StreamData::new(seq_offsets, data));
    }
    if r.at != r.end {
        return None;
    }
    Some((
        ParsedChunk { chunk: want.chunk, num_sequences: want.num_sequences, streams, malformed: Vec::new() },
        loaded_as,
        checksum,
    ))
}
