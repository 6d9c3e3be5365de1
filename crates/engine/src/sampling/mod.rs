//! Sampling: which sequences make up each minibatch, in which order — CNTK `MinibatchSource`
//! semantics, bit for bit (CNTK 2.7's `BlockRandomizer`, `NoRandomizer` and packers; `docs/parity.md`).
//!
//! Everything here is pure and deterministic. The input is a [`Timeline`]: the nominal length of
//! every sequence and the chunk each one belongs to, as the index pass produced them. The output
//! is a stream of [`MinibatchPlan`]s: lists of sequence references plus the checkpoint position.
//! Nothing here touches files or parsed data; the caller (the `dump` command, the daemon's
//! session actor) loads the chunks that the plans name.
//!
//! Invariants:
//! * the order of sequences is a function of (timeline, window, seed, sweep) only — never of the
//!   minibatch size, the number of minibatches taken or when a checkpoint was taken;
//! * a position is a count of nominal samples on the global timeline (all workers together);
//!   [`Sampler::restore`] to a position reproduces what an uninterrupted run delivers after it.

pub mod mixture;
pub mod mt64;
mod plan;
pub mod randomizer;
pub mod scheduler;

#[cfg(test)]
mod proptests;

pub use plan::window_sequences;
pub use scheduler::{
    BuiltSweep, EpochLimit, EqualSteps, MinibatchPlan, NextSweepJob, Sampler, SamplingError, SamplingOptions, SeqRef,
    Tail, Window, DEFAULT_WINDOW_CHUNKS,
};

/// Narrows a sequence or chunk index to the `u32` of [`SeqRef`]. `Sampler::new` rejects
/// timelines whose counts do not fit (`SamplingError::TooManySequences`), so this cannot fail.
pub(crate) fn to_u32(index: usize) -> u32 {
    u32::try_from(index).expect("sequence and chunk counts are validated to fit in u32")
}

/// The shape of a dataset as the sampler sees it: sequences in file order, grouped into chunks.
///
/// Sequence `i` (global, 0-based, file order) has nominal length `seq_len[i]` (≥ 1). Chunk `c`
/// holds sequences `chunk_start[c] .. chunk_start[c + 1]`; chunks are contiguous and in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// Nominal length (samples) of each sequence, in file order.
    pub seq_len: Lengths,
    /// Index of each chunk's first sequence; one more entry than there are chunks, the last equal
    /// to `seq_len.len()`.
    pub chunk_start: Vec<usize>,
}

impl Timeline {
    /// Number of chunks.
    #[must_use]
    pub fn num_chunks(&self) -> usize {
        self.chunk_start.len().saturating_sub(1)
    }

    /// Number of sequences.
    #[must_use]
    pub fn num_sequences(&self) -> usize {
        self.seq_len.len()
    }

    /// Nominal samples of sequences `range` (of the whole timeline for `..`).
    #[must_use]
    pub fn samples(&self, range: impl std::ops::RangeBounds<usize>) -> u64 {
        self.seq_len.samples(range)
    }
}

/// The nominal lengths of a timeline's sequences: nothing per sequence while every one is a
/// single sample (libsvm lines, one-line CTF sequences), else one `u32` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lengths(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// This many sequences, each one sample.
    Ones(usize),
    /// Each sequence's length (not all one).
    Each(Vec<u32>),
}

/// What every sequence of [`Repr::Ones`] is long.
static ONE: u32 = 1;

impl Lengths {
    /// No sequence yet.
    #[must_use]
    pub fn new() -> Self {
        Self(Repr::Ones(0))
    }

