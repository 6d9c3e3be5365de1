//! The record decoder of `tf.train.Example`: each configured feature of a record's Example into
//! a stream, as `tf.io.parse_single_example` reads a `FixedLenFeature` (a dense stream of `dim`
//! values), a `VarLenFeature` (a sparse stream whose sample holds value `i` at index `i`) or a
//! `FixedLenSequenceFeature([dim], allow_missing=True)` (a dense stream whose record has one
//! sample per `dim` values). A `bytes` feature is a strings stream, one sample per byte string:
//! exactly `dim` of them (fixed-length) or any number (sequence).
//!
//! The protobuf wire format is read directly (no generated code, no copy): `Example.features`
//! (field 1) is a `Features`, whose `feature` map (field 1) holds entries of a key (1) and a
//! `Feature` (2) — one of `bytes_list` (1), `float_list` (2), `int64_list` (3), each a list in
//! field 1, packed or not. The protobuf rules hold: the last entry of a repeated key wins, a
//! message field seen twice is merged (a list's values concatenate), the last member of a oneof
//! seen wins, unknown fields are skipped.
//!
//! A record is malformed — charged to `max_errors`, the record kept as an empty sequence, as a
//! bad line of the other formats is — when its data CRC fails, its bytes are no valid Example,
//! a feature has another type than configured, a fixed-length feature has another number of
//! values than `dim` (or is missing without a default), a var-length one has more than `dim`,
//! a sequence one a number of values that is no multiple of `dim`, or an `int64` value is not
//! exact in the dataset's precision. A feature present but with no
//! list set counts as missing, as `tf.io.parse_single_example` reads it (its default applies).

use std::path::Path;
use std::sync::Arc;

use crate::format::chunk::{StreamData, StreamKind, StreamSpec};
use crate::format::ctf::StreamBuf;
use crate::format::deepx::DeepxElement;
use crate::format::errors::{ErrorKind, Locate, Location, Malformed};
use crate::options::{ExampleFeature, FeatureDefault, FeatureLength, FeatureType};

use super::wire::{Field, Wire};

/// A feature's list as found: its kind (1 bytes, 2 float, 3 int64; 0 none) and the first list
/// message seen for it; any later ones of the same kind (rare: a writer that split a list; their
/// values concatenate) are in the record's [`Split`], so a record's table is plain words that
/// need no drop. `round` counts the feature's starts over (a repeated map key, another list
/// kind): the split lists of earlier rounds stay in [`Split`], ignored, so starting over costs the
/// same however many lists the record holds (removing them made a crafted record quadratic). A
/// start over takes two bytes at least, so a record (4 GiB at most) never wraps the count.
#[derive(Default, Clone, Copy)]
struct Found<'a> {
    kind: u64,
    first: Option<&'a [u8]>,
    split: bool,
    round: u32,
}

/// The list messages after the first of each feature, in the order seen: `(feature, its round,
/// list)`.
type Split<'a> = Vec<(usize, u32, &'a [u8])>;

impl<'a> Found<'a> {
    /// The feature starts over as `kind`: its lists so far are dropped.
    fn reset(&mut self, kind: u64) {
        *self = Found { kind, first: None, split: false, round: self.round.wrapping_add(1) };
    }

    fn push(&mut self, i: usize, list: &'a [u8], split: &mut Split<'a>) {
        if self.first.is_none() {
            self.first = Some(list);
        } else {
            split.push((i, self.round, list));
            self.split = true;
        }
    }

    /// Feature `i`'s list messages, in order.
    fn lists<'s>(&self, i: usize, split: &'s Split<'a>) -> impl Iterator<Item = &'a [u8]> + 's {
        let more = if self.split { &split[..] } else { &[][..] };
        let round = self.round;
        self.first.into_iter().chain(more.iter().filter(move |&&(j, r, _)| j == i && r == round).map(|&(_, _, l)| l))
    }
}

/// Features per record decoded without allocating their table (more take a `Vec`).
const INLINE_FEATURES: usize = 8;

/// Decodes `tf.train.Example` records into the configured features' streams.
#[derive(Debug, Clone)]
pub struct ExampleDecoder {
    features: Vec<ExampleFeature>,
}

impl ExampleDecoder {
    /// A decoder for `features` (one per stream, in the streams' order).
    #[must_use]
    pub fn new(features: &[ExampleFeature]) -> Self {
        Self { features: features.to_vec() }
    }

