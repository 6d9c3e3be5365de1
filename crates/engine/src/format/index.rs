//! The index: where each sequence is, how long it is nominally, and how sequences group into
//! chunks — the output of the first pass over the data (CNTK's `Index`, `IndexBuilder`).
//!
//! Format-specific indexers produce one [`FileIndex`] per file; [`build_chunks`] groups the
//! sequences of all files into chunks with CNTK's rule (§1.14): a new chunk starts when the
//! current chunk's byte span is 0 or when `span + sequence size > chunk_size_bytes`. Chunks never
//! cross files. Everything scheduling-related uses the nominal lengths recorded here.

use crate::options::IndexLimits;
use std::path::Path;
use std::sync::Arc;

mod budget;
mod read;

pub(crate) use budget::{room_for_one_more, too_many_sequences};
pub(crate) use read::{for_each_line, index_local, read_as_sized, read_digest, read_full};

/// One sequence as the index pass found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceDesc {
    /// The sequence key: the numeric id, or the 0-based line number in line mode.
    pub key: u64,
    /// Byte offset of its first byte in the file.
    pub offset: u64,
    /// 0-based line number of its first line.
    pub line: u64,
    /// Size in bytes (up to the next sequence's first byte).
    pub size: u32,
    /// Nominal length in samples (≥ 1).
    pub samples: u32,
}

/// The index of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIndex {
    /// The file.
    pub path: Arc<Path>,
    /// Its size in bytes when indexed.
    pub size: u64,
    /// CRC-32 (ISO-HDLC) of the file's content — of every byte, or for a TFRecord file of every
    /// record's header and footer (its length and its data's CRC-32C) —, part of the dataset's
    /// identity (a resume refuses other content, wherever the file lives).
    pub digest: u32,
    /// Sequences in file order.
    pub sequences: Sequences,
}

/// The columns a [`Sequences`] keeps beside the sizes ([`Sequences::columns`]): four independent
/// yes-or-no facts, as the cache file's flag byte holds them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct Columns {
    /// Every offset (else they follow from the first and the sizes).
    pub offsets: bool,
    /// Sample counts (else one each).
    pub samples: bool,
    /// First lines (else the sequence's index).
    pub lines: bool,
    /// Keys (else the line).
    pub keys: bool,
}

impl Columns {
    /// As one byte (bit 0 offsets, 1 samples, 2 lines, 3 keys).
    #[must_use]
    pub fn bits(self) -> u8 {
        u8::from(self.offsets) | u8::from(self.samples) << 1 | u8::from(self.lines) << 2 | u8::from(self.keys) << 3
    }

    /// From [`Columns::bits`]; `None` for a byte with other bits set.
    #[must_use]
    pub fn from_bits(b: u8) -> Option<Self> {
        (b < 16).then_some(Self { offsets: b & 1 != 0, samples: b & 2 != 0, lines: b & 4 != 0, keys: b & 8 != 0 })
    }

    /// Bytes of one sequence with these columns: its size, and each column kept.
    #[must_use]
    pub fn record_bytes(self) -> usize {
        4 + 8 * usize::from(self.offsets)
            + 4 * usize::from(self.samples)
            + 8 * usize::from(self.lines)
            + 8 * usize::from(self.keys)
    }
}

/// Sequences one in every this many keep their offset while every sequence starts where the one
/// before it ended ([`Sequences`]); the sizes column marks where every this many begin.
const OFFSET_STRIDE: usize = 64;

/// The sizes of a file's sequences in file order, each a variable-length number (LEB128: 7 bits a
/// byte, so 1 byte under 128, 2 under 16 KiB, at most 5), with the byte where every
/// [`OFFSET_STRIDE`]th begins: a sequence's size is read by decoding at most that many.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SizeColumn {
    bytes: Vec<u8>,
    /// `blocks[k]`: where the size of sequence `k * OFFSET_STRIDE` begins.
    blocks: Vec<u64>,
}

impl SizeColumn {
    /// Bytes `size` takes.
    fn encoded_len(size: u32) -> usize {
        (32 - (size | 1).leading_zeros() as usize).div_ceil(7)
    }

