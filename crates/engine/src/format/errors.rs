//! Data errors: where they are, what kind, and the `max_errors` budget.
//!
//! CNTK distinguishes *errors*, each of which costs one unit of `maxErrors`, from *fatal* errors
//! that stop reading regardless (CNTK's `TextParser`). Decoders report the
//! former as [`Malformed`] values and return the latter as [`DataError`]. The [`ErrorBudget`]
//! charges each malformed *place* once — keyed by file, byte offset and kind — so re-parsing an
//! evicted chunk does not spend the budget again (CNTK re-counts; that is documented as a bug).

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A place in an input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub file: Arc<Path>,
    /// 1-based line number.
    pub line: u64,
    /// 0-based byte offset from the start of the file.
    pub offset: u64,
}

/// Where a record is, made into a [`Location`] only when an error names it: a decoder's hot path
/// takes no share of the file's name per record (an atomic count that the parser threads
/// contend for).
pub trait Locate {
    /// The location.
    fn location(&self) -> Location;
}

impl Locate for Location {
    fn location(&self) -> Location {
        self.clone()
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: byte offset {}", self.file.display(), self.line, self.offset)
    }
}

/// What kind of malformed input was found; also the `kind` label of the parse-error metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// Row content that does not start with `|`.
    UnexpectedCharacter,
    /// `|` followed by a delimiter, another `|` or a non-printable byte.
    InvalidName,
    /// The sequence's bytes end inside an input name.
    DanglingName,
    /// A value that is not a number in CNTK's grammar.
    BadNumber,
    /// A dense sample with more than `dim` values.
    DenseTooLong,
    /// A malformed sparse entry (`idx:value`).
    BadSparseEntry,
    /// A sparse index ≥ `dim`.
    SparseIndexOutOfRange,
    /// A row from which no sample could be read.
    EmptyRow,
    /// A length-defining stream has more samples than the sequence's nominal length.
    SequenceTooLong,
    /// No length-defining stream reaches the sequence's nominal length.
    SequenceTooShort,
    /// A malformed line of a deepx/libsvm file.
    BadLine,
    /// A TFRecord frame whose data fails its CRC (or is not the length indexed).
    BadRecord,
    /// A record that is no valid `tf.train.Example`, or whose features do not match the streams.
    BadExample,
}

impl ErrorKind {
    /// Stable snake-case name (metric label, logs).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnexpectedCharacter => "unexpected_character",
            Self::InvalidName => "invalid_name",
            Self::DanglingName => "dangling_name",
            Self::BadNumber => "bad_number",
            Self::DenseTooLong => "dense_too_long",
            Self::BadSparseEntry => "bad_sparse_entry",
            Self::SparseIndexOutOfRange => "sparse_index_out_of_range",
            Self::EmptyRow => "empty_row",
            Self::SequenceTooLong => "sequence_too_long",
            Self::SequenceTooShort => "sequence_too_short",
            Self::BadLine => "bad_line",
            Self::BadRecord => "bad_record",
            Self::BadExample => "bad_example",
        }
    }
}

/// One malformed place: costs one unit of `max_errors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// The kind.
    pub kind: ErrorKind,
    /// Where it was detected.
    pub at: Location,
    /// What was expected and what was found.
    pub message: String,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

/// Reading data failed.
///
/// `Clone`, so one failed chunk load reaches every session waiting for that chunk — and each
/// client's error reply — with its place and kind intact ([`DataError::place`],
/// [`DataError::kind_name`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum DataError {
    /// An I/O error on a data file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error (shared: the error is cloned to every waiter).
        source: Arc<std::io::Error>,
    },
    /// Input that stops reading regardless of `max_errors` (CNTK's fatal errors).
    #[error("{at}: {message}")]
    Fatal {
        /// Where.
        at: Location,
        /// What was expected and what was found.
        message: String,
    },
    /// The error budget is spent: `last` is the error that exceeded it.
    #[error("{last}\nreached the maximum number of allowed errors ({max_errors}) while reading the input file ({}){}", last.at.file.display(), tolerated_note(tolerated.as_deref()))]
    TooManyErrors {
        /// The error that exceeded the budget (boxed, as `tolerated`: every `Result` of the
        /// crate carries this error).
        last: Box<Malformed>,
        /// The configured `max_errors`.
        max_errors: u64,
        /// How many places the same charge took before it (left out as `max_errors` allows),
        /// and the first: a caller told only this error never logs them (found by a probe:
        /// `dump` never named them).
        tolerated: Option<Box<(usize, Malformed)>>,
    },
    /// A dataset-level problem (no file matches a glob, a resume against other data, …).
    #[error("{0}")]
    Dataset(String),
    /// A sequence of more than one sample in frame mode (CNTK's `FramePacker`), before its place
    /// is known ([`DataError::locate_sequence`] makes it a [`DataError::Fatal`] at its place).
    #[error("detected a non-frame sequence of size {samples} in frame mode (sequence {seq} of the timeline, in chunk {chunk})")]
    NonFrame {
        /// The sequence, in the dataset's timeline.
        seq: u64,
        /// Its chunk.
        chunk: u32,
        /// Its samples (in the stream that has more than one).
        samples: u64,
        /// That stream (in the dataset's stream order), where known.
        stream: Option<usize>,
    },
}

