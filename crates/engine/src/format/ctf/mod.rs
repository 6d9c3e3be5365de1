//! CNTK Text Format: the index pass ([`index`]), CNTK's number grammar ([`number`]) and the parse
//! pass ([`decode`]). Knows nothing of actors, sessions or sampling: it turns bytes into
//! [`FileIndex`](crate::format::index::FileIndex)es and columnar stream buffers.

pub mod decode;
mod element;
pub mod index;
pub mod number;
mod scan;

pub use decode::{CtfDecoder, SeqContext, StreamBuf};
pub use element::Element;
pub use index::{index_file, index_reader, CtfIndexOptions};
