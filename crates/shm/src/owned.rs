//! A minibatch as a slot carries it, owned: per stream, contiguous columnar buffers —
//! `sequence_offsets` over samples; dense values `[num_samples, dim]` row-major; sparse CSR per
//! sample (`sample_offsets`, `indices`, `values`, entries in file order); strings as offsets and
//! bytes. What `dump` prints, what a Rust client copies out of a slot ([`decode_minibatch`]) and
//! what tests compare. It is a [`SlotSource`] like the engine's gathered minibatch, through the
//! same tensor table ([`crate::table`]).

use minibatchd_sys::{as_bytes, cast_slice};

use crate::layout::{self, DType, LayoutError, RingHeader};
use crate::table::{Field, SlotSource, TensorDesc};
use crate::Result;

/// Element values of a stream, in the dataset's precision.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// `precision = "float32"`.
    F32(Vec<f32>),
    /// `precision = "float64"`.
    F64(Vec<f64>),
}

impl Values {
    /// Number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::F64(v) => v.len(),
        }
    }

    /// Whether there are no values.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.len() * 4,
            Self::F64(v) => v.len() * 8,
        }
    }

    /// Value `i` widened to `f64` (exact for both precisions).
    #[must_use]
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Self::F32(v) => f64::from(v[i]),
            Self::F64(v) => v[i],
        }
    }
}

/// Sparse indices: CTF uses int32 (CNTK's `IndexType`), deepx keeps u64 feature ids as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Indices {
    /// CTF.
    I32(Vec<i32>),
    /// deepx feature ids.
    U64(Vec<u64>),
}

/// One stream of a minibatch.
#[derive(Debug, Clone, PartialEq)]
pub struct MbStream {
    /// Sample offsets of each sequence; one more than sequences.
    pub sequence_offsets: Vec<i64>,
    /// The samples.
    pub data: MbData,
}

/// Sample data of one stream of a minibatch.
#[derive(Debug, Clone, PartialEq)]
pub enum MbData {
    /// `num_samples × dim`, row-major.
    Dense {
        /// Values per sample.
        dim: usize,
        /// The values.
        values: Values,
    },
    /// CSR per sample.
    Sparse {
        /// Values per sample (the stream's `dim`).
        dim: usize,
        /// Entry offsets per sample; one more than samples.
        sample_offsets: Vec<i64>,
        /// Column indices.
        indices: Indices,
        /// Entry values.
        values: Values,
    },
    /// One string per sample.
    Strings {
        /// Byte offsets; one more than samples.
        offsets: Vec<i64>,
        /// UTF-8 bytes.
        bytes: Vec<u8>,
    },
}

impl MbStream {
    /// Number of sequences.
    #[must_use]
    pub fn num_sequences(&self) -> usize {
        self.sequence_offsets.len() - 1
    }

    /// Number of samples.
    #[must_use]
    pub fn num_samples(&self) -> usize {
        usize::try_from(*self.sequence_offsets.last().unwrap_or(&0)).unwrap_or(0)
    }
}

/// A minibatch ready for delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Minibatch {
    /// 0-based index in the session.
    pub index: u64,
    /// Sweep at the start of the minibatch.
    pub sweep: u64,
    /// Whether the minibatch ends at or crosses a sweep boundary.
    pub end_of_sweep: bool,
    /// Checkpoint position after this minibatch.
    pub position: u64,
    /// The data-order ledger's fingerprint (the engine's `MinibatchPlan::fingerprint`); 0
    /// when a slot written by an older daemon carries none.
    pub fingerprint: u64,
    /// One entry per stream, in dataset order.
    pub streams: Vec<MbStream>,
}

fn values_dtype(v: &Values) -> DType {
    match v {
        Values::F32(_) => DType::F32,
        Values::F64(_) => DType::F64,
    }
}

fn values_bytes(v: &Values) -> &[u8] {
    match v {
        Values::F32(x) => as_bytes(x),
        Values::F64(x) => as_bytes(x),
    }
}

impl SlotSource for Minibatch {
    fn index(&self) -> u64 {
        self.index
    }

    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn tensors(&self) -> Vec<TensorDesc> {
        let mut out = Vec::new();
        for (s, st) in self.streams.iter().enumerate() {
            out.push(TensorDesc::vector(s, Field::SequenceOffsets, DType::I64, st.sequence_offsets.len()));
            match &st.data {
                MbData::Dense { dim, values } => {
                    out.push(TensorDesc::matrix(s, Field::DenseValues, values_dtype(values), st.num_samples(), *dim));
                }
                MbData::Sparse { sample_offsets, indices, values, .. } => {
                    out.push(TensorDesc::vector(s, Field::SampleOffsets, DType::I64, sample_offsets.len()));
                    let (dtype, n) = match indices {
                        Indices::I32(i) => (DType::I32, i.len()),
                        Indices::U64(i) => (DType::U64, i.len()),
                    };
                    out.push(TensorDesc::vector(s, Field::Indices, dtype, n));
                    out.push(TensorDesc::vector(s, Field::SparseValues, values_dtype(values), values.len()));
                }
                MbData::Strings { offsets, bytes } => {
                    out.push(TensorDesc::vector(s, Field::StringOffsets, DType::I64, offsets.len()));
                    out.push(TensorDesc::vector(s, Field::StringBytes, DType::U8, bytes.len()));
                }
            }
        }
        out
    }

