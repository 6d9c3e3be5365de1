//! The copy code against an oracle built sample by sample, and the two slot sources (the
//! gathered minibatch and its owned copy) against each other, byte for byte.

use minibatchd_shm::{decode_minibatch, LayoutError, Ring, RingGeometry};
use minibatchd_sys::{LocalMemory, SlotMemory};

use super::{MbData, MbIndices, MbStream, MbValues};
use crate::format::chunk::{Indices, Values};

/// How the test chunks store their sparse indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ids {
    /// CTF: int32.
    Ctf,
    /// deepx ids wider than 32 bits in both chunks.
    Wide,
    /// deepx ids of 32 bits in the first chunk ([`Indices::U32`]), wider ones in the second: the
    /// gather widens the first's.
    Mixed,
}

/// Samples of the sequences of [`chunks`]' two chunks: 0–3 samples, or one each where `unit`.
fn lens_of(unit: [bool; 2]) -> [&'static [usize]; 2] {
    [if unit[0] { &[1, 1, 1, 1] } else { &[1, 3, 0, 2] }, if unit[1] { &[1, 1, 1] } else { &[2, 1, 1] }]
}

/// Two chunks with a dense, a sparse (CTF or deepx ids, as `ids` says) and a strings stream; sequences of
/// 0–3 samples and sparse samples of 1–2 entries, or, in a chunk marked `unit`, one sample per
/// sequence and one entry per sample (the gather's fast path).
fn chunks(
    f64: bool,
    id_kind: Ids,
    unit: [bool; 2],
) -> (crate::sampling::Timeline, super::ChunkMap<std::sync::Arc<crate::format::chunk::ParsedChunk>>) {
    use crate::format::chunk::{ParsedChunk, StreamData, StreamValues};
    let seq_lens = lens_of(unit);
    let mut map = super::ChunkMap::default();
    let mut next = 0.5f64;
    for (c, lens) in seq_lens.iter().enumerate() {
        let mut seq_offsets = vec![0usize];
        for l in *lens {
            seq_offsets.push(seq_offsets.last().copied().unwrap_or(0) + l);
        }
        let samples = *seq_offsets.last().unwrap_or(&0);
        let mut floats = |n: usize| -> Values {
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    next += 1.25;
                    next
                })
                .collect();
            if f64 {
                Values::F64(v.into())
            } else {
                #[allow(clippy::cast_possible_truncation)] // the f32 copy of the f64 test values
                Values::F32(v.iter().map(|&x| x as f32).collect())
            }
        };
        let sample_offsets: Vec<usize> = (0..=samples).map(|j| if unit[c] { j } else { j * 2 - j / 2 }).collect();
        let entries = *sample_offsets.last().unwrap_or(&0);
        let ids: Vec<u64> = (0..entries as u64).map(|i| (i * 7 + c as u64) % 10).collect();
        let indices = match (id_kind, c) {
            (Ids::Ctf, _) => Indices::I32(ids.iter().map(|&i| i32::try_from(i).expect("ids are below 10")).collect()),
            (Ids::Mixed, 0) => Indices::U32(ids.iter().map(|&i| u32::try_from(i << 28).expect("below 2^32")).collect()),
            _ => Indices::U64(ids.iter().map(|&i| i << 40).collect()),
        };
        let width = if unit[c] { 1 } else { 3 };
        let string_offsets: Vec<usize> = (0..=samples).map(|j| j * width).collect();
        let streams = vec![
            StreamData::new(seq_offsets.clone(), StreamValues::Dense { dim: 2, values: floats(samples * 2) }),
            StreamData::new(
                seq_offsets.clone(),
                StreamValues::Sparse { sample_offsets, indices, values: floats(entries) },
            ),
            StreamData::new(
                seq_offsets,
                StreamValues::Strings {
                    offsets: string_offsets,
                    bytes: (0..samples * width).map(|b| u8::try_from(b).expect("a few samples")).collect(),
                },
            ),
        ];
        assert_eq!(streams.iter().all(StreamData::unit_sequences), unit[c]);
        assert_eq!(streams[1].unit_entries() && streams[2].unit_entries(), unit[c]);
        map.insert(
            u32::try_from(c).expect("two chunks"),
            std::sync::Arc::new(ParsedChunk { chunk: c, num_sequences: lens.len(), streams, malformed: Vec::new() }),
        );
    }
    (crate::sampling::Timeline { seq_len: vec![1; 7].into(), chunk_start: vec![0, 4, 7] }, map)
}