    /// Appends the size of sequence `i` (the next one).
    fn push(&mut self, i: usize, mut size: u32) {
        if i.is_multiple_of(OFFSET_STRIDE) {
            self.blocks.push(self.bytes.len() as u64);
        }
        // Seven bits a byte, low first, the high bit set on all but the last; each value pushed
        // is below 0x80 (masked, or what is left once it is).
        #[allow(clippy::cast_possible_truncation)]
        {
            while size >= 0x80 {
                self.bytes.push((size & 0x7f) as u8 | 0x80);
                size >>= 7;
            }
            self.bytes.push(size as u8);
        }
    }

    /// The sizes from sequence `i` on, in order.
    fn from(&self, i: usize) -> SizeReader<'_> {
        let k = i / OFFSET_STRIDE;
        let at = self.blocks.get(k).map_or(self.bytes.len(), |&b| usize::try_from(b).unwrap_or(usize::MAX));
        let mut r = SizeReader { bytes: &self.bytes, at };
        for _ in k * OFFSET_STRIDE..i {
            r.next_size();
        }
        r
    }

    /// Bytes it holds once shrunk.
    fn len_bytes(&self) -> usize {
        self.bytes.len() + self.blocks.len() * 8
    }

    fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.blocks.capacity() * 8
    }

    fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.blocks.shrink_to_fit();
    }
}

/// Reads a [`SizeColumn`] in order.
struct SizeReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl SizeReader<'_> {
    /// The next size (0 past the end: callers read only sizes that were pushed).
    fn next_size(&mut self) -> u32 {
        let mut size = 0u32;
        let mut shift = 0;
        while let Some(&b) = self.bytes.get(self.at) {
            self.at += 1;
            size |= u32::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        size
    }
}

/// The sequences of a file, column by column, each column kept only once it does not follow from
/// the others: while every sequence starts where the one before ended, one offset in
/// [`OFFSET_STRIDE`] (the others are the sizes added up); while every sequence is one sample, no
/// sample counts; while every sequence's first line is its index, no lines; while every key is
/// its line (line mode, and every deepx format), no keys. The sizes are variable-length numbers
/// ([`SizeColumn`]). A file of short lines without blank ones costs its sizes, 1 byte a sequence
/// under 128 bytes and 2 under 16 KiB, where [`SequenceDesc`]s cost 32. Built in file order
/// ([`Sequences::push`]); read by index ([`Sequences::get`]) or in order ([`Sequences::range`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sequences {
    len: usize,
    sizes: SizeColumn,
    /// Every sequence's offset, once one did not start where the one before ended.
    offsets: Vec<u64>,
    /// Until then, the offset of sequence `k * OFFSET_STRIDE` at `k`.
    strided: Vec<u64>,
    /// One past the last byte of the last sequence.
    end: u64,
    /// Empty while every sequence has one sample.
    samples: Vec<u32>,
    /// Empty while every sequence's first line is its index.
    lines: Vec<u64>,
    /// Empty while every key is the sequence's line.
    keys: Vec<u64>,
    /// The sizes were let go: every sequence is one line of its own, so a chunk's lines are its
    /// sequences ([`Sequences::let_go_of_line_sizes`]).
    sizes_follow_lines: bool,
    /// A file indexed by its chunks alone ([`Sequences::of_line_chunks`]).
    line_chunks: Option<Box<LineChunks>>,
}

/// A file of one-line sequences indexed by its chunks alone
/// ([`crate::format::line_chunks`]): its sequences' sizes were never held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineChunks {
    /// The chunk size they were cut for.
    pub chunk_size: u64,
    /// Where the first sequence begins.
    pub first_offset: u64,
    /// Each chunk's end and line count, in order; a chunk begins where the one before ended.
    pub chunks: Vec<(u64, u64)>,
}

impl LineChunks {
    /// Whether the chunks follow each other from the first offset to `size`, each of at least a
    /// line, and hold `lines` lines (what a cache file read back must say).
    #[must_use]
    pub fn tile(&self, size: u64, lines: u64) -> bool {
        let (mut start, mut seen) = (self.first_offset, 0u64);
        for &(end, n) in &self.chunks {
            if end <= start || n == 0 {
                return false;
            }
            (start, seen) = (end, seen.saturating_add(n));
        }
        start == size && seen == lines
    }
}

impl Sequences {
    /// Number of sequences.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room for `n` sequences' sizes (the one column every file has), a byte each.
    #[must_use]
    pub fn with_capacity(n: usize) -> Self {
        Self { sizes: SizeColumn { bytes: Vec::with_capacity(n), blocks: Vec::new() }, ..Self::default() }
    }