    fn fill(&self, tensor: &TensorDesc, out: &mut [u8]) {
        let Some(st) = self.streams.get(tensor.stream) else { return };
        let src: &[u8] = match (tensor.field, &st.data) {
            (Field::SequenceOffsets, _) => as_bytes(&st.sequence_offsets),
            (Field::DenseValues, MbData::Dense { values, .. })
            | (Field::SparseValues, MbData::Sparse { values, .. }) => values_bytes(values),
            (Field::SampleOffsets, MbData::Sparse { sample_offsets, .. }) => as_bytes(sample_offsets),
            (Field::Indices, MbData::Sparse { indices: Indices::I32(i), .. }) => as_bytes(i),
            (Field::Indices, MbData::Sparse { indices: Indices::U64(i), .. }) => as_bytes(i),
            (Field::StringOffsets, MbData::Strings { offsets, .. }) => as_bytes(offsets),
            (Field::StringBytes, MbData::Strings { bytes, .. }) => bytes,
            _ => &[],
        };
        let n = out.len().min(src.len());
        out[..n].copy_from_slice(&src[..n]);
    }
}

/// Decodes slot `slot` of the ring in `ring_bytes` back into an owned [`Minibatch`] (a copy):
/// what a Rust client or a test compares with `dump`. `expected_generation` guards against a
/// stale slot. Sweep, end-of-sweep and position are not in the slot (they travel in the `ready`
/// message) and are left 0/false.
///
/// # Errors
/// [`LayoutError`] for a corrupt slot, a stale generation, or tensors that do not form streams.
pub fn decode_minibatch(
    ring_bytes: &[u8],
    slot: u64,
    expected_generation: u64,
    stream_dims: &[usize],
) -> Result<Minibatch> {
    let header = RingHeader::read(ring_bytes)?;
    if slot >= header.slot_count {
        return Err(LayoutError::Corrupt("slot index out of range"));
    }
    let bytes = &ring_bytes[header.slot_range(slot)];
    let (sh, table) = layout::decode_slot(bytes)?;
    if sh.generation != expected_generation {
        return Err(LayoutError::Corrupt("stale slot generation"));
    }
    let data = |i: usize| -> &[u8] { &bytes[table[i].0.data_range()] };
    let i64s = |i: usize| cast_slice::<i64>(data(i)).map(<[i64]>::to_vec).ok_or(LayoutError::Corrupt("int64 tensor"));
    let values = |i: usize| -> Result<Values, LayoutError> {
        match DType::from_code(table[i].0.dtype)? {
            DType::F32 => {
                Ok(Values::F32(cast_slice::<f32>(data(i)).ok_or(LayoutError::Corrupt("float32 tensor"))?.to_vec()))
            }
            DType::F64 => {
                Ok(Values::F64(cast_slice::<f64>(data(i)).ok_or(LayoutError::Corrupt("float64 tensor"))?.to_vec()))
            }
            _ => Err(LayoutError::Corrupt("values tensor is not a float type")),
        }
    };
    let mut streams = Vec::new();
    let mut i = 0;
    for &dim in stream_dims {
        let field = |i: usize| table.get(i).map_or("", |t| t.1.rsplit('/').next().unwrap_or(""));
        if field(i) != "sequence_offsets" {
            return Err(LayoutError::Corrupt("expected a sequence_offsets tensor"));
        }
        let sequence_offsets = i64s(i)?;
        let data = match field(i + 1) {
            "values" => {
                i += 2;
                MbData::Dense { dim, values: values(i - 1)? }
            }
            "sample_offsets" if table.len() >= i + 4 => {
                let indices = match DType::from_code(table.get(i + 2).ok_or(LayoutError::Corrupt("indices"))?.0.dtype)?
                {
                    DType::I32 => {
                        Indices::I32(cast_slice::<i32>(data(i + 2)).ok_or(LayoutError::Corrupt("indices"))?.to_vec())
                    }
                    DType::U64 => {
                        Indices::U64(cast_slice::<u64>(data(i + 2)).ok_or(LayoutError::Corrupt("indices"))?.to_vec())
                    }
                    _ => return Err(LayoutError::Corrupt("indices dtype")),
                };
                let d = MbData::Sparse { dim, sample_offsets: i64s(i + 1)?, indices, values: values(i + 3)? };
                i += 4;
                d
            }
            "offsets" if table.len() >= i + 3 => {
                let d = MbData::Strings { offsets: i64s(i + 1)?, bytes: data(i + 2).to_vec() };
                i += 3;
                d
            }
            _ => return Err(LayoutError::Corrupt("unknown stream layout")),
        };
        streams.push(MbStream { sequence_offsets, data });
    }
    Ok(Minibatch {
        index: sh.minibatch,
        sweep: 0,
        end_of_sweep: false,
        position: 0,
        fingerprint: sh.fingerprint,
        streams,
    })
}
