//! A ring of slots over some [`SlotMemory`]: the header is written once at creation; each
//! minibatch is encoded into a slot as a tensor table plus data ([`super::layout`]).
//!
//! The ring knows nothing of leases: which slot is free is the session's business
//! (`pipeline::slots`). It only guarantees that a slot's header is written after its data, so a
//! reader that checks the generation never sees a half-written slot as valid.

use crate::format::chunk::{Indices, Values};
use crate::minibatch::{Elem, Gathered, MbData, MbStream, Minibatch};

use super::layout::{self, DType, LayoutError, RingHeader, TensorMeta, TensorSpec, RING_HEADER_BYTES, SLOT_GRANULE};
use super::{as_bytes, cast_slice, SlotMemory};

/// Slot count and size of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Number of slots (≥ 1).
    pub slot_count: u64,
    /// Bytes per slot, a multiple of [`SLOT_GRANULE`].
    pub slot_size: u64,
}

impl RingGeometry {
    /// `slot_count` slots of at least `slot_size` bytes (rounded up to the granule).
    #[must_use]
    pub fn new(slot_count: u64, slot_size: u64) -> Self {
        Self { slot_count: slot_count.max(1), slot_size: slot_size.max(1).div_ceil(SLOT_GRANULE) * SLOT_GRANULE }
    }

    /// Total bytes of the ring (header included).
    #[must_use]
    pub fn total_bytes(&self) -> u64 {
        RING_HEADER_BYTES.saturating_add(self.slot_count.saturating_mul(self.slot_size))
    }
}

/// A ring being written.
pub struct Ring<M: SlotMemory> {
    memory: M,
    header: RingHeader,
}

impl<M: SlotMemory> std::fmt::Debug for Ring<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("header", &self.header).finish_non_exhaustive()
    }
}

impl<M: SlotMemory> Ring<M> {
    /// Writes the header for `geometry` into `memory`, which must hold `geometry.total_bytes()`.
    ///
    /// # Errors
    /// [`LayoutError::Corrupt`] if the memory is too small.
    pub fn new(mut memory: M, geometry: RingGeometry, daemon_id: u64, session_id: u64) -> Result<Self, LayoutError> {
        let header = RingHeader::new(daemon_id, session_id, geometry.slot_count, geometry.slot_size);
        if (memory.bytes().len() as u64) < header.total_bytes {
            return Err(LayoutError::Corrupt("memory smaller than the ring"));
        }
        header.write(memory.bytes_mut());
        Ok(Self { memory, header })
    }

    /// The header.
    #[must_use]
    pub fn header(&self) -> &RingHeader {
        &self.header
    }

    /// The memory (for the memfd to pass, or for tests that read it back).
    #[must_use]
    pub fn memory(&self) -> &M {
        &self.memory
    }

    /// Encodes `mb` into slot `slot` with `generation`. Returns the bytes used.
    ///
    /// # Errors
    /// [`LayoutError::TooLarge`] when the minibatch does not fit a slot; `Corrupt` for a slot
    /// index out of range.
    pub fn write(&mut self, slot: u64, generation: u64, mb: &Minibatch, names: &[String]) -> Result<u64, LayoutError> {
        if slot >= self.header.slot_count {
            return Err(LayoutError::Corrupt("slot index out of range"));
        }
        let range = self.header.slot_range(slot);
        let shapes = shapes_of(mb);
        let mut tensor_names = Vec::new();
        for (name, s) in names.iter().zip(&mb.streams) {
            for field in fields_of(s) {
                tensor_names.push(format!("{name}/{field}"));
            }
        }
        let specs = specs_of(mb, &tensor_names, &shapes);
        layout::encode_slot(&mut self.memory.bytes_mut()[range], generation, mb.index, mb.fingerprint, &specs)
    }
}