    /// Appends the next sequence of the file.
    pub fn push(&mut self, s: SequenceDesc) {
        let i = self.len;
        let after = self.columns_after(&s);
        if after.offsets {
            if self.offsets.is_empty() {
                let mut offsets = Vec::with_capacity(i + 1);
                offsets.extend(self.range(0, i).map(|d| d.offset));
                self.offsets = offsets;
                self.strided = Vec::new();
            }
            self.offsets.push(s.offset);
        } else if i.is_multiple_of(OFFSET_STRIDE) {
            self.strided.push(s.offset);
        }
        self.end = s.offset + u64::from(s.size);
        self.sizes.push(i, s.size);
        if after.samples {
            if self.samples.is_empty() {
                self.samples = vec![1; i];
            }
            self.samples.push(s.samples);
        }
        let line_of = |lines: &[u64], j: usize| if lines.is_empty() { j as u64 } else { lines[j] };
        if after.keys {
            if self.keys.is_empty() {
                self.keys = (0..i).map(|j| line_of(&self.lines, j)).collect();
            }
            self.keys.push(s.key);
        }
        if after.lines {
            if self.lines.is_empty() {
                self.lines = (0..i as u64).collect();
            }
            self.lines.push(s.line);
        }
        self.len += 1;
    }

    /// Lets go of the sizes of a file of one-line sequences (a deepx file, a CTF file of one
    /// line a sequence; the caller knows) when nothing but them is kept: then sequence `i` is
    /// line `i`, each starts where the one before ended, and a chunk's sequences are its lines,
    /// which its reader finds in its bytes (a CTF file's last sequence runs to the end of its
    /// chunk: it may hold blank lines after its own). What is left is an offset every
    /// [`OFFSET_STRIDE`] sequences. Whether it did.
    pub fn let_go_of_line_sizes(&mut self) -> bool {
        if self.len == 0 || self.columns() != Columns::default() {
            return false;
        }
        self.sizes = SizeColumn::default();
        self.sizes_follow_lines = true;
        true
    }

    /// The sequences of a file indexed by its chunks alone: each chunk's lines, one sequence each
    /// (sizes let go, [`Sequences::let_go_of_line_sizes`]).
    #[must_use]
    pub fn of_line_chunks(chunks: LineChunks) -> Self {
        let len = chunks.chunks.iter().fold(0u64, |n, &(_, lines)| n.saturating_add(lines));
        Self {
            len: usize::try_from(len).unwrap_or(usize::MAX),
            end: chunks.chunks.last().map_or(chunks.first_offset, |&(end, _)| end),
            sizes_follow_lines: true,
            line_chunks: Some(Box::new(chunks)),
            ..Self::default()
        }
    }

    /// The chunks of a file indexed by them alone ([`Sequences::of_line_chunks`]).
    #[must_use]
    pub fn line_chunks(&self) -> Option<&LineChunks> {
        self.line_chunks.as_deref()
    }

    /// Whether the sizes were let go ([`Sequences::let_go_of_line_sizes`]): [`Sequences::get`]
    /// and [`Sequences::range`] must not be asked then.
    #[must_use]
    pub fn sizes_follow_lines(&self) -> bool {
        self.sizes_follow_lines
    }

    /// Sequence `i`.
    ///
    /// # Panics
    /// If `i` is not below [`Sequences::len`], or the sizes were let go.
    #[must_use]
    pub fn get(&self, i: usize) -> SequenceDesc {
        assert!(i < self.len, "sequence {i} of {}", self.len);
        assert!(!self.sizes_follow_lines, "the sizes were let go: a chunk's lines are its sequences");
        if !self.offsets.is_empty() {
            return self.at(i, self.offsets[i], self.sizes.from(i).next_size());
        }
        let k = i / OFFSET_STRIDE;
        let mut sizes = self.sizes.from(k * OFFSET_STRIDE);
        let mut offset = self.strided[k];
        for _ in k * OFFSET_STRIDE..i {
            offset += u64::from(sizes.next_size());
        }
        self.at(i, offset, sizes.next_size())
    }

    fn at(&self, i: usize, offset: u64, size: u32) -> SequenceDesc {
        let line = if self.lines.is_empty() { i as u64 } else { self.lines[i] };
        SequenceDesc {
            key: if self.keys.is_empty() { line } else { self.keys[i] },
            offset,
            line,
            size,
            samples: if self.samples.is_empty() { 1 } else { self.samples[i] },
        }
    }

