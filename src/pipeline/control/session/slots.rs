//! Who holds each ring slot of a session ([`SlotTable`]: ownership, generations, stale
//! releases): one connection's bookkeeping, apart from the registry all connections share.

/// Who holds a ring slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOwner {
    /// The producer may write it (free, or being filled).
    Producer,
    /// Announced to the client with this generation; it holds it until `release`.
    Client {
        /// Generation announced.
        generation: u64,
        /// Index of the minibatch in it.
        minibatch: u64,
    },
}

/// Ring slot bookkeeping of one session: generations and ownership.
#[derive(Debug, Clone)]
pub struct SlotTable {
    owner: Vec<SlotOwner>,
    generation: Vec<u64>,
}

/// What a `release` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The slot goes back to the producer; it held minibatch `minibatch`.
    Freed {
        /// The minibatch index that was in the slot.
        minibatch: u64,
    },
    /// Unknown slot, a slot not held by the client, or an old generation: ignored.
    Stale,
}

impl SlotTable {
    /// `n` slots, all the producer's, generation 0.
    #[must_use]
    pub fn new(n: usize) -> Self {
        Self { owner: vec![SlotOwner::Producer; n], generation: vec![0; n] }
    }

    /// The generation the producer should write into `slot` next (the current one + 1).
    #[must_use]
    pub fn next_generation(&self, slot: usize) -> u64 {
        self.generation[slot] + 1
    }

    /// The producer filled `slot` with `generation`: it now belongs to the client.
    pub fn announce(&mut self, slot: usize, generation: u64, minibatch: u64) {
        self.generation[slot] = generation;
        self.owner[slot] = SlotOwner::Client { generation, minibatch };
    }

    /// The client gives `slot` back.
    pub fn release(&mut self, slot: u64, generation: u64) -> Release {
        let Ok(i) = usize::try_from(slot) else { return Release::Stale };
        match self.owner.get(i) {
            Some(&SlotOwner::Client { generation: g, minibatch }) if g == generation => {
                self.owner[i] = SlotOwner::Producer;
                Release::Freed { minibatch }
            }
            _ => Release::Stale,
        }
    }

    /// Slots the client holds.
    #[must_use]
    pub fn leased(&self) -> usize {
        self.owner.iter().filter(|o| matches!(o, SlotOwner::Client { .. })).count()
    }
}
