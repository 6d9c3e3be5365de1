//! The index pass's stream of a whole object, copied into the object cache as it is read
//! ([`ObjectCache::tee`]).

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;

use super::trailer::{entry_sum, trailer, TRAILER_BYTES};
use super::ObjectCache;
use crate::remote::ObjectMeta;
use crate::state_file;

impl ObjectCache {
    /// `reader` (the whole of `object`, being streamed by the index pass) with every byte it
    /// yields also written to the cache as the object's whole range, kept once the stream ends
    /// with exactly the object's size: the chunks of the first sweep are then read from disk,
    /// not fetched again. Objects larger than half the cache are not kept.
    #[must_use]
    pub fn tee<'a>(&'a self, object: &ObjectMeta, reader: Box<dyn Read + Send + 'a>) -> Box<dyn Read + Send + 'a> {
        if object.size == 0 || object.size > self.max_bytes / 2 || self.contains(object, 0, object.size) {
            return reader;
        }
        if state_file::secure_dir(&self.dir).is_err() {
            return reader;
        }
        // Its room is reserved before a byte is written (found by a probe: the copy was counted
        // only once complete, and went past the bound with the entries already there); when
        // other writes hold it, the object is not kept.
        let reserved = self.on_disk(object.size + TRAILER_BYTES);
        if !self.reserve(&mut self.lock(), reserved) {
            return reader;
        }
        let Ok((tmp, file)) = state_file::create_temp(&self.dir, "whole") else {
            self.release(reserved);
            return reader;
        };
        Box::new(Tee {
            cache: self,
            object: object.clone(),
            reader,
            out: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
            tmp,
            written: 0,
            reserved,
            crc: entry_sum(&Self::key(object, 0, object.size)),
        })
    }
}

/// The index pass's stream of a whole object, copied into the cache as it is read.
struct Tee<'a> {
    cache: &'a ObjectCache,
    object: ObjectMeta,
    reader: Box<dyn Read + Send + 'a>,
    out: Option<std::io::BufWriter<File>>,
    tmp: PathBuf,
    written: u64,
    /// The room reserved for the copy ([`ObjectCache::reserve`]) until it is kept or given up.
    reserved: u64,
    crc: crc32fast::Hasher,
}

impl Read for Tee<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.reader.read(buf)?;
        if let Some(out) = &mut self.out {
            if n > 0 {
                if out.write_all(&buf[..n]).is_err() {
                    // The copy is given up; the stream goes on.
                    self.out = None;
                    let _ = std::fs::remove_file(&self.tmp);
                    self.cache.release(std::mem::take(&mut self.reserved));
                }
                self.crc.update(&buf[..n]);
                self.written += n as u64;
            } else if self.written == self.object.size {
                if let Some(mut out) = self.out.take() {
                    let crc = std::mem::take(&mut self.crc).finalize();
                    let reserved = std::mem::take(&mut self.reserved);
                    if out.write_all(&trailer(crc)).is_ok() && out.into_inner().is_ok() {
                        self.cache.keep_whole(&self.object, &self.tmp, reserved);
                    } else {
                        let _ = std::fs::remove_file(&self.tmp);
                        self.cache.release(reserved);
                    }
                }
            }
        }
        Ok(n)
    }
}

impl Drop for Tee<'_> {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            // Not read to the end: no partial copy is kept.
            let _ = std::fs::remove_file(&self.tmp);
        }
        if self.reserved > 0 {
            self.cache.release(std::mem::take(&mut self.reserved));
        }
    }
}
