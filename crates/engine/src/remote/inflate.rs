//! Gzip objects: an object whose first two bytes are gzip's is decompressed once into the state
//! directory (`crate::format::inflate`'s copies, with its limits), and read from there.

use std::path::{Path, PathBuf};

use super::{shared_index_stamp, ObjectMeta, Remote, RemoteError};
use crate::format::errors::DataError;
use crate::format::inflate::{inflated_copy, GZIP_MAGIC};
use crate::options::InflateLimits;

/// The decompressed copy of the object `object` if it is gzip data (by its first two bytes),
/// else `None`: as `crate::format::inflate::readable_path`, the object streamed once from
/// `remote`.
///
/// # Errors
/// As `crate::format::inflate::readable_path`, and object-storage errors naming the URL.
pub fn inflated_object(
    object: &ObjectMeta,
    remote: &Remote,
    state_dir: &Path,
    limits: &InflateLimits,
) -> Result<Option<PathBuf>, DataError> {
    let mut magic = Vec::new();
    remote.store.read_range(object, 0, object.size.min(2), &mut magic).map_err(RemoteError::into_data)?;
    if magic != GZIP_MAGIC {
        return Ok(None);
    }
    let stamp = shared_index_stamp(object);
    let name = PathBuf::from(&object.url);
    inflated_copy(&name, &stamp, state_dir, limits, &mut || remote.store.open(object).map_err(RemoteError::into_data))
        .map(Some)
}
