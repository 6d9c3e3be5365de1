//! The byte layout of a ring and of its slots (`docs/daemon.md`, "Shared-memory ring"). Layout version 1.
//!
//! ```text
//! offset 0            RingHeader (64 bytes), zero padding up to RING_HEADER_BYTES (4096)
//! RING_HEADER_BYTES   slot 0 ─┐  each slot_size bytes (a multiple of 4096)
//!   + k * slot_size   slot k ─┘
//!
//! slot:  SlotHeader (64 bytes)
//!        TensorEntry × num_tensors (64 bytes each)
//!        tensor names (UTF-8, not terminated)
//!        tensor data, each tensor at a 64-byte aligned offset from the slot start
//! ```
//!
//! Every header is `#[repr(C)]`, holds no pointers and starts with a magic; integers are in the
//! machine's native byte order (the ring never leaves the machine; `RingHeader::byte_order`
//! records it). Headers are encoded and decoded field by field, so this module needs no `unsafe`.
//!
//! Tensors of a slot, per stream in the dataset's stream order (`S` = the stream's name):
//! * `S/sequence_offsets` int64 `[num_sequences + 1]`, over samples;
//! * dense: `S/values` float32|float64 `[num_samples, dim]`;
//! * sparse: `S/sample_offsets` int64 `[num_samples + 1]`, `S/indices` int32|uint64 `[nnz]`,
//!   `S/values` float32|float64 `[nnz]`;
//! * strings: `S/offsets` int64 `[num_samples + 1]`, `S/bytes` uint8 `[len]`.

use crate::Result;

/// Magic at the start of a ring.
pub const RING_MAGIC: [u8; 8] = *b"MBDRING\0";
/// Magic at the start of a written slot.
pub const SLOT_MAGIC: [u8; 4] = *b"MBSL";
/// Version of this layout; a reader that sees another refuses the ring.
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes before slot 0 (one page, so slots are page aligned).
pub const RING_HEADER_BYTES: u64 = 4096;
/// Alignment of every tensor's data within a slot.
pub const TENSOR_ALIGN: usize = 64; // a power of two
/// Slot sizes are rounded up to this.
pub const SLOT_GRANULE: u64 = 4096;
/// Most dimensions a tensor can have.
pub const MAX_NDIM: usize = 4;
/// Native byte order marker: `1` read back as `0x01000000` means the other order.
const BYTE_ORDER_MARK: u32 = 1;

/// Decoding or encoding a ring or slot failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The bytes do not start with the expected magic.
    #[error("bad magic: not a minibatchd ring or slot")]
    BadMagic,
    /// The ring was written with another layout version.
    #[error("ring layout version {found} is not supported (this build reads version {expected})")]
    VersionMismatch {
        /// Version found in the header.
        found: u32,
        /// Version this build understands.
        expected: u32,
    },
    /// Written on a machine of the other byte order.
    #[error("ring written with the other byte order")]
    ByteOrder,
    /// The minibatch does not fit in a slot.
    #[error("minibatch needs {needed_bytes} bytes but a slot holds {slot_size_bytes}; reopen the session with a larger slot_size_bytes")]
    TooLarge {
        /// Bytes the minibatch needs.
        needed_bytes: u64,
        /// Bytes a slot holds.
        slot_size_bytes: u64,
    },
    /// An offset, length or shape points outside the region.
    #[error("corrupt layout: {0}")]
    Corrupt(&'static str),
    /// An unknown dtype code.
    #[error("unknown dtype code {0}")]
    UnknownDType(u32),
}

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum DType {
    /// `float32`.
    F32 = 1,
    /// `float64`.
    F64 = 2,
    /// `int32`.
    I32 = 3,
    /// `int64`.
    I64 = 4,
    /// `uint64`.
    U64 = 5,
    /// `uint8`.
    U8 = 6,
}

impl DType {
    /// Bytes per element.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::F32 | Self::I32 => 4,
            Self::F64 | Self::I64 | Self::U64 => 8,
        }
    }

    /// The type's name in `numpy`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F64 => "float64",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U64 => "uint64",
            Self::U8 => "uint8",
        }
    }

    /// The type of a code.
    ///
    /// # Errors
    /// [`LayoutError::UnknownDType`].
    pub fn from_code(code: u32) -> Result<Self> {
        Ok(match code {
            1 => Self::F32,
            2 => Self::F64,
            3 => Self::I32,
            4 => Self::I64,
            5 => Self::U64,
            6 => Self::U8,
            other => return Err(LayoutError::UnknownDType(other)),
        })
    }
}

