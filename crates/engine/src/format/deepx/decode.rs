//! The parse pass of the deepx formats: one line → one instance, appended to columnar buffers.
//!
//! [`DeepxDecoder::decode_line`] parses the bytes of one line (as the index pass found it) and
//! appends one sample to every stream, or — when the line is malformed — no sample at all and one
//! [`Malformed`] (kind [`ErrorKind::BadLine`], charged against `max_errors` by the caller) naming
//! the file, line, byte offset and the offending token. Either way the line closes one sequence,
//! so a chunk's sequences stay aligned with the index: a malformed line is a sequence of 0 samples.
//!
//! The grammar is deepx's (its `libsvm`, `libsvm_ex` and `uch` instance readers), minus its bugs:
//! * `WS` is space or tab; one `\r` before the line end is dropped (CRLF files); trailing blanks
//!   add nothing (deepx adds a spurious feature 0);
//! * labels: `label_size` reals, each optionally `:weight`; label in `[-1e4, 1e4]`, weight in
//!   `(0, 1e4]`, range checks on the narrowed value as deepx does;
//! * right after the labels, optionally `uuid:STR` (up to the next blank, `:` and `|` included)
//!   and, with `qid = true`, `qid:N`, in either order;
//! * features: `id[:value]`, `id` a `u64` written in decimal, `|value| ≤ 100`, value 1 when
//!   absent; file order and duplicates kept;
//! * `libsvm`: 0..n features; `libsvm_ex`: exactly `x_size` non-empty groups separated by `|`
//!   (blanks allowed around it; one trailing `|` tolerated); `uch`: user `|` candidate, then 0..n
//!   history items, the first `x_hist_item_size` kept and the rest checked but ignored;
//! * every token must end at a blank, the line end, or (`libsvm_ex`, `uch`) a `|`: deepx's
//!   accidental separators (`3:0.5,4:1`, `2:3:4`, `1:0.5x`) are errors here.

use std::path::Path;
use std::sync::Arc;

use super::number::{parse_id, parse_real, plain_feature, single_digit_real, IdError, FEATURE_WINDOW};
use super::schema::{Layout, Schema};

mod buffers;
mod sparse;

use crate::format::ctf::Element;
use crate::format::errors::{ErrorKind, Locate, Location, Malformed};
use buffers::rollback;
pub use buffers::DeepxBufs;
pub use sparse::SparseBuf;
use sparse::{FeatureId, Ids};

/// deepx's `MAX_INSTANCE_LABEL`.
const MAX_LABEL: f64 = 10_000.0;
/// deepx's `MAX_INSTANCE_WEIGHT`.
const MAX_WEIGHT: f64 = 10_000.0;
/// deepx's `MAX_FEATURE_VALUE`.
const MAX_FEATURE_VALUE: f64 = 100.0;

/// `|v| <= max`; false for NaN.
#[inline]
fn within(v: f64, max: f64) -> bool {
    v.abs() <= max
}

/// An element type of the deepx streams: narrowed from `f64`, widened back for range checks.
pub trait DeepxElement: Element + Into<f64> {}

impl DeepxElement for f32 {}

impl DeepxElement for f64 {}

/// Where [`DeepxDecoder::features`] stopped.
enum Step {
    /// At this `|` or the line's end, every feature stored.
    End(usize),
    /// At the feature starting here, whose id needs 64 bits: nothing of it stored.
    Widen(usize),
}

/// Where a line's bytes come from, for error locations.
#[derive(Debug, Clone, Copy)]
pub struct LineContext<'a> {
    /// The file as configured (a `.gz` file, not its decompressed copy).
    pub file: &'a Arc<Path>,
    /// 0-based line number.
    pub line: u64,
    /// Byte offset of the line's first byte (in the decompressed data for `.gz`).
    pub offset: u64,
}

impl Locate for LineContext<'_> {
    /// The record's location, its line 1-based.
    fn location(&self) -> Location {
        Location { file: self.file.clone(), line: self.line + 1, offset: self.offset }
    }
}

