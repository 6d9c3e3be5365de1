//! Several sources joined by sequence key (CNTK's bundler): the first source drives chunking; a
//! sequence of it whose key is missing from another source is dropped; the nominal length of a
//! joined sequence is the `defines_mb_size` source's length if one source has such a stream, else
//! the maximum over the sources. Chunks left empty by dropped sequences are dropped.

use std::collections::HashMap;

use super::OpenSource;
use crate::format::errors::DataError;
use crate::format::index::ChunkDesc;
use crate::sampling::{Lengths, Timeline};
use crate::Result;

/// A sequence of the joined dataset: where its bytes are in each source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SeqLoc {
    pub(super) file: u32,
    pub(super) seq: u32,
}

impl SeqLoc {
    /// Sequence `seq` of file `file` of a source; an error past `u32` (a file of 2^32 or more
    /// sequences), where a narrowing cast would silently point at another sequence.
    fn new(file: usize, seq: usize) -> Result<Self> {
        match (u32::try_from(file), u32::try_from(seq)) {
            (Ok(file), Ok(seq)) => Ok(Self { file, seq }),
            _ => Err(DataError::Dataset(format!("file {file} of a source has more than 2^32 - 1 sequences"))),
        }
    }
}

pub(super) type Joined = (Vec<ChunkDesc>, Vec<SeqLoc>, Timeline);

/// Joins the sources by key and builds the timeline over the primary chunks. A dataset of one
/// source keeps no places (the places are empty): every sequence is kept, so a sequence's place
/// follows from its chunk ([`place_in_chunk`]) — 8 bytes per sequence less.
pub(super) fn join(sources: &[OpenSource], primary_chunks: &[ChunkDesc], main_source: Option<usize>) -> Result<Joined> {
    let maps = key_maps(&sources[1..])?;
    // Reserved exactly (no doubling: the index's memory is what `Dataset::index_bytes` counts).
    let total: usize = primary_chunks.iter().map(|c| c.num_seqs).sum();
    let mut chunks = Vec::with_capacity(primary_chunks.len());
    let one_source = sources.len() == 1;
    let mut locs = Vec::with_capacity(if one_source { 0 } else { total.saturating_mul(sources.len()) });
    let mut seq_len = Lengths::new();
    let mut chunk_start = vec![0usize];
    let (mut loc, mut lens) = (Vec::new(), Vec::new());
    // Per further source: the first source's sequences it has no key for (left out, as CNTK
    // does), and the first of them (key, file, line, byte).
    let mut missing = vec![0u64; sources.len().saturating_sub(1)];
    let mut first_missing: Vec<Option<(u64, usize, u64, u64)>> = vec![None; missing.len()];
    // Per further source, which of its sequences a sequence of the first source has the key of
    // (joined or not: another source may lack it), a bit each.
    let mut keyed: Vec<Keyed> = sources[1..].iter().map(Keyed::new).collect();
    for c in primary_chunks {
        let idx = &sources[0].indexes[c.file];
        if one_source && (idx.sequences.sizes_follow_lines() || !idx.sequences.columns().samples) {
            // One sample each (its sequences are its lines — a deepx file chunked as it was
            // indexed — or its index keeps no lengths), all kept: nothing to read per sequence.
            if c.num_seqs > 0 {
                SeqLoc::new(c.file, c.first_seq + c.num_seqs - 1)?;
                seq_len.push_ones(c.num_seqs);
                chunks.push(ChunkDesc { num_samples: c.num_seqs as u64, ..*c });
                chunk_start.push(seq_len.len());
            }
            continue;
        }
        let mut kept = 0usize;
        let mut samples = 0u64;
        // In order, each in constant time (`get` adds up to 63 sizes for an offset).
        let chunk_sequences = idx.sequences.range(c.first_seq, c.num_seqs);
        'seqs: for (qi, q) in (c.first_seq..c.first_seq + c.num_seqs).zip(chunk_sequences) {
            loc.clear();
            lens.clear();
            loc.push(SeqLoc::new(c.file, qi)?);
            lens.push(q.samples);
            let mut dropped = false;
            for (i, (m, s)) in maps.iter().zip(&sources[1..]).enumerate() {
                let Some(&l) = m.get(&q.key) else {
                    if !dropped {
                        missing[i] += 1;
                        first_missing[i].get_or_insert((q.key, c.file, q.line + 1, q.offset));
                    }
                    dropped = true;
                    continue;
                };
                keyed[i].set(l);
                if !dropped {
                    lens.push(s.indexes[l.file as usize].sequences.get(l.seq as usize).samples);
                    loc.push(l);
                }
            }
            if dropped {
                continue 'seqs;
            }
            let len = match main_source {
                Some(m) => lens[m],
                None => lens.iter().copied().max().unwrap_or(0),
            };
            kept += 1;
            samples += u64::from(len);
            seq_len.push(len, total);
            if !one_source {
                locs.extend_from_slice(&loc);
            }
        }
        if kept > 0 {
            chunks.push(ChunkDesc { num_seqs: kept, num_samples: samples, ..*c });
            chunk_start.push(seq_len.len());
        }
    }
    for (i, &n) in missing.iter().enumerate().filter(|(_, &n)| n > 0) {
        let other = sources[i + 1].files.first().map(|f| f.display().to_string()).unwrap_or_default();
        let Some((key, file, line, offset)) = first_missing[i] else { continue };
        let file = sources[0].files.get(file).map(|f| f.display().to_string()).unwrap_or_default();
        tracing::warn!(
            sequences = n,
            first_key = key,
            first_at = %format_args!("{file}:{line} (byte {offset})"),
            source = %other,
            "sequences of the first source have no sequence of the same key in another source: they are left out of the dataset"
        );
    }
    warn_unjoined(sources, &maps, &keyed);
    if seq_len.is_empty() {
        let all = &sources[0].files;
        let mut names = all.iter().take(3).map(|f| f.display().to_string()).collect::<Vec<_>>();
        if all.len() > 3 {
            names.push(format!("{} more", all.len() - 3));
        }
        let files = names.join(", ");
        let why = if one_source { "" } else { " after joining its sources by key" };
        return Err(DataError::Dataset(format!("the dataset has no sequence{why} (files: {files})")));
    }
    locs.shrink_to_fit();
    seq_len.shrink_to_fit();
    chunk_start.shrink_to_fit();
    chunks.shrink_to_fit();
    Ok((chunks, locs, Timeline { seq_len, chunk_start }))
}