    /// The streams, in order: fixed-length and sequence features dense, var-length ones
    /// sparse, bytes features strings.
    #[must_use]
    pub fn specs(&self) -> Vec<StreamSpec> {
        self.features
            .iter()
            .map(|f| {
                let (kind, dim) = match (f.dtype, &f.length) {
                    (FeatureType::Bytes, _) => (StreamKind::Strings, 0),
                    (_, FeatureLength::Var) => (StreamKind::SparseI32, f.dim),
                    _ => (StreamKind::Dense, f.dim),
                };
                StreamSpec { name: f.stream.clone(), kind, dim }
            })
            .collect()
    }

    /// The chunk's streams from its buffers (dense, sparse or strings, by each feature).
    #[must_use]
    pub fn into_streams<T: DeepxElement>(&self, bufs: Vec<StreamBuf<T>>) -> Vec<StreamData> {
        bufs.into_iter()
            .zip(&self.features)
            .map(|(b, f)| match (f.dtype, &f.length) {
                (FeatureType::Bytes, _) => b.into_strings_data(),
                (_, length) => b.into_stream_data(f.dim, matches!(length, FeatureLength::Var)),
            })
            .collect()
    }

    /// Decodes the record whose whole frame is `frame` (at `at`: the file, its record number
    /// from 1 as the line, its offset) into one sequence: a sample per fixed-length or
    /// var-length stream, as many as the feature has per sequence or bytes stream; a malformed
    /// record goes to `errors` and leaves an empty sequence.
    pub fn decode_record<T: DeepxElement>(
        &self,
        frame: &[u8],
        at: &impl Locate,
        bufs: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    ) {
        let result = super::frame_data(frame, at).and_then(|data| {
            self.fill(data, bufs).map_err(|message| Malformed {
                kind: ErrorKind::BadExample,
                at: at.location(),
                message,
            })
        });
        if let Err(m) = result {
            // Back to what the earlier records hold: the samples before this record, and their
            // values, entries or bytes.
            for (b, f) in bufs.iter_mut().zip(&self.features) {
                let before = b.seq_offsets.last().copied().unwrap_or(0);
                b.samples = before;
                match (f.dtype, &f.length) {
                    (FeatureType::Bytes, _) => {
                        b.sample_offsets.truncate(before + 1);
                        b.bytes.truncate(b.sample_offsets.last().copied().unwrap_or(0));
                    }
                    (_, FeatureLength::Var) => {
                        b.sample_offsets.truncate(before + 1);
                        let end = b.sample_offsets.last().copied().unwrap_or(0);
                        b.values.truncate(end);
                        b.indices.truncate(end);
                    }
                    _ => b.values.truncate(before * f.dim),
                }
            }
            errors.push(m);
        }
        for b in bufs.iter_mut() {
            b.seq_offsets.push(b.samples);
        }
    }

    /// Each feature's values of the Example `data` into `bufs`.
    fn fill<T: DeepxElement>(&self, data: &[u8], bufs: &mut [StreamBuf<T>]) -> Result<(), String> {
        let mut inline: [Found<'_>; INLINE_FEATURES] = [Found::default(); INLINE_FEATURES];
        let mut spilled: Vec<Found<'_>> = Vec::new();
        let found: &mut [Found<'_>] = if self.features.len() <= INLINE_FEATURES {
            &mut inline[..self.features.len()]
        } else {
            spilled.resize(self.features.len(), Found::default());
            &mut spilled
        };
        let mut split: Split<'_> = Vec::new();
        let mut example = Wire::new(data);
        while let Some((number, value)) = example.next()? {
            let (1, Field::Bytes(features)) = (number, value) else { continue };
            let mut features = Wire::new(features);
            while let Some((number, value)) = features.next()? {
                let (1, Field::Bytes(entry)) = (number, value) else { continue };
                // An entry's value seen twice is one `Feature` merged from both, as protobuf
                // merges a message field: read in turn as one (found by a probe: the last alone
                // was kept, a list's first part dropped without a word).
                let (mut key, mut feature, mut more): (&[u8], Option<&[u8]>, Vec<&[u8]>) = (b"", None, Vec::new());
                let mut entry = Wire::new(entry);
                while let Some((number, value)) = entry.next()? {
                    match (number, value) {
                        (1, Field::Bytes(k)) => key = k,
                        (2, Field::Bytes(f)) if feature.is_none() => feature = Some(f),
                        (2, Field::Bytes(f)) => more.push(f),
                        _ => {}
                    }
                }
                if let Some(i) = self.features.iter().position(|f| f.key.as_bytes() == key) {
                    // A map's last entry of a key wins.
                    found[i].reset(0);
                    for part in feature.into_iter().chain(more) {
                        let mut kind = Wire::new(part);
                        while let Some((number, value)) = kind.next()? {
                            if let (1..=3, Field::Bytes(list)) = (number, value) {
                                if found[i].kind != number {
                                    found[i].reset(number);
                                }
                                found[i].push(i, list, &mut split);
                            }
                        }
                    }
                    // Present with no list set: `kind` stays 0, the feature missing, as
                    // TensorFlow's parser reads it (a default, or the required feature's error).
                }
            }
        }
        for (i, ((f, found), buf)) in self.features.iter().zip(found.iter()).zip(bufs.iter_mut()).enumerate() {
            fill_feature(f, found.lists(i, &split), found.kind, buf)?;
        }
        Ok(())
    }
}

/// The field number of a `Feature`'s list of `dtype`: 1 `bytes_list`, 2 `float_list`, 3
/// `int64_list`.
fn list_kind(dtype: FeatureType) -> u64 {
    match dtype {
        FeatureType::Bytes => 1,
        FeatureType::Float => 2,
        FeatureType::Int64 => 3,
    }
}

fn type_name(kind: u64) -> &'static str {
    match kind {
        1 => "bytes",
        2 => "float",
        _ => "int64",
    }
}