/// A parse failure: where in the line, and what.
struct Bad {
    at: usize,
    message: String,
}

type Parse<T> = Result<T, Bad>;

fn bad(at: usize, message: String) -> Bad {
    Bad { at, message }
}

/// What sits at `s[at]`, for messages.
fn found(s: &[u8], at: usize) -> String {
    match s.get(at) {
        None => "the end of the line".into(),
        Some(&b) if b.is_ascii_graphic() => format!("'{}'", b as char),
        Some(&b) => format!("byte 0x{b:02x}"),
    }
}

/// The token at `s[from..]` up to the next blank or `|`, for messages.
fn token(s: &[u8], from: usize) -> String {
    let end =
        s[from.min(s.len())..].iter().position(|&b| b == b' ' || b == b'\t' || b == b'|').map_or(s.len(), |i| from + i);
    crate::format::errors::quoted(&s[from.min(end)..end])
}

#[inline]
fn skip_ws(s: &[u8], mut p: usize) -> usize {
    while let Some(b' ' | b'\t') = s.get(p) {
        p += 1;
    }
    p
}

/// Parses the lines of one dataset's files (every deepx format, svmlight options included).
#[derive(Debug, Clone)]
pub struct DeepxDecoder {
    schema: Schema,
    /// Whether features of the plain shape are read by [`plain_feature`] first (always, but in
    /// the differential tests of that fast path, [`DeepxDecoder::general_only`]).
    plain: bool,
}

impl DeepxDecoder {
    /// A decoder producing `schema`'s streams.
    #[must_use]
    pub fn new(schema: Schema) -> Self {
        Self { schema, plain: true }
    }

    /// The same decoder reading every feature with the general readers only: the reference the
    /// plain-feature fast path is checked against (tests, fuzzing). Not for production use.
    #[doc(hidden)]
    #[must_use]
    pub fn general_only(mut self) -> Self {
        self.plain = false;
        self
    }

    /// The streams it produces.
    #[must_use]
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Parses one line (`bytes` as the index pass delimited it, its `\n` included or not) into
    /// `out` as one sequence. A malformed line becomes a sequence of 0 samples and one entry in
    /// `errors`.
    pub fn decode_line<T: DeepxElement>(
        &self,
        bytes: &[u8],
        ctx: &LineContext<'_>,
        out: &mut DeepxBufs<T>,
        errors: &mut Vec<Malformed>,
    ) {
        let mut line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        line = line.strip_suffix(b"\r").unwrap_or(line);
        if self.schema.comments {
            line = strip_comment(line);
        }
        match self.parse(line, out) {
            Ok(()) => {
                for x in &mut out.x {
                    x.sample_offsets.push(x.len());
                }
                if self.schema.uuid {
                    out.uuid_offsets.push(out.uuid_bytes.len());
                }
                out.samples += 1;
            }
            Err(Bad { at, message }) => {
                rollback(out, self.schema.label_size);
                errors.push(Malformed {
                    kind: ErrorKind::BadLine,
                    at: Location { file: ctx.file.clone(), line: ctx.line + 1, offset: ctx.offset + at as u64 },
                    message,
                });
            }
        }
        out.surplus.truncate(0);
        out.seq_offsets.push(out.samples);
    }

