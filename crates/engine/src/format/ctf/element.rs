//! The element types a CTF (or deepx) stream's values are stored as, shared by the parse pass
//! ([`super::decode`]) and its dense fast path ([`super::scan`]).

use minibatchd_sys::simd::DenseRun;

use crate::format::chunk::Values;

/// An element type values are stored as.
pub trait Element: Copy + Default + Send + Sync + 'static {
    /// Narrows CNTK's `f64` accumulator, as `static_cast<ElemType>`.
    fn from_f64(v: f64) -> Self;
    /// A stored `f32` (a TFRecord `float_list` value): its bits as they are in `f32`, widened
    /// exactly in `f64`.
    fn from_f32(v: f32) -> Self;
    /// Wraps a vector of decoded values into the chunk's [`Values`].
    fn into_values(v: Vec<Self>) -> Values;
    /// The dense fast path's vector kernel for this element type
    /// ([`minibatchd_sys::simd::dense_run_f32`]).
    fn dense_run(bytes: &[u8], out: &mut [Self]) -> DenseRun;
}

impl Element for f32 {
    #[inline]
    #[allow(clippy::cast_possible_truncation)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }
    fn into_values(v: Vec<Self>) -> Values {
        Values::F32(v.into())
    }
    #[inline]
    fn dense_run(bytes: &[u8], out: &mut [Self]) -> DenseRun {
        minibatchd_sys::simd::dense_run_f32(bytes, out)
    }
}

impl Element for f64 {
    #[inline]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        f64::from(v)
    }
    fn into_values(v: Vec<Self>) -> Values {
        Values::F64(v.into())
    }
    #[inline]
    fn dense_run(bytes: &[u8], out: &mut [Self]) -> DenseRun {
        minibatchd_sys::simd::dense_run_f64(bytes, out)
    }
}