/// Feature `f`'s values (`found`) into its stream's buffer as this record's samples, checked
/// against its type and length.
fn fill_feature<'a, T: DeepxElement>(
    f: &ExampleFeature,
    lists: impl Iterator<Item = &'a [u8]>,
    kind: u64,
    buf: &mut StreamBuf<T>,
) -> Result<(), String> {
    let want = list_kind(f.dtype);
    if kind == 0 {
        return fill_missing(f, buf);
    }
    if kind != want {
        return Err(format!(
            "feature '{}' holds {} {}_list, not the {} the stream '{}' is configured with",
            f.key,
            if kind == 3 { "an" } else { "a" },
            type_name(kind),
            type_name(want),
            f.stream
        ));
    }
    if f.dtype == FeatureType::Bytes {
        return fill_bytes(f, lists, buf);
    }
    let start = buf.values.len();
    for list in lists {
        let mut w = Wire::new(list);
        while let Some((number, value)) = w.next()? {
            if number != 1 {
                continue;
            }
            match (f.dtype, value) {
                (FeatureType::Float, Field::Bytes(packed)) => {
                    if packed.len() % 4 != 0 {
                        return Err(format!("feature '{}': a packed float list of {} bytes", f.key, packed.len()));
                    }
                    buf.values.extend(
                        packed
                            .chunks_exact(4)
                            .map(|c| T::from_f32(f32::from_le_bytes(c.try_into().unwrap_or_default()))),
                    );
                }
                (FeatureType::Float, Field::Fixed32(bits)) => {
                    buf.values.push(T::from_f32(f32::from_bits(bits)));
                }
                (FeatureType::Int64, Field::Bytes(packed)) => {
                    let mut p = Wire::new(packed);
                    while !p.at_end() {
                        buf.values.push(exact::<T>(f, p.varint()?)?);
                    }
                }
                (FeatureType::Int64, Field::Varint(v)) => buf.values.push(exact::<T>(f, v)?),
                _ => return Err(format!("feature '{}': a list value of the wrong wire type", f.key)),
            }
        }
    }
    let n = buf.values.len() - start;
    match f.length {
        FeatureLength::Fixed { .. } if n != f.dim => Err(format!(
            "feature '{}' has {n} {} values, the stream '{}' takes exactly {} (tf.io.FixedLenFeature([{}]))",
            f.key,
            type_name(want),
            f.stream,
            f.dim,
            f.dim
        )),
        FeatureLength::Fixed { .. } => {
            buf.samples += 1;
            Ok(())
        }
        FeatureLength::Var if n > f.dim => {
            Err(format!("feature '{}' has {n} values, more than the stream '{}''s dim {}", f.key, f.stream, f.dim))
        }
        FeatureLength::Var => {
            // A var-length list: value i at index i (dim bounds n, which fits i32).
            buf.indices.extend((0..n).map(|i| i32::try_from(i).unwrap_or(i32::MAX)));
            buf.sample_offsets.push(buf.indices.len());
            buf.samples += 1;
            Ok(())
        }
        FeatureLength::Sequence if !n.is_multiple_of(f.dim) => Err(format!(
            "feature '{}' has {n} {} values, not a multiple of the stream '{}''s dim {} \
             (tf.io.FixedLenSequenceFeature([{}]))",
            f.key,
            type_name(want),
            f.stream,
            f.dim,
            f.dim
        )),
        FeatureLength::Sequence => {
            buf.samples += n / f.dim;
            Ok(())
        }
    }
}