    fn parse<T: DeepxElement>(&self, s: &[u8], out: &mut DeepxBufs<T>) -> Parse<()> {
        let mut p = self.labels(s, skip_ws(s, 0), out)?;
        p = self.specials(s, p, out)?;
        let n = s.len();
        match self.schema.layout {
            Layout::Libsvm => {
                if p < n {
                    self.series(s, p, &mut out.x[0], false)?;
                }
            }
            Layout::LibsvmEx { groups } => {
                for g in 0..groups {
                    if p >= n || s[p] == b'|' {
                        let what = if g == 0 { "missing" } else { "empty" };
                        return Err(bad(p, format!("{what} feature group {g}: libsvm_ex with x_size = {groups} needs {groups} non-empty groups separated by '|', found {}", found(s, p))));
                    }
                    let q = self.series(s, p, &mut out.x[g], true)?;
                    if g + 1 < groups {
                        if q >= n {
                            return Err(bad(
                                q,
                                format!("the line has {} feature group(s), but x_size = {groups}", g + 1),
                            ));
                        }
                        p = skip_ws(s, q + 1);
                    } else if q < n {
                        // Empty groups after the last one (`|`, `||`, `| |`) carry nothing and
                        // deepx accepts them; a non-empty one would be dropped, so it is an error.
                        let mut r = skip_ws(s, q + 1);
                        while r < n && s[r] == b'|' {
                            r = skip_ws(s, r + 1);
                        }
                        if r < n {
                            return Err(bad(
                                r,
                                format!("more than x_size = {groups} feature groups (deepx ignores the rest silently)"),
                            ));
                        }
                    }
                }
            }
            Layout::Uch { hist } => {
                if p >= n || s[p] == b'|' {
                    return Err(bad(
                        p,
                        format!(
                            "missing user features: uch needs 'user | candidate [| history…]', found {}",
                            found(s, p)
                        ),
                    ));
                }
                let q = self.series(s, p, &mut out.x[0], true)?;
                p = if q < n { skip_ws(s, q + 1) } else { q };
                if q >= n || p >= n || s[p] == b'|' {
                    return Err(bad(
                        p,
                        format!("missing candidate features after the user features, found {}", found(s, p)),
                    ));
                }
                let mut q = self.series(s, p, &mut out.x[1], true)?;
                let mut items = 0usize;
                while q < n {
                    p = skip_ws(s, q + 1);
                    if p >= n {
                        break; // a trailing '|' ends the history
                    }
                    if s[p] == b'|' {
                        return Err(bad(p, format!("history item {items} is empty")));
                    }
                    let buf = if items < hist { &mut out.x[2 + items] } else { &mut out.surplus };
                    q = self.series(s, p, buf, true)?;
                    items += 1;
                }
                #[allow(clippy::cast_precision_loss)] // at most 128
                out.hist_size.push(T::from_f64(items.min(hist) as f64));
            }
        }
        Ok(())
    }

    /// `label_size` labels with optional weights; returns the offset of the next token.
    fn labels<T: DeepxElement>(&self, s: &[u8], mut p: usize, out: &mut DeepxBufs<T>) -> Parse<usize> {
        let k = self.schema.label_size;
        for i in 0..k {
            if p >= s.len() {
                return Err(bad(p, format!("missing label {} of label_size = {k}", i + 1)));
            }
            let (label, q) = parse_real(s, p).map_err(|(e, at)| {
                bad(at, format!("invalid label: expected {}, found {}", e.expected(), found(s, at)))
            })?;
            let label = T::from_f64(label);
            if !within(label.into(), MAX_LABEL) {
                return Err(bad(p, format!("label {} is out of range [-10000, 10000]", token(s, p))));
            }
            let (weight, q) = if s.get(q) == Some(&b':') {
                let (wv, r) = parse_real(s, q + 1).map_err(|(e, at)| {
                    bad(
                        at,
                        format!(
                            "invalid weight after '{}': expected {}, found {}",
                            token(s, p),
                            e.expected(),
                            found(s, at)
                        ),
                    )
                })?;
                let wv = T::from_f64(wv);
                if !(wv.into() > 0.0 && wv.into() <= MAX_WEIGHT) {
                    return Err(bad(q + 1, format!("weight {} is out of range (0, 10000]", token(s, q + 1))));
                }
                (wv, r)
            } else {
                (T::from_f64(1.0), q)
            };
            if q < s.len() && s[q] != b' ' && s[q] != b'\t' {
                return Err(bad(
                    q,
                    format!("unexpected {} after label '{}'", found(s, q), crate::format::errors::quoted(&s[p..q])),
                ));
            }
            out.y.push(label);
            if self.schema.w {
                out.w.push(weight);
            }
            p = skip_ws(s, q);
        }
        Ok(p)
    }