    /// Sequences `first .. first + count`, in order (each in constant time).
    ///
    /// # Panics
    /// If the range passes [`Sequences::len`].
    pub fn range(&self, first: usize, count: usize) -> impl Iterator<Item = SequenceDesc> + '_ {
        assert!(first + count <= self.len, "sequences {first}..{} of {}", first + count, self.len);
        let mut offset = if count == 0 { 0 } else { self.get(first).offset };
        let mut sizes = self.sizes.from(if count == 0 { self.len } else { first });
        (first..first + count).map(move |i| {
            if !self.offsets.is_empty() {
                offset = self.offsets[i];
            }
            let d = self.at(i, offset, sizes.next_size());
            offset += u64::from(d.size);
            d
        })
    }

    /// Every sequence's size, in order.
    ///
    /// # Panics
    /// If the sizes were let go ([`Sequences::let_go_of_line_sizes`]).
    pub fn sizes(&self) -> impl Iterator<Item = u32> + '_ {
        assert!(!self.sizes_follow_lines, "the sizes were let go: a chunk's lines are its sequences");
        let mut sizes = self.sizes.from(0);
        (0..self.len).map(move |_| sizes.next_size())
    }

    /// Every sequence, in order.
    pub fn iter(&self) -> impl Iterator<Item = SequenceDesc> + '_ {
        self.range(0, self.len)
    }

    /// Gives back what the columns over-allocated.
    pub fn shrink_to_fit(&mut self) {
        for v in [&mut self.offsets, &mut self.strided, &mut self.lines, &mut self.keys] {
            v.shrink_to_fit();
        }
        self.sizes.shrink_to_fit();
        self.samples.shrink_to_fit();
        if let Some(lc) = &mut self.line_chunks {
            lc.chunks.shrink_to_fit();
        }
    }

    /// Which columns it keeps beside the sizes (the others follow from the rules of
    /// [`Sequences`]), and the first sequence's offset: what a record of the index cache file
    /// holds.
    #[must_use]
    pub fn columns(&self) -> Columns {
        Columns {
            offsets: !self.offsets.is_empty(),
            samples: !self.samples.is_empty(),
            lines: !self.lines.is_empty(),
            keys: !self.keys.is_empty(),
        }
    }

    /// Bytes its columns hold once shrunk ([`Sequences::shrink_to_fit`]): their lengths (no
    /// sizes once they were let go, [`Sequences::let_go_of_line_sizes`]).
    #[must_use]
    pub fn footprint(&self) -> u64 {
        let others = self.columns().record_bytes() - 4;
        let chunks = self.line_chunks.as_ref().map_or(0, |c| c.chunks.len() * 16);
        (self.sizes.len_bytes() + self.len * others + self.strided.len() * 8 + chunks) as u64
    }

    /// [`Sequences::footprint`] once `s` is pushed: a column that `s` is the first to need then
    /// holds a value for every sequence before it too.
    #[must_use]
    pub fn footprint_after(&self, s: &SequenceDesc) -> u64 {
        let n = self.len as u64 + 1;
        let after = self.columns_after(s);
        let strided = if after.offsets { 0 } else { (self.len / OFFSET_STRIDE) as u64 + 1 };
        let block = if self.len.is_multiple_of(OFFSET_STRIDE) { 8 } else { 0 };
        let sizes = (self.sizes.len_bytes() + SizeColumn::encoded_len(s.size) + block) as u64;
        sizes + n * (after.record_bytes() as u64 - 4) + strided * 8
    }

    /// A bound on [`Sequences::footprint_after`] whatever the next sequence is (every column
    /// kept, the longest size encoding and a new block): below the budget, the exact count is not
    /// needed.
    #[must_use]
    pub fn footprint_bound(&self) -> u64 {
        let n = self.len as u64 + 1;
        let all = Columns { offsets: true, samples: true, lines: true, keys: true };
        let sizes = (self.sizes.len_bytes() + SizeColumn::encoded_len(u32::MAX) + 8) as u64;
        sizes + n * (all.record_bytes() as u64 - 4) + ((self.len / OFFSET_STRIDE) as u64 + 1) * 8
    }

    /// The columns kept once `s` is pushed: those kept now, and those `s` is the first to need.
    pub(crate) fn columns_after(&self, s: &SequenceDesc) -> Columns {
        let kept = self.columns();
        Columns {
            offsets: kept.offsets || (self.len > 0 && s.offset != self.end),
            samples: kept.samples || s.samples != 1,
            lines: kept.lines || s.line != self.len as u64,
            keys: kept.keys || s.key != s.line,
        }
    }

    /// Bytes its columns hold (their capacities).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        (self.offsets.capacity() + self.strided.capacity() + self.lines.capacity() + self.keys.capacity()) * 8
            + self.sizes.heap_bytes()
            + self.samples.capacity() * 4
            + self.line_chunks.as_ref().map_or(0, |c| c.chunks.capacity() * 16)
    }
}

