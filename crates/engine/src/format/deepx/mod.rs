//! deepx's instance formats `libsvm`, `libsvm_ex` and `uch` (with svmlight options for `libsvm`):
//! the line index pass ([`index`]), the number grammar ([`number`]), the stream schema
//! ([`schema`]) and the parse pass ([`decode`]).
//!
//! Every line is one instance, i.e. a sequence of nominal length 1; a minibatch of N samples is a
//! deepx batch of N instances. The behaviour matched is deepx's instance readers (`docs/differences.md` lists the departures);
//! every deliberate difference from deepx is listed in `docs/differences.md` (section "deepx").
//! Knows nothing of actors, sessions or sampling.

pub mod decode;
pub mod index;
pub mod number;
mod pow10;
pub mod schema;

pub use decode::{DeepxBufs, DeepxDecoder, DeepxElement, LineContext, SparseBuf};
pub use index::{index_file, index_reader, LineIndexOptions};
pub use schema::{Layout, Schema};
