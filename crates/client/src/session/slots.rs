//! What a delivered minibatch's slot holds: its tensors, an owned copy, a mixture's own tensors,
//! read from the ring it was delivered in.

use minibatchd_shm::layout::{self, DType, LayoutError, RingHeader, TensorView};
use minibatchd_shm::Minibatch;
use minibatchd_sys::ReadOnlyMapping;

use super::{ClientError, Delivered, Session};
use crate::protocol::{MixtureSlot, MixtureState};
use crate::Result;

impl Session {
    /// The mapping and header of the ring `mb` came from.
    pub(super) fn ring_of(&self, mb: &Delivered) -> Result<(&ReadOnlyMapping, &RingHeader)> {
        if mb.ring == self.ring {
            return Ok((&self.mapping, &self.header));
        }
        self.old_rings
            .iter()
            .find(|r| r.ring == mb.ring)
            .map(|r| (&r.mapping, &r.header))
            .ok_or_else(|| ClientError::Protocol(format!("a minibatch of ring {} that is no longer mapped", mb.ring)))
    }

    /// What a mixture's minibatch carries in its slot after the streams.
    pub(super) fn mixture_slot(&self, mb: &Delivered) -> Result<MixtureSlot> {
        let tensors = self.tensors(mb)?;
        let find = |name: &str| {
            tensors
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.data)
                .ok_or_else(|| ClientError::Protocol(format!("a mixture's minibatch without its {name} tensor")))
        };
        let ints = |name: &str| -> Result<Vec<u32>> {
            find(name)?
                .chunks_exact(4)
                .map(|b| u32::try_from(i32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| ClientError::Protocol(format!("a negative source in {name}")))
        };
        let state: Vec<i64> = find("mixture/state")?
            .chunks_exact(8)
            .map(|b| i64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        let state = MixtureState::from_tensor(&state)
            .ok_or_else(|| ClientError::Protocol("a mixture's state tensor of another shape".into()))?;
        Ok(MixtureSlot { state, sources: ints("mixture/sources")?, sweeps_ended: ints("mixture/sweeps_ended")? })
    }

    /// The slot's tensors (zero-copy views on the ring), in table order.
    ///
    /// # Errors
    /// [`LayoutError`] for a corrupt or stale slot.
    pub fn tensors(&self, mb: &Delivered) -> Result<Vec<TensorView<'_>>> {
        let (mapping, header) = self.ring_of(mb)?;
        let bytes = &mapping.bytes()[header.slot_range(mb.slot)];
        let (h, table) = layout::decode_slot(bytes)?;
        if h.generation != mb.generation {
            return Err(LayoutError::Corrupt("stale slot generation").into());
        }
        Ok(table
            .iter()
            .map(|(e, _)| {
                let name_at = e.name_offset as usize;
                TensorView {
                    name: std::str::from_utf8(&bytes[name_at..name_at + e.name_len as usize]).unwrap_or(""),
                    dtype: DType::from_code(e.dtype).unwrap_or(DType::U8),
                    shape: e.shape[..(e.ndim as usize).min(e.shape.len())].to_vec(),
                    data: &bytes[e.data_range()],
                }
            })
            .collect())
    }

    /// Copies `mb` out into an owned [`Minibatch`] (the delivery layout of `minibatchd_shm::owned`).
    ///
    /// # Errors
    /// [`LayoutError`].
    pub fn copy(&self, mb: &Delivered) -> Result<Minibatch> {
        let dims: Vec<usize> = self.streams.iter().map(|s| usize::try_from(s.dim).unwrap_or(usize::MAX)).collect();
        let mut out = minibatchd_shm::decode_minibatch(self.ring_of(mb)?.0.bytes(), mb.slot, mb.generation, &dims)?;
        out.sweep = mb.meta.sweep;
        out.end_of_sweep = mb.meta.end_of_sweep;
        out.position = mb.meta.position;
        Ok(out)
    }
}
