//! A ring of slots over some [`SlotMemory`]: the header is written once at creation; each
//! minibatch is encoded into a slot as a tensor table plus data ([`super::layout`]).
//!
//! The ring knows nothing of leases: which slot is free is the session's business
//! (the daemon's session). It only guarantees that a slot's header is written after its data, so a
//! reader that checks the generation never sees a half-written slot as valid.

use minibatchd_sys::{SharedSlots, SlotMemory};

use crate::layout::{self, LayoutError, RingHeader, TensorMeta, RING_HEADER_BYTES, SLOT_GRANULE};
use crate::table::{SlotSource, TensorDesc};
use crate::Result;

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
    pub fn new(mut memory: M, geometry: RingGeometry, daemon_id: u64, session_id: u64) -> Result<Self> {
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

    /// Writes `source` into slot `slot` with `generation`: header, tensor table and names here,
    /// each tensor's bytes by [`SlotSource::fill`] straight into the slot (the engine copies
    /// samples from the parsed chunks into shared memory with no intermediate buffer). Tensor
    /// `t` is named `names[t.stream]/field`. Returns the bytes used.
    ///
    /// # Errors
    /// [`LayoutError::TooLarge`] when the minibatch does not fit a slot (nothing is copied);
    /// `Corrupt` for a slot index out of range.
    pub fn write(&mut self, slot: u64, generation: u64, source: &impl SlotSource, names: &[String]) -> Result<u64> {
        if slot >= self.header.slot_count {
            return Err(LayoutError::Corrupt("slot index out of range"));
        }
        let range = self.header.slot_range(slot);
        encode(&mut self.memory.bytes_mut()[range], generation, source, names)
    }

    /// The ring for several writers at once, each slot written by one of them at a time
    /// ([`SharedRing::write`]); its memory is reached only through those writes from then on.
    ///
    /// # Errors
    /// [`LayoutError::Corrupt`] if the slots do not fit the memory (checked in [`Ring::new`]).
    pub fn into_shared(self) -> Result<SharedRing<M>> {
        let Self { memory, header } = self;
        let (offset, size, count) = (header.slot_range(0).start, header.slot_range(0).len(), header.slot_count);
        let count = usize::try_from(count).map_err(|_| LayoutError::Corrupt("slot count"))?;
        let slots =
            SharedSlots::new(memory, offset, size, count).ok_or(LayoutError::Corrupt("slots past the memory"))?;
        Ok(SharedRing { slots, header })
    }
}

/// A ring written by several threads at once (the daemon's fillers), one writer per slot at a
/// time: a ring's slots are disjoint, and each is handed to one writer by the slot protocol
/// (a free slot goes to one minibatch).
pub struct SharedRing<M: SlotMemory> {
    slots: SharedSlots<M>,
    header: RingHeader,
}

impl<M: SlotMemory> std::fmt::Debug for SharedRing<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRing").field("header", &self.header).finish_non_exhaustive()
    }
}

impl<M: SlotMemory> SharedRing<M> {
    /// The header.
    #[must_use]
    pub fn header(&self) -> &RingHeader {
        &self.header
    }

    /// [`Ring::write`] through a shared reference.
    ///
    /// # Errors
    /// As [`Ring::write`]; `Corrupt` also when another thread is writing `slot` now.
    pub fn write(&self, slot: u64, generation: u64, source: &impl SlotSource, names: &[String]) -> Result<u64> {
        if slot >= self.header.slot_count {
            return Err(LayoutError::Corrupt("slot index out of range"));
        }
        let k = usize::try_from(slot).map_err(|_| LayoutError::Corrupt("slot index out of range"))?;
        self.slots
            .write(k, |out| encode(out, generation, source, names))
            .unwrap_or(Err(LayoutError::Corrupt("a slot written by two writers at once")))
    }
}

/// Encodes `source` into the slot `out`: header, tensor table and names, each tensor's bytes by
/// [`SlotSource::fill`]; the bytes used.
fn encode(out: &mut [u8], generation: u64, source: &impl SlotSource, names: &[String]) -> Result<u64> {
    let tensors = source.tensors();
    let tensor_names = tensor_names(&tensors, names);
    let metas = metas(&tensors, &tensor_names);
    layout::encode_slot_with(out, generation, source.index(), source.fingerprint(), &metas, |i, out| {
        source.fill(&tensors[i], out);
    })
}