impl<'a> IntoIterator for &'a Sequences {
    type Item = SequenceDesc;
    type IntoIter = Box<dyn Iterator<Item = SequenceDesc> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl FromIterator<SequenceDesc> for Sequences {
    fn from_iter<I: IntoIterator<Item = SequenceDesc>>(iter: I) -> Self {
        let mut s = Self::default();
        for d in iter {
            s.push(d);
        }
        s
    }
}

/// A chunk: consecutive sequences of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkDesc {
    /// Index of the file in the source's file list.
    pub file: usize,
    /// First byte (the first sequence's offset).
    pub start: u64,
    /// One past the last byte of the last sequence.
    pub end: u64,
    /// Index of the first sequence within the file's sequence list.
    pub first_seq: usize,
    /// Number of sequences.
    pub num_seqs: usize,
    /// Sum of nominal lengths.
    pub num_samples: u64,
}

/// Groups the sequences of `files` into chunks with CNTK's rule; chunks never cross files.
#[must_use]
#[allow(clippy::missing_panics_doc)] // its one `expect` cannot fail: a chunk is pushed just before
pub fn build_chunks(files: &[FileIndex], chunk_size_bytes: u64) -> Vec<ChunkDesc> {
    let mut chunks: Vec<ChunkDesc> = Vec::new();
    for (fi, file) in files.iter().enumerate() {
        let mut open = false;
        for (si, s) in file.sequences.iter().enumerate() {
            let start_new = match chunks.last() {
                Some(c) if open => {
                    let span = c.end - c.start;
                    span == 0 || span + u64::from(s.size) > chunk_size_bytes
                }
                _ => true,
            };
            if start_new {
                chunks.push(ChunkDesc {
                    file: fi,
                    start: s.offset,
                    end: s.offset,
                    first_seq: si,
                    num_seqs: 0,
                    num_samples: 0,
                });
                open = true;
            }
            let c = chunks.last_mut().expect("a chunk was pushed above");
            c.num_seqs += 1;
            c.num_samples += u64::from(s.samples);
            c.end = s.offset + u64::from(s.size);
        }
    }
    chunks
}

/// What the index of a file holds in an opened dataset: its columns, and per sequence what the
/// dataset adds (`limits.bytes_per_sequence`).
#[must_use]
pub fn index_cost(sequences: &Sequences, limits: &IndexLimits) -> u64 {
    let n = sequences.len() as u64;
    sequences
        .footprint()
        .saturating_add(n.saturating_mul(limits.bytes_per_sequence))
        .saturating_add(limits.lengths_bytes(n, sequences.columns().samples))
}

#[cfg(test)]
mod tests {
    use proptest::arbitrary::any;
    use proptest::prelude::{prop_oneof, Just};

    use super::*;

    fn file(sizes: &[(u64, u32)]) -> FileIndex {
        FileIndex {
            path: Arc::from(Path::new("x")),
            size: 0,
            digest: 0,
            sequences: sizes
                .iter()
                .enumerate()
                .map(|(i, &(offset, size))| SequenceDesc { key: i as u64, offset, line: i as u64, size, samples: 1 })
                .collect(),
        }
    }