impl<M: SlotMemory> Ring<M> {
    /// Writes the gathered minibatch `mb` into slot `slot` with `generation`, copying each
    /// sample straight from the parsed chunks into the slot (no intermediate buffers). The bytes
    /// are those [`Ring::write`] writes for `mb.to_minibatch()`. Returns the bytes used.
    ///
    /// # Errors
    /// As [`Ring::write`].
    pub fn write_gathered(
        &mut self,
        slot: u64,
        generation: u64,
        mb: &Gathered,
        names: &[String],
    ) -> Result<u64, LayoutError> {
        if slot >= self.header.slot_count {
            return Err(LayoutError::Corrupt("slot index out of range"));
        }
        let range = self.header.slot_range(slot);
        let tensors = mb.tensors();
        let tensor_names: Vec<String> = tensors
            .iter()
            .map(|t| {
                format!(
                    "{}/{}",
                    names.get(t.stream).map_or("", String::as_str),
                    t.field.name()
                )
            })
            .collect();
        let metas: Vec<TensorMeta<'_>> = tensors
            .iter()
            .zip(&tensor_names)
            .map(|(t, name)| TensorMeta {
                name,
                dtype: dtype_of(t.elem),
                shape: &t.shape[..t.ndim],
                nbytes: t.nbytes(),
            })
            .collect();
        layout::encode_slot_with(
            &mut self.memory.bytes_mut()[range],
            generation,
            mb.index,
            mb.fingerprint,
            &metas,
            |i, out| mb.fill(&tensors[i], out),
        )
    }
}

fn dtype_of(e: Elem) -> DType {
    match e {
        Elem::F32 => DType::F32,
        Elem::F64 => DType::F64,
        Elem::I32 => DType::I32,
        Elem::I64 => DType::I64,
        Elem::U64 => DType::U64,
        Elem::U8 => DType::U8,
    }
}

fn fields_of(s: &MbStream) -> &'static [&'static str] {
    match s.data {
        MbData::Dense { .. } => &["sequence_offsets", "values"],
        MbData::Sparse { .. } => &["sequence_offsets", "sample_offsets", "indices", "values"],
        MbData::Strings { .. } => &["sequence_offsets", "offsets", "bytes"],
    }
}

fn values_spec(v: &Values) -> (DType, &[u8], u64) {
    match v {
        Values::F32(x) => (DType::F32, as_bytes(x), x.len() as u64),
        Values::F64(x) => (DType::F64, as_bytes(x), x.len() as u64),
    }
}

/// Shapes per tensor, in table order (kept apart so specs can borrow them).
fn shapes_of(mb: &Minibatch) -> Vec<[u64; 2]> {
    let mut out = Vec::new();
    for s in &mb.streams {
        out.push([s.sequence_offsets.len() as u64, 0]);
        let n = s.num_samples() as u64;
        match &s.data {
            MbData::Dense { dim, .. } => out.push([n, *dim as u64]),
            MbData::Sparse { sample_offsets, values, .. } => {
                out.push([sample_offsets.len() as u64, 0]);
                out.push([values.len() as u64, 0]);
                out.push([values.len() as u64, 0]);
            }
            MbData::Strings { offsets, bytes } => {
                out.push([offsets.len() as u64, 0]);
                out.push([bytes.len() as u64, 0]);
            }
        }
    }
    out
}

fn specs_of<'a>(mb: &'a Minibatch, names: &'a [String], shapes: &'a [[u64; 2]]) -> Vec<TensorSpec<'a>> {
    let mut out = Vec::new();
    let mut k = 0;
    let mut push = |out: &mut Vec<TensorSpec<'a>>, dtype: DType, data: &'a [u8], two_d: bool| {
        let shape: &'a [u64] = if two_d { &shapes[k][..2] } else { &shapes[k][..1] };
        out.push(TensorSpec { name: &names[k], dtype, shape, data });
        k += 1;
    };
    for s in &mb.streams {
        push(&mut out, DType::I64, as_bytes(&s.sequence_offsets), false);
        match &s.data {
            MbData::Dense { values, .. } => {
                let (dt, b, _) = values_spec(values);
                push(&mut out, dt, b, true);
            }
            MbData::Sparse { sample_offsets, indices, values, .. } => {
                push(&mut out, DType::I64, as_bytes(sample_offsets), false);
                match indices {
                    Indices::I32(i) => push(&mut out, DType::I32, as_bytes(i), false),
                    Indices::U64(i) => push(&mut out, DType::U64, as_bytes(i), false),
                }
                let (dt, b, _) = values_spec(values);
                push(&mut out, dt, b, false);
            }
            MbData::Strings { offsets, bytes } => {
                push(&mut out, DType::I64, as_bytes(offsets), false);
                push(&mut out, DType::U8, bytes, false);
            }
        }
    }
    out
}

