//! The options that shape a dataset — formats, sources, streams, precision, error budget,
//! sampling defaults, deepx options. The engine owns these types; the daemon's `config` module
//! builds them from TOML and environment overrides after validating every key, so each value here
//! already satisfies the invariants documented on it (a stream's `dim` ≥ 1, at most one
//! `defines_mb_size` stream, deepx sizes within deepx's limits, …).

use std::path::PathBuf;

use crate::sampling::Window;

/// Default of `datasets.*.chunk_size_bytes`: CNTK's `chunkSizeInBytes` default (32 MiB).
pub const DEFAULT_CHUNK_SIZE_BYTES: u64 = 32 * 1024 * 1024;
/// Default of `datasets.*.sampling.window_chunks`: CNTK V2's `DEFAULT_RANDOMIZATION_WINDOW_IN_CHUNKS`.
pub use crate::sampling::DEFAULT_WINDOW_CHUNKS;
/// Largest sparse `dim`: CNTK's sparse index type is a signed 32-bit integer.
pub const MAX_SPARSE_DIM: u64 = i32::MAX as u64;
/// Largest dense `dim`: a dense sample is materialised per sample, so an absurd `dim` from a
/// config typo must not turn into an absurd allocation.
pub const MAX_DENSE_DIM: u64 = 1 << 24;
/// Default of `daemon.max_inflated_bytes`: the largest decompressed copy of one `.gz` input
/// (64 GiB: far above any one file of a text dataset, far below a disk a bomb could fill).
pub const DEFAULT_MAX_INFLATED_BYTES: u64 = 64 << 30;
/// Default of `daemon.max_inflate_ratio`: a `.gz` input may decompress to at most this many
/// times its compressed size. Text training data compresses 3–15×; deflate cannot exceed about
/// 1032×, so a bomb sits near that bound — 100× (the bound of zip-bomb guards such as Apache
/// POI's minimum inflate ratio 0.01) leaves genuine data a wide margin and stops a 3 MB bomb at
/// 300 MB instead of 3 GB.
pub const DEFAULT_MAX_INFLATE_RATIO: u64 = 100;
/// Every `.gz` input may decompress to this many bytes whatever its ratio, so that tiny,
/// very repetitive files (test fixtures) are never refused by the ratio.
pub const INFLATE_RATIO_GRACE_BYTES: u64 = 1 << 20;

/// Bytes the timeline holds per sequence beside the file index's own columns
/// ([`crate::format::Sequences`], counted as they are): its nominal length, kept only once a
/// sequence is longer than one sample ([`crate::sampling::Lengths`]) — in a dataset of one
/// source, exactly when its index keeps a samples column.
pub const TIMELINE_BYTES_PER_SEQUENCE: u64 = 4;
/// What a dataset of several sources adds per sequence and source: the sequence's place in the
/// source (8) and, for each source beyond the first, its entry in the join's key map while the
/// dataset opens (about 24, counted on every source to keep it simple).
pub const JOIN_BYTES_PER_SOURCE: u64 = 32;
/// The fewest bytes a sequence's own columns take in the file index (its size, a byte at the
/// least: a variable-length number).
pub const MIN_COLUMN_BYTES_PER_SEQUENCE: u64 = 1;

/// `daemon.memory_limit_bytes` divided by this is the largest sequence (and line) indexed: a
/// parser thread holds a chunk whole, and a chunk holds at least one sequence.
pub const SEQUENCE_SHARE_OF_MEMORY_LIMIT: u64 = 16;
/// `daemon.memory_limit_bytes` divided by this is the most one chunk's parsed dense values may
/// take: a chunk larger than the cache's share could never be held, and parsing it would pass the
/// limit before the cache could refuse it.
pub const PARSED_CHUNK_SHARE_OF_MEMORY_LIMIT: u64 = 2;
/// `daemon.memory_limit_bytes` divided by this is what the indexes of all datasets may hold
/// together.
pub const INDEX_SHARE_OF_MEMORY_LIMIT: u64 = 4;

