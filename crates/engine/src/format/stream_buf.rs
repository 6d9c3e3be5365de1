//! The decoders whose chunk buffers are one [`StreamBuf`] per stream, filled a record at a time
//! (the Example, raw and CSV decoders): [`StreamBufDecoder`], which `crate::format::record`
//! makes a `RecordDecoder`. Apart from `record`, so that the formats that implement it do not
//! depend on the module that names every format.

use crate::format::chunk::{StreamData, StreamSpec};
use crate::format::ctf::StreamBuf;
use crate::format::deepx::DeepxElement;
use crate::format::deepx::LineContext as RecordAt;
use crate::format::errors::Malformed;

/// Most values a stream's buffer reserves before its chunk is decoded: beyond it the buffer grows
/// as values come (within the chunk's memory share, checked record by record), so a chunk of many
/// records that hold nothing — empty lines of a CSV file of wide rows — reserves no more than this.
pub const MAX_RESERVED_VALUES: usize = 1 << 22;

/// An empty stream buffer for a chunk of `records` records: its sequence offsets reserved
/// (at most [`MAX_RESERVED_VALUES`] of them up front), as every record decoder's buffers start.
#[must_use]
pub fn record_buffer<T>(records: usize) -> StreamBuf<T> {
    let mut b = StreamBuf::new();
    b.seq_offsets.reserve(records.min(MAX_RESERVED_VALUES));
    b
}

/// A decoder whose chunk buffers are one [`StreamBuf`] per stream, filled a record at a time —
/// the Example, raw and CSV decoders. Implementing it makes a decoder a
/// `crate::format::record::RecordDecoder`.
pub trait StreamBufDecoder: Send + Sync {
    /// The streams, in the order of the parsed chunk's.
    fn specs(&self) -> Vec<StreamSpec>;

    /// Empty buffers for a chunk of `records` records.
    fn buffers<T: DeepxElement>(&self, records: usize) -> Vec<StreamBuf<T>>;

    /// Decodes one record (at `at`, its line or record number 0-based; its [`Locate::location`](crate::format::errors::Locate::location)
    /// names it 1-based in an error) into a sample of each stream, or pushes its malformed place
    /// to `errors` and leaves a sequence of 0 samples.
    fn decode_record<T: DeepxElement>(
        &self,
        record: &[u8],
        at: &RecordAt<'_>,
        out: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    );

    /// What the buffers hold, in values of `T`: values, sparse indices, strings' bytes, and the
    /// sample and sequence offsets (a chunk's are bounded by its share of the memory limit,
    /// checked after every record: a short record may cost many — a default of `dim` values,
    /// empty byte strings, a sequence offset in every stream).
    fn dense_values<T: DeepxElement>(&self, out: &[StreamBuf<T>]) -> usize {
        let size = std::mem::size_of::<T>().max(1);
        out.iter()
            .map(|b| {
                let offsets = (b.sample_offsets.len() + b.seq_offsets.len()) * 8;
                b.values.len() + (b.indices.len() * 4 + b.bytes.len() + offsets) / size
            })
            .sum()
    }

    /// The chunk's streams.
    fn chunk_streams<T: DeepxElement>(&self, out: Vec<StreamBuf<T>>) -> Vec<StreamData>;
}