    proptest::proptest! {
        /// Whatever columns a file needs (gaps between sequences, several samples, keys other
        /// than the line, skipped lines, from any sequence on), every sequence reads back as it
        /// was pushed, by index and in order from anywhere.
        #[test]
        fn sequences_read_back_as_pushed(
            steps in proptest::collection::vec((0u64..3, prop_oneof![1u32..200, 100u32..70_000, Just(u32::MAX), any::<u32>()], 1u32..4, 0u64..3, proptest::bool::weighted(0.1)), 1..300),
            from in 0usize..300,
        ) {
            let (mut offset, mut line) = (3u64, 0u64);
            let mut want = Vec::new();
            for (i, &(gap, size, samples, skipped, own_key)) in steps.iter().enumerate() {
                // Columns stay implicit in the first part (no gaps, one sample, key = line = index).
                let late = i > steps.len() / 2;
                offset += if late { gap } else { 0 };
                line += if late { skipped } else { 0 };
                let samples = if late { samples } else { 1 };
                let key = if late && own_key { 1_000_000 + i as u64 } else { line };
                want.push(SequenceDesc { key, offset, line, size, samples });
                offset += u64::from(size);
                line += 1;
            }
            let mut seqs = Sequences::default();
            for w in &want {
                let after = seqs.footprint_after(w);
                proptest::prop_assert!(seqs.footprint_bound() >= after, "the budget's quick bound is a bound");
                seqs.push(*w);
                proptest::prop_assert_eq!(seqs.footprint(), after, "the footprint foretold before a push");
            }
            proptest::prop_assert_eq!(seqs.len(), want.len());
            for (i, w) in want.iter().enumerate() {
                proptest::prop_assert_eq!(seqs.get(i), *w);
            }
            let from = from % want.len();
            proptest::prop_assert_eq!(seqs.range(from, want.len() - from).collect::<Vec<_>>(), want[from..].to_vec());
            proptest::prop_assert_eq!(seqs.iter().collect::<Vec<_>>(), want);
        }
    }

    #[test]
    fn a_file_of_one_line_sequences_without_gaps_costs_a_byte_a_sequence() {
        let seqs: Sequences = (0..10_000u32)
            .scan(0u64, |offset, i| {
                let size = 5 + i % 7;
                let d = SequenceDesc { key: u64::from(i), offset: *offset, line: u64::from(i), size, samples: 1 };
                *offset += u64::from(size);
                Some(d)
            })
            .collect();
        let mut seqs = seqs;
        seqs.shrink_to_fit();
        // A byte a size (all under 128), and a mark every 64 in the sizes and the offsets.
        assert!(seqs.heap_bytes() <= 10_000 + 2 * (10_000 / OFFSET_STRIDE + 1) * 8, "{} bytes", seqs.heap_bytes());
        assert_eq!(seqs.get(9_999).offset, (0..9_999u64).map(|i| 5 + i % 7).sum::<u64>());
    }

    #[test]
    fn a_size_takes_seven_bits_a_byte() {
        for (size, bytes) in [(0, 1), (127, 1), (128, 2), (16_383, 2), (16_384, 3), (u32::MAX, 5)] {
            assert_eq!(SizeColumn::encoded_len(size), bytes, "{size}");
            let mut c = SizeColumn::default();
            c.push(0, size);
            assert_eq!(c.bytes.len(), bytes, "{size}");
            assert_eq!(c.from(0).next_size(), size);
        }
    }

    #[test]
    fn chunk_boundaries_follow_cntk_rule() {
        // sizes 4,4,4 at 0,4,8 with chunk size 8 -> [0,1] [2]
        let f = file(&[(0, 4), (4, 4), (8, 4)]);
        let c = build_chunks(&[f], 8);
        assert_eq!(c.iter().map(|c| c.num_seqs).collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn a_sequence_larger_than_the_chunk_size_gets_its_own_chunk() {
        let f = file(&[(0, 2), (2, 100), (102, 2)]);
        let c = build_chunks(&[f], 10);
        assert_eq!(c.iter().map(|c| c.num_seqs).collect::<Vec<_>>(), vec![1, 1, 1]);
    }

    #[test]
    fn gaps_count_in_the_span() {
        // A dropped line between the first two sequences widens the span once the second is
        // added: 0..3, gap, 10..13 is a span of 13, so a third sequence of 3 needs 16.
        let f = file(&[(0, 3), (10, 3), (13, 3)]);
        assert_eq!(build_chunks(std::slice::from_ref(&f), 15).len(), 2);
        assert_eq!(build_chunks(&[f], 16).len(), 1);
    }

    #[test]
    fn chunks_never_cross_files() {
        let c = build_chunks(&[file(&[(0, 1)]), file(&[(0, 1)])], 1 << 20);
        assert_eq!(c.len(), 2);
        assert_eq!((c[1].file, c[1].first_seq), (1, 0));
    }
}