/// Bounds on what the index pass may hold in memory, so that no input — a file of millions of
/// short lines, one endless line, a gzip bomb — makes indexing grow past the memory the
/// configuration allows. Exceeding one is a fatal error naming the file, line and byte offset.
///
/// Not part of [`DatasetConfig`]: they follow `daemon.memory_limit_bytes`, which a reload may
/// change without the datasets being opened again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexLimits {
    /// Most sequences of one dataset (over its sources and files).
    pub max_sequences: u64,
    /// Most bytes the index of one dataset may hold: its files' columns and, per sequence,
    /// `bytes_per_sequence` more.
    pub max_index_bytes: u64,
    /// What the dataset holds per sequence beyond the file index's columns (a joined dataset's
    /// places and its timeline's lengths).
    pub bytes_per_sequence: u64,
    /// The timeline's lengths follow the index's samples column (a dataset of one source): it
    /// keeps them, [`TIMELINE_BYTES_PER_SEQUENCE`] for every sequence of the dataset, once a file
    /// keeps that column, else nothing.
    pub lengths_follow_samples: bool,
    /// Sequences of the dataset's earlier files ([`IndexLimits::left_after`]): the first file
    /// that keeps a samples column pays their lengths too.
    pub sequences_before: u64,
    /// An earlier file kept a samples column (and paid for every length before it).
    pub lengths_kept: bool,
    /// Most bytes of one sequence, and so of one line: the index pass holds a line whole, and a
    /// parser thread holds a chunk (at least one sequence) whole.
    pub max_sequence_bytes: u64,
    /// Most bytes of one chunk's parsed dense values (a dense sample costs `dim` values however
    /// short its text): past it, loading the chunk fails with the file, line and offset.
    pub max_parsed_chunk_bytes: u64,
    /// Bytes of parsed chunks the index pass may keep: a file whose every line is a sequence is
    /// then parsed in the pass that indexes it (the daemon gives the chunk cache's room; 0, the
    /// default, parses nothing ahead).
    pub parse_ahead_bytes: u64,
    /// Whether the buffers of chunks parsed ahead are advised huge pages (`[daemon] huge_pages`).
    pub parse_ahead_huge_pages: bool,
}

impl IndexLimits {
    /// No bound beyond the formats' own (a sequence under 4 GiB).
    pub const UNBOUNDED: Self = Self {
        max_sequences: u64::MAX,
        max_index_bytes: u64::MAX,
        bytes_per_sequence: 0,
        lengths_follow_samples: true,
        sequences_before: 0,
        lengths_kept: false,
        max_sequence_bytes: u32::MAX as u64,
        max_parsed_chunk_bytes: u64::MAX,
        parse_ahead_bytes: 0,
        parse_ahead_huge_pages: false,
    };

    /// What is left for the next file of a dataset once its earlier files' indexes hold
    /// `sequences` sequences and `bytes` bytes, `lengths_kept` whether one of them keeps a samples
    /// column.
    #[must_use]
    pub fn left_after(self, sequences: u64, bytes: u64, lengths_kept: bool) -> Self {
        Self {
            max_sequences: self.max_sequences.saturating_sub(sequences),
            max_index_bytes: self.max_index_bytes.saturating_sub(bytes),
            sequences_before: sequences,
            lengths_kept,
            ..self
        }
    }

    /// These limits for an object whose index is shared through object storage: its encoded form
    /// (4 bytes a size and more, [`crate::format::index_cache`]) is held whole while it is
    /// uploaded or downloaded, so the sequences are as many as the budget holds at 4 bytes each,
    /// not at the byte or two their sizes take in memory.
    #[must_use]
    pub fn for_shared_index(self) -> Self {
        Self { max_sequences: self.max_sequences.min(self.max_index_bytes / 4), ..self }
    }

    /// What the timeline's lengths cost a file of `sequences` sequences whose index does
    /// (`samples`) or does not keep a samples column: in a dataset of one source, nothing while
    /// no file keeps one; the file that is the first to keep one pays for every sequence so far;
    /// every later file for its own.
    #[must_use]
    pub fn lengths_bytes(&self, sequences: u64, samples: bool) -> u64 {
        let paid = if !self.lengths_follow_samples {
            0
        } else if self.lengths_kept {
            sequences
        } else if samples {
            sequences.saturating_add(self.sequences_before)
        } else {
            0
        };
        paid.saturating_mul(TIMELINE_BYTES_PER_SEQUENCE)
    }

