//! The record formats, registered in one place: for each [`RecordOptions`] variant, its
//! [`RecordReader`] (how a file splits into records), its decoder (how a record becomes samples
//! of the dataset's streams) and those streams. The dataset indexes, chunks, decodes, caches and
//! serves every record format through this module alone, so a new one needs its reader and
//! decoder module, a variant here (and in [`RecordOptions`] and `FormatKind`), and its dataset
//! table in the daemon's configuration — nothing in the daemon, `dump`, the parsed cache,
//! object storage or the clients (`docs/formats.md`, "Adding a format").

use crate::format::chunk::StreamSpec;
use crate::format::csv::CsvDecoder;
use crate::format::fixed::RawDecoder;
use crate::format::record::{
    CsvReader, FixedLengthReader, RecordDecoder, RecordReader, TfRecordReader, WholeFileReader,
};
use crate::format::tfrecord::example::ExampleDecoder;
use crate::format::whole_file::WholeFileDecoder;
use crate::options::RecordOptions;

/// The decoder of a record format.
#[derive(Debug, Clone)]
pub enum RecordFormatDecoder {
    /// `tf.train.Example`.
    Example(ExampleDecoder),
    /// `decode_raw` of fixed-length records.
    Raw(RawDecoder),
    /// `decode_csv`.
    Csv(CsvDecoder),
    /// A whole file's bytes and path.
    WholeFile(WholeFileDecoder),
}

/// What runs with a record format's decoder, whatever its type: the dataset's chunk decode
/// ([`RecordFormatDecoder::visit`]).
pub trait DecoderVisitor {
    /// What the visit gives.
    type Out;

    /// Runs with decoder `d`.
    fn visit<D: RecordDecoder>(self, d: &D) -> Self::Out;
}

impl RecordFormatDecoder {
    /// Runs `v` with the decoder.
    pub fn visit<V: DecoderVisitor>(&self, v: V) -> V::Out {
        match self {
            Self::Example(d) => v.visit(d),
            Self::Raw(d) => v.visit(d),
            Self::Csv(d) => v.visit(d),
            Self::WholeFile(d) => v.visit(d),
        }
    }
}

/// A record format opened from its options: reader, decoder and the dataset's streams.
pub struct RecordFormat {
    /// Splits each file into records.
    pub reader: Box<dyn RecordReader>,
    /// Decodes each record.
    pub decoder: RecordFormatDecoder,
    /// The streams, in the parsed chunks' order.
    pub streams: Vec<StreamSpec>,
}

/// The reader, decoder and streams of `options`' format.
#[must_use]
pub fn open(options: &RecordOptions) -> RecordFormat {
    let (reader, decoder): (Box<dyn RecordReader>, RecordFormatDecoder) = match options {
        RecordOptions::TfRecord(features) => {
            (Box::new(TfRecordReader), RecordFormatDecoder::Example(ExampleDecoder::new(features)))
        }
        RecordOptions::FixedLength(fixed) => (
            Box::new(FixedLengthReader(fixed.layout)),
            RecordFormatDecoder::Raw(RawDecoder::new(fixed.streams.clone())),
        ),
        RecordOptions::Csv(csv) => (
            Box::new(CsvReader(csv.layout)),
            RecordFormatDecoder::Csv(CsvDecoder::new(csv.options.clone(), csv.streams.clone())),
        ),
        RecordOptions::WholeFile => (Box::new(WholeFileReader), RecordFormatDecoder::WholeFile(WholeFileDecoder)),
    };
    let streams = decoder.visit(Streams);
    RecordFormat { reader, decoder, streams }
}

/// The visit that asks a decoder for its streams.
struct Streams;

impl DecoderVisitor for Streams {
    type Out = Vec<StreamSpec>;

    fn visit<D: RecordDecoder>(self, d: &D) -> Vec<StreamSpec> {
        d.streams()
    }
}
