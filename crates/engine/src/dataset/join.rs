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
    // Key → location maps of the secondary sources; the first occurrence of a key wins.
    let maps: Vec<HashMap<u64, SeqLoc>> = sources[1..]
        .iter()
        .map(|s| {
            let mut m = HashMap::new();
            for (fi, idx) in s.indexes.iter().enumerate() {
                for (qi, q) in idx.sequences.iter().enumerate() {
                    m.entry(q.key).or_insert(SeqLoc::new(fi, qi)?);
                }
            }
            Ok(m)
        })
        .collect::<Result<_, DataError>>()?;
    // Reserved exactly (no doubling: the index's memory is what `Dataset::index_bytes` counts).
    let total: usize = primary_chunks.iter().map(|c| c.num_seqs).sum();
    let mut chunks = Vec::with_capacity(primary_chunks.len());
    let one_source = sources.len() == 1;
    let mut locs = Vec::with_capacity(if one_source { 0 } else { total.saturating_mul(sources.len()) });
    let mut seq_len = Lengths::new();
    let mut chunk_start = vec![0usize];
    let (mut loc, mut lens) = (Vec::new(), Vec::new());
    // Per further source: the first source's sequences it has no key for (left out, as CNTK does).
    let mut missing = vec![0u64; sources.len().saturating_sub(1)];
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
            for (i, (m, s)) in maps.iter().zip(&sources[1..]).enumerate() {
                let Some(&l) = m.get(&q.key) else {
                    missing[i] += 1;
                    continue 'seqs;
                };
                lens.push(s.indexes[l.file as usize].sequences.get(l.seq as usize).samples);
                loc.push(l);
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
        let first = sources[0].files.first().map(|f| f.display().to_string()).unwrap_or_default();
        let other = sources[i + 1].files.first().map(|f| f.display().to_string()).unwrap_or_default();
        tracing::warn!(
            sequences = n,
            first_source = %first,
            source = %other,
            "sequences of the first source have no sequence of the same key in another source: they are left out of the dataset"
        );
    }
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

/// The place of sequence `g` of the timeline in a dataset of one source: sequence
/// `first_seq + (g - chunk_start)` of the chunk's file (checked to fit by [`join`], which builds
/// each with [`SeqLoc::new`]).
pub(super) fn place_in_chunk(chunk: &ChunkDesc, chunk_start: usize, g: usize) -> SeqLoc {
    let seq = chunk.first_seq + (g - chunk_start);
    SeqLoc { file: u32::try_from(chunk.file).unwrap_or(u32::MAX), seq: u32::try_from(seq).unwrap_or(u32::MAX) }
}