/// Heap memory for a ring of `geometry`.
fn memory_for(geometry: RingGeometry) -> LocalMemory {
    LocalMemory::new(usize::try_from(geometry.total_bytes()).expect("a test ring fits in memory"))
}

fn shapes(f64: bool, ids: Ids) -> Vec<super::StreamShape> {
    use crate::format::chunk::StreamKind;
    let sparse = if ids == Ids::Ctf { StreamKind::SparseI32 } else { StreamKind::SparseU64 };
    [(StreamKind::Dense, 2), (sparse, 10), (StreamKind::Strings, 0)]
        .into_iter()
        .map(|(kind, dim)| super::StreamShape { kind, dim, float64: f64 })
        .collect()
}

/// The minibatch built the obvious way, sample by sample (an oracle independent of
/// `Gathered::fill`).
fn naive(
    plan: &crate::sampling::MinibatchPlan,
    timeline: &crate::sampling::Timeline,
    map: &super::ChunkMap<std::sync::Arc<crate::format::chunk::ParsedChunk>>,
) -> Vec<MbStream> {
    use crate::format::chunk::StreamValues;
    fn push_values(dst: &mut MbValues, src: &Values, i: usize) {
        match (dst, src) {
            (MbValues::F32(d), Values::F32(s)) => d.push(s[i]),
            (MbValues::F64(d), Values::F64(s)) => d.push(s[i]),
            _ => panic!("mixed precisions"),
        }
    }
    let first = &map[&0];
    let mut out: Vec<MbStream> = first
        .streams
        .iter()
        .map(|sd| {
            let empty = |v: &Values| {
                if matches!(v, Values::F64(_)) {
                    MbValues::F64(Vec::new())
                } else {
                    MbValues::F32(Vec::new())
                }
            };
            let data = match &sd.data {
                StreamValues::Dense { dim, values } => MbData::Dense { dim: *dim, values: empty(values) },
                StreamValues::Sparse { indices, values, .. } => MbData::Sparse {
                    dim: 10,
                    sample_offsets: vec![0],
                    indices: if matches!(indices, Indices::I32(_)) {
                        MbIndices::I32(Vec::new())
                    } else {
                        MbIndices::U64(Vec::new())
                    },
                    values: empty(values),
                },
                StreamValues::Strings { .. } => MbData::Strings { offsets: vec![0], bytes: Vec::new() },
            };
            MbStream { sequence_offsets: vec![0], data }
        })
        .collect();
    for r in &plan.sequences {
        let chunk = &map[&r.chunk];
        let local = r.seq as usize - timeline.chunk_start[r.chunk as usize];
        for (o, sd) in out.iter_mut().zip(&chunk.streams) {
            let (s0, s1) = (sd.seq_offsets[local], sd.seq_offsets[local + 1]);
            for j in s0..s1 {
                match (&mut o.data, &sd.data) {
                    (MbData::Dense { dim, values }, StreamValues::Dense { values: sv, .. }) => {
                        for k in 0..*dim {
                            push_values(values, sv, j * *dim + k);
                        }
                    }
                    (
                        MbData::Sparse { sample_offsets, indices, values, .. },
                        StreamValues::Sparse { sample_offsets: so, indices: si, values: sv },
                    ) => {
                        for e in so[j]..so[j + 1] {
                            match (&mut *indices, si) {
                                (MbIndices::I32(d), Indices::I32(s)) => d.push(s[e]),
                                (MbIndices::U64(d), Indices::U32(s)) => d.push(u64::from(s[e])),
                                (MbIndices::U64(d), Indices::U64(s)) => d.push(s[e]),
                                _ => panic!("mixed index types"),
                            }
                            push_values(values, sv, e);
                        }
                        sample_offsets.push(i64::try_from(values.len()).expect("small"));
                    }
                    (MbData::Strings { offsets, bytes }, StreamValues::Strings { offsets: so, bytes: sb }) => {
                        bytes.extend_from_slice(&sb[so[j]..so[j + 1]]);
                        offsets.push(i64::try_from(bytes.len()).expect("small"));
                    }
                    _ => panic!("kinds differ"),
                }
            }
            let last = *o.sequence_offsets.last().unwrap_or(&0);
            o.sequence_offsets.push(last + i64::try_from(s1 - s0).expect("small"));
        }
    }
    out
}