    /// The most bytes of one sequence — a line, a record, a whole file —: `max_sequence_bytes`,
    /// and 4 GiB at most (an index keeps a sequence's size in 32 bits). Errors give the reason as
    /// [`largest_sequence_why`] says it.
    #[must_use]
    pub fn largest_sequence(&self) -> u64 {
        self.max_sequence_bytes.min(u64::from(u32::MAX))
    }

    /// The limits of a dataset of `sources` sources under `daemon.memory_limit_bytes =
    /// memory_limit`, when the indexes of the datasets already open hold `in_use` bytes: the
    /// indexes of all datasets share a [`INDEX_SHARE_OF_MEMORY_LIMIT`]th of the limit, and a
    /// sequence may hold a [`SEQUENCE_SHARE_OF_MEMORY_LIMIT`]th.
    #[must_use]
    pub fn within(memory_limit: u64, in_use: u64, sources: usize) -> Self {
        let sources = sources.max(1) as u64;
        let bytes_per_sequence =
            if sources > 1 { TIMELINE_BYTES_PER_SEQUENCE + JOIN_BYTES_PER_SOURCE * sources } else { 0 };
        let max_index_bytes = (memory_limit / INDEX_SHARE_OF_MEMORY_LIMIT).saturating_sub(in_use);
        Self {
            // A timeline counts its sequences in 32 bits.
            max_sequences: (max_index_bytes / (MIN_COLUMN_BYTES_PER_SEQUENCE + bytes_per_sequence))
                .min(u64::from(u32::MAX)),
            max_index_bytes,
            bytes_per_sequence,
            lengths_follow_samples: sources == 1,
            sequences_before: 0,
            lengths_kept: false,
            max_sequence_bytes: (memory_limit / SEQUENCE_SHARE_OF_MEMORY_LIMIT).clamp(1, u64::from(u32::MAX)),
            max_parsed_chunk_bytes: (memory_limit / PARSED_CHUNK_SHARE_OF_MEMORY_LIMIT).max(1),
            parse_ahead_bytes: 0,
            parse_ahead_huge_pages: false,
        }
    }
}

/// Why one sequence may hold at most [`IndexLimits::largest_sequence`] bytes, as every format's
/// error for a larger one says it.
#[must_use]
pub fn largest_sequence_why() -> String {
    format!("4 GiB at most, and daemon.memory_limit_bytes / {SEQUENCE_SHARE_OF_MEMORY_LIMIT}")
}

/// Text formats. A closed set: every `match` on it is exhaustive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatKind {
    /// CNTK Text Format.
    Ctf,
    /// deepx `libsvm` (and svmlight variants).
    Libsvm,
    /// deepx `libsvm_ex`.
    LibsvmEx,
    /// deepx `uch`.
    Uch,
    /// TensorFlow's TFRecord files of `tf.train.Example` records.
    TfRecord,
    /// Fixed-length binary records (`FixedLengthRecordDataset`), decoded raw (`decode_raw`).
    FixedLength,
    /// CSV lines (`TextLineDataset`) decoded by `decode_csv`'s rules.
    Csv,
    /// Whole files (`WholeFileReader`, `tf.io.read_file`): each file one record, its bytes and
    /// its path.
    WholeFile,
}

impl FormatKind {
    /// Whether its inputs are read as they are unless the dataset names a `compression`: binary
    /// records and whole files may begin with gzip's magic bytes.
    #[must_use]
    pub fn read_as_is_by_default(self) -> bool {
        matches!(self, Self::FixedLength | Self::WholeFile)
    }

    /// One of deepx's instance formats.
    #[must_use]
    pub fn is_deepx(self) -> bool {
        matches!(self, Self::Libsvm | Self::LibsvmEx | Self::Uch)
    }

    /// The formats' names in a config, for messages.
    pub const NAMES: &'static str = "ctf, libsvm, libsvm_ex, uch, tfrecord, fixed_length, csv or whole_file";

