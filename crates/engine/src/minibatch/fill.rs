//! How a gathered minibatch's tensors are described and copied into a slot ([`SlotSource`]):
//! each tensor is written straight from the held chunks' arrays, each chunk's array found once.

use std::sync::Arc;

use minibatchd_shm::table::{DType, Field, SlotSource, TensorDesc};

use super::{i64_of, Gathered, Piece, Shape};
use crate::format::chunk::{Indices, ParsedChunk, StreamData, StreamValues, Values};

/// How many sequences ahead of the copy the gather prefetches their samples.
const PREFETCH_AHEAD: usize = 6;

fn float_dtype(f64: bool) -> DType {
    if f64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Writes `values` as native-endian int64s into `out`.
fn put_i64s(out: &mut [u8], values: impl Iterator<Item = i64>) {
    for (dst, v) in out.chunks_exact_mut(8).zip(values) {
        dst.copy_from_slice(&v.to_ne_bytes());
    }
}

/// `dst.copy_from_slice(src)`, with the sizes of one sparse entry (a 4- or 8-byte index or
/// value: one-hot labels, deepx features) copied inline instead of through a `memcpy` call —
/// a minibatch of sparse samples is hundreds of such copies.
#[inline]
fn copy_small(dst: &mut [u8], src: &[u8]) {
    match (dst.len(), src.len()) {
        (4, 4) => dst.copy_from_slice(&src[..4]),
        (8, 8) => dst.copy_from_slice(&src[..8]),
        _ => dst.copy_from_slice(src),
    }
}

/// Writes `values` as native-endian `i32`s into `out`.
fn put_i32s(out: &mut [u8], values: &[i32]) {
    for (dst, v) in out.chunks_exact_mut(4).zip(values) {
        dst.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Writes the 32-bit feature ids `ids` as native-endian `u64`s into `out`.
fn widen_ids(out: &mut [u8], ids: &[u32]) {
    for (dst, &id) in out.chunks_exact_mut(8).zip(ids) {
        dst.copy_from_slice(&u64::from(id).to_ne_bytes());
    }
}

/// One array of a held chunk's stream, for the copy of a tensor: its bytes and the width of an
/// entry, or 32-bit feature ids that the copy widens to 64 bits.
#[derive(Debug, Clone, Copy)]
pub(super) enum Array<'a> {
    Bytes(&'a [u8], usize),
    Narrow(&'a [u32]),
}

impl<'a> Array<'a> {
    /// The array of `data` that tensor field `field` copies.
    fn of(field: Field, data: &'a StreamValues) -> Self {
        let values = |v: &'a Values| match v {
            Values::F32(x) => Array::Bytes(minibatchd_sys::as_bytes(x), 4),
            Values::F64(x) => Array::Bytes(minibatchd_sys::as_bytes(x), 8),
        };
        match (field, data) {
            (Field::DenseValues, StreamValues::Dense { values: v, .. })
            | (Field::SparseValues, StreamValues::Sparse { values: v, .. }) => values(v),
            (Field::Indices, StreamValues::Sparse { indices, .. }) => match indices {
                Indices::I32(x) => Array::Bytes(minibatchd_sys::as_bytes(x), 4),
                Indices::U32(x) => Array::Narrow(x),
                Indices::U64(x) => Array::Bytes(minibatchd_sys::as_bytes(x), 8),
            },
            (Field::StringBytes, StreamValues::Strings { bytes, .. }) => Array::Bytes(bytes, 1),
            _ => unreachable!("a stream keeps its kind across chunks (checked in gather)"),
        }
    }

    /// Entries `range` of the array.
    fn range(self, range: std::ops::Range<usize>) -> Self {
        match self {
            Array::Bytes(b, width) => Array::Bytes(&b[range.start * width..range.end * width], width),
            Array::Narrow(ids) => Array::Narrow(&ids[range]),
        }
    }

    /// Its stored bytes: what the output holds, except for narrow ids, whose bytes serve the
    /// prefetch only.
    fn bytes(self) -> &'a [u8] {
        match self {
            Array::Bytes(b, _) => b,
            Array::Narrow(ids) => minibatchd_sys::as_bytes(ids),
        }
    }
}

/// Something found in each held chunk's stream that a tensor's pieces come from, found once per
/// chunk: a piece's is then an index, not a walk through the chunk's streams.
pub(super) struct PerChunk<'a, T, F> {
    /// Per held chunk: the stream the pieces read, and what was found in it.
    found: Vec<Option<(usize, T)>>,
    find: F,
    chunks: &'a [Arc<ParsedChunk>],
}

impl<'a, T: Copy, F: Fn(&'a StreamData) -> T> PerChunk<'a, T, F> {
    /// What was found for piece `p`'s chunk and stream.
    #[inline]
    pub(super) fn of(&self, p: &Piece) -> T {
        match self.found[p.chunk] {
            Some((stream, x)) if stream == p.stream => x,
            // A held chunk's pieces of one output stream all read the same stream of it (the
            // map of its dataset); found again rather than trusted.
            _ => (self.find)(&self.chunks[p.chunk].streams[p.stream]),
        }
    }
}

/// [`PerChunk`] of `pieces`, each chunk's found by `find` at its first piece.
pub(super) fn per_chunk<'a, T: Copy, F: Fn(&'a StreamData) -> T>(
    chunks: &'a [Arc<ParsedChunk>],
    pieces: &[Piece],
    find: F,
) -> PerChunk<'a, T, F> {
    let mut found: Vec<Option<(usize, T)>> = vec![None; chunks.len()];
    for p in pieces {
        if found[p.chunk].is_none() {
            found[p.chunk] = Some((p.stream, find(&chunks[p.chunk].streams[p.stream])));
        }
    }
    PerChunk { found, find, chunks }
}