#[test]
fn gathered_writes_the_bytes_of_the_assembled_minibatch() {
    use crate::sampling::{MinibatchPlan, SeqRef};
    // File order (runs of sequences one after the other in a chunk, one copy each) and runs
    // that break and start again, beside random orders.
    let orders: [&[u32]; 6] =
        [&[6, 0, 3, 1, 5, 2, 4], &[2], &[], &[1, 1, 4], &[0, 1, 2, 3, 4, 5, 6], &[2, 3, 1, 2, 3, 5, 6, 4]];
    for (f64, ids, unit) in [
        (false, Ids::Ctf, [false; 2]),
        (true, Ids::Wide, [false; 2]),
        (false, Ids::Ctf, [true; 2]),
        (true, Ids::Wide, [true, false]),
        (false, Ids::Mixed, [false; 2]),
        (true, Ids::Mixed, [true, false]),
    ] {
        let (timeline, mut map) = chunks(f64, ids, unit);
        let lens: Vec<usize> = lens_of(unit).concat();
        for order in orders {
            let plan = MinibatchPlan {
                sequences: order.iter().map(|&seq| SeqRef { seq, chunk: u32::from(seq >= 4) }).collect(),
                sweep: 1,
                end_of_sweep: true,
                position: 9,
                retire: Vec::new(),
                samples: order.len() as u64,
                next_sweeps_at: Vec::new(),
            };
            let names = vec!["d".to_owned(), "s".to_owned(), "u".to_owned()];
            let gathered = super::gather(4, &plan, &timeline, &shapes(f64, ids), false, &mut map).expect("gather");
            let mb = gathered.to_minibatch();
            let geometry = RingGeometry::new(2, 8192);
            let mut a = Ring::new(memory_for(geometry), geometry, 1, 1).expect("ring");
            let mut b = Ring::new(memory_for(geometry), geometry, 1, 1).expect("ring");
            let used = a.write(1, 3, &mb, &names).expect("write");
            assert_eq!(b.write(1, 3, &gathered, &names).expect("write_gathered"), used);
            assert_eq!(a.memory().bytes(), b.memory().bytes(), "order {order:?}");
            let back = decode_minibatch(b.memory().bytes(), 1, 3, &[2, 10, 0]).expect("decode");
            assert_eq!(format!("{:?}", back.streams), format!("{:?}", mb.streams));
            assert_eq!(format!("{:?}", mb.streams), format!("{:?}", naive(&plan, &timeline, &map)), "order {order:?}");
            let samples: usize = order.iter().map(|&q| lens[q as usize]).sum();
            assert_eq!(mb.streams[0].num_samples(), samples);
            // Gathered a chunk at a time, the second chunk first: the same bytes in the slot.
            let plans = std::slice::from_ref(&plan);
            let mut parts = super::Parts::new(plans);
            let mut missing: Vec<u32> = parts.missing().collect();
            missing.reverse();
            for c in missing {
                parts.take(plans, &timeline, c, &map[&c]).expect("take");
            }
            assert_eq!(parts.missing().count(), 0);
            let taken = parts.size_bytes();
            assert_eq!(taken > 0, !order.is_empty(), "order {order:?}");
            let mut in_parts = parts.finish(4, plans, &shapes(f64, ids), false).expect("finish");
            assert_eq!(parts.size_bytes(), taken, "the copies' bytes are still known once handed on");
            assert_eq!(in_parts.len(), 1);
            let in_parts = in_parts.remove(0);
            let mut c = Ring::new(memory_for(geometry), geometry, 1, 1).expect("ring");
            assert_eq!(c.write(1, 3, &in_parts, &names).expect("write in parts"), used);
            assert_eq!(c.memory().bytes(), b.memory().bytes(), "in parts, order {order:?}");
        }
    }
}