    /// Its name in a config.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ctf => "ctf",
            Self::Libsvm => "libsvm",
            Self::LibsvmEx => "libsvm_ex",
            Self::Uch => "uch",
            Self::TfRecord => "tfrecord",
            Self::FixedLength => "fixed_length",
            Self::Csv => "csv",
            Self::WholeFile => "whole_file",
        }
    }

    /// Every format, in [`FormatKind::NAMES`]'s order.
    pub const ALL: [Self; 8] = [
        Self::Ctf,
        Self::Libsvm,
        Self::LibsvmEx,
        Self::Uch,
        Self::TfRecord,
        Self::FixedLength,
        Self::Csv,
        Self::WholeFile,
    ];

    /// The format named `s` in a config ([`FormatKind::NAMES`]): the one whose
    /// [`FormatKind::name`] it is.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// Element type of the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 32-bit floats (CNTK V2 always uses these).
    Float32,
    /// 64-bit floats.
    Float64,
}

/// Storage of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// `dim` values per sample.
    Dense,
    /// `index:value` entries per sample.
    Sparse,
}

/// `[datasets.NAME.streams.STREAM]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// The table key: the name the stream has in minibatches.
    pub name: String,
    /// The token after `|` in the data (defaults to the name).
    pub alias: String,
    /// Sample dimension.
    pub dim: usize,
    /// Dense or sparse.
    pub format: StreamFormat,
    /// Whether this stream alone defines a sequence's nominal length (CNTK `definesMBSize`).
    pub defines_mb_size: bool,
}

/// One CTF source: files read in order, with their streams. A dataset has one, or several joined
/// by sequence key (CNTK's bundler), the first driving chunking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// Paths or glob patterns, resolved against the config file's directory.
    pub files: Vec<PathBuf>,
    /// CNTK `skipSequenceIds`: every line is its own sequence.
    pub skip_sequence_ids: bool,
    /// Streams, sorted by name (a TOML table has no order the loader keeps): the order of the
    /// tensors in every slot, of `opened`'s `streams` and of `dump`'s objects.
    pub streams: Vec<StreamConfig>,
}

/// `[datasets.NAME.sampling]`: defaults that a session may override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingDefaults {
    /// Randomize (CNTK `BlockRandomizer`) or not (`NoRandomizer`).
    pub randomize: bool,
    /// The randomization window.
    pub window: Window,
    /// `randomization_seed`.
    pub seed: u64,
}

/// `[datasets.NAME]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetConfig {
    /// The table key.
    pub name: String,
    /// The text format.
    pub format: FormatKind,
    /// The sources; `sources[0]` drives chunking. For a plain dataset, one source built from the
    /// dataset's own `files` and `streams`.
    pub sources: Vec<SourceConfig>,
    /// CNTK `chunkSizeInBytes`.
    pub chunk_size_bytes: u64,
    /// CNTK `maxErrors`: the number of tolerated errors.
    pub max_errors: u64,
    /// Cache the index pass in `state_dir`.
    pub cache_index: bool,
    /// Parse the dataset into the chunk cache as soon as the daemon has indexed it, before any
    /// session asks (up to the cache budget), so a trainer's first sweep starts warm.
    pub preload: bool,
    /// Element type.
    pub precision: Precision,
    /// Sampling defaults.
    pub sampling: SamplingDefaults,
    /// deepx options (`label_size`, …); `None` for CTF.
    pub deepx: Option<DeepxOptions>,
    /// Limits on decompressing `.gz` inputs (from the daemon's `[daemon]` section: they are the
    /// same for every dataset).
    pub inflate: InflateLimits,
    /// A record format's options (`tfrecord`, `fixed_length`, `csv`, `whole_file`: the formats of
    /// `crate::format::registry`); `None` for CTF and the deepx formats.
    pub records: Option<RecordOptions>,
    /// How the inputs are compressed (`compression`): gzip recognised by its magic bytes unless
    /// the dataset says otherwise (`fixed_length`: none, binary records may begin with them).
    pub compression: Compression,
    /// Threads the index pass of one large file may use (from the daemon's `parser_threads`,
    /// one per core when 0: the index pass runs before anything is parsed).
    pub index_threads: usize,
}

/// The type of a `tf.train.Example` feature (`tf.io.FixedLenFeature`'s and `VarLenFeature`'s
/// `dtype`), read into the dataset's precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureType {
    /// `tf.float32`: a `float_list`.
    Float,
    /// `tf.int64`: an `int64_list`; each value must be exact in the dataset's precision (a
    /// larger one is a malformed record, never a rounded value).
    Int64,
    /// `tf.string`: a `bytes_list`; each byte string is one sample of a strings stream, its
    /// bytes as written (no text decoding).
    Bytes,
}