/// `x` as a `usize`: lossless on the 64-bit targets minibatchd runs on; elsewhere it saturates,
/// so an offset past the address space fails a bounds check instead of wrapping to a wrong place.
fn to_usize(x: u64) -> usize {
    usize::try_from(x).unwrap_or(usize::MAX)
}

/// Little helper to read and write native-order fields at fixed offsets.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[at..at + 4]);
        u32::from_ne_bytes(b)
    }
    fn u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_ne_bytes(b)
    }
}

fn put_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// The ring header, at offset 0 of the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct RingHeader {
    /// [`RING_MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// `1` in the writer's byte order.
    pub byte_order: u32,
    /// Random id of the daemon process start that created the ring.
    pub daemon_id: u64,
    /// The session's id within that daemon.
    pub session_id: u64,
    /// Number of slots.
    pub slot_count: u64,
    /// Bytes per slot (a multiple of [`SLOT_GRANULE`]).
    pub slot_size: u64,
    /// Offset of slot 0 ([`RING_HEADER_BYTES`]).
    pub slots_offset: u64,
    /// Total bytes of the ring.
    pub total_bytes: u64,
}

const _: () = assert!(std::mem::size_of::<RingHeader>() == RingHeader::SIZE);

impl RingHeader {
    /// Encoded size in bytes.
    pub const SIZE: usize = 64;

    /// Writes the header into the first [`Self::SIZE`] bytes of `out`.
    pub fn write(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.magic);
        put_u32(out, 8, self.layout_version);
        put_u32(out, 12, self.byte_order);
        put_u64(out, 16, self.daemon_id);
        put_u64(out, 24, self.session_id);
        put_u64(out, 32, self.slot_count);
        put_u64(out, 40, self.slot_size);
        put_u64(out, 48, self.slots_offset);
        put_u64(out, 56, self.total_bytes);
    }

    /// Reads and checks the header at the start of `bytes` (magic, version, byte order, and that
    /// the geometry fits in `bytes`).
    ///
    /// # Errors
    /// Any [`LayoutError`] naming what is wrong.
    pub fn read(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < Self::SIZE || bytes[..8] != RING_MAGIC {
            return Err(LayoutError::BadMagic);
        }
        let f = Fields(bytes);
        let h = Self {
            magic: RING_MAGIC,
            layout_version: f.u32(8),
            byte_order: f.u32(12),
            daemon_id: f.u64(16),
            session_id: f.u64(24),
            slot_count: f.u64(32),
            slot_size: f.u64(40),
            slots_offset: f.u64(48),
            total_bytes: f.u64(56),
        };
        if h.byte_order != BYTE_ORDER_MARK {
            return Err(if h.byte_order.swap_bytes() == BYTE_ORDER_MARK {
                LayoutError::ByteOrder
            } else {
                LayoutError::Corrupt("byte order mark")
            });
        }
        if h.layout_version != LAYOUT_VERSION {
            return Err(LayoutError::VersionMismatch { found: h.layout_version, expected: LAYOUT_VERSION });
        }
        let end = h.slot_count.checked_mul(h.slot_size).and_then(|s| s.checked_add(h.slots_offset));
        if end.is_none_or(|e| e > h.total_bytes) || h.total_bytes > bytes.len() as u64 {
            return Err(LayoutError::Corrupt("slot geometry exceeds the ring"));
        }
        Ok(h)
    }

    /// A header for a new ring.
    #[must_use]
    pub fn new(daemon_id: u64, session_id: u64, slot_count: u64, slot_size: u64) -> Self {
        Self {
            magic: RING_MAGIC,
            layout_version: LAYOUT_VERSION,
            byte_order: BYTE_ORDER_MARK,
            daemon_id,
            session_id,
            slot_count,
            slot_size,
            slots_offset: RING_HEADER_BYTES,
            total_bytes: RING_HEADER_BYTES + slot_count * slot_size,
        }
    }

    /// Byte range of slot `slot` within the ring.
    #[must_use]
    pub fn slot_range(&self, slot: u64) -> std::ops::Range<usize> {
        let start = self.slots_offset + slot * self.slot_size;
        to_usize(start)..to_usize(start + self.slot_size)
    }
}

/// The header at the start of a written slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct SlotHeader {
    /// [`SLOT_MAGIC`].
    pub magic: [u8; 4],
    /// Entries in the tensor table.
    pub num_tensors: u32,
    /// The slot's generation when written (matches the `ready` message).
    pub generation: u64,
    /// The minibatch's index in its session.
    pub minibatch: u64,
    /// Bytes of the slot in use.
    pub used_bytes: u64,
    /// The minibatch's data-order ledger fingerprint
    /// (the engine's `MinibatchPlan::fingerprint`). Layout version 1 had reserved zero
    /// bytes here, so 0 means a daemon that did not write one.
    pub fingerprint: u64,
    /// Reserved, zero.
    pub reserved: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<SlotHeader>() == SlotHeader::SIZE);

