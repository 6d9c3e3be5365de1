//! Configuration keys of the deepx instance formats (`label_size`, `w`, `uuid`, `x_size`,
//! `x_hist_item_size`) and deepx's `instance_reader_config` string.
//!
//! The formats themselves are not implemented yet (issue 6): validation accepts their keys so
//! that configs can be written, and reports the format as unsupported.

use crate::config::walk::{Table, Walker};
use crate::config::{DeepxOptions, FormatKind};

/// Reads the deepx keys of a dataset table.
pub(crate) fn parse(w: &mut Walker, t: &mut Table<'_>, format: FormatKind) -> Option<DeepxOptions> {
    let opts = DeepxOptions {
        label_size: t.usize(w, "label_size", 1, 1 << 20).unwrap_or(1),
        w: t.boolean(w, "w").unwrap_or(false),
        uuid: t.boolean(w, "uuid").unwrap_or(false),
        x_size: t.usize(w, "x_size", 1, 1 << 16),
        x_hist_item_size: t.usize(w, "x_hist_item_size", 1, 1 << 16),
    };
    let _ = t.string(w, "instance_reader_config");
    w.issue(&t.key_path("format"), &format!("format {format:?} is not implemented yet (deepx formats: issue 6)"));
    Some(opts)
}