/// What a fixed-length feature holds when a record lacks it (`default_value`): `dim` values, or
/// one that every value takes (kept as one: a default of 2^24 values costs no memory until a
/// record needs it).
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureDefault {
    /// One or `dim` numbers (integers for an `int64` feature).
    Numbers(Vec<f64>),
    /// One or `dim` byte strings, for a `bytes` feature.
    Bytes(Vec<Vec<u8>>),
}

impl FeatureDefault {
    /// Value `i` of `dim`: the `i`th, or the one every value takes.
    #[must_use]
    pub fn at<T>(values: &[T], i: usize) -> &T {
        &values[if values.len() == 1 { 0 } else { i }]
    }
}

/// How many values a feature has per record.
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureLength {
    /// `tf.io.FixedLenFeature([dim])`: exactly the stream's `dim` values, or `default` (its
    /// `default_value`) when the record lacks the feature; without a default the feature is
    /// required. A dense stream of one sample a record, or for `bytes` a strings stream of `dim`
    /// samples a record (one byte string each).
    Fixed {
        /// The values of a record without the feature (`dim` of them, or one for all).
        default: Option<FeatureDefault>,
    },
    /// `tf.io.VarLenFeature`: any number of values up to the stream's `dim`, none when the record
    /// lacks it. A sparse stream whose sample holds value `i` at index `i`.
    Var,
    /// `tf.io.FixedLenSequenceFeature([dim], allow_missing=True)` (or a `VarLenFeature` read as
    /// a sequence): any multiple of `dim` values, none when the record lacks the feature, each
    /// `dim` of them one sample — the record's sequence in this stream has that many samples. A
    /// dense stream; for `bytes` (`dim` 1) a strings stream of one sample per byte string.
    Sequence,
}

/// A stream of a `tfrecord` dataset: the `tf.train.Example` feature that fills it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleFeature {
    /// The stream's name.
    pub stream: String,
    /// The feature's key in the Example's map (config `feature`, default the stream's name).
    pub key: String,
    /// Its type.
    pub dtype: FeatureType,
    /// Its length.
    pub length: FeatureLength,
    /// Values per record: exactly (fixed) or at most (var); values per sample (sequence).
    pub dim: usize,
}

/// Limits on the decompressed copy of a `.gz` input ([`crate::format::inflate`]): it may hold at
/// most `min(max_bytes, max(max_ratio × compressed size, INFLATE_RATIO_GRACE_BYTES))` bytes.
/// Exceeding them is an error naming the file, the limit and its key; the partial copy is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InflateLimits {
    /// `daemon.max_inflated_bytes`: the largest decompressed copy of one file, in bytes (≥ 1).
    pub max_bytes: u64,
    /// `daemon.max_inflate_ratio`: decompressed bytes per compressed byte (≥ 1).
    pub max_ratio: u64,
}

impl Default for InflateLimits {
    fn default() -> Self {
        Self { max_bytes: DEFAULT_MAX_INFLATED_BYTES, max_ratio: DEFAULT_MAX_INFLATE_RATIO }
    }
}

/// Which limit bounds a decompressed copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateBound {
    /// `max_bytes`.
    Bytes,
    /// `max_ratio` × the compressed size (or the grace).
    Ratio,
}

impl InflateLimits {
    /// The most bytes a file of `compressed` bytes may decompress to, and which limit that is.
    #[must_use]
    pub fn allowed(&self, compressed: u64) -> (u64, InflateBound) {
        let by_ratio = self.max_ratio.saturating_mul(compressed).max(INFLATE_RATIO_GRACE_BYTES);
        if self.max_bytes <= by_ratio {
            (self.max_bytes, InflateBound::Bytes)
        } else {
            (by_ratio, InflateBound::Ratio)
        }
    }
}