impl SlotHeader {
    /// Encoded size in bytes.
    pub const SIZE: usize = 64;

    fn write(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.magic);
        put_u32(out, 4, self.num_tensors);
        put_u64(out, 8, self.generation);
        put_u64(out, 16, self.minibatch);
        put_u64(out, 24, self.used_bytes);
        put_u64(out, 32, self.fingerprint);
        out[40..64].fill(0);
    }

    /// Reads the header at the start of a slot.
    ///
    /// # Errors
    /// [`LayoutError::BadMagic`] for a slot never written.
    pub fn read(slot: &[u8]) -> Result<Self> {
        if slot.len() < Self::SIZE || slot[..4] != SLOT_MAGIC {
            return Err(LayoutError::BadMagic);
        }
        let f = Fields(slot);
        Ok(Self {
            magic: SLOT_MAGIC,
            num_tensors: f.u32(4),
            generation: f.u64(8),
            minibatch: f.u64(16),
            used_bytes: f.u64(24),
            fingerprint: f.u64(32),
            reserved: [0; 3],
        })
    }
}

/// One entry of a slot's tensor table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct TensorEntry {
    /// Offset of the UTF-8 name from the slot start.
    pub name_offset: u32,
    /// Length of the name in bytes.
    pub name_len: u32,
    /// [`DType`] code.
    pub dtype: u32,
    /// Number of dimensions used in `shape` (1..=[`MAX_NDIM`]).
    pub ndim: u32,
    /// Shape; unused dimensions are 0.
    pub shape: [u64; MAX_NDIM],
    /// Offset of the data from the slot start (a multiple of [`TENSOR_ALIGN`]).
    pub offset: u64,
    /// Bytes of data.
    pub nbytes: u64,
}

const _: () = assert!(std::mem::size_of::<TensorEntry>() == TensorEntry::SIZE);

impl TensorEntry {
    /// Encoded size in bytes.
    pub const SIZE: usize = 64;

    /// Byte range of the data from the slot start (`offset..offset + nbytes`; [`decode_slot`]
    /// checked that it lies inside the slot).
    #[must_use]
    pub fn data_range(&self) -> std::ops::Range<usize> {
        to_usize(self.offset)..to_usize(self.offset + self.nbytes)
    }

    fn write(&self, out: &mut [u8]) {
        put_u32(out, 0, self.name_offset);
        put_u32(out, 4, self.name_len);
        put_u32(out, 8, self.dtype);
        put_u32(out, 12, self.ndim);
        for (k, d) in self.shape.iter().enumerate() {
            put_u64(out, 16 + 8 * k, *d);
        }
        put_u64(out, 48, self.offset);
        put_u64(out, 56, self.nbytes);
    }

    fn read(b: &[u8]) -> Self {
        let f = Fields(b);
        let mut shape = [0u64; MAX_NDIM];
        for (k, d) in shape.iter_mut().enumerate() {
            *d = f.u64(16 + 8 * k);
        }
        Self {
            name_offset: f.u32(0),
            name_len: f.u32(4),
            dtype: f.u32(8),
            ndim: f.u32(12),
            shape,
            offset: f.u64(48),
            nbytes: f.u64(56),
        }
    }
}

/// A tensor to be written: name, type, shape and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorSpec<'a> {
    /// `stream/field`.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape (1 or 2 dimensions here).
    pub shape: &'a [u64],
    /// The data, `product(shape) * dtype.size()` bytes.
    pub data: &'a [u8],
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// A tensor to be written by a fill function: everything but the data.
#[derive(Debug, Clone, Copy)]
pub struct TensorMeta<'a> {
    /// `stream/field`.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape (1 or 2 dimensions here).
    pub shape: &'a [u64],
    /// Bytes of data, `product(shape) * dtype.size()`.
    pub nbytes: usize,
}

impl<'a> TensorSpec<'a> {
    fn meta(&self) -> TensorMeta<'a> {
        TensorMeta { name: self.name, dtype: self.dtype, shape: self.shape, nbytes: self.data.len() }
    }
}