#[test]
fn a_gathered_minibatch_too_large_for_the_slot_is_refused_before_any_copy() {
    use crate::sampling::{MinibatchPlan, SeqRef};
    let (timeline, mut map) = chunks(true, Ids::Ctf, [false; 2]);
    let plan = MinibatchPlan {
        sequences: (0..700).map(|i| SeqRef { seq: i % 7, chunk: u32::from(i % 7 >= 4) }).collect(),
        sweep: 0,
        end_of_sweep: false,
        position: 0,
        retire: Vec::new(),
        samples: 700,
        next_sweeps_at: Vec::new(),
    };
    let gathered = super::gather(0, &plan, &timeline, &shapes(true, Ids::Ctf), false, &mut map).expect("gather");
    let geometry = RingGeometry::new(1, 64);
    assert!(
        (gathered.to_minibatch().streams[0].num_samples() * 16) as u64 > geometry.slot_size,
        "the minibatch must not fit"
    );
    let mut ring = Ring::new(memory_for(geometry), geometry, 1, 1).expect("ring");
    let before = ring.memory().bytes().to_vec();
    let names = vec!["d".to_owned(), "s".to_owned(), "u".to_owned()];
    assert!(matches!(ring.write(0, 1, &gathered, &names), Err(LayoutError::TooLarge { .. })));
    assert_eq!(ring.memory().bytes(), &before[..]);
}

#[test]
fn parts_refuse_to_finish_before_every_chunk_is_taken_and_a_plan_sequence_a_chunk_lacks() {
    use crate::sampling::{MinibatchPlan, SeqRef};
    let (timeline, map) = chunks(false, Ids::Ctf, [false; 2]);
    let plan = MinibatchPlan {
        sequences: vec![SeqRef { seq: 5, chunk: 1 }, SeqRef { seq: 0, chunk: 0 }],
        sweep: 0,
        end_of_sweep: false,
        position: 2,
        retire: Vec::new(),
        samples: 2,
        next_sweeps_at: Vec::new(),
    };
    let plans = std::slice::from_ref(&plan);
    let mut parts = super::Parts::new(plans);
    assert_eq!(parts.missing().collect::<Vec<_>>(), [1, 0], "in order of first need");
    parts.take(plans, &timeline, 1, &map[&1]).expect("take");
    assert!(parts.size_bytes() > 0);
    let err = parts.finish(0, plans, &shapes(false, Ids::Ctf), false).expect_err("chunk 0 missing");
    assert_eq!(err.to_string(), "chunk 0 is not loaded");
    // Chunk 1's data offered as chunk 0: its sequence 0 is there, so a timeline whose chunk 0
    // starts later finds the plan's sequence outside it.
    let shifted = crate::sampling::Timeline { seq_len: vec![1; 7].into(), chunk_start: vec![1, 4, 7] };
    let err = parts.take(plans, &shifted, 0, &map[&0]).expect_err("sequence 0 is before chunk 0");
    assert_eq!(err.to_string(), "sequence 0 is not in chunk 0");
}

#[test]
fn a_chunk_stored_otherwise_than_declared_is_refused_naming_its_stream() {
    use crate::format::chunk::StreamKind;
    use crate::sampling::{MinibatchPlan, SeqRef};
    let (timeline, mut map) = chunks(false, Ids::Ctf, [false; 2]);
    // Sequences of both chunks; the check is made at each chunk's first sequence.
    let plan = MinibatchPlan {
        sequences: vec![SeqRef { seq: 0, chunk: 0 }, SeqRef { seq: 5, chunk: 1 }, SeqRef { seq: 1, chunk: 0 }],
        sweep: 0,
        end_of_sweep: false,
        position: 0,
        retire: Vec::new(),
        samples: 3,
        next_sweeps_at: Vec::new(),
    };
    let good = shapes(false, Ids::Ctf);
    super::gather(0, &plan, &timeline, &good, false, &mut map).expect("the declared shapes");
    let mut wider = good.clone();
    wider[0].dim = 3;
    let err = super::gather(0, &plan, &timeline, &wider, false, &mut map).expect_err("dimension 2, not 3");
    assert_eq!(err.to_string(), "stream 0 of chunk 0 has dimension 2, the dataset declares 3");
    let mut f64s = good.clone();
    f64s[1].float64 = true;
    let err = super::gather(0, &plan, &timeline, &f64s, false, &mut map).expect_err("f32, not f64");
    assert_eq!(err.to_string(), "stream 1 of chunk 0 is not stored as the dataset declares (kind or precision)");
    let mut more = good;
    more.push(super::StreamShape { kind: StreamKind::Dense, dim: 1, float64: false });
    let err = super::gather(0, &plan, &timeline, &more, false, &mut map).expect_err("no fourth stream");
    assert_eq!(err.to_string(), "chunk 0 has 3 streams but 4 stream shapes were given");
}