/// A record without feature `f`: its default, an empty sample (var-length), no samples
/// (sequence), or the error of a required feature.
fn fill_missing<T: DeepxElement>(f: &ExampleFeature, buf: &mut StreamBuf<T>) -> Result<(), String> {
    match &f.length {
        FeatureLength::Fixed { default: Some(FeatureDefault::Numbers(d)) } => {
            match f.dtype {
                // A float feature's default is a float32, as TensorFlow casts it.
                #[allow(clippy::cast_possible_truncation)]
                FeatureType::Float | FeatureType::Bytes => {
                    buf.values.extend((0..f.dim).map(|i| T::from_f32(*FeatureDefault::at(d, i) as f32)));
                }
                FeatureType::Int64 => {
                    for &v in (0..f.dim).map(|i| FeatureDefault::at(d, i)) {
                        // An integer (the config checks it), exact in the precision or refused.
                        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        buf.values.push(exact::<T>(f, v as i64 as u64)?);
                    }
                }
            }
            buf.samples += 1;
        }
        FeatureLength::Fixed { default: Some(FeatureDefault::Bytes(d)) } => {
            for i in 0..f.dim {
                push_string(buf, FeatureDefault::at::<Vec<u8>>(d, i));
            }
        }
        FeatureLength::Fixed { default: None } => {
            return Err(format!(
                "feature '{}' ({}) is required but the Example lacks it (give it a default to allow that)",
                f.key,
                type_name(list_kind(f.dtype))
            ))
        }
        FeatureLength::Var => {
            buf.sample_offsets.push(buf.indices.len());
            buf.samples += 1;
        }
        FeatureLength::Sequence => {}
    }
    Ok(())
}

/// One byte string as the next sample of a strings stream.
fn push_string<T>(buf: &mut StreamBuf<T>, s: &[u8]) {
    buf.bytes.extend_from_slice(s);
    buf.sample_offsets.push(buf.bytes.len());
    buf.samples += 1;
}

/// A `bytes_list`'s strings, each a sample: exactly `dim` of them (fixed-length), or any number
/// (sequence).
fn fill_bytes<'a, T>(
    f: &ExampleFeature,
    lists: impl Iterator<Item = &'a [u8]>,
    buf: &mut StreamBuf<T>,
) -> Result<(), String> {
    let start = buf.samples;
    for list in lists {
        let mut w = Wire::new(list);
        while let Some((number, value)) = w.next()? {
            match (number, value) {
                (1, Field::Bytes(s)) => push_string(buf, s),
                (1, _) => return Err(format!("feature '{}': a bytes_list value of the wrong wire type", f.key)),
                _ => {}
            }
        }
    }
    let n = buf.samples - start;
    match f.length {
        FeatureLength::Fixed { .. } if n != f.dim => Err(format!(
            "feature '{}' has {n} bytes values, the stream '{}' takes exactly {} (tf.io.FixedLenFeature([{}], tf.string))",
            f.key, f.stream, f.dim, f.dim
        )),
        _ => Ok(()),
    }
}

/// The int64 `raw` (two's complement) as a `T`, if `T` holds it exactly.
fn exact<T: DeepxElement>(f: &ExampleFeature, raw: u64) -> Result<T, String> {
    #[allow(clippy::cast_possible_wrap)]
    let v = raw as i64;
    #[allow(clippy::cast_precision_loss)]
    let wide = v as f64;
    let t = T::from_f64(wide);
    let back: f64 = t.into();
    #[allow(clippy::cast_possible_truncation)]
    if back.to_bits() == wide.to_bits() && (wide as i128) == i128::from(v) {
        Ok(t)
    } else {
        // Found by a probe: on a float32 dataset the message read as if it were float64.
        let (name, limit) = if std::mem::size_of::<T>() == 4 { ("float32", "2^24") } else { ("float64", "2^53") };
        let fix =
            if std::mem::size_of::<T>() == 4 { "; precision = \"float64\" holds integers up to 2^53" } else { "" };
        Err(format!(
            "feature '{}': the int64 value {v} is not exact in the dataset's precision ({name}, exact for integers up to \
             {limit}){fix}",
            f.key
        ))
    }
}