/// The bytes one minibatch needs in a slot.
#[must_use]
pub fn needed_bytes(mb: &Minibatch, names: &[String]) -> u64 {
    let shapes = shapes_of(mb);
    let mut tensor_names = Vec::new();
    for (name, s) in names.iter().zip(&mb.streams) {
        for field in fields_of(s) {
            tensor_names.push(format!("{name}/{field}"));
        }
    }
    layout::encoded_size(&specs_of(mb, &tensor_names, &shapes))
}

/// Decodes slot `slot` of the ring in `ring_bytes` back into an owned [`Minibatch`] (a copy):
/// what a Rust client or a test compares with `dump`. `expected_generation` guards against a
/// stale slot. Sweep, end-of-sweep and position are not in the slot (they travel in the `ready`
/// message) and are left 0/false.
///
/// # Errors
/// [`LayoutError`] for a corrupt slot, a stale generation, or tensors that do not form streams.
pub fn decode_minibatch(ring_bytes: &[u8], slot: u64, expected_generation: u64, stream_dims: &[usize]) -> Result<Minibatch, LayoutError> {
    let header = RingHeader::read(ring_bytes)?;
    if slot >= header.slot_count {
        return Err(LayoutError::Corrupt("slot index out of range"));
    }
    let bytes = &ring_bytes[header.slot_range(slot)];
    let (sh, table) = layout::decode_slot(bytes)?;
    if sh.generation != expected_generation {
        return Err(LayoutError::Corrupt("stale slot generation"));
    }
    let data = |i: usize| -> &[u8] {
        let e = &table[i].0;
        &bytes[e.offset as usize..(e.offset + e.nbytes) as usize]
    };
    let i64s = |i: usize| cast_slice::<i64>(data(i)).map(<[i64]>::to_vec).ok_or(LayoutError::Corrupt("int64 tensor"));
    let values = |i: usize| -> Result<Values, LayoutError> {
        match DType::from_code(table[i].0.dtype)? {
            DType::F32 => Ok(Values::F32(cast_slice::<f32>(data(i)).ok_or(LayoutError::Corrupt("float32 tensor"))?.to_vec())),
            DType::F64 => Ok(Values::F64(cast_slice::<f64>(data(i)).ok_or(LayoutError::Corrupt("float64 tensor"))?.to_vec())),
            _ => Err(LayoutError::Corrupt("values tensor is not a float type")),
        }
    };
    let mut streams = Vec::new();
    let mut i = 0;
    for &dim in stream_dims {
        let field = |i: usize| table.get(i).map(|t| t.1.rsplit('/').next().unwrap_or("")).unwrap_or("");
        if field(i) != "sequence_offsets" {
            return Err(LayoutError::Corrupt("expected a sequence_offsets tensor"));
        }
        let sequence_offsets = i64s(i)?;
        let data = match field(i + 1) {
            "values" => {
                i += 2;
                MbData::Dense { dim, values: values(i - 1)? }
            }
            "sample_offsets" if table.len() >= i + 4 => {
                let indices = match DType::from_code(table.get(i + 2).ok_or(LayoutError::Corrupt("indices"))?.0.dtype)? {
                    DType::I32 => Indices::I32(cast_slice::<i32>(data(i + 2)).ok_or(LayoutError::Corrupt("indices"))?.to_vec()),
                    DType::U64 => Indices::U64(cast_slice::<u64>(data(i + 2)).ok_or(LayoutError::Corrupt("indices"))?.to_vec()),
                    _ => return Err(LayoutError::Corrupt("indices dtype")),
                };
                let d = MbData::Sparse { dim, sample_offsets: i64s(i + 1)?, indices, values: values(i + 3)? };
                i += 4;
                d
            }
            "offsets" if table.len() >= i + 3 => {
                let d = MbData::Strings { offsets: i64s(i + 1)?, bytes: data(i + 2).to_vec() };
                i += 3;
                d
            }
            _ => return Err(LayoutError::Corrupt("unknown stream layout")),
        };
        streams.push(MbStream { sequence_offsets, data });
    }
    Ok(Minibatch { index: sh.minibatch, sweep: 0, end_of_sweep: false, position: 0, fingerprint: sh.fingerprint, streams })
}

