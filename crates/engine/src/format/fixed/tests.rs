//! Fixed-length records: the layout TensorFlow accepts and refuses, the index of a file and of a
//! stream, every raw type in both byte orders, exactness, and no panic on any record.

use super::*;
use crate::format::chunk::{StreamValues, Values};
use proptest::prelude::*;

fn limits() -> IndexLimits {
    IndexLimits::UNBOUNDED
}

fn options(record_bytes: u32, header_bytes: u64, footer_bytes: u64) -> FixedLengthOptions {
    FixedLengthOptions { record_bytes, header_bytes, footer_bytes }
}

fn name() -> Arc<Path> {
    Arc::from(Path::new("data.bin"))
}

fn stream(name: &str, dtype: RawType, offset: usize, dim: usize, little_endian: bool) -> RawStream {
    RawStream { name: name.into(), dtype, offset, dim, little_endian }
}

/// Decodes `records` with `streams` in precision `T`: per stream its values, and the errors.
fn decode<T: DeepxElement>(
    streams: Vec<RawStream>,
    records: &[&[u8]],
) -> (Vec<Vec<f64>>, Vec<Malformed>, Vec<Vec<usize>>) {
    let d = RawDecoder::new(streams);
    let mut out = d.buffers::<T>(records.len());
    let mut errors = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let file = name();
        let at = RecordAt { file: &file, line: i as u64, offset: 0 };
        d.decode_record(r, &at, &mut out, &mut errors);
    }
    let offsets = out.iter().map(|b| b.seq_offsets.clone()).collect();
    let values = d
        .chunk_streams(out)
        .into_iter()
        .map(|sd| match sd.data {
            StreamValues::Dense { values: Values::F32(v), .. } => v.iter().map(|&x| f64::from(x)).collect(),
            StreamValues::Dense { values: Values::F64(v), .. } => v.to_vec(),
            other => panic!("a raw stream is dense, not {other:?}"),
        })
        .collect();
    (values, errors, offsets)
}

#[test]
fn a_file_is_header_records_and_footer_as_tensorflow_reads_it() {
    let o = options(5, 2, 1);
    assert_eq!(o.records(13), Ok(2));
    for (size, expect) in [
        (12, "not a multiple of the record length (5 bytes): 4 bytes are left"),
        (2, "fewer than its header"),
        (3, "holds no record"),
    ] {
        let e = o.records(size).expect_err("refused");
        assert!(e.contains(expect), "{size}: {e}");
    }
    let bytes: Vec<u8> = (0u8..13).collect();
    let idx = index_reader(&bytes[..], name(), 13, o, limits(), &mut |_| {}).expect("indexed");
    let got: Vec<(u64, u64, u32)> = idx.sequences.iter().map(|s| (s.key, s.offset, s.size)).collect();
    assert_eq!(got, vec![(0, 2, 5), (1, 7, 5)]);
    assert_eq!(idx.digest, crc32fast::hash(&bytes));
    let e = index_reader(&bytes[..12], name(), 12, o, limits(), &mut |_| {}).expect_err("a cut file");
    assert!(e.to_string().contains("data.bin") && e.to_string().contains("body of 9 bytes"), "{e}");
    // Found by a probe: the bytes left over were named at byte 0; they start after record 1,
    // at byte 7, where record 2 would.
    match &e {
        DataError::Fatal { at, .. } => assert_eq!((at.line, at.offset), (2, 7), "{e}"),
        other => panic!("not a fatal data error: {other}"),
    }
    let e = o.records(9).expect_err("one byte left");
    assert!(e.contains("1 byte is left"), "{e}");
    // A reader that yields fewer bytes than the size said.
    let e = index_reader(&bytes[..8], name(), 13, o, limits(), &mut |_| {}).expect_err("short");
    assert!(e.to_string().contains("read 8 bytes of a file of 13"), "{e}");
}

#[test]
fn the_index_respects_the_sequence_limit() {
    let mut l = limits();
    l.max_sequences = 3;
    let bytes = [0u8; 8];
    let e = index_reader(&bytes[..], name(), 8, options(2, 0, 0), l, &mut |_| {}).expect_err("over the limit");
    assert!(e.to_string().contains("more than 3 sequences"), "{e}");
}

#[test]
fn every_type_in_both_byte_orders() {
    let cases: [(RawType, Vec<u8>, Vec<f64>); 13] = [
        (RawType::Bf16, vec![0xc0, 0x3f, 0x80, 0xbf], vec![1.5, -1.0]),
        (RawType::Bool, vec![0, 1, 7], vec![0.0, 1.0, 1.0]),
        (RawType::I8, vec![0xff, 0x7f], vec![-1.0, 127.0]),
        (RawType::U8, vec![0xff, 0x01], vec![255.0, 1.0]),
        (RawType::I16, vec![0xfe, 0xff], vec![-2.0]),
        (RawType::U16, vec![0x01, 0x02], vec![513.0]),
        (RawType::I32, vec![0xff, 0xff, 0xff, 0xff], vec![-1.0]),
        (RawType::U32, vec![0x00, 0x00, 0x80, 0x00], vec![8_388_608.0]),
        (RawType::I64, (-5i64).to_le_bytes().to_vec(), vec![-5.0]),
        (RawType::U64, 7u64.to_le_bytes().to_vec(), vec![7.0]),
        (RawType::F16, vec![0x00, 0x3c, 0x00, 0xc0], vec![1.0, -2.0]),
        (RawType::F32, 1.5f32.to_le_bytes().to_vec(), vec![1.5]),
        (RawType::F64, 0.1f64.to_le_bytes().to_vec(), vec![0.1]),
    ];
    for (dtype, le, want) in cases {
        let dim = le.len() / dtype.size();
        let (v, errors, _) = decode::<f64>(vec![stream("x", dtype, 0, dim, true)], &[&le]);
        assert!(errors.is_empty(), "{dtype:?}: {errors:?}");
        assert_eq!(v[0], want, "{dtype:?} little-endian");
        // The same values big-endian: each value's bytes reversed.
        let be: Vec<u8> = le.chunks(dtype.size()).flat_map(|c| c.iter().rev().copied()).collect();
        let (v, _, _) = decode::<f64>(vec![stream("x", dtype, 0, dim, false)], &[&be]);
        assert_eq!(v[0], want, "{dtype:?} big-endian");
    }
}