#[test]
fn what_is_found_once_a_chunk_is_found_again_for_a_piece_of_another_stream() {
    use crate::format::chunk::{StreamData, StreamValues};
    let (_, map) = chunks(false, Ids::Ctf, [false; 2]);
    let held = vec![map[&0].clone(), map[&1].clone()];
    let piece = |chunk, stream| super::Piece { chunk, stream, s0: 0, s1: 1, e0: 0, e1: 1 };
    // Chunk 0's first piece reads stream 0, a later one stream 1; chunk 1's reads stream 2.
    let pieces = [piece(0, 0), piece(1, 2), piece(0, 1), piece(0, 0)];
    let kind = |sd: &StreamData| match sd.data {
        StreamValues::Dense { .. } => "dense",
        StreamValues::Sparse { .. } => "sparse",
        StreamValues::Strings { .. } => "strings",
    };
    let found = super::fill::per_chunk(&held, &pieces, kind);
    let kinds: Vec<&str> = pieces.iter().map(|p| found.of(p)).collect();
    assert_eq!(kinds, ["dense", "strings", "sparse", "dense"]);
}

#[test]
fn frame_mode_is_checked_where_the_minibatch_is_located_and_a_copy_gathers_the_same_bytes() {
    use crate::sampling::{MinibatchPlan, SeqRef};
    let (timeline, mut map) = chunks(false, Ids::Ctf, [false; 2]);
    let plan = |seqs: &[(u32, u32)]| MinibatchPlan {
        sequences: seqs.iter().map(|&(seq, chunk)| SeqRef { seq, chunk }).collect(),
        sweep: 0,
        end_of_sweep: false,
        position: 0,
        retire: Vec::new(),
        samples: 0,
        next_sweeps_at: Vec::new(),
    };
    // Frame mode: sequence 1 of chunk 0 has 3 samples. The error comes from `gather` itself (the
    // daemon's planner), not from the copy into a slot.
    let framed = plan(&[(0, 0), (5, 1), (1, 0)]);
    let err = super::gather(0, &framed, &timeline, &shapes(false, Ids::Ctf), true, &mut map).expect_err("3 samples");
    assert!(
        matches!(err, crate::format::errors::DataError::NonFrame { seq: 1, chunk: 0, samples: 3, stream: Some(0) }),
        "{err}"
    );
    // One-sample sequences pass frame mode.
    super::gather(0, &plan(&[(0, 0), (5, 1)]), &timeline, &shapes(false, Ids::Ctf), true, &mut map).expect("frames");
    // Copied on another thread (as the daemon's fillers do) or here: the same minibatch, byte for
    // byte, and the one a naive gather makes.
    let whole = plan(&[(6, 1), (1, 0), (2, 0), (4, 1), (3, 0), (0, 0), (5, 1)]);
    let gathered = super::gather(3, &whole, &timeline, &shapes(false, Ids::Ctf), false, &mut map).expect("gather");
    let copy = gathered.clone();
    let there = std::thread::spawn(move || copy.to_minibatch()).join().expect("the other thread");
    let here = gathered.to_minibatch();
    assert_eq!(format!("{there:?}"), format!("{here:?}"));
    assert_eq!(format!("{here:?}"), format!("{:?}", gathered.clone().to_minibatch()), "a copy after a copy");
    assert_eq!(format!("{:?}", here.streams), format!("{:?}", naive(&whole, &timeline, &map)));
}