#[cfg(test)]
mod tests {
    //! The conformance suite: the same checks on both backends.
    use super::*;
    use crate::shm::{LocalMemory, MemfdMemory};

    fn sample_minibatch() -> Minibatch {
        Minibatch {
            index: 3,
            sweep: 0,
            end_of_sweep: false,
            position: 0,
            fingerprint: 0x0123_4567_89ab_cdef,
            streams: vec![
                MbStream { sequence_offsets: vec![0, 2, 3], data: MbData::Dense { dim: 2, values: Values::F32(vec![0.5, 1.0, f32::NAN, -0.0, 3.0, 4.0]) } },
                MbStream {
                    sequence_offsets: vec![0, 1, 2],
                    data: MbData::Sparse { dim: 10, sample_offsets: vec![0, 2, 2], indices: Indices::I32(vec![3, 7]), values: Values::F32(vec![1.0, 2.0]) },
                },
                MbStream { sequence_offsets: vec![0, 1], data: MbData::Strings { offsets: vec![0, 3], bytes: b"abc".to_vec() } },
            ],
        }
    }

    fn conformance<M: SlotMemory>(memory: M) {
        let geometry = RingGeometry::new(3, 5000);
        assert_eq!(geometry.slot_size, 8192);
        let mut ring = Ring::new(memory, geometry, 11, 22).expect("ring");
        let names = vec!["f".to_owned(), "l".to_owned(), "u".to_owned()];
        let mb = sample_minibatch();
        let used = ring.write(2, 5, &mb, &names).expect("fits");
        assert_eq!(used, needed_bytes(&mb, &names));
        let bytes = ring.memory().bytes();
        let h = RingHeader::read(bytes).expect("header");
        assert_eq!((h.daemon_id, h.session_id, h.slot_count, h.slot_size), (11, 22, 3, 8192));
        let back = decode_minibatch(bytes, 2, 5, &[2, 10, 1]).expect("decodes");
        // NaN != NaN: compare the dense values bitwise.
        assert_eq!(format!("{:?}", back.streams), format!("{:?}", mb.streams));
        assert_eq!(back.index, 3);
        assert!(decode_minibatch(bytes, 2, 4, &[2, 10, 1]).is_err(), "stale generation");
        assert!(decode_minibatch(bytes, 1, 0, &[2, 10, 1]).is_err(), "never written");
        assert!(ring.write(3, 1, &mb, &names).is_err(), "slot out of range");
        let mut big = mb.clone();
        big.streams[0].data = MbData::Dense { dim: 2, values: Values::F32(vec![0.0; 4000]) };
        big.streams[0].sequence_offsets = vec![0, 2000];
        assert!(matches!(ring.write(0, 1, &big, &names), Err(LayoutError::TooLarge { slot_size_bytes: 8192, .. })));
    }