impl DataError {
    /// An I/O error on `path`.
    #[must_use]
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_owned(), source: Arc::new(source) }
    }

    /// This error with the place of its sequence where `locate` knows it: a
    /// [`DataError::NonFrame`] becomes a [`DataError::Fatal`] naming its file, line and byte
    /// offset (found by a probe: the message named only the sequence's number in the timeline,
    /// useless to find it in several files or joined sources). Any other error is returned as is.
    #[must_use]
    pub fn locate_sequence(self, locate: impl FnOnce(u64, Option<usize>) -> Option<Location>) -> Self {
        match self {
            Self::NonFrame { seq, stream, .. } => match locate(seq, stream) {
                Some(at) => Self::Fatal { message: self.to_string(), at },
                None => self,
            },
            other => other,
        }
    }

    /// The file, 1-based line and byte offset the error is about, when it is about one place.
    #[must_use]
    pub fn place(&self) -> Option<&Location> {
        match self {
            Self::Fatal { at, .. } => Some(at),
            Self::TooManyErrors { last, .. } => Some(&last.at),
            Self::Io { .. } | Self::Dataset(_) | Self::NonFrame { .. } => None,
        }
    }

    /// The file the error is about, when there is one.
    #[must_use]
    pub fn file(&self) -> Option<&Path> {
        match self {
            Self::Io { path, .. } => Some(path),
            _ => self.place().map(|l| &*l.file),
        }
    }

    /// A stable snake-case name of what went wrong: for a spent budget, the kind of the error
    /// that spent it ([`ErrorKind::as_str`]); otherwise `io`, `fatal` or `dataset`.
    #[must_use]
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::Fatal { .. } | Self::NonFrame { .. } => "fatal",
            Self::TooManyErrors { last, .. } => last.kind.as_str(),
            Self::Dataset(_) => "dataset",
        }
    }
}

/// The `max_errors` budget of one dataset, shared by every reader of it.
///
/// Each distinct malformed place (file, byte offset, kind) is charged once, however often the
/// chunk holding it is parsed.
#[derive(Debug)]
pub struct ErrorBudget {
    max_errors: u64,
    seen: Mutex<HashSet<(Arc<Path>, u64, ErrorKind)>>,
}

impl ErrorBudget {
    /// A budget that tolerates exactly `max_errors` errors.
    #[must_use]
    pub fn new(max_errors: u64) -> Self {
        Self { max_errors, seen: Mutex::new(HashSet::new()) }
    }

    /// Errors charged so far.
    #[must_use]
    pub fn spent(&self) -> u64 {
        self.seen.lock().map_or(u64::MAX, |s| s.len() as u64)
    }

