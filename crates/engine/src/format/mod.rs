//! Data formats: one module per format, each with an index pass and a decoder. Nothing here
//! knows about actors, sessions or sampling.
//!
//! * [`index`]: sequence and chunk descriptors shared by all formats, and CNTK's chunking rule;
//! * [`index_cache`]: the on-disk index cache (versioned, atomic, validated against the data file);
//! * [`chunk`]: the columnar parsed chunk that sessions share;
//! * [`errors`]: locations, malformed-input kinds and the `max_errors` budget;
//! * [`ctf`]: CNTK Text Format;
//! * [`deepx`]: deepx's `libsvm`, `libsvm_ex` and `uch` (and svmlight variants);
//! * [`inflate`]: `.gz` inputs, decompressed once into `state_dir`;
//! * [`tfrecord`]: TensorFlow's TFRecord files, and `tf.train.Example` records;
//! * [`fixed`]: fixed-length records and their raw decoder (`decode_raw`);
//! * [`csv`]: CSV lines and `decode_csv`'s fields;
//! * [`whole_file`]: whole files, each one record of its bytes and path;
//! * [`record`]: the record reader every format implements (the index pass behind one trait);
//! * [`registry`]: the record formats' readers and decoders, in one place;
//! * [`stream_buf`]: the decoders that fill one `StreamBuf` per stream;
//! * `parts`: the index pass of one large file on several threads.

pub mod chunk;
pub mod csv;
pub mod ctf;
pub mod deepx;
pub mod errors;
pub mod fixed;
pub mod index;
pub mod index_cache;
pub mod inflate;
pub mod line_chunks;
pub mod parsed_cache;
pub(crate) mod parts;
pub mod record;
pub mod registry;
pub mod stream_buf;
pub mod tfrecord;
pub mod whole_file;

pub use chunk::{Indices, ParsedChunk, StreamData, StreamKind, StreamSpec, StreamValues, Values};
pub use errors::{DataError, ErrorBudget, ErrorKind, Location, Malformed};
pub use index::{build_chunks, ChunkDesc, FileIndex, SequenceDesc, Sequences};