fn tensor_names(tensors: &[TensorDesc], names: &[String]) -> Vec<String> {
    tensors.iter().map(|t| format!("{}/{}", names.get(t.stream).map_or("", String::as_str), t.field.name())).collect()
}

fn metas<'a>(tensors: &'a [TensorDesc], names: &'a [String]) -> Vec<TensorMeta<'a>> {
    tensors
        .iter()
        .zip(names)
        .map(|(t, name)| TensorMeta { name, dtype: t.dtype, shape: t.dims(), nbytes: t.nbytes() })
        .collect()
}

/// The bytes `source` needs in a slot, its tensors named after `names`.
#[must_use]
pub fn needed_bytes(source: &impl SlotSource, names: &[String]) -> u64 {
    let tensors = source.tensors();
    let tensor_names = tensor_names(&tensors, names);
    layout::encoded_size_of(&metas(&tensors, &tensor_names))
}

#[cfg(test)]
mod tests {
    //! The conformance suite: the same checks on both backends.
    use super::*;
    use crate::layout::RingHeader;
    use crate::owned::{decode_minibatch, Indices, MbData, MbStream, Minibatch, Values};
    use minibatchd_sys::{LocalMemory, MemfdMemory};

    fn sample_minibatch() -> Minibatch {
        Minibatch {
            index: 3,
            sweep: 0,
            end_of_sweep: false,
            position: 0,
            fingerprint: 0x0123_4567_89ab_cdef,
            streams: vec![
                MbStream {
                    sequence_offsets: vec![0, 2, 3],
                    data: MbData::Dense { dim: 2, values: Values::F32(vec![0.5, 1.0, f32::NAN, -0.0, 3.0, 4.0]) },
                },
                MbStream {
                    sequence_offsets: vec![0, 1, 2],
                    data: MbData::Sparse {
                        dim: 10,
                        sample_offsets: vec![0, 2, 2],
                        indices: Indices::I32(vec![3, 7]),
                        values: Values::F32(vec![1.0, 2.0]),
                    },
                },
                MbStream {
                    sequence_offsets: vec![0, 1],
                    data: MbData::Strings { offsets: vec![0, 3], bytes: b"abc".to_vec() },
                },
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

    #[test]
    fn a_shared_ring_is_written_by_two_threads_and_reads_back_as_written() {
        let geometry = RingGeometry::new(4, 5000);
        let memory = MemfdMemory::create("shared", geometry.total_bytes()).expect("memfd");
        let view = minibatchd_sys::ReadOnlyMapping::map(
            memory.fd().try_clone_to_owned().expect("dup"),
            geometry.total_bytes(),
        )
        .expect("map");
        let ring = Ring::new(memory, geometry, 11, 22).expect("ring").into_shared().expect("shared");
        assert_eq!(ring.header().slot_count, 4);
        let names = vec!["f".to_owned(), "l".to_owned(), "u".to_owned()];
        let mb = sample_minibatch();
        std::thread::scope(|s| {
            for half in 0..2u64 {
                let (ring, names, mb) = (&ring, &names, &mb);
                s.spawn(move || {
                    for round in 0..50 {
                        for slot in [half, half + 2] {
                            let mut mine = mb.clone();
                            mine.index = 100 * slot + round;
                            ring.write(slot, round + 1, &mine, names).expect("fits");
                        }
                    }
                });
            }
        });
        for slot in 0..4 {
            let back = decode_minibatch(view.bytes(), slot, 50, &[2, 10, 1]).expect("decodes");
            assert_eq!(back.index, 100 * slot + 49);
            assert_eq!(format!("{:?}", back.streams), format!("{:?}", mb.streams));
        }
        assert!(ring.write(4, 1, &mb, &names).is_err(), "slot out of range");
    }

    #[test]
    fn local_backend_conforms() {
        let bytes = usize::try_from(RingGeometry::new(3, 5000).total_bytes()).expect("a small ring fits in memory");
        conformance(LocalMemory::new(bytes));
    }

    #[test]
    fn memfd_backend_conforms() {
        conformance(MemfdMemory::create("conformance", RingGeometry::new(3, 5000).total_bytes()).expect("memfd"));
    }
}