    /// Two chunks with a dense, a sparse (CTF or deepx ids) and a strings stream; sequences of
    /// 0–3 samples.
    fn chunks(
        f64: bool,
        u64_ids: bool,
    ) -> (
        crate::sampling::Timeline,
        crate::minibatch::ChunkMap<std::sync::Arc<crate::format::chunk::ParsedChunk>>,
    ) {
        use crate::format::chunk::{ParsedChunk, StreamData, StreamValues};
        let seq_lens: [&[usize]; 2] = [&[1, 3, 0, 2], &[2, 1, 1]];
        let mut map = crate::minibatch::ChunkMap::default();
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
                    Values::F64(v)
                } else {
                    Values::F32(v.iter().map(|&x| x as f32).collect())
                }
            };
            let sample_offsets: Vec<usize> = (0..=samples).map(|j| j * 2 - j / 2).collect();
            let entries = *sample_offsets.last().unwrap_or(&0);
            let ids: Vec<u64> = (0..entries as u64)
                .map(|i| (i * 7 + c as u64) % 10)
                .collect();
            let indices = if u64_ids {
                Indices::U64(ids.iter().map(|&i| i << 40).collect())
            } else {
                Indices::I32(ids.iter().map(|&i| i as i32).collect())
            };
            let string_offsets: Vec<usize> = (0..=samples).map(|j| j * 3).collect();
            let streams = vec![
                StreamData {
                    seq_offsets: seq_offsets.clone(),
                    data: StreamValues::Dense {
                        dim: 2,
                        values: floats(samples * 2),
                    },
                },
                StreamData {
                    seq_offsets: seq_offsets.clone(),
                    data: StreamValues::Sparse {
                        sample_offsets,
                        indices,
                        values: floats(entries),
                    },
                },
                StreamData {
                    seq_offsets,
                    data: StreamValues::Strings {
                        offsets: string_offsets,
                        bytes: (0..samples * 3).map(|b| b as u8).collect(),
                    },
                },
            ];
            map.insert(
                c as u32,
                std::sync::Arc::new(ParsedChunk {
                    chunk: c,
                    num_sequences: lens.len(),
                    streams,
                }),
            );
        }
        (
            crate::sampling::Timeline {
                seq_len: vec![1; 7],
                chunk_start: vec![0, 4, 7],
            },
            map,
        )
    }

    fn shapes(f64: bool, u64_ids: bool) -> Vec<crate::minibatch::StreamShape> {
        use crate::format::chunk::StreamKind;
        let sparse = if u64_ids {
            StreamKind::SparseU64
        } else {
            StreamKind::SparseI32
        };
        [
            (StreamKind::Dense, 2),
            (sparse, 10),
            (StreamKind::Strings, 0),
        ]
        .into_iter()
        .map(|(kind, dim)| crate::minibatch::StreamShape {
            kind,
            dim,
            float64: f64,
        })
        .collect()
    }

    /// The minibatch built the obvious way, sample by sample (an oracle independent of
    /// `Gathered::fill`).
    fn naive(
        plan: &crate::sampling::MinibatchPlan,
        timeline: &crate::sampling::Timeline,
        map: &crate::minibatch::ChunkMap<std::sync::Arc<crate::format::chunk::ParsedChunk>>,
    ) -> Vec<MbStream> {
        use crate::format::chunk::StreamValues;
        fn push_values(dst: &mut Values, src: &Values, i: usize) {
            match (dst, src) {
                (Values::F32(d), Values::F32(s)) => d.push(s[i]),
                (Values::F64(d), Values::F64(s)) => d.push(s[i]),
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
                        Values::F64(Vec::new())
                    } else {
                        Values::F32(Vec::new())
                    }
                };
                let data = match &sd.data {
                    StreamValues::Dense { dim, values } => MbData::Dense {
                        dim: *dim,
                        values: empty(values),
                    },
                    StreamValues::Sparse {
                        indices, values, ..
                    } => MbData::Sparse {
                        dim: 10,
                        sample_offsets: vec![0],
                        indices: if matches!(indices, Indices::U64(_)) {
                            Indices::U64(Vec::new())
                        } else {
                            Indices::I32(Vec::new())
                        },
                        values: empty(values),
                    },
                    StreamValues::Strings { .. } => MbData::Strings {
                        offsets: vec![0],
                        bytes: Vec::new(),
                    },
                };
                MbStream {
                    sequence_offsets: vec![0],
                    data,
                }
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
                            MbData::Sparse {
                                sample_offsets,
                                indices,
                                values,
                                ..
                            },
                            StreamValues::Sparse {
                                sample_offsets: so,
                                indices: si,
                                values: sv,
                            },
                        ) => {
                            for e in so[j]..so[j + 1] {
                                match (&mut *indices, si) {
                                    (Indices::I32(d), Indices::I32(s)) => d.push(s[e]),
                                    (Indices::U64(d), Indices::U64(s)) => d.push(s[e]),
                                    _ => panic!("mixed index types"),
                                }
                                push_values(values, sv, e);
                            }
                            sample_offsets.push(values.len() as i64);
                        }
                        (
                            MbData::Strings { offsets, bytes },
                            StreamValues::Strings {
                                offsets: so,
                                bytes: sb,
                            },
                        ) => {
                            bytes.extend_from_slice(&sb[so[j]..so[j + 1]]);
                            offsets.push(bytes.len() as i64);
                        }
                        _ => panic!("kinds differ"),
                    }
                }
                let last = *o.sequence_offsets.last().unwrap_or(&0);
                o.sequence_offsets.push(last + (s1 - s0) as i64);
            }
        }
        out
    }

    #[test]
    fn gathered_writes_the_bytes_of_the_assembled_minibatch() {
        use crate::sampling::{MinibatchPlan, SeqRef};
        let orders: [&[u32]; 4] = [&[6, 0, 3, 1, 5, 2, 4], &[2], &[], &[1, 1, 4]];
        for (f64, u64_ids) in [(false, false), (true, true)] {
            let (timeline, mut map) = chunks(f64, u64_ids);
            for order in orders {
                let plan = MinibatchPlan {
                    sequences: order
                        .iter()
                        .map(|&seq| SeqRef {
                            seq,
                            chunk: u32::from(seq >= 4),
                        })
                        .collect(),
                    sweep: 1,
                    end_of_sweep: true,
                    position: 9,
                    retire: Vec::new(),
                };
                let names = vec!["d".to_owned(), "s".to_owned(), "u".to_owned()];
                let gathered = crate::minibatch::gather(
                    4,
                    &plan,
                    &timeline,
                    &shapes(f64, u64_ids),
                    false,
                    &mut map,
                )
                .expect("gather");
                let mb = gathered.to_minibatch();
                let geometry = RingGeometry::new(2, 8192);
                let mut a = Ring::new(
                    LocalMemory::new(geometry.total_bytes() as usize),
                    geometry,
                    1,
                    1,
                )
                .expect("ring");
                let mut b = Ring::new(
                    LocalMemory::new(geometry.total_bytes() as usize),
                    geometry,
                    1,
                    1,
                )
                .expect("ring");
                let used = a.write(1, 3, &mb, &names).expect("write");
                assert_eq!(
                    b.write_gathered(1, 3, &gathered, &names)
                        .expect("write_gathered"),
                    used
                );
                assert_eq!(a.memory().bytes(), b.memory().bytes(), "order {order:?}");
                let back = decode_minibatch(b.memory().bytes(), 1, 3, &[2, 10, 0]).expect("decode");
                assert_eq!(format!("{:?}", back.streams), format!("{:?}", mb.streams));
                assert_eq!(
                    format!("{:?}", mb.streams),
                    format!("{:?}", naive(&plan, &timeline, &map)),
                    "order {order:?}"
                );
                let samples: usize = order
                    .iter()
                    .map(|&q| [1, 3, 0, 2, 2, 1, 1][q as usize])
                    .sum();
                assert_eq!(mb.streams[0].num_samples(), samples);
            }
        }
    }

    #[test]
    fn a_gathered_minibatch_too_large_for_the_slot_is_refused_before_any_copy() {
        use crate::sampling::{MinibatchPlan, SeqRef};
        let (timeline, mut map) = chunks(true, false);
        let plan = MinibatchPlan {
            sequences: (0..700)
                .map(|i| SeqRef {
                    seq: i % 7,
                    chunk: u32::from(i % 7 >= 4),
                })
                .collect(),
            sweep: 0,
            end_of_sweep: false,
            position: 0,
            retire: Vec::new(),
        };
        let gathered =
            crate::minibatch::gather(0, &plan, &timeline, &shapes(true, false), false, &mut map)
                .expect("gather");
        let geometry = RingGeometry::new(1, 64);
        assert!(
            gathered.to_minibatch().streams[0].num_samples() * 16 > geometry.slot_size as usize,
            "the minibatch must not fit"
        );
        let mut ring = Ring::new(
            LocalMemory::new(geometry.total_bytes() as usize),
            geometry,
            1,
            1,
        )
        .expect("ring");
        let before = ring.memory().bytes().to_vec();
        let names = vec!["d".to_owned(), "s".to_owned(), "u".to_owned()];
        assert!(matches!(
            ring.write_gathered(0, 1, &gathered, &names),
            Err(LayoutError::TooLarge { .. })
        ));
        assert_eq!(ring.memory().bytes(), &before[..]);
    }

    #[test]
    fn local_backend_conforms() {
        conformance(LocalMemory::new(RingGeometry::new(3, 5000).total_bytes() as usize));
    }

    #[test]
    fn memfd_backend_conforms() {
        conformance(MemfdMemory::create("conformance", RingGeometry::new(3, 5000).total_bytes()).expect("memfd"));
    }
}
