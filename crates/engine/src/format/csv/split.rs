//! Splitting a CSV line into its fields, as TensorFlow's `decode_csv` does, and where each begins.

use std::borrow::Cow;

/// The fields of a line (its `\r`s and newline removed), as `decode_csv` splits them; a quoted
/// field unescaped.
///
/// # Errors
/// A quoted field that does not end with a quote before the delimiter or the end, or an unquoted
/// field holding a quote (with `quotes`).
pub fn split_fields(line: &[u8], delim: u8, quotes: bool) -> Result<Vec<Cow<'_, [u8]>>, FieldError> {
    split_fields_upto(line, delim, quotes, usize::MAX)
}

/// [`split_fields`], stopping with an error once a field past the first `columns` is found: a
/// record's fields cost 24 bytes each, so a malformed line of many empty fields must not be
/// split whole (found by a probe: a 40 MB line of commas took 985 MB to be found malformed).
///
/// # Errors
/// As [`split_fields`], and more than `columns` fields.
pub fn split_fields_upto(
    line: &[u8],
    delim: u8,
    quotes: bool,
    columns: usize,
) -> Result<Vec<Cow<'_, [u8]>>, FieldError> {
    let mut fields = Vec::new();
    if line.is_empty() {
        return Ok(fields);
    }
    let n = line.len();
    let mut i = 0;
    loop {
        if quotes && line[i..].first() == Some(&b'"') {
            let mut value = Vec::new();
            let mut j = i + 1;
            loop {
                match line.get(j) {
                    None => {
                        return Err(FieldError::at(
                            fields.len(),
                            "does not end with a quote before the delimiter or the line's end",
                            "the quoted",
                        ))
                    }
                    Some(b'"') if line.get(j + 1) == Some(&b'"') => {
                        value.push(b'"');
                        j += 2;
                    }
                    Some(b'"') if j + 1 == n || line[j + 1] == delim => {
                        j += 1;
                        break;
                    }
                    Some(b'"') => {
                        return Err(FieldError::at(
                            fields.len(),
                            "holds a quote that is not doubled (\"\") nor followed by the delimiter",
                            "the quoted",
                        ))
                    }
                    Some(&b) => {
                        value.push(b);
                        j += 1;
                    }
                }
            }
            fields.push(Cow::Owned(value));
            i = j;
        } else {
            // Fields are short: a loop beats a vector search's set-up.
            let end = line[i..].iter().position(|&b| b == delim).map_or(n, |k| i + k);
            let field = &line[i..end];
            if quotes && field.contains(&b'"') {
                return Err(FieldError::at(
                    fields.len(),
                    "holds a quote (quote the field and double the quote)",
                    "the unquoted",
                ));
            }
            fields.push(Cow::Borrowed(field));
            i = end;
        }
        // At the delimiter after a field, or the line's end.
        if i >= n {
            return Ok(fields);
        }
        if fields.len() >= columns {
            // Counted, not split: a line of many empty fields costs no memory (above).
            let found = field_starts(line, delim, quotes).count();
            return Err(FieldError { field: columns, message: format!("expected {columns} fields, found {found}") });
        }
        i += 1;
        if i == n {
            // A trailing delimiter: one more, empty field.
            fields.push(Cow::Borrowed(&line[n..]));
            return Ok(fields);
        }
    }
}

/// A line that does not split into fields: the field where it goes wrong (counted from 0), and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field the problem is in (or, for too many fields, the first one too many).
    pub field: usize,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    fn at(field: usize, what: &str, kind: &str) -> Self {
        Self { field, message: format!("{kind} field {field} {what}") }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where each field of `line` begins, as [`split_fields`] splits it (quoted fields skipped whole,
/// a doubled quote inside one included), without allocating: for the byte offset of an error in
/// a field, and to count a line's fields.
pub(super) fn field_starts(line: &[u8], delim: u8, quotes: bool) -> impl Iterator<Item = usize> + '_ {
    let mut next = (!line.is_empty()).then_some(0usize);
    std::iter::from_fn(move || {
        let start = next?;
        let mut i = start;
        if quotes && line.get(i) == Some(&b'"') {
            i += 1;
            loop {
                match line.get(i) {
                    None => break,
                    Some(b'"') if line.get(i + 1) == Some(&b'"') => i += 2,
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
        }
        next = line.get(i..).and_then(|rest| memchr::memchr(delim, rest)).map(|k| i + k + 1);
        Some(start)
    })
}