/// deepx instance-reader options (`docs/config.md`), validated by
/// `format::deepx_config` (deepx's rules and limits).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // deepx's independent config flags, named as deepx names them
pub struct DeepxOptions {
    /// Labels per instance (`1..=32`): `__instY` (and `__instW`) have this many values per sample.
    pub label_size: usize,
    /// Whether the `__instW` stream (a weight per label) is produced.
    pub w: bool,
    /// Whether the `__instUUID` stream (a string per instance) is produced.
    pub uuid: bool,
    /// `libsvm_ex`: number of feature groups `__instX0…` (`1..=128`).
    pub x_size: Option<usize>,
    /// `uch`: number of history slots `__instXhist0…` (`1..=128`).
    pub x_hist_item_size: Option<usize>,
    /// deepx's `batch` (instances per batch), when given: the dataset's suggested minibatch size
    /// in samples (one instance = one sample). The size a session asks for always wins.
    pub batch: Option<usize>,
    /// `libsvm` only, svmlight: `#` at the start of a token starts a comment up to the line end.
    pub comments: bool,
    /// `libsvm` only, svmlight: an optional `qid:N` token after the labels, kept in `__instQID`.
    pub qid: bool,
    /// `libsvm` only: feature ids in the file are 0-based as written (0, the default and deepx's
    /// behaviour) or 1-based (1: LIBSVM/SVMlight; the stored id is the written id − 1).
    pub feature_index_base: u8,
}

impl Default for DeepxOptions {
    fn default() -> Self {
        Self {
            label_size: 1,
            w: false,
            uuid: false,
            x_size: None,
            x_hist_item_size: None,
            batch: None,
            comments: false,
            qid: false,
            feature_index_base: 0,
        }
    }
}

impl DatasetConfig {
    /// All streams of all sources, in order (primary source first).
    pub fn streams(&self) -> impl Iterator<Item = &StreamConfig> {
        self.sources.iter().flat_map(|s| s.streams.iter())
    }

    /// Whether every chunk of its `bytes` of text is parsed before a session with its defaults
    /// gets its first minibatch: with `preload`, or randomized with a chunk window that spans the
    /// text (CNTK's default, 128 chunks of 32 MiB, spans up to 4 GiB). Then its index pass parses
    /// the chunks as it counts them ([`IndexLimits::parse_ahead_bytes`]) at no cost to that first
    /// minibatch; otherwise the first minibatch needs a chunk or a few, which it gets sooner from
    /// a count of every chunk (fast) followed by the parse of what it needs.
    #[must_use]
    pub fn first_minibatch_needs_every_chunk(&self, bytes: u64) -> bool {
        let spans = match self.sampling.window {
            Window::Chunks(n) => (n as u64).saturating_mul(self.chunk_size_bytes) >= bytes,
            // In samples, which the text's size does not tell.
            Window::Samples(_) => false,
        };
        self.preload || (self.sampling.randomize && spans)
    }
}

#[cfg(test)]
mod tests {
    use super::{FormatKind, IndexLimits};

    /// Every format is parsed back from its name, and the message's list names each once.
    #[test]
    fn every_format_is_read_back_from_its_name() {
        for k in FormatKind::ALL {
            assert_eq!(FormatKind::parse(k.name()), Some(k));
            assert_eq!(FormatKind::NAMES.matches(k.name()).count(), 1 + usize::from(k == FormatKind::Libsvm), "{k:?}");
        }
        assert_eq!(FormatKind::parse("svm"), None);
    }

    /// A byte a sequence at the least, but never more sequences than a timeline counts (32 bits),
    /// and an object whose index is shared in its encoded form (4 bytes a size) no more than the
    /// budget holds at 4 bytes each.
    #[test]
    fn the_sequence_count_stays_within_what_the_index_and_the_timeline_hold() {
        let small = IndexLimits::within(8 << 30, 0, 1);
        assert_eq!(small.max_index_bytes, 2 << 30);
        assert_eq!(small.max_sequences, 2 << 30);
        assert_eq!(small.for_shared_index().max_sequences, (2 << 30) / 4);
        let huge = IndexLimits::within(1 << 40, 0, 1);
        assert_eq!(huge.max_sequences, u64::from(u32::MAX));
        assert_eq!(huge.for_shared_index().max_sequences, u64::from(u32::MAX));
        // A joined dataset pays its places per sequence too.
        let joined = IndexLimits::within(8 << 30, 0, 2);
        assert!(joined.max_sequences < small.max_sequences / 60, "{}", joined.max_sequences);
    }
}

/// A `fixed_length` dataset: how its files are laid out, and the streams a record holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedConfig {
    /// Header, record and footer bytes.
    pub layout: FixedLengthOptions,
    /// The streams, in name order.
    pub streams: Vec<RawStream>,
}