/// Which sequences of a further source a sequence of the first source has the key of: a bit
/// each, in one numbering of the source's files' sequences.
struct Keyed {
    starts: Vec<usize>,
    bits: Vec<u64>,
}

impl Keyed {
    fn new(s: &OpenSource) -> Self {
        let mut starts = Vec::with_capacity(s.indexes.len());
        let mut total = 0usize;
        for idx in &s.indexes {
            starts.push(total);
            total += idx.sequences.len();
        }
        Self { starts, bits: vec![0; total.div_ceil(64)] }
    }

    fn flat(&self, l: SeqLoc) -> usize {
        self.starts.get(l.file as usize).map_or(0, |&at| at + l.seq as usize)
    }

    fn set(&mut self, l: SeqLoc) {
        let k = self.flat(l);
        if let Some(w) = self.bits.get_mut(k / 64) {
            *w |= 1 << (k % 64);
        }
    }

    fn get(&self, l: SeqLoc) -> bool {
        let k = self.flat(l);
        self.bits.get(k / 64).is_some_and(|w| w & (1 << (k % 64)) != 0)
    }
}

/// Logs, per further source, its sequences whose key no sequence of the first source has: they
/// are never read — their malformed lines are not found either, where CNTK 2.7 parses them with
/// the rest of their chunk (`docs/differences.md`). Found by a probe: they went without a word.
fn warn_unjoined(sources: &[OpenSource], maps: &[HashMap<u64, SeqLoc>], keyed: &[Keyed]) {
    for ((m, s), keyed) in maps.iter().zip(&sources[1..]).zip(keyed) {
        let (mut unjoined, mut first) = (0u64, None::<SeqLoc>);
        for l in m.values().filter(|&&l| !keyed.get(l)) {
            unjoined += 1;
            if first.is_none_or(|f| (l.file, l.seq) < (f.file, f.seq)) {
                first = Some(*l);
            }
        }
        let Some(l) = first else { continue };
        let q = s.indexes[l.file as usize].sequences.get(l.seq as usize);
        let file = s.files.get(l.file as usize).map(|f| f.display().to_string()).unwrap_or_default();
        tracing::warn!(
            sequences = unjoined,
            first_key = q.key,
            first_at = %format_args!("{file}:{} (byte {})", q.line + 1, q.offset),
            "sequences of a joined source have a key that no sequence of the first source has: they are never read (nor checked for malformed lines)"
        );
    }
}

/// Key → location maps of the secondary sources (`sources`, the dataset's after the first).
fn key_maps(sources: &[OpenSource]) -> Result<Vec<HashMap<u64, SeqLoc>>> {
    // Key → location maps of the secondary sources; the first occurrence of a key wins (CNTK 2.7
    // joins the first or a later one, depending on how many sequences the source has:
    // `docs/differences.md`); a later sequence of the same key is never read. Not silently:
    // the operator is told how many repeat and where the first repeat is.
    sources
        .iter()
        .map(|s| {
            let mut m = HashMap::new();
            let mut repeats = 0u64;
            let mut first_repeat = None;
            for (fi, idx) in s.indexes.iter().enumerate() {
                for (qi, q) in idx.sequences.iter().enumerate() {
                    let loc = SeqLoc::new(fi, qi)?;
                    if let std::collections::hash_map::Entry::Vacant(e) = m.entry(q.key) {
                        e.insert(loc);
                    } else {
                        repeats += 1;
                        first_repeat.get_or_insert((q.key, fi, q.line + 1, q.offset));
                    }
                }
            }
            if let Some((key, fi, line, offset)) = first_repeat {
                let file = s.files.get(fi).map(|f| f.display().to_string()).unwrap_or_default();
                tracing::warn!(
                    sequences = repeats,
                    first_key = key,
                    first_at = %format_args!("{file}:{line} (byte {offset})"),
                    "sequences of a joined source repeat a key that an earlier sequence of that source has: only the first sequence of a key is joined, the later ones are left out of the dataset"
                );
            }
            Ok(m)
        })
        .collect::<Result<_, DataError>>()
}

/// The place of sequence `g` of the timeline in a dataset of one source: sequence
/// `first_seq + (g - chunk_start)` of the chunk's file (checked to fit by [`join`], which builds
/// each with [`SeqLoc::new`]).
pub(super) fn place_in_chunk(chunk: &ChunkDesc, chunk_start: usize, g: usize) -> SeqLoc {
    let seq = chunk.first_seq + (g - chunk_start);
    SeqLoc { file: u32::try_from(chunk.file).unwrap_or(u32::MAX), seq: u32::try_from(seq).unwrap_or(u32::MAX) }
}
