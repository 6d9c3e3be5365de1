//! A chunk's growing buffers ([`DeepxBufs`]): made with room for a typical chunk, rolled back
//! after a malformed line, and turned into the chunk's streams at its end — the buffers' life
//! around the line parse of [`super::DeepxDecoder`].

use super::{DeepxDecoder, DeepxElement, SparseBuf};
use crate::format::chunk::{StreamData, StreamValues};
use crate::format::deepx::schema::Layout;

/// Growing buffers of every stream of a chunk being parsed.
#[derive(Debug, Clone)]
pub struct DeepxBufs<T> {
    /// The CSR tensors, in schema order (`__instX`; `__instX0…`; `__instXuser`, `__instXcand`,
    /// `__instXhist0…`).
    pub x: Vec<SparseBuf<T>>,
    /// `__instY`: `label_size` values per sample.
    pub y: Vec<T>,
    /// `__instW` (when configured): `label_size` values per sample.
    pub w: Vec<T>,
    /// `__instUUID` (when configured): byte offsets per sample, starting with 0.
    pub uuid_offsets: Vec<usize>,
    /// `__instUUID` bytes.
    pub uuid_bytes: Vec<u8>,
    /// `__instXhist_size` (uch): one value per sample.
    pub hist_size: Vec<T>,
    /// `__instQID` (svmlight `qid`): one value per sample.
    pub qid: Vec<T>,
    /// Sample offsets per sequence (0 or 1 sample each); starts with 0.
    pub seq_offsets: Vec<usize>,
    /// Samples so far.
    pub samples: usize,
    /// History items beyond `x_hist_item_size`: parsed for syntax, then dropped.
    pub(super) surplus: SparseBuf<T>,
}

impl<T> DeepxBufs<T> {
    /// Bytes its vectors hold (their capacities): what a chunk being parsed costs so far.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        let t = std::mem::size_of::<T>();
        self.x.iter().chain(std::iter::once(&self.surplus)).map(SparseBuf::heap_bytes).sum::<usize>()
            + (self.y.capacity() + self.w.capacity() + self.hist_size.capacity() + self.qid.capacity()) * t
            + (self.uuid_offsets.capacity() + self.seq_offsets.capacity()) * 8
            + self.uuid_bytes.capacity()
    }
}

impl DeepxDecoder {
    /// Empty buffers for one chunk.
    #[must_use]
    pub fn buffers<T>(&self) -> DeepxBufs<T> {
        self.buffers_for(0, 0, false)
    }

    /// Empty buffers for a chunk of `bytes` bytes and `lines` lines, with room for a typical
    /// chunk (a feature takes about 8 bytes or more), so that they rarely grow by copying; the
    /// feature ids and values are backed by huge pages when `huge` (fewer page faults while they
    /// fill).
    #[must_use]
    pub fn buffers_for<T>(&self, bytes: usize, lines: usize, huge: bool) -> DeepxBufs<T> {
        let groups = self.schema.num_sparse();
        let entries = bytes / 8 / groups;
        let sparse = || {
            let mut b = SparseBuf::new(huge);
            b.reserve(entries);
            b.sample_offsets.reserve(lines);
            b
        };
        DeepxBufs {
            x: (0..groups).map(|_| sparse()).collect(),
            y: Vec::with_capacity(lines * self.schema.label_size),
            w: Vec::new(),
            uuid_offsets: vec![0],
            uuid_bytes: Vec::new(),
            hist_size: Vec::new(),
            qid: Vec::new(),
            seq_offsets: vec![0],
            samples: 0,
            surplus: SparseBuf::new(huge),
        }
    }

    /// Turns the buffers of a chunk into streams, in schema order.
    #[must_use]
    pub fn into_streams<T: DeepxElement>(&self, bufs: DeepxBufs<T>) -> Vec<StreamData> {
        let seq = bufs.seq_offsets;
        let label_size = self.schema.label_size;
        let mut out: Vec<StreamData> = bufs
            .x
            .into_iter()
            .map(|SparseBuf { sample_offsets, ids, values, .. }| {
                StreamData::new(
                    seq.clone(),
                    StreamValues::Sparse { sample_offsets, indices: ids.into(), values: T::into_values(values) },
                )
            })
            .collect();
        let dense = |dim: usize, values: Vec<T>| {
            StreamData::new(seq.clone(), StreamValues::Dense { dim, values: T::into_values(values) })
        };
        if matches!(self.schema.layout, Layout::Uch { .. }) {
            out.push(dense(1, bufs.hist_size));
        }
        out.push(dense(label_size, bufs.y));
        if self.schema.w {
            out.push(dense(label_size, bufs.w));
        }
        if self.schema.uuid {
            out.push(StreamData::new(
                seq.clone(),
                StreamValues::Strings { offsets: bufs.uuid_offsets, bytes: bufs.uuid_bytes },
            ));
        }
        if self.schema.qid {
            out.push(dense(1, bufs.qid));
        }
        out
    }
}

/// Drops what a malformed line appended: every buffer goes back to its committed length, which
/// the per-sample offsets and the sample count record (no bookkeeping per line).
pub(super) fn rollback<T>(out: &mut DeepxBufs<T>, label_size: usize) {
    for x in &mut out.x {
        let committed = x.sample_offsets.last().copied().unwrap_or(0);
        x.truncate(committed);
        x.renarrow(committed);
    }
    let rows = out.samples;
    out.y.truncate(rows * label_size);
    out.w.truncate(rows * label_size);
    out.uuid_bytes.truncate(out.uuid_offsets.last().copied().unwrap_or(0));
    out.hist_size.truncate(rows);
    out.qid.truncate(rows);
}