/// The options of a record format: one whose files a `RecordReader` splits into records that one
/// `RecordDecoder` turns into the dataset's streams. `crate::format::registry` maps each to its
/// reader and decoder; the daemon's configuration reads each from its dataset table.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordOptions {
    /// TFRecord files of `tf.train.Example`s: the feature of each stream, in the streams' order.
    TfRecord(Vec<ExampleFeature>),
    /// Fixed-length records: the files' layout and each stream's slice of a record.
    FixedLength(FixedConfig),
    /// CSV: the header lines, how fields split, and each stream's columns.
    Csv(CsvConfig),
    /// Whole files: nothing to configure.
    WholeFile,
}

/// A `csv` dataset: the header lines skipped, how records split into fields, and the streams.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvConfig {
    /// Header lines skipped in each file.
    pub layout: CsvLayout,
    /// Fields per record, delimiter, quoting, `na_value`.
    pub options: CsvOptions,
    /// The streams, in name order.
    pub streams: Vec<CsvStream>,
}

// Fixed-length records (`crate::format::fixed`).

/// Largest `record_bytes`: a record is one sequence, whose size the index keeps in a `u32`.
pub const MAX_RECORD_BYTES: u32 = 1 << 30;

/// How a fixed-length file is laid out (`FixedLengthRecordDataset`'s arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedLengthOptions {
    /// Bytes of each record, 1..=[`MAX_RECORD_BYTES`].
    pub record_bytes: u32,
    /// Bytes before the first record.
    pub header_bytes: u64,
    /// Bytes after the last record.
    pub footer_bytes: u64,
}

impl FixedLengthOptions {
    /// A stable description, part of the index cache key.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        format!("fixed;record={};header={};footer={}", self.record_bytes, self.header_bytes, self.footer_bytes)
    }

    /// Where the bytes after the last whole record of a file of `size` bytes start (its offset)
    /// and how many there are; `None` when its body is whole records (or it has no body).
    #[must_use]
    pub fn leftover(&self, size: u64) -> Option<(u64, u64)> {
        let around = self.header_bytes.saturating_add(self.footer_bytes);
        let body = size.checked_sub(around)?;
        let record = u64::from(self.record_bytes.max(1));
        let left = body % record;
        (left != 0).then(|| (self.header_bytes + (body - left), left))
    }

    /// The number of records of a file of `size` bytes, or why it has none that can be read.
    ///
    /// # Errors
    /// A file smaller than its header and footer, a body that is not whole records, or no record.
    pub fn records(&self, size: u64) -> Result<u64, String> {
        let around = self.header_bytes.saturating_add(self.footer_bytes);
        if size < around {
            return Err(format!(
                "the file holds {size} bytes, fewer than its header ({} bytes) and footer ({} bytes)",
                self.header_bytes, self.footer_bytes
            ));
        }
        let body = size - around;
        let record = u64::from(self.record_bytes.max(1));
        if let Some((_, left)) = self.leftover(size) {
            return Err(format!(
                "excluding the header ({} bytes) and footer ({} bytes), the file has a body of {body} bytes, which is \
                 not a multiple of the record length ({record} bytes): {} left after the last whole record",
                self.header_bytes,
                self.footer_bytes,
                match left {
                    1 => "1 byte is".to_owned(),
                    n => format!("{n} bytes are"),
                }
            ));
        }
        if body == 0 {
            return Err(format!(
                "the file holds no record (its {size} bytes are its header and footer): remove it from the dataset's files"
            ));
        }
        Ok(body / record)
    }
}

/// `decode_raw`'s value types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawType {
    /// `int8`.
    I8,
    /// `uint8`.
    U8,
    /// `int16`.
    I16,
    /// `uint16`.
    U16,
    /// `int32`.
    I32,
    /// `uint32`.
    U32,
    /// `int64`.
    I64,
    /// `uint64`.
    U64,
    /// `float16` (IEEE half).
    F16,
    /// `bfloat16` (the upper half of a `float32`).
    Bf16,
    /// `bool`: a byte, 0 false (0.0), anything else true (1.0).
    Bool,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