    /// `uuid:STR` and (svmlight) `qid:N`, each at most once, right after the labels.
    fn specials<T: DeepxElement>(&self, s: &[u8], mut p: usize, out: &mut DeepxBufs<T>) -> Parse<usize> {
        let (mut uuid, mut qid) = (false, false);
        loop {
            let rest = &s[p..];
            if !uuid && rest.starts_with(b"uuid:") {
                let start = p + 5;
                let end = s[start..].iter().position(|&b| b == b' ' || b == b'\t').map_or(s.len(), |i| start + i);
                if end == start {
                    return Err(bad(start, "empty uuid after 'uuid:'".into()));
                }
                if self.schema.uuid {
                    out.uuid_bytes.extend_from_slice(&s[start..end]);
                }
                uuid = true;
                p = skip_ws(s, end);
            } else if self.schema.qid && !qid && rest.starts_with(b"qid:") {
                let (v, q) = parse_id(s, p + 4).map_err(|(e, at)| match e {
                    IdError::NoDigits => {
                        bad(at, format!("invalid qid: expected decimal digits, found {}", found(s, at)))
                    }
                    IdError::Overflow => bad(at, format!("qid {} overflows 64 bits", token(s, at))),
                })?;
                if q < s.len() && s[q] != b' ' && s[q] != b'\t' {
                    return Err(bad(q, format!("unexpected {} after qid", found(s, q))));
                }
                #[allow(clippy::cast_precision_loss)]
                let t = T::from_f64(v as f64);
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                if t.into() as u64 != v || v > (1 << 53) {
                    return Err(bad(p + 4, format!("qid {v} cannot be stored exactly in the dataset's precision (2^24 for float32, 2^53 for float64)")));
                }
                out.qid.push(t);
                qid = true;
                p = skip_ws(s, q);
            } else {
                break;
            }
        }
        if self.schema.qid && !qid {
            return Err(bad(p, format!("missing 'qid:N' after the labels (qid = true), found {}", found(s, p))));
        }
        Ok(p)
    }

    /// Features from `s[p]` (not blank) up to the line end or, with `pipe`, a `|`; returns the
    /// offset of that `|` or the line length.
    #[inline]
    fn series<T: DeepxElement>(&self, s: &[u8], mut p: usize, buf: &mut SparseBuf<T>, pipe: bool) -> Parse<usize> {
        // The two options are constants of the feature loop, not flags it tests per feature.
        let (one_based, plain) = (self.schema.one_based, self.plain);
        loop {
            let v = &mut buf.values;
            let step = match (&mut buf.ids, one_based, pipe) {
                (Ids::Narrow(ids), false, false) => Self::features::<T, u32, false, false>(s, p, ids, v, plain)?,
                (Ids::Narrow(ids), false, true) => Self::features::<T, u32, false, true>(s, p, ids, v, plain)?,
                (Ids::Narrow(ids), true, false) => Self::features::<T, u32, true, false>(s, p, ids, v, plain)?,
                (Ids::Narrow(ids), true, true) => Self::features::<T, u32, true, true>(s, p, ids, v, plain)?,
                (Ids::Wide(ids), false, false) => Self::features::<T, u64, false, false>(s, p, ids, v, plain)?,
                (Ids::Wide(ids), false, true) => Self::features::<T, u64, false, true>(s, p, ids, v, plain)?,
                (Ids::Wide(ids), true, false) => Self::features::<T, u64, true, false>(s, p, ids, v, plain)?,
                (Ids::Wide(ids), true, true) => Self::features::<T, u64, true, true>(s, p, ids, v, plain)?,
            };
            match step {
                Step::End(q) => return Ok(q),
                Step::Widen(at) => {
                    buf.widen();
                    p = at;
                }
            }
        }
    }