impl SlotSource for Gathered {
    fn index(&self) -> u64 {
        self.index
    }

    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn tensors(&self) -> Vec<TensorDesc> {
        let mut out = Vec::with_capacity(self.streams.len() * 4);
        for (si, s) in self.streams.iter().enumerate() {
            out.push(TensorDesc::vector(si, Field::SequenceOffsets, DType::I64, s.sequence_ends.len() + 1));
            match s.shape {
                Shape::Dense { dim, f64 } => {
                    out.push(TensorDesc::matrix(si, Field::DenseValues, float_dtype(f64), s.samples, dim));
                }
                Shape::Sparse { f64, u64_ids, .. } => {
                    let ids = if u64_ids { DType::U64 } else { DType::I32 };
                    out.push(TensorDesc::vector(si, Field::SampleOffsets, DType::I64, s.samples + 1));
                    out.push(TensorDesc::vector(si, Field::Indices, ids, s.entries));
                    out.push(TensorDesc::vector(si, Field::SparseValues, float_dtype(f64), s.entries));
                }
                Shape::Strings => {
                    out.push(TensorDesc::vector(si, Field::StringOffsets, DType::I64, s.samples + 1));
                    out.push(TensorDesc::vector(si, Field::StringBytes, DType::U8, s.entries));
                }
            }
        }
        if let Some(m) = &self.mixture {
            let at = self.streams.len();
            out.push(TensorDesc::vector(at, Field::MixtureSources, DType::I32, m.sources.len()));
            out.push(TensorDesc::vector(at, Field::MixtureSweepsEnded, DType::I32, m.sweeps_ended.len()));
            out.push(TensorDesc::vector(at, Field::MixtureState, DType::I64, m.state.len()));
        }
        out
    }

    fn fill(&self, t: &TensorDesc, out: &mut [u8]) {
        if let (Some(m), Field::MixtureSources | Field::MixtureSweepsEnded | Field::MixtureState) =
            (&self.mixture, t.field)
        {
            match t.field {
                Field::MixtureSources => put_i32s(out, &m.sources),
                Field::MixtureSweepsEnded => put_i32s(out, &m.sweeps_ended),
                _ => put_i64s(out, m.state.iter().copied()),
            }
            return;
        }
        let s = &self.streams[t.stream];
        match t.field {
            Field::SequenceOffsets => {
                put_i64s(out, std::iter::once(0).chain(s.sequence_ends.iter().map(|&end| i64_of(end))));
            }
            Field::SampleOffsets | Field::StringOffsets => {
                let mut rows = out.chunks_exact_mut(8);
                if let Some(first) = rows.next() {
                    first.copy_from_slice(&0i64.to_ne_bytes());
                }
                let offsets = per_chunk(&self.chunks, &s.pieces, |sd| match &sd.data {
                    _ if sd.unit_entries() => None,
                    StreamValues::Sparse { sample_offsets: o, .. } | StreamValues::Strings { offsets: o, .. } => {
                        Some(o.as_slice())
                    }
                    StreamValues::Dense { .. } => unreachable!("offsets of a dense stream"),
                });
                let mut at = 0usize;
                for p in &s.pieces {
                    match offsets.of(p) {
                        // Entry k of the piece is sample k: its end offset is known.
                        None => {
                            for (k, dst) in (1..=p.s1 - p.s0).zip(&mut rows) {
                                dst.copy_from_slice(&i64_of(at + k).to_ne_bytes());
                            }
                        }
                        Some(o) => {
                            let base = i64_of(at) - i64_of(p.e0);
                            // The offsets first: `zip` takes from its first iterator before it
                            // finds the second exhausted, which would skip a row of the output.
                            for (&o, dst) in o[p.s0 + 1..=p.s1].iter().zip(&mut rows) {
                                dst.copy_from_slice(&(i64_of(o) + base).to_ne_bytes());
                            }
                        }
                    }
                    at += p.e1 - p.e0;
                }
            }
            Field::DenseValues | Field::SparseValues | Field::Indices | Field::StringBytes => {
                // Each held chunk's array found once a tensor, not once a piece: the lookup (a
                // few matches and bounds checks) was, per piece, as costly as the copy of a
                // one-hot label (benches/delivery.rs under callgrind, docs/benchmarks.md).
                let arrays = per_chunk(&self.chunks, &s.pieces, |sd| Array::of(t.field, &sd.data));
                let sources: Vec<Array<'_>> = s.pieces.iter().map(|p| arrays.of(p).range(p.e0..p.e1)).collect();
                for a in sources.iter().take(PREFETCH_AHEAD) {
                    minibatchd_sys::prefetch(a.bytes());
                }
                let mut at = 0usize;
                for (i, a) in sources.iter().enumerate() {
                    if let Some(ahead) = sources.get(i + PREFETCH_AHEAD) {
                        minibatchd_sys::prefetch(ahead.bytes());
                    }
                    match *a {
                        Array::Narrow(ids) => {
                            widen_ids(&mut out[at..at + 8 * ids.len()], ids);
                            at += 8 * ids.len();
                        }
                        Array::Bytes(src, _) => {
                            copy_small(&mut out[at..at + src.len()], src);
                            at += src.len();
                        }
                    }
                }
            }
            // Written above, with the mixture's tensors.
            Field::MixtureSources | Field::MixtureSweepsEnded | Field::MixtureState => {}
        }
    }
}