impl RawType {
    /// The type named `name` (TensorFlow's names; `half`, `float` and `double` too).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "int8" => Self::I8,
            "uint8" => Self::U8,
            "int16" => Self::I16,
            "uint16" => Self::U16,
            "int32" => Self::I32,
            "uint32" => Self::U32,
            "int64" => Self::I64,
            "uint64" => Self::U64,
            "float16" | "half" => Self::F16,
            "bfloat16" => Self::Bf16,
            "bool" => Self::Bool,
            "float32" | "float" => Self::F32,
            "float64" | "double" => Self::F64,
            _ => return None,
        })
    }

    /// Bytes per value.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 | Self::Bool => 1,
            Self::I16 | Self::U16 | Self::F16 | Self::Bf16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// The type's name in a config.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::I8 => "int8",
            Self::U8 => "uint8",
            Self::I16 => "int16",
            Self::U16 => "uint16",
            Self::I32 => "int32",
            Self::U32 => "uint32",
            Self::I64 => "int64",
            Self::U64 => "uint64",
            Self::F16 => "float16",
            Self::Bf16 => "bfloat16",
            Self::F32 => "float32",
            Self::F64 => "float64",
            Self::Bool => "bool",
        }
    }

    /// The names [`RawType::parse`] takes, for messages.
    pub const NAMES: &'static str =
        "int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, float64, bool";
}

/// One stream of a fixed-length record: `dim` values of `dtype` from byte `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawStream {
    /// The stream's name.
    pub name: String,
    /// The values' type.
    pub dtype: RawType,
    /// Byte offset in the record.
    pub offset: usize,
    /// Values per record.
    pub dim: usize,
    /// Byte order (`decode_raw`'s `little_endian`).
    pub little_endian: bool,
}

impl RawStream {
    /// Bytes of the record it reads.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.dim.saturating_mul(self.dtype.size())
    }
}

// CSV (`crate::format::csv`).

/// What shapes a CSV file's index: the header lines skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvLayout {
    /// Lines skipped at the start of each file.
    pub skip_header_lines: u64,
}

impl CsvLayout {
    /// A stable description, part of the index cache key.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        format!("csv;header={}", self.skip_header_lines)
    }
}

/// A column's type (`decode_csv`'s `record_defaults` types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsvType {
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `string`: the field's bytes as they are (unquoted, nothing trimmed), a strings stream of
    /// one sample per column.
    String,
}

impl CsvType {
    /// The type named `name`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "float32" | "float" => Self::F32,
            "float64" | "double" => Self::F64,
            "int32" => Self::I32,
            "int64" => Self::I64,
            "string" | "bytes" => Self::String,
            _ => return None,
        })
    }

    /// Its name in a config.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F64 => "float64",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::String => "string",
        }
    }
}

/// A value a CSV field holds (or a default): an integer, exactness checked, a float, or a
/// string's bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum CsvValue {
    /// An `int32` or `int64` value.
    Int(i64),
    /// A `float32` or `float64` value (a `float32` one widened exactly).
    Float(f64),
    /// A `string` value.
    Text(Vec<u8>),
}

/// A stream of CSV columns: dense (`dim` numbers a record), or for `string` columns a strings
/// stream of one sample per column.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvStream {
    /// The stream's name.
    pub name: String,
    /// The columns' type.
    pub dtype: CsvType,
    /// The columns (0-based), in the stream's order: `dim` is their number.
    pub columns: Vec<usize>,
    /// The value of an empty or `na_value` field; `None`: such a field is malformed.
    pub default: Option<CsvValue>,
}

/// How records split into fields (`decode_csv`'s options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// Fields per record.
    pub columns: usize,
    /// The field delimiter.
    pub field_delim: u8,
    /// Double quotes quote fields.
    pub use_quote_delim: bool,
    /// A field equal to this is missing (as an empty one is).
    pub na_value: Vec<u8>,
}

/// How an input is compressed (a dataset's `compression` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// gzip when the input starts with gzip's magic bytes, else as it is.
    #[default]
    Auto,
    /// As it is.
    None,
    /// gzip (one or more members): refused when it is not.
    Gzip,
    /// One zlib stream (RFC 1950; TensorFlow's `compression_type="ZLIB"`), which has no magic to
    /// recognise it by.
    Zlib,
}

impl Compression {
    /// The compression named `name` in a config.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "none" | "" => Self::None,
            "gzip" => Self::Gzip,
            "zlib" => Self::Zlib,
            _ => return None,
        })
    }
}