    /// [`Self::series`] with the ids stored as `I`, 1-based ids or not, and a `|` ending the
    /// series or not: the mode is chosen once per series, not tested per feature.
    #[inline]
    fn features<T: DeepxElement, I: FeatureId, const ONE_BASED: bool, const PIPE: bool>(
        s: &[u8],
        mut p: usize,
        ids: &mut Vec<I>,
        values: &mut Vec<T>,
        plain: bool,
    ) -> Parse<Step> {
        let n = s.len();
        loop {
            // The plain shape first (`id:1`, `id:0.5`), read from a fixed window; anything else,
            // and the last bytes of the line, below.
            let window = if plain { s.get(p..p + FEATURE_WINDOW) } else { None };
            if let Some(w) = window.and_then(|w| <&[u8; FEATURE_WINDOW]>::try_from(w).ok()) {
                if let Some((id, v, len)) = plain_feature(w) {
                    let id = if ONE_BASED { id.wrapping_sub(1) } else { id };
                    if let (false, Some(stored)) = (ONE_BASED && id == u64::MAX, I::store(id)) {
                        ids.push(stored);
                        values.push(T::from_f64(v));
                        // `s[p + len]` is a blank; what follows is as after any feature.
                        p = skip_ws(s, p + len + 1);
                        if p >= n {
                            return Ok(Step::End(n));
                        }
                        if PIPE && s[p] == b'|' {
                            return Ok(Step::End(p));
                        }
                        continue;
                    }
                }
            }
            let (mut id, q) = parse_id(s, p).map_err(|(e, at)| match e {
                IdError::NoDigits => {
                    bad(at, format!("invalid feature id: expected decimal digits, found {}", found(s, at)))
                }
                IdError::Overflow => bad(at, format!("feature id {} overflows 64 bits", token(s, at))),
            })?;
            if ONE_BASED {
                id = id
                    .checked_sub(1)
                    .ok_or_else(|| bad(p, "feature id 0 in a file with 1-based ids (feature_index_base = 1)".into()))?;
            }
            let (value, q) = if q < n && s[q] == b':' {
                // `id:1` and other one-digit values: always within range.
                if let Some((v, r)) = single_digit_real(s, q + 1) {
                    (T::from_f64(v), r)
                } else {
                    let (v, r) = parse_real(s, q + 1).map_err(|(e, at)| {
                        bad(
                            at,
                            format!("invalid value of feature {id}: expected {}, found {}", e.expected(), found(s, at)),
                        )
                    })?;
                    let v = T::from_f64(v);
                    if !within(v.into(), MAX_FEATURE_VALUE) {
                        return Err(bad(
                            q + 1,
                            format!("value {} of feature {id} is out of range [-100, 100]", token(s, q + 1)),
                        ));
                    }
                    (v, r)
                }
            } else {
                (T::from_f64(1.0), q)
            };
            let Some(stored) = I::store(id) else { return Ok(Step::Widen(p)) };
            ids.push(stored);
            values.push(value);
            if q >= n {
                return Ok(Step::End(n));
            }
            match s[q] {
                b' ' | b'\t' => {}
                b'|' if PIPE => return Ok(Step::End(q)),
                b'|' => {
                    return Err(bad(
                        q,
                        "unexpected '|' after a feature: libsvm has one feature group (see libsvm_ex)".into(),
                    ))
                }
                _ => {
                    return Err(bad(
                        q,
                        format!(
                            "unexpected {} after feature '{}'",
                            found(s, q),
                            crate::format::errors::quoted(&s[p..q])
                        ),
                    ))
                }
            }
            // `s[q]` is the blank just matched.
            p = skip_ws(s, q + 1);
            if p >= n {
                return Ok(Step::End(n));
            }
            if PIPE && s[p] == b'|' {
                return Ok(Step::End(p));
            }
        }
    }
}

/// svmlight comments: a `#` at the start of a token ends the line's data.
fn strip_comment(line: &[u8]) -> &[u8] {
    for at in memchr::memchr_iter(b'#', line) {
        if at == 0 || line[at - 1] == b' ' || line[at - 1] == b'\t' {
            return &line[..at];
        }
    }
    line
}

#[cfg(test)]
mod tests;