#[test]
fn halves_convert_exactly_subnormals_infinities_and_nan_included() {
    assert_eq!(f16_to_f32(0x0001).to_bits(), (2f32.powi(-24)).to_bits());
    assert_eq!(f16_to_f32(0x03ff).to_bits(), (1023.0 * 2f32.powi(-24)).to_bits());
    assert_eq!(f16_to_f32(0x7bff).to_bits(), (65504.0f32).to_bits());
    assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    assert_eq!(f16_to_f32(0x7c00).to_bits(), (f32::INFINITY).to_bits());
    assert_eq!(f16_to_f32(0xfc00).to_bits(), (f32::NEG_INFINITY).to_bits());
    assert!(f16_to_f32(0x7e00).is_nan());
    assert_eq!(f16_to_f32(0x3555).to_bits(), (0.333_251_95f32).to_bits());
}

#[test]
fn an_integer_the_precision_cannot_hold_is_a_malformed_record_not_a_rounded_value() {
    let big = (1i64 << 24) + 1;
    let records: [&[u8]; 3] = [&1i64.to_le_bytes(), &big.to_le_bytes(), &(1i64 << 40).to_le_bytes()];
    let (v, errors, offsets) = decode::<f32>(vec![stream("id", RawType::I64, 0, 1, true)], &records);
    // 2^40 is exact in float32; 2^24 + 1 is not.
    assert_eq!(v[0], vec![1.0, 1_099_511_627_776.0]);
    assert_eq!(offsets[0], vec![0, 1, 1, 2], "the bad record is a sequence of 0 samples");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].at.line, 2);
    assert!(errors[0].message.contains("16777217") && errors[0].message.contains("float64"), "{}", errors[0].message);
    let (v, errors, _) = decode::<f64>(vec![stream("id", RawType::I64, 0, 1, true)], &records);
    assert!(errors.is_empty());
    assert_eq!(v[0][1].to_bits(), 16_777_217f64.to_bits());
}

#[test]
fn streams_read_their_slices_and_a_short_record_is_malformed() {
    let streams = vec![stream("label", RawType::U8, 0, 1, true), stream("pixels", RawType::U8, 1, 3, true)];
    let (v, errors, offsets) = decode::<f32>(streams, &[&[7, 1, 2, 3], &[8, 4, 5], &[9, 6, 7, 8]]);
    assert_eq!(v[0], vec![7.0, 9.0]);
    assert_eq!(v[1], vec![1.0, 2.0, 3.0, 6.0, 7.0, 8.0]);
    assert_eq!(offsets[1], vec![0, 1, 1, 2]);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].message.contains("holds 3 bytes; stream 'pixels' reads 3 bytes from byte 1"),
        "{}",
        errors[0].message
    );
}

proptest! {
    #[test]
    fn no_record_panics_and_every_record_is_one_sequence(
        records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 1..8),
        offset in 0usize..10,
        dim in 0usize..4,
        dtype in prop::sample::select(vec![RawType::I8, RawType::U16, RawType::I32, RawType::U64, RawType::F16, RawType::F32, RawType::F64]),
        little in any::<bool>(),
    ) {
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let (v, errors, offsets) = decode::<f32>(vec![stream("x", dtype, offset, dim, little)], &refs);
        prop_assert_eq!(offsets[0].len(), records.len() + 1);
        let samples = offsets[0].last().copied().unwrap_or(0);
        prop_assert_eq!(v[0].len(), samples * dim);
        prop_assert_eq!(samples + errors.len(), records.len());
    }

    #[test]
    fn any_size_and_layout_is_indexed_or_refused_without_panic(
        size in 0u64..200,
        record in 1u32..20,
        header in 0u64..20,
        footer in 0u64..20,
    ) {
        let o = options(record, header, footer);
        let bytes = vec![0u8; usize::try_from(size).expect("small")];
        match index_reader(&bytes[..], name(), size, o, limits(), &mut |_| {}) {
            Ok(idx) => {
                prop_assert_eq!(idx.sequences.len() as u64 * u64::from(record) + header + footer, size);
                prop_assert!(!idx.sequences.is_empty());
            }
            Err(_) => prop_assert!(o.records(size).is_err()),
        }
    }

    /// A file indexed from disk in parts on several threads (its digest read in parts) gives the
    /// one-thread index — records, digest, size — or the same refusal.
    #[test]
    fn an_index_in_parts_is_the_one_thread_index(
        bytes in prop::collection::vec(any::<u8>(), 0..2000),
        record in 1u32..20,
        header in 0u64..20,
        footer in 0u64..20,
        threads in 2usize..6,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("r.bin");
        std::fs::write(&p, &bytes).expect("write");
        let o = options(record, header, footer);
        let on = |threads: usize| {
            index_file(&p, name(), o, limits(), threads, &mut |_| {})
                .map(|i| (i.sequences.iter().collect::<Vec<_>>(), i.digest, i.size))
                .map_err(|e| e.to_string())
        };
        let one = on(1);
        if let Ok((_, digest, _)) = &one {
            prop_assert_eq!(*digest, crc32fast::hash(&bytes));
        }
        prop_assert_eq!(one, on(threads));
    }
}
