//! A sparse stream's growing buffers for a chunk being parsed ([`SparseBuf`]): feature ids in
//! 32 bits until one does not fit, then widened to 64 (and narrowed back where a rolled-back
//! line was the only wide one), values, and entry offsets per sample.

use crate::format::chunk::Indices;

/// One sparse stream (a deepx CSR tensor) of the chunk being parsed.
#[derive(Debug, Clone)]
pub struct SparseBuf<T> {
    /// Entry offsets per sample; starts with 0.
    pub sample_offsets: Vec<usize>,
    /// Feature ids, file order.
    pub(super) ids: Ids,
    /// Feature values.
    pub values: Vec<T>,
    /// The committed entries when the ids were widened, while the line that widened them is not
    /// committed yet: if it is rolled back, they go back to 32 bits ([`SparseBuf::renarrow`]).
    pub(super) widened_at: Option<usize>,
    /// Whether a rollback narrowed the ids back once already in this chunk.
    pub(super) renarrowed: bool,
    /// Whether its large vectors are advised huge pages.
    huge: bool,
}

/// Feature ids as parsed: 32 bits wide until one does not fit, then every id widened once.
#[derive(Debug, Clone)]
pub(super) enum Ids {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl<T> SparseBuf<T> {
    /// Bytes its vectors hold (their capacities).
    pub(super) fn heap_bytes(&self) -> usize {
        let ids = match &self.ids {
            Ids::Narrow(v) => v.capacity() * 4,
            Ids::Wide(v) => v.capacity() * 8,
        };
        self.sample_offsets.capacity() * 8 + ids + self.values.capacity() * std::mem::size_of::<T>()
    }

    pub(super) fn new(huge: bool) -> Self {
        Self {
            sample_offsets: vec![0],
            ids: Ids::Narrow(Vec::new()),
            values: Vec::new(),
            widened_at: None,
            renarrowed: false,
            huge,
        }
    }

    /// Feature ids so far, widened (for tests and checks; the chunk keeps them narrow).
    #[must_use]
    pub fn ids(&self) -> Vec<u64> {
        match &self.ids {
            Ids::Narrow(v) => v.iter().map(|&x| u64::from(x)).collect(),
            Ids::Wide(v) => v.clone(),
        }
    }

    /// Number of features so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no feature was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Whether the ids are kept 32 bits wide (every one so far fits).
    #[must_use]
    pub fn narrow(&self) -> bool {
        matches!(self.ids, Ids::Narrow(_))
    }

    /// The first id wider than 32 bits: every id so far is widened, once per chunk at most.
    #[cold]
    #[inline(never)]
    pub(super) fn widen(&mut self) {
        if let Ids::Narrow(v) = &self.ids {
            let mut wide = Vec::with_capacity(v.capacity());
            minibatchd_sys::advise_huge_pages(&wide, self.huge);
            wide.extend(v.iter().map(|&x| u64::from(x)));
            self.ids = Ids::Wide(wide);
            self.widened_at = self.sample_offsets.last().copied();
        }
    }

    /// After a rollback to `committed` entries: when the line rolled back is the one that widened
    /// the ids (every id before it fit), they go back to 32 bits. Once per chunk at most, so a
    /// file of such lines costs two copies of the ids, not two per line.
    #[cold]
    pub(super) fn renarrow(&mut self, committed: usize) {
        if self.renarrowed || self.widened_at != Some(committed) {
            return;
        }
        if let Ids::Wide(v) = &self.ids {
            let mut narrow = Vec::with_capacity(v.capacity());
            minibatchd_sys::advise_huge_pages(&narrow, self.huge);
            for &id in v {
                let Ok(id) = u32::try_from(id) else { return };
                narrow.push(id);
            }
            self.ids = Ids::Narrow(narrow);
            self.renarrowed = true;
            self.widened_at = None;
        }
    }

    pub(super) fn reserve(&mut self, entries: usize) {
        match &mut self.ids {
            Ids::Narrow(v) => {
                v.reserve(entries);
                minibatchd_sys::advise_huge_pages(v, self.huge);
            }
            Ids::Wide(v) => {
                v.reserve(entries);
                minibatchd_sys::advise_huge_pages(v, self.huge);
            }
        }
        self.values.reserve(entries);
        minibatchd_sys::advise_huge_pages(&self.values, self.huge);
    }

    pub(super) fn truncate(&mut self, len: usize) {
        match &mut self.ids {
            Ids::Narrow(v) => v.truncate(len),
            Ids::Wide(v) => v.truncate(len),
        }
        self.values.truncate(len);
    }
}

/// How a feature id is stored: `u32` while the chunk's ids fit, else `u64`.
pub(super) trait FeatureId: Sized {
    /// `id` as stored, or `None` when it does not fit.
    fn store(id: u64) -> Option<Self>;
}

impl FeatureId for u32 {
    #[inline]
    fn store(id: u64) -> Option<Self> {
        u32::try_from(id).ok()
    }
}

impl FeatureId for u64 {
    #[inline]
    fn store(id: u64) -> Option<Self> {
        Some(id)
    }
}

impl From<Ids> for Indices {
    fn from(ids: Ids) -> Self {
        match ids {
            Ids::Narrow(v) => Indices::U32(v.into()),
            Ids::Wide(v) => Indices::U64(v.into()),
        }
    }
}