/// Bytes a slot needs for `tensors`.
#[must_use]
pub fn encoded_size(tensors: &[TensorSpec<'_>]) -> u64 {
    encoded_size_of(&tensors.iter().map(TensorSpec::meta).collect::<Vec<_>>())
}

/// Bytes a slot needs for tensors described by `metas`.
#[must_use]
pub fn encoded_size_of(metas: &[TensorMeta<'_>]) -> u64 {
    let names: usize = metas.iter().map(|t| t.name.len()).sum();
    let mut at = align_up(SlotHeader::SIZE + TensorEntry::SIZE * metas.len() + names, TENSOR_ALIGN);
    for t in metas {
        at = align_up(at + t.nbytes, TENSOR_ALIGN);
    }
    at as u64
}

/// Writes `tensors` into `slot` (header, table, names, data).
///
/// # Errors
/// [`LayoutError::TooLarge`] if they do not fit (nothing of the slot's previous content that a
/// reader could mistake for valid data is left half-written: the header is written last).
pub fn encode_slot(
    slot: &mut [u8],
    generation: u64,
    minibatch: u64,
    fingerprint: u64,
    tensors: &[TensorSpec<'_>],
) -> Result<u64> {
    let metas: Vec<TensorMeta<'_>> = tensors.iter().map(TensorSpec::meta).collect();
    encode_slot_with(slot, generation, minibatch, fingerprint, &metas, |i, out| out.copy_from_slice(tensors[i].data))
}

/// Writes the tensors described by `metas` into `slot`: header, table and names here, each
/// tensor's data by `fill(i, bytes)`, which must fill exactly `metas[i].nbytes` bytes in place
/// (the gather writes samples straight from the parsed chunks into shared memory).
///
/// # Errors
/// As [`encode_slot`]; `fill` is not called when the tensors do not fit.
pub fn encode_slot_with(
    slot: &mut [u8],
    generation: u64,
    minibatch: u64,
    fingerprint: u64,
    metas: &[TensorMeta<'_>],
    mut fill: impl FnMut(usize, &mut [u8]),
) -> Result<u64> {
    let needed = encoded_size_of(metas);
    if needed > slot.len() as u64 {
        return Err(LayoutError::TooLarge { needed_bytes: needed, slot_size_bytes: slot.len() as u64 });
    }
    let table = SlotHeader::SIZE;
    let mut name_at = table + TensorEntry::SIZE * metas.len();
    let names: usize = metas.iter().map(|t| t.name.len()).sum();
    let mut data_at = align_up(name_at + names, TENSOR_ALIGN);
    for (i, t) in metas.iter().enumerate() {
        if t.shape.len() > MAX_NDIM {
            return Err(LayoutError::Corrupt("too many dimensions"));
        }
        let mut shape = [0u64; MAX_NDIM];
        shape[..t.shape.len()].copy_from_slice(t.shape);
        let entry = TensorEntry {
            name_offset: u32::try_from(name_at).map_err(|_| LayoutError::Corrupt("name offset"))?,
            name_len: u32::try_from(t.name.len()).map_err(|_| LayoutError::Corrupt("name length"))?,
            dtype: t.dtype as u32,
            ndim: u32::try_from(t.shape.len()).map_err(|_| LayoutError::Corrupt("too many dimensions"))?,
            shape,
            offset: data_at as u64,
            nbytes: t.nbytes as u64,
        };
        entry.write(&mut slot[table + i * TensorEntry::SIZE..]);
        slot[name_at..name_at + t.name.len()].copy_from_slice(t.name.as_bytes());
        name_at += t.name.len();
        fill(i, &mut slot[data_at..data_at + t.nbytes]);
        data_at = align_up(data_at + t.nbytes, TENSOR_ALIGN);
    }
    let header = SlotHeader {
        magic: SLOT_MAGIC,
        num_tensors: u32::try_from(metas.len()).map_err(|_| LayoutError::Corrupt("tensor count"))?,
        generation,
        minibatch,
        used_bytes: needed,
        fingerprint,
        reserved: [0; 3],
    };
    header.write(slot);
    Ok(needed)
}

/// A decoded tensor: a view on the slot's bytes.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// `stream/field`.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// The data.
    pub data: &'a [u8],
}

/// Decodes a slot's tensor table, checking every offset and shape against the slot.
///
/// # Errors
/// [`LayoutError`] for an unwritten or corrupt slot.
pub fn decode_slot(slot: &[u8]) -> Result<(SlotHeader, Vec<(TensorEntry, String)>)> {
    let header = SlotHeader::read(slot)?;
    let n = header.num_tensors as usize;
    let table_end = SlotHeader::SIZE
        .checked_add(n.checked_mul(TensorEntry::SIZE).ok_or(LayoutError::Corrupt("table"))?)
        .ok_or(LayoutError::Corrupt("table"))?;
    if table_end > slot.len() {
        return Err(LayoutError::Corrupt("tensor table exceeds the slot"));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let e = TensorEntry::read(&slot[SlotHeader::SIZE + i * TensorEntry::SIZE..]);
        let dtype = DType::from_code(e.dtype)?;
        let name_end = (e.name_offset as usize).checked_add(e.name_len as usize).ok_or(LayoutError::Corrupt("name"))?;
        let name = slot.get(e.name_offset as usize..name_end).ok_or(LayoutError::Corrupt("name outside the slot"))?;
        let name = std::str::from_utf8(name).map_err(|_| LayoutError::Corrupt("name is not UTF-8"))?.to_owned();
        if e.ndim == 0 || e.ndim as usize > MAX_NDIM {
            return Err(LayoutError::Corrupt("ndim"));
        }
        let elems = e.shape[..e.ndim as usize]
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or(LayoutError::Corrupt("shape"))?;
        if elems.checked_mul(dtype.size() as u64) != Some(e.nbytes) {
            return Err(LayoutError::Corrupt("shape does not match nbytes"));
        }
        if e.offset & (TENSOR_ALIGN as u64 - 1) != 0
            || e.offset.checked_add(e.nbytes).is_none_or(|end| end > slot.len() as u64)
        {
            return Err(LayoutError::Corrupt("tensor data outside the slot"));
        }
        out.push((e, name));
    }
    Ok((header, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_header_round_trips_and_checks_version() {
        let h = RingHeader::new(7, 9, 3, 8192);
        let mut b = vec![0u8; to_usize(h.total_bytes)];
        h.write(&mut b);
        assert_eq!(RingHeader::read(&b), Ok(h));
        put_u32(&mut b, 8, 2);
        assert_eq!(RingHeader::read(&b), Err(LayoutError::VersionMismatch { found: 2, expected: 1 }));
        put_u32(&mut b, 8, 1);
        assert_eq!(RingHeader::read(&b[..100]), Err(LayoutError::Corrupt("slot geometry exceeds the ring")));
        b[0] = b'X';
        assert_eq!(RingHeader::read(&b), Err(LayoutError::BadMagic));
    }

    #[test]
    fn slot_round_trips_with_aligned_tensors() {
        let mut slot = vec![0u8; 4096];
        let offs = minibatchd_sys::as_bytes(&[0i64, 2, 3][..]).to_vec();
        let vals = minibatchd_sys::as_bytes(&[1.5f32, 2.5, 3.5, 4.5, 5.5, 6.5][..]).to_vec();
        let specs = [
            TensorSpec { name: "f/sequence_offsets", dtype: DType::I64, shape: &[3], data: &offs },
            TensorSpec { name: "f/values", dtype: DType::F32, shape: &[3, 2], data: &vals },
        ];
        let used = encode_slot(&mut slot, 4, 11, 0x5eed, &specs).expect("fits");
        assert_eq!(used, encoded_size(&specs));
        let (h, table) = decode_slot(&slot).expect("decodes");
        assert_eq!((h.generation, h.minibatch, h.num_tensors), (4, 11, 2));
        assert_eq!(table[1].1, "f/values");
        let e = table[1].0;
        assert_eq!(e.offset % 64, 0);
        assert_eq!(&slot[e.data_range()], &vals[..]);
        assert_eq!(&e.shape[..2], &[3, 2]);
    }

    #[test]
    fn too_large_is_an_error_not_a_partial_write() {
        let mut slot = vec![0u8; 256];
        let data = vec![0u8; 1000];
        let specs = [TensorSpec { name: "x", dtype: DType::U8, shape: &[1000], data: &data }];
        assert!(matches!(
            encode_slot(&mut slot, 1, 0, 0, &specs),
            Err(LayoutError::TooLarge { slot_size_bytes: 256, .. })
        ));
        assert_eq!(SlotHeader::read(&slot), Err(LayoutError::BadMagic));
    }

    #[test]
    fn corrupt_tables_are_refused() {
        let mut slot = vec![0u8; 4096];
        let data = [0u8; 8];
        encode_slot(&mut slot, 1, 0, 0, &[TensorSpec { name: "x", dtype: DType::U8, shape: &[8], data: &data }])
            .expect("fits");
        let mut bad = slot.clone();
        put_u64(&mut bad, SlotHeader::SIZE + 48, 4096); // data offset at the very end
        assert!(decode_slot(&bad).is_err());
        let mut bad = slot.clone();
        put_u32(&mut bad, SlotHeader::SIZE + 8, 99);
        assert_eq!(decode_slot(&bad).err(), Some(LayoutError::UnknownDType(99)));
        let mut bad = slot;
        put_u32(&mut bad, 4, u32::MAX);
        assert!(decode_slot(&bad).is_err());
    }
}