/// Where record `record` (0-based) at `offset` of `file` is, for errors.
#[must_use]
pub fn record_location(file: &Arc<Path>, record: u64, offset: u64) -> Location {
    Location { file: file.clone(), line: record + 1, offset }
}

/// Encoders of the wire format, for tests and tools that write Examples.
pub mod write {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(u8::try_from(v & 0x7f).unwrap_or(0) | 0x80);
            v >>= 7;
        }
        out.push(u8::try_from(v).unwrap_or(0));
    }

    /// A length-delimited field (wire type 2) `number` holding `bytes`.
    pub fn bytes_field(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
        varint(out, number << 3 | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }

    /// A feature's value.
    pub enum Value<'a> {
        /// A `float_list`, packed.
        Floats(&'a [f32]),
        /// An `int64_list`, packed.
        Ints(&'a [i64]),
        /// A `bytes_list`.
        Bytes(&'a [&'a [u8]]),
        /// A `Feature` with no list set.
        Empty,
    }

    /// The serialized `tf.train.Example` of `features` (key and value), in that order.
    #[must_use]
    pub fn example(features: &[(&str, Value<'_>)]) -> Vec<u8> {
        let mut map = Vec::new();
        for (key, value) in features {
            let mut feature = Vec::new();
            match value {
                Value::Floats(v) => {
                    let packed: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    let mut list = Vec::new();
                    bytes_field(&mut list, 1, &packed);
                    bytes_field(&mut feature, 2, &list);
                }
                Value::Ints(v) => {
                    let mut packed = Vec::new();
                    for &x in *v {
                        #[allow(clippy::cast_sign_loss)]
                        varint(&mut packed, x as u64);
                    }
                    let mut list = Vec::new();
                    bytes_field(&mut list, 1, &packed);
                    bytes_field(&mut feature, 3, &list);
                }
                Value::Bytes(v) => {
                    let mut list = Vec::new();
                    for b in *v {
                        bytes_field(&mut list, 1, b);
                    }
                    bytes_field(&mut feature, 1, &list);
                }
                Value::Empty => {}
            }
            let mut entry = Vec::new();
            bytes_field(&mut entry, 1, key.as_bytes());
            bytes_field(&mut entry, 2, &feature);
            bytes_field(&mut map, 1, &entry);
        }
        let mut out = Vec::new();
        bytes_field(&mut out, 1, &map);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::write::{example, Value};
    use super::*;
    use crate::format::tfrecord::frame;

    fn features() -> Vec<ExampleFeature> {
        vec![
            ExampleFeature {
                stream: "x".into(),
                key: "x".into(),
                dtype: FeatureType::Float,
                length: FeatureLength::Fixed { default: None },
                dim: 3,
            },
            ExampleFeature {
                stream: "ids".into(),
                key: "tokens".into(),
                dtype: FeatureType::Int64,
                length: FeatureLength::Var,
                dim: 4,
            },
            ExampleFeature {
                stream: "y".into(),
                key: "label".into(),
                dtype: FeatureType::Int64,
                length: FeatureLength::Fixed { default: Some(FeatureDefault::Numbers(vec![-1.0])) },
                dim: 1,
            },
        ]
    }

    /// Decodes `records` (Examples); returns the buffers and the errors' messages.
    fn decode(records: &[Vec<u8>]) -> (Vec<StreamBuf<f32>>, Vec<String>) {
        let d = ExampleDecoder::new(&features());
        let mut bufs: Vec<StreamBuf<f32>> = (0..3).map(|_| StreamBuf::new()).collect();
        let mut errors = Vec::new();
        let file: Arc<Path> = Arc::from(Path::new("t"));
        for (i, r) in records.iter().enumerate() {
            d.decode_record(&frame(r), &record_location(&file, i as u64, 0), &mut bufs, &mut errors);
        }
        (bufs, errors.iter().map(|e| e.message.clone()).collect())
    }

    #[test]
    fn fixed_and_var_length_features_fill_dense_and_sparse_streams() {
        let r1 = example(&[
            ("x", Value::Floats(&[1.5, -2.0, 3.25])),
            ("tokens", Value::Ints(&[7, -3])),
            ("label", Value::Ints(&[1])),
            ("other", Value::Bytes(&[b"ignored"])),
        ]);
        let r2 = example(&[("label", Value::Ints(&[0])), ("x", Value::Floats(&[0.0, 0.5, 1.0]))]);
        let (b, errors) = decode(&[r1, r2]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(b[0].values, vec![1.5, -2.0, 3.25, 0.0, 0.5, 1.0]);
        assert_eq!((b[1].values.clone(), b[1].indices.clone()), (vec![7.0, -3.0], vec![0, 1]));
        assert_eq!(b[1].sample_offsets, vec![0, 2, 2]);
        assert_eq!(b[2].values, vec![1.0, 0.0]);
        assert_eq!(b[0].seq_offsets, vec![0, 1, 2]);
    }

    #[test]
    fn a_missing_feature_takes_its_default_or_is_required() {
        let (b, errors) = decode(&[example(&[("x", Value::Floats(&[1.0, 2.0, 3.0]))])]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(b[2].values, vec![-1.0]);
        let (b, errors) = decode(&[example(&[("label", Value::Ints(&[2]))])]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("'x' (float) is required"), "{errors:?}");
        assert_eq!(b[0].seq_offsets, vec![0, 0], "the bad record is an empty sequence");
        assert!(b[2].values.is_empty(), "nothing of the bad record is kept");
    }

    #[test]
    fn wrong_types_counts_and_inexact_integers_are_malformed_records() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (example(&[("x", Value::Ints(&[1, 2, 3]))]), "holds an int64_list, not the float"),
            (example(&[("x", Value::Floats(&[1.0, 2.0]))]), "has 2 float values"),
            (example(&[("x", Value::Floats(&[1.0; 3])), ("tokens", Value::Ints(&[1; 5]))]), "more than the stream"),
            (
                example(&[("x", Value::Floats(&[1.0; 3])), ("label", Value::Ints(&[(1 << 24) + 1]))]),
                "not exact in the dataset's precision (float32, exact for integers up to 2^24); precision = \"float64\"",
            ),
            (vec![0x0a, 0x05, 0x01], "runs past the end"),
        ];
        for (record, want) in cases {
            let (_, errors) = decode(&[record]);
            assert!(errors.len() == 1 && errors[0].contains(want), "{want}: {errors:?}");
        }
        // 2^24 is exact in float32.
        let (b, errors) = decode(&[example(&[("x", Value::Floats(&[1.0; 3])), ("label", Value::Ints(&[1 << 24]))])]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(b[2].values, vec![16_777_216.0]);
    }

    #[test]
    fn protobuf_rules_last_map_entry_wins_and_lists_merge() {
        let mut r = example(&[("x", Value::Floats(&[9.0, 9.0, 9.0]))]);
        r.extend(example(&[("x", Value::Floats(&[1.0, 2.0, 3.0]))]));
        let (b, errors) = decode(&[r]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(b[0].values, vec![1.0, 2.0, 3.0]);
        // A present feature with no list set is missing, as TensorFlow reads it: the var-length
        // stream has none, a fixed-length one its default, or the required feature's error.
        let (b, errors) = decode(&[example(&[
            ("x", Value::Floats(&[1.0, 2.0, 3.0])),
            ("tokens", Value::Empty),
            ("label", Value::Empty),
        ])]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(b[1].sample_offsets, vec![0, 0]);
        assert_eq!(b[2].values, vec![-1.0]);
        let (_, errors) = decode(&[example(&[("x", Value::Empty)])]);
        assert!(errors.len() == 1 && errors[0].contains("is required"), "{errors:?}");
    }

    /// A writer that split a feature's list, changed its kind, or repeated its map key: the
    /// values are those of the feature's last start, its lists concatenated in order, whatever
    /// another feature's split lists are.
    #[test]
    fn split_lists_and_starts_over_keep_the_last_round_in_order() {
        use super::write::bytes_field as field;
        // A `Feature` of these lists: (1 bytes, 2 float, 3 int64; its values packed).
        let feature = |lists: &[(u64, Vec<u8>)]| {
            let mut f = Vec::new();
            for (kind, packed) in lists {
                let mut list = Vec::new();
                field(&mut list, 1, packed);
                field(&mut f, *kind, &list);
            }
            f
        };
        let floats = |v: &[f32]| (2u64, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        let ints = |v: &[u8]| (3u64, v.to_vec());
        let entries: Vec<(&str, Vec<u8>)> = vec![
            ("tokens", feature(&[ints(&[7]), ints(&[8]), ints(&[9])])),
            ("x", feature(&[floats(&[9.0]), floats(&[9.0]), ints(&[5]), floats(&[1.0]), floats(&[2.0, 3.0])])),
            ("label", feature(&[ints(&[1]), ints(&[2])])),
            // The label's key again: its earlier lists (split ones included) are dropped.
            ("label", feature(&[ints(&[4])])),
        ];
        let mut map = Vec::new();
        for (key, f) in &entries {
            let mut entry = Vec::new();
            field(&mut entry, 1, key.as_bytes());
            field(&mut entry, 2, f);
            field(&mut map, 1, &entry);
        }
        let mut record = Vec::new();
        field(&mut record, 1, &map);
        let (b, errors) = decode(&[record]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(b[0].values, vec![1.0, 2.0, 3.0]);
        assert_eq!(b[1].values, vec![7.0, 8.0, 9.0]);
        assert_eq!(b[2].values, vec![4.0]);

        // One entry whose value (its `Feature`) is written twice, or three times: merged as
        // protobuf merges a message field, not the last alone (found by a probe: `x`'s first
        // part was dropped without a word); an empty `Feature` after a list adds nothing.
        let entry = |key: &str, values: &[Vec<u8>]| {
            let mut entry = Vec::new();
            field(&mut entry, 1, key.as_bytes());
            for v in values {
                field(&mut entry, 2, v);
            }
            let mut map = Vec::new();
            field(&mut map, 1, &entry);
            map
        };
        let mut map = entry("x", &[feature(&[floats(&[1.0])]), feature(&[floats(&[2.0, 3.0])])]);
        map.extend(entry("tokens", &[feature(&[ints(&[7])]), Vec::new()]));
        map.extend(entry("label", &[feature(&[floats(&[9.0])]), feature(&[ints(&[4])]), Vec::new()]));
        let mut record = Vec::new();
        field(&mut record, 1, &map);
        let (b, errors) = decode(&[record]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(b[0].values, vec![1.0, 2.0, 3.0]);
        assert_eq!(b[1].values, vec![7.0]);
        assert_eq!(b[2].values, vec![4.0], "the oneof's last member");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..proptest::prelude::ProptestConfig::default() })]

        /// No record makes the decoder panic, and every record is one sequence: a sample of every
        /// stream, or an error and none.
        #[test]
        fn hostile_records_never_panic(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            prefix in proptest::sample::select(vec![
                Vec::new(),
                vec![0x0a], vec![0x0a, 0x80], vec![0x0a, 0x10, 0x0a, 0x0e, 0x0a, 0x01, b'x'],
                example(&[("x", Value::Floats(&[1.0, 2.0, 3.0]))]),
            ]),
        ) {
            let mut record = prefix;
            record.extend(data);
            let d = ExampleDecoder::new(&features());
            let mut bufs: Vec<StreamBuf<f32>> = (0..3).map(|_| StreamBuf::new()).collect();
            let mut errors = Vec::new();
            let file: Arc<Path> = Arc::from(Path::new("t"));
            d.decode_record(&frame(&record), &record_location(&file, 0, 0), &mut bufs, &mut errors);
            for b in &bufs {
                proptest::prop_assert_eq!(b.seq_offsets.len(), 2);
                proptest::prop_assert_eq!(b.samples, usize::from(errors.is_empty()));
            }
            proptest::prop_assert_eq!(bufs[0].values.len(), if errors.is_empty() { 3 } else { 0 });
        }
    }

    /// A record left out for a later feature's error keeps nothing of its earlier bytes or
    /// sequence streams; the records around it keep theirs.
    #[test]
    fn a_bad_record_leaves_nothing_in_bytes_and_sequence_streams() {
        let features = vec![
            ExampleFeature {
                stream: "w".into(),
                key: "w".into(),
                dtype: FeatureType::Bytes,
                length: FeatureLength::Sequence,
                dim: 1,
            },
            ExampleFeature {
                stream: "s".into(),
                key: "s".into(),
                dtype: FeatureType::Float,
                length: FeatureLength::Sequence,
                dim: 2,
            },
            ExampleFeature {
                stream: "b".into(),
                key: "b".into(),
                dtype: FeatureType::Bytes,
                length: FeatureLength::Fixed { default: Some(FeatureDefault::Bytes(vec![b"d".to_vec()])) },
                dim: 1,
            },
        ];
        let d = ExampleDecoder::new(&features);
        let mut bufs: Vec<StreamBuf<f32>> = (0..3).map(|_| StreamBuf::new()).collect();
        let mut errors = Vec::new();
        let file: Arc<Path> = Arc::from(Path::new("t"));
        let records = [
            example(&[("w", Value::Bytes(&[b"ab", b"c"])), ("s", Value::Floats(&[1.0, 2.0]))]),
            // Bytes and a sequence read, then `b` has two strings: the record is left out.
            example(&[
                ("w", Value::Bytes(&[b"zz"])),
                ("s", Value::Floats(&[3.0, 4.0])),
                ("b", Value::Bytes(&[b"1", b"2"])),
            ]),
            example(&[("s", Value::Floats(&[5.0, 6.0, 7.0]))]),
            example(&[("w", Value::Bytes(&[b""])), ("b", Value::Bytes(&[b"\xff"]))]),
        ];
        for (i, r) in records.iter().enumerate() {
            d.decode_record(&frame(r), &record_location(&file, i as u64, 0), &mut bufs, &mut errors);
        }
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].message.contains("has 2 bytes values"), "{errors:?}");
        assert!(errors[1].message.contains("not a multiple"), "{errors:?}");
        assert_eq!((bufs[0].bytes.clone(), bufs[0].sample_offsets.clone()), (b"abc".to_vec(), vec![0, 2, 3, 3]));
        assert_eq!(bufs[0].seq_offsets, vec![0, 2, 2, 2, 3]);
        assert_eq!((bufs[1].values.clone(), bufs[1].seq_offsets.clone()), (vec![1.0, 2.0], vec![0, 1, 1, 1, 1]));
        assert_eq!((bufs[2].bytes.clone(), bufs[2].sample_offsets.clone()), (b"d\xff".to_vec(), vec![0, 1, 2]));
        assert_eq!(bufs[2].seq_offsets, vec![0, 1, 1, 1, 2]);
    }

    #[test]
    fn unknown_fields_are_skipped_and_a_varint_past_64_bits_is_malformed() {
        use super::write::bytes_field;
        // An unknown field (number 5, a varint) inside `Features` and inside the Example: skipped,
        // as protobuf does (TensorFlow's parser refuses the record).
        let plain = example(&[("x", Value::Floats(&[1.0, 2.0, 3.0])), ("label", Value::Ints(&[4]))]);
        assert!(plain[1] < 0x80, "a one-byte length");
        let mut features = plain[2..].to_vec();
        features.extend_from_slice(&[5 << 3, 1]);
        let mut with_unknown = Vec::new();
        bytes_field(&mut with_unknown, 1, &features);
        with_unknown.extend_from_slice(&[9 << 3, 7]);
        let (b, errors) = decode(&[with_unknown]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!((b[0].values.clone(), b[2].values.clone()), (vec![1.0, 2.0, 3.0], vec![4.0]));
        // An int64 of ten varint bytes whose last is above 1 (TensorFlow drops the bits past 64
        // and reads -1): more than 64 bits, a malformed record.
        let (mut list, mut feature, mut entry, mut map, mut out) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut long = vec![0xff; 9];
        long.push(0x7f);
        bytes_field(&mut list, 1, &long);
        bytes_field(&mut feature, 3, &list);
        bytes_field(&mut entry, 1, b"label");
        bytes_field(&mut entry, 2, &feature);
        bytes_field(&mut map, 1, &entry);
        let mut x = example(&[("x", Value::Floats(&[1.0, 2.0, 3.0]))])[2..].to_vec();
        x.extend_from_slice(&map);
        bytes_field(&mut out, 1, &x);
        let (_, errors) = decode(&[out]);
        assert!(errors.len() == 1 && errors[0].contains("more than 64 bits"), "{errors:?}");
    }

    #[test]
    fn a_damaged_record_is_malformed_not_decoded() {
        let d = ExampleDecoder::new(&features());
        let mut bufs: Vec<StreamBuf<f32>> = (0..3).map(|_| StreamBuf::new()).collect();
        let mut errors = Vec::new();
        let mut f = frame(&example(&[("x", Value::Floats(&[1.0, 2.0, 3.0]))]));
        let n = f.len();
        f[n - 6] ^= 0x20;
        let file: Arc<Path> = Arc::from(Path::new("t"));
        d.decode_record(&f, &record_location(&file, 0, 0), &mut bufs, &mut errors);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].kind, ErrorKind::BadRecord);
        assert!(bufs[0].values.is_empty());
    }
}
