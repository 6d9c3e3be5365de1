//! Compressed objects: a gzip object (by its first two bytes, or as the dataset's `compression`
//! says) or a zlib one (as it says) is decompressed once into the state
//! directory (`crate::format::inflate`'s copies, with its limits), and read from there.

use std::path::{Path, PathBuf};

use super::{shared_index_stamp, ObjectMeta, Remote, RemoteError};
use crate::format::errors::DataError;
use crate::format::inflate::{codec_for, inflated_copy, Compression, GZIP_MAGIC};
use crate::options::InflateLimits;

/// The decompressed copy of the object `object` as `compression` says (`Auto`: if it is gzip
/// data, by its first two bytes), else `None`: as `crate::format::inflate::readable_path_as`,
/// the object streamed once from `remote`.
///
/// # Errors
/// As `crate::format::inflate::readable_path_as`, and object-storage errors naming the URL.
pub fn inflated_object(
    object: &ObjectMeta,
    remote: &Remote,
    compression: Compression,
    state_dir: &Path,
    limits: &InflateLimits,
) -> Result<Option<PathBuf>, DataError> {
    let gzip = || -> Result<bool, DataError> {
        let mut magic = Vec::new();
        remote
            .store
            .read_range(object, 0, object.size.min(GZIP_MAGIC.len() as u64), &mut magic)
            .map_err(RemoteError::into_data)?;
        Ok(magic == GZIP_MAGIC)
    };
    let Some(codec) = codec_for(compression, &object.url, gzip)? else { return Ok(None) };
    let stamp = shared_index_stamp(object);
    let name = PathBuf::from(&object.url);
    inflated_copy(&name, &stamp, codec, state_dir, limits, &mut || {
        remote.store.open(object).map_err(RemoteError::into_data)
    })
    .map(Some)
}
