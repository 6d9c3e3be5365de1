//! What names and what versions an object: the key a request sends, and whether an answer is
//! of the version listed.

use object_store::path::Path as Key;

use super::{other, ObjectMeta, RemoteError};

/// The `object_store` path of `key`, as S3 spells it. Found by a probe: `Path::from` percent-encoded
/// what it takes for illegal (`%`, `#`, `?`, `~`, brackets, any non-ASCII character), and the
/// request encoded it again, so such keys were asked for under another name ("no such object");
/// parsed, the key is sent as it is, encoded once by the request.
pub(crate) fn key_of(url: &str, key: &str) -> Result<Key, RemoteError> {
    Key::parse(key).map_err(|e| {
        other(
            url,
            format!(
                "the key {key:?} cannot be read: {e} (keys with an empty segment (`a//b`), a `.` or `..` segment, or \
                 a control character are not supported)"
            ),
        )
    })
}

/// Whether a response's object (`size`, `etag`, `modified`: its modification time in Unix
/// seconds) is the version `object` was listed as. ETags are compared without quotes and a weak
/// `W/` mark. An object listed without one (a server that sends none) is checked by size and
/// modification time, to the second: found by a probe, checked by size alone, a rewrite of the
/// same size was read half old, half new. A response without an ETag for an object listed with
/// one is not proven to be that version (a server or proxy that drops `If-Match` and the ETag
/// could send any version of the same size).
pub(crate) fn same_version(object: &ObjectMeta, size: u64, etag: Option<&str>, modified: i64) -> bool {
    let bare = |t: &str| t.trim_start_matches("W/").trim_matches('"').to_owned();
    size == object.size
        && if object.etag.starts_with(NO_ETAG) {
            object.etag == modified_tag(modified)
        } else {
            etag.is_some_and(|t| bare(t) == bare(&object.etag))
        }
}

/// What stands for the ETag of an object its server lists without one.
pub(crate) const NO_ETAG: &str = "last-modified:";

/// The version of an object listed without an ETag: its modification time, in Unix seconds (the
/// precision of a response's `Last-Modified`).
pub(crate) fn modified_tag(unix_secs: i64) -> String {
    format!("{NO_ETAG}{unix_secs}")
}
