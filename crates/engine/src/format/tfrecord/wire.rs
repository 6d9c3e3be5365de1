//! A protobuf wire-format reader over one message's bytes, for the `tf.train.Example` decoder
//! ([`super::example`]): fields one at a time, borrowed from the bytes (no generated code, no
//! copy), with the malformed shapes as small errors.

/// A protobuf wire-format reader over one message's bytes.
pub(super) struct Wire<'a> {
    b: &'a [u8],
    p: usize,
}

/// A field's value as the wire carries it.
#[derive(Clone, Copy)]
pub(super) enum Field<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Why bytes are no valid message: small and `Copy`, so that the per-field calls of a record's
/// decode return a few words (a `String` error made each call's result a large value moved
/// through memory); it becomes the record's message only when a record is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WireError {
    VarintPastEnd,
    VarintOver64Bits,
    VarintOverTenBytes,
    FieldPastEnd,
    LengthPastMessage,
    FieldNumberZero,
    WireType(u64),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::VarintPastEnd => f.write_str("a varint runs past the end"),
            WireError::VarintOver64Bits => f.write_str("a varint of more than 64 bits"),
            WireError::VarintOverTenBytes => f.write_str("a varint of more than ten bytes"),
            WireError::FieldPastEnd => f.write_str("a field runs past the end"),
            WireError::LengthPastMessage => f.write_str("a length past the message"),
            WireError::FieldNumberZero => f.write_str("a field number 0"),
            WireError::WireType(w) => write!(f, "wire type {w} (groups are not in Example)"),
        }
    }
}

impl From<WireError> for String {
    /// The record's message: what is wrong, said to be about the record's protobuf (found by a
    /// probe: "a field runs past the end" alone did not say that the record is no Example).
    fn from(e: WireError) -> Self {
        format!("the record is not a valid tf.train.Example protobuf: {e}")
    }
}

impl<'a> Wire<'a> {
    pub(super) fn new(b: &'a [u8]) -> Self {
        Self { b, p: 0 }
    }

    /// Whether every byte was read.
    pub(super) fn at_end(&self) -> bool {
        self.p == self.b.len()
    }

    /// A varint; one of a single byte (field keys, lengths under 128: most of an Example's)
    /// without the loop.
    #[inline]
    pub(super) fn varint(&mut self) -> Result<u64, WireError> {
        match self.b.get(self.p) {
            Some(&byte) if byte < 0x80 => {
                self.p += 1;
                Ok(u64::from(byte))
            }
            _ => self.long_varint(),
        }
    }

    fn long_varint(&mut self) -> Result<u64, WireError> {
        let mut v: u64 = 0;
        for shift in (0..70).step_by(7) {
            let Some(&byte) = self.b.get(self.p) else { return Err(WireError::VarintPastEnd) };
            self.p += 1;
            if shift == 63 && byte > 1 {
                return Err(WireError::VarintOver64Bits);
            }
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::VarintOverTenBytes)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.p.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(WireError::FieldPastEnd)?;
        let s = &self.b[self.p..end];
        self.p = end;
        Ok(s)
    }

    /// The next field (number and value), or `None` at the end of the message.
    #[inline]
    pub(super) fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, WireError> {
        if self.at_end() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (number, wire) = (key >> 3, key & 7);
        if number == 0 {
            return Err(WireError::FieldNumberZero);
        }
        let value = match wire {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed64
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| WireError::LengthPastMessage)?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default())),
            w => return Err(WireError::WireType(w)),
        };
        Ok(Some((number, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::{Wire, WireError};

    #[test]
    fn a_field_number_0_is_malformed_where_tensorflow_skips_it() {
        // Key 0x02: field 0, wire type 2 (TensorFlow 2.21 parses such an Example; protobuf
        // forbids the number: docs/differences.md, TFRecord 12).
        assert_eq!(Wire::new(&[0x02, 0x00]).next().err(), Some(WireError::FieldNumberZero));
        assert!(matches!(Wire::new(&[0x0a, 0x00]).next(), Ok(Some((1, _)))));
    }
}
