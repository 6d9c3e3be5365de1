//! Checks between `[daemon]`'s paths and the datasets' files that neither alone can make.

use std::collections::BTreeMap;
use std::path::Path;

use super::walk::Walker;
use super::DatasetConfig;

/// A dataset whose files take in `state_dir` would read the daemon's own checkpoint, lock and
/// caches as data, and fail to open once they change (found by a probe: `validate` passed a
/// `state_dir` inside a `whole_file` dataset's directory). Refused with the dataset's path.
pub(super) fn state_dir_outside_datasets(w: &mut Walker, state_dir: &Path, datasets: &BTreeMap<String, DatasetConfig>) {
    // As written and with its links resolved: a glob may spell either.
    let written = state_dir.join("checkpoint.json");
    let state_dir = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_owned());
    let inside = state_dir.join("checkpoint.json");
    for (name, d) in datasets {
        for entry in d.sources.iter().flat_map(|s| &s.files) {
            let text = entry.to_string_lossy();
            if text.starts_with(minibatchd_engine::remote::SCHEME) {
                continue;
            }
            let takes_it = if minibatchd_engine::dataset::is_pattern(entry) {
                glob::Pattern::new(&text).is_ok_and(|p| p.matches_path(&inside) || p.matches_path(&written))
            } else {
                entry.is_dir() && std::fs::canonicalize(entry).is_ok_and(|dir| state_dir.starts_with(dir))
            };
            if takes_it {
                w.issue(
                    &format!("datasets.{name}.files"),
                    &format!(
                        "{} takes in daemon.state_dir ({}): the daemon would read its own checkpoint, lock and caches \
                         as data; put state_dir outside the datasets' files",
                        entry.display(),
                        state_dir.display()
                    ),
                );
            }
        }
    }
}
