//! The streams of a deepx dataset: deepx's tensor names, their storage and dimensions.
//!
//! | stream | kind | dim | present |
//! |---|---|---|---|
//! | `__instX` (libsvm), `__instX0…` (`libsvm_ex`), `__instXuser`, `__instXcand`, `__instXhist0…` (uch) | sparse, u64 ids, f32/f64 values | 0 (ids unbounded) | always |
//! | `__instXhist_size` (uch) | dense | 1 | always |
//! | `__instY` | dense | `label_size` | always |
//! | `__instW` | dense | `label_size` | `w` |
//! | `__instUUID` | strings | 0 | `uuid` |
//! | `__instQID` (libsvm, svmlight) | dense | 1 | `qid` |
//!
//! deepx's `[batch, label_size]` tensors are a minibatch's `[num_samples, dim]` dense values; a
//! CSR tensor is the sparse stream's `sample_offsets` (deepx's `row_offset`), `indices` (`col`)
//! and `values`. `__instXhist_size` is rank 1 in deepx (`[batch]`): here it is `[batch, 1]`.

use crate::format::chunk::{StreamKind, StreamSpec};
use crate::options::{DeepxOptions, FormatKind};

/// deepx's `X_NAME`.
pub const X_NAME: &str = "__instX";
/// deepx's `X_USER_NAME`.
pub const X_USER_NAME: &str = "__instXuser";
/// deepx's `X_CAND_NAME`.
pub const X_CAND_NAME: &str = "__instXcand";
/// deepx's `X_HIST_NAME` (followed by the slot number).
pub const X_HIST_NAME: &str = "__instXhist";
/// deepx's `X_HIST_SIZE_NAME`.
pub const X_HIST_SIZE_NAME: &str = "__instXhist_size";
/// deepx's `Y_NAME`.
pub const Y_NAME: &str = "__instY";
/// deepx's `W_NAME`.
pub const W_NAME: &str = "__instW";
/// deepx's `UUID_NAME`.
pub const UUID_NAME: &str = "__instUUID";
/// The svmlight query id (not a deepx tensor).
pub const QID_NAME: &str = "__instQID";

/// The body grammar of a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One feature series.
    Libsvm,
    /// `groups` series separated by `|`.
    LibsvmEx {
        /// `x_size`.
        groups: usize,
    },
    /// user | candidate | history items.
    Uch {
        /// `x_hist_item_size`.
        hist: usize,
    },
}

/// Everything that shapes the parse of a deepx dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // independent deepx options, one flag each (not states)
pub struct Schema {
    /// The body grammar.
    pub layout: Layout,
    /// Labels per line.
    pub label_size: usize,
    /// Produce `__instW`.
    pub w: bool,
    /// Produce `__instUUID`.
    pub uuid: bool,
    /// svmlight `qid:N` (required on every line) into `__instQID`.
    pub qid: bool,
    /// svmlight `#` comments.
    pub comments: bool,
    /// Written ids are 1-based.
    pub one_based: bool,
}

impl Schema {
    /// The schema of a validated deepx dataset.
    #[must_use]
    pub fn new(format: FormatKind, o: &DeepxOptions) -> Self {
        let layout = match format {
            FormatKind::LibsvmEx => Layout::LibsvmEx { groups: o.x_size.unwrap_or(1) },
            FormatKind::Uch => Layout::Uch { hist: o.x_hist_item_size.unwrap_or(1) },
            // `libsvm`; no other format has a deepx schema.
            _ => Layout::Libsvm,
        };
        Self {
            layout,
            label_size: o.label_size.max(1),
            w: o.w,
            uuid: o.uuid,
            qid: o.qid,
            comments: o.comments,
            one_based: o.feature_index_base == 1,
        }
    }

    /// Number of sparse (CSR) streams.
    #[must_use]
    pub fn num_sparse(&self) -> usize {
        match self.layout {
            Layout::Libsvm => 1,
            Layout::LibsvmEx { groups } => groups,
            Layout::Uch { hist } => 2 + hist,
        }
    }

    /// The streams, in the order of the parsed chunk's streams.
    #[must_use]
    pub fn specs(&self) -> Vec<StreamSpec> {
        let sparse = |name: String| StreamSpec { name, kind: StreamKind::SparseU64, dim: 0 };
        let dense = |name: &str, dim: usize| StreamSpec { name: name.to_owned(), kind: StreamKind::Dense, dim };
        let mut out = Vec::new();
        match self.layout {
            Layout::Libsvm => out.push(sparse(X_NAME.into())),
            Layout::LibsvmEx { groups } => out.extend((0..groups).map(|g| sparse(format!("{X_NAME}{g}")))),
            Layout::Uch { hist } => {
                out.push(sparse(X_USER_NAME.into()));
                out.push(sparse(X_CAND_NAME.into()));
                out.extend((0..hist).map(|h| sparse(format!("{X_HIST_NAME}{h}"))));
                out.push(dense(X_HIST_SIZE_NAME, 1));
            }
        }
        out.push(dense(Y_NAME, self.label_size));
        if self.w {
            out.push(dense(W_NAME, self.label_size));
        }
        if self.uuid {
            out.push(StreamSpec { name: UUID_NAME.into(), kind: StreamKind::Strings, dim: 0 });
        }
        if self.qid {
            out.push(dense(QID_NAME, 1));
        }
        out
    }
}