    /// Number of sequences.
    #[must_use]
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Ones(n) => *n,
            Repr::Each(v) => v.len(),
        }
    }

    /// Whether there is none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every sequence is one sample (nothing is kept per sequence).
    #[must_use]
    pub fn all_ones(&self) -> bool {
        matches!(self.0, Repr::Ones(_))
    }

    /// Appends the next sequence's length; the first that is not 1 makes room for `capacity`
    /// lengths in all (the sequences expected), so the column is allocated once.
    pub fn push(&mut self, len: u32, capacity: usize) {
        match &mut self.0 {
            Repr::Ones(n) if len == 1 => *n += 1,
            Repr::Ones(n) => {
                let mut v = Vec::with_capacity(capacity.max(*n + 1));
                v.resize(*n, 1);
                v.push(len);
                self.0 = Repr::Each(v);
            }
            Repr::Each(v) => v.push(len),
        }
    }

    /// Appends `n` sequences of one sample each.
    pub fn push_ones(&mut self, n: usize) {
        match &mut self.0 {
            Repr::Ones(k) => *k += n,
            Repr::Each(v) => v.resize(v.len() + n, 1),
        }
    }

    /// Lengths in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let (ones, each) = match &self.0 {
            Repr::Ones(n) => (*n, &[][..]),
            Repr::Each(v) => (0, &v[..]),
        };
        std::iter::repeat_n(1, ones).chain(each.iter().copied())
    }

    /// Nominal samples of sequences `range`.
    #[must_use]
    pub fn samples(&self, range: impl std::ops::RangeBounds<usize>) -> u64 {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len(),
        };
        match &self.0 {
            Repr::Ones(_) => end.saturating_sub(start) as u64,
            Repr::Each(v) => v[start..end].iter().map(|&l| u64::from(l)).sum(),
        }
    }

    /// The first sequence of length 0, if any (a malformed timeline).
    #[must_use]
    pub fn first_zero(&self) -> Option<usize> {
        match &self.0 {
            Repr::Ones(_) => None,
            Repr::Each(v) => v.iter().position(|&l| l == 0),
        }
    }

    /// The longest sequence (0 for none).
    #[must_use]
    pub fn max(&self) -> u32 {
        match &self.0 {
            Repr::Ones(n) => u32::from(*n > 0),
            Repr::Each(v) => v.iter().copied().max().unwrap_or(0),
        }
    }

    /// The shortest sequence's length (0 for none at all, or where a sequence has no sample).
    #[must_use]
    pub fn min(&self) -> u32 {
        match &self.0 {
            Repr::Ones(n) => u32::from(*n > 0),
            Repr::Each(v) => v.iter().copied().min().unwrap_or(0),
        }
    }

    /// Bytes it holds on the heap.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Ones(_) => 0,
            Repr::Each(v) => v.capacity() * std::mem::size_of::<u32>(),
        }
    }

    /// Gives back spare capacity.
    pub fn shrink_to_fit(&mut self) {
        if let Repr::Each(v) = &mut self.0 {
            v.shrink_to_fit();
        }
    }
}

impl Default for Lengths {
    fn default() -> Self {
        Self::new()
    }
}

impl From<Vec<u32>> for Lengths {
    /// Keeps nothing per sequence when every length is 1.
    fn from(v: Vec<u32>) -> Self {
        if v.iter().all(|&l| l == 1) {
            Self(Repr::Ones(v.len()))
        } else {
            Self(Repr::Each(v))
        }
    }
}

impl FromIterator<u32> for Lengths {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<u32>>().into()
    }
}

impl std::ops::Index<usize> for Lengths {
    type Output = u32;

    fn index(&self, i: usize) -> &u32 {
        match &self.0 {
            Repr::Ones(n) => {
                assert!(i < *n, "sequence {i} of {n}");
                &ONE
            }
            Repr::Each(v) => &v[i],
        }
    }
}

impl PartialEq<Vec<u32>> for Lengths {
    fn eq(&self, other: &Vec<u32>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::Lengths;

    /// One-sample sequences keep nothing per sequence; the first longer one keeps every length,
    /// and every view (index, sums, iteration, the longest) reads the same either way.
    #[test]
    fn lengths_keep_nothing_while_every_sequence_is_one_sample() {
        let mut l = Lengths::new();
        for _ in 0..1000 {
            l.push(1, 2000);
        }
        assert!(l.all_ones() && l.heap_bytes() == 0 && l.len() == 1000);
        assert_eq!((l[999], l.samples(..), l.samples(10..20), l.max(), l.first_zero()), (1, 1000, 10, 1, None));
        l.push(3, 2000);
        assert!(!l.all_ones());
        assert_eq!(l.heap_bytes(), 2000 * 4, "room for the expected sequences, once");
        assert_eq!((l[999], l[1000], l.samples(..), l.samples(999..), l.max()), (1, 3, 1003, 4, 3));
        let v: Vec<u32> = l.iter().collect();
        assert_eq!(Lengths::from(v.clone()), l);
        assert_eq!(l, v);
        assert_eq!(Lengths::from(vec![1; 5]), (0..5).map(|_| 1).collect::<Lengths>());
        assert!(Lengths::from(vec![1; 5]).all_ones());
        assert_eq!(Lengths::from(vec![2, 0]).first_zero(), Some(1));
    }

    #[test]
    #[should_panic(expected = "sequence 5 of 5")]
    fn a_length_past_the_end_is_a_bug() {
        let _ = Lengths::from(vec![1; 5])[5];
    }
}
