//! Fetches ahead of the parsers (the readahead stage), which leave a range the cache has no
//! room for to its parser rather than download it twice.

use super::{DataError, ObjectCache, ObjectMeta, ObjectStore};

/// What a fetch does with a range the cache has no room for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoRoom {
    /// Reads it from the store into memory, uncached: a parser needs it now.
    ReadIntoMemory,
    /// Leaves it: a fetch ahead of the parser, which reads it itself later.
    Skip,
}

impl ObjectCache {
    /// Fetches `start..end` of `object` into the cache ahead of its parser (the readahead stage):
    /// `true` once the range is on disk, `false` when the cache has no room for it now — then
    /// nothing is downloaded, and the parser reads the range itself when it needs it (a range
    /// read ahead into memory would be dropped unused and downloaded twice).
    ///
    /// # Errors
    /// The store's errors (naming the URL), and I/O errors of the cache directory.
    pub fn fetch_ahead(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectMeta,
        start: u64,
        end: u64,
    ) -> Result<bool, DataError> {
        self.fetch_kept(store, object, start, end, NoRoom::Skip).map(|c| c.is_some()).map_err(|(e, _)| e)
    }
}
