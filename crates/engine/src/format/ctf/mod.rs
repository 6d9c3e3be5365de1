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

/// The bytes of a UTF-8 byte-order mark that `head` (a file's first bytes) starts with: CNTK 2.7
/// skips them one at a time as far as they match, so a file that starts with `EF` or `EF BB` alone
/// is read from its next byte, and `EF BF` fails at offset 1 (checked against CNTK 2.7).
#[must_use]
pub fn bom_prefix(head: &[u8]) -> usize {
    head.iter().zip([0xEF, 0xBB, 0xBF]).take_while(|&(&a, b)| a == b).count()
}
