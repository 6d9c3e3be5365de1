//! The tensor table of a slot — the one definition that minibatch assembly (the engine's
//! `Gathered`), the owned [`Minibatch`](crate::owned::Minibatch) and the ring writer share.
//!
//! A slot carries, per stream in the dataset's stream order, the tensors of [`Field`] in this
//! order (`S` = the stream's name):
//! * `S/sequence_offsets` int64 `[num_sequences + 1]`, over samples;
//! * dense: `S/values` float32|float64 `[num_samples, dim]`;
//! * sparse: `S/sample_offsets` int64 `[num_samples + 1]`, `S/indices` int32|uint64 `[nnz]`,
//!   `S/values` float32|float64 `[nnz]`;
//! * strings: `S/offsets` int64 `[num_samples + 1]`, `S/bytes` uint8 `[len]`.
//!
//! A mixture's minibatch then carries, under the name `mixture`: `mixture/sources` int32
//! `[num_sequences]` (the source of each sequence), `mixture/sweeps_ended` int32 `[k]` (the
//! sources that completed a sweep in it) and `mixture/state` int64 `[4 + 4 × sources]` (the
//! mixture's state after it: step, slots, samples, ended, then per source its position, sequences
//! taken, credit and weight parts).

pub use crate::layout::DType;

/// Which array of a stream a tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `sequence_offsets`, int64 `[num_sequences + 1]`.
    SequenceOffsets,
    /// Dense `values` `[num_samples, dim]`.
    DenseValues,
    /// Sparse `sample_offsets`, int64 `[num_samples + 1]`.
    SampleOffsets,
    /// Sparse `indices`.
    Indices,
    /// Sparse `values`.
    SparseValues,
    /// Strings `offsets`, int64 `[num_samples + 1]`.
    StringOffsets,
    /// Strings `bytes`.
    StringBytes,
    /// A mixture's `sources`, int32 `[num_sequences]`.
    MixtureSources,
    /// A mixture's `sweeps_ended`, int32 `[k]`.
    MixtureSweepsEnded,
    /// A mixture's `state`, int64 `[4 + 4 × sources]`.
    MixtureState,
}

impl Field {
    /// The tensor name's field part.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::SequenceOffsets => "sequence_offsets",
            Self::DenseValues | Self::SparseValues => "values",
            Self::SampleOffsets => "sample_offsets",
            Self::Indices => "indices",
            Self::StringOffsets => "offsets",
            Self::StringBytes => "bytes",
            Self::MixtureSources => "sources",
            Self::MixtureSweepsEnded => "sweeps_ended",
            Self::MixtureState => "state",
        }
    }
}

/// One tensor of a slot, in table order: everything but its name and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// Stream index (the name's `S` part).
    pub stream: usize,
    /// Which array.
    pub field: Field,
    /// Element type.
    pub dtype: DType,
    /// Shape: `[n]` or `[n, dim]` (`ndim` says which).
    pub shape: [u64; 2],
    /// 1 or 2.
    pub ndim: usize,
}

impl TensorDesc {
    /// A one-dimensional tensor of `n` elements.
    #[must_use]
    pub fn vector(stream: usize, field: Field, dtype: DType, n: usize) -> Self {
        Self { stream, field, dtype, shape: [n as u64, 0], ndim: 1 }
    }

    /// A `rows × cols` tensor.
    #[must_use]
    pub fn matrix(stream: usize, field: Field, dtype: DType, rows: usize, cols: usize) -> Self {
        Self { stream, field, dtype, shape: [rows as u64, cols as u64], ndim: 2 }
    }

    /// The used dimensions of the shape.
    #[must_use]
    pub fn dims(&self) -> &[u64] {
        &self.shape[..self.ndim.min(2)]
    }

    /// Bytes of the data.
    #[must_use]
    pub fn nbytes(&self) -> usize {
        let n = self.dims().iter().product::<u64>();
        usize::try_from(n).unwrap_or(usize::MAX).saturating_mul(self.dtype.size())
    }
}

/// Anything a ring slot can be written from: the engine's located-but-not-copied minibatch
/// (`Gathered`, which copies samples straight from parsed chunks) and the owned
/// [`Minibatch`](crate::owned::Minibatch) (tests, tools). Both produce the same bytes for the same
/// minibatch (`minibatchd-engine`'s tests check it).
pub trait SlotSource {
    /// The minibatch's 0-based index in its session.
    fn index(&self) -> u64;
    /// The data-order ledger's fingerprint of the minibatch.
    fn fingerprint(&self) -> u64;
    /// The tensor table, in slot order.
    fn tensors(&self) -> Vec<TensorDesc>;
    /// Writes the data of `tensor` (one of [`SlotSource::tensors`]) into `out`, which is exactly
    /// `tensor.nbytes()` long.
    fn fill(&self, tensor: &TensorDesc, out: &mut [u8]);
}