    /// Charges the errors found while parsing one chunk, in file order. Returns the newly
    /// charged ones (callers log and count them).
    ///
    /// # Errors
    /// [`DataError::TooManyErrors`] with the first error beyond the budget.
    pub fn charge(&self, errors: &[Malformed]) -> Result<Vec<Malformed>, DataError> {
        if errors.is_empty() {
            return Ok(Vec::new());
        }
        let mut seen = match self.seen.lock() {
            Ok(g) => g,
            // A panic elsewhere while holding the lock leaves a valid set; keep using it.
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut fresh = Vec::new();
        for e in errors {
            if seen.insert((e.at.file.clone(), e.at.offset, e.kind)) {
                if seen.len() as u64 > self.max_errors {
                    return Err(DataError::TooManyErrors {
                        last: Box::new(e.clone()),
                        max_errors: self.max_errors,
                        tolerated: fresh.first().map(|first: &Malformed| Box::new((fresh.len(), first.clone()))),
                    });
                }
                fresh.push(e.clone());
            }
        }
        Ok(fresh)
    }
}

/// What [`DataError::TooManyErrors`] adds about the places left out before it in its charge.
fn tolerated_note(tolerated: Option<&(usize, Malformed)>) -> String {
    match tolerated {
        Some((count, first)) => {
            format!("; before it, {count} malformed place(s) left out as max_errors allows, the first: {first}")
        }
        None => String::new(),
    }
}

/// Characters of the input a message quotes at most ([`quoted`]).
pub const QUOTED_CHARS: usize = 64;

/// Bytes of the input quoted in a message: as text, with control characters, a BOM and a
/// zero-width space escaped (`\0`, `\u{1b}`), so that an error never writes raw control bytes
/// to a terminal or a log — and at most [`QUOTED_CHARS`] characters, then how long the whole
/// is: a token of 2 MB quoted whole filled the log with each error and pushed the reason out of
/// what a client is told (found by a hostile probe).
#[must_use]
pub fn quoted(bytes: &[u8]) -> String {
    // Four bytes a character at most: enough for the characters shown, without converting the rest.
    let head = String::from_utf8_lossy(&bytes[..bytes.len().min(QUOTED_CHARS * 4)]);
    let mut chars = head.chars();
    let mut out = String::new();
    for c in chars.by_ref().take(QUOTED_CHARS) {
        if c.is_control() || c == '\u{feff}' || c == '\u{200b}' {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if chars.next().is_some() || bytes.len() > QUOTED_CHARS * 4 {
        let _ = std::fmt::Write::write_fmt(&mut out, format_args!("… ({} bytes)", bytes.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(offset: u64) -> Malformed {
        Malformed {
            kind: ErrorKind::BadNumber,
            at: Location { file: Arc::from(Path::new("f.ctf")), line: 1, offset },
            message: "x".into(),
        }
    }

    #[test]
    fn quoted_input_is_short_and_escaped() {
        assert_eq!(quoted(b"0.5x"), "0.5x");
        assert_eq!(quoted(b"a\x1b[2Jb\0"), "a\\u{1b}[2Jb\\0");
        let long = quoted("é".repeat(1000).as_bytes());
        assert_eq!(long, format!("{}… (2000 bytes)", "é".repeat(QUOTED_CHARS)));
        assert_eq!(quoted("x".repeat(QUOTED_CHARS).as_bytes()), "x".repeat(QUOTED_CHARS));
        assert_eq!(
            quoted("x".repeat(QUOTED_CHARS + 1).as_bytes()),
            format!("{}… (65 bytes)", "x".repeat(QUOTED_CHARS))
        );
        // Cut inside a character, and invalid bytes: no panic, the length told.
        assert!(quoted(&[0xffu8; 10_000]).ends_with("… (10000 bytes)"));
    }

    #[test]
    fn max_errors_tolerates_exactly_n() {
        let b = ErrorBudget::new(2);
        assert_eq!(b.charge(&[err(1), err(2)]).map(|v| v.len()).ok(), Some(2));
        assert!(matches!(b.charge(&[err(3)]), Err(DataError::TooManyErrors { max_errors: 2, .. })));
    }

    /// Found by a probe: `dump` logs the places a charge accepts only when the charge succeeds,
    /// so one a chunk tolerated before the place that spent the budget was never named; the
    /// error names it.
    #[test]
    fn a_spent_budget_names_the_places_its_charge_tolerated_before() {
        let b = ErrorBudget::new(1);
        let Err(e) = b.charge(&[err(2), err(4)]) else { panic!("the second place spends a budget of 1") };
        let text = e.to_string();
        assert!(text.contains("before it, 1 malformed place(s) left out as max_errors allows, the first: "), "{text}");
        assert!(text.contains(&err(2).to_string()), "{text}");
        let Err(alone) = ErrorBudget::new(0).charge(&[err(3)]) else { panic!("a budget of 0") };
        assert!(!alone.to_string().contains("before it"), "{alone}");
    }

    #[test]
    fn reparsing_the_same_place_costs_nothing() {
        let b = ErrorBudget::new(1);
        assert_eq!(b.charge(&[err(7)]).map(|v| v.len()).ok(), Some(1));
        assert_eq!(b.charge(&[err(7)]).map(|v| v.len()).ok(), Some(0));
        assert_eq!(b.spent(), 1);
    }

    #[test]
    fn zero_budget_fails_on_first_error_with_its_location() {
        let b = ErrorBudget::new(0);
        let e = b.charge(&[err(42)]).expect_err("budget 0");
        let text = e.to_string();
        assert!(text.contains("f.ctf:1: byte offset 42"), "{text}");
        assert!(text.contains("maximum number of allowed errors"), "{text}");
    }
}
