//! A small walker over the merged config tree that records every problem with its key path
//! instead of stopping at the first. Tables track which keys were read; whatever is left when a
//! table is finished is an unknown key.

use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use super::ConfigIssue;

/// Collects issues while the tree is read.
pub(crate) struct Walker {
    base: PathBuf,
    /// `base` is canonical (absolute, no symbolic link, no `..`): a leading `..` of a relative
    /// path may then be taken off it lexically.
    canonical_base: bool,
    issues: Vec<ConfigIssue>,
}

/// A value in the tree, with its path.
pub(crate) struct Node<'a> {
    path: String,
    value: NodeValue<'a>,
}

enum NodeValue<'a> {
    Borrowed(&'a Value),
    Owned(Value),
    EmptyTable,
}

/// A table being read: keys not taken by the time [`Walker::finish`] runs are reported.
pub(crate) struct Table<'a> {
    path: String,
    rest: Map<String, Value>,
    taken: Vec<String>,
    /// Every key asked for, present or not: the keys a misspelt one may have meant.
    asked: Vec<String>,
    _marker: std::marker::PhantomData<&'a ()>,
}

impl<'a> Node<'a> {
    pub(crate) fn root(value: &'a Value) -> Self {
        Self { path: String::new(), value: NodeValue::Borrowed(value) }
    }

    pub(crate) fn empty_table(parent: &Node<'_>, key: &str) -> Node<'static> {
        Node { path: join(&parent.path, key), value: NodeValue::EmptyTable }
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The raw value (`None` for a table that was absent), for readers with their own rules.
    pub(crate) fn json(&self) -> Option<&Value> {
        self.value()
    }

    fn value(&self) -> Option<&Value> {
        match &self.value {
            NodeValue::Borrowed(v) => Some(v),
            NodeValue::Owned(v) => Some(v),
            NodeValue::EmptyTable => None,
        }
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "no usable value (a number too large to read?)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a table",
    }
}

impl Walker {
    pub(crate) fn new(base: &Path) -> Self {
        let canonical_base = base.is_absolute() && std::fs::canonicalize(base).is_ok_and(|c| c == base);
        Self { base: base.to_owned(), canonical_base, issues: Vec::new() }
    }

    pub(crate) fn into_issues(mut self) -> Vec<ConfigIssue> {
        self.issues.sort_by(|a, b| a.path.cmp(&b.path));
        self.issues
    }

    /// Records a problem at `path`; one that an environment override set is said to come from
    /// it (found by a probe: `..__SOCKET__X=5` was told "daemon.socket: expected a string, found
    /// a table", with nothing naming the variable).
    pub(crate) fn issue(&mut self, path: &str, message: &str) {
        let message = match overrides_under(path, message.contains("found a table")) {
            vars if vars.is_empty() || message.contains("MINIBATCHD__") => message.to_owned(),
            vars => format!("{message} (from {})", vars.join(", ")),
        };
        self.issues.push(ConfigIssue { path: path.to_owned(), message });
    }

    pub(crate) fn table<'a>(&mut self, node: &Node<'a>) -> Option<Table<'a>> {
        let rest = match node.value() {
            None => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                self.issue(&node.path, &format!("expected a table, found {}", type_name(other)));
                return None;
            }
        };
        Some(Table {
            path: node.path.clone(),
            rest,
            taken: Vec::new(),
            asked: Vec::new(),
            _marker: std::marker::PhantomData,
        })
    }

    pub(crate) fn array<'a>(&mut self, node: &Node<'a>) -> Option<Vec<Node<'a>>> {
        match node.value() {
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Node { path: format!("{}[{i}]", node.path), value: NodeValue::Owned(v.clone()) })
                    .collect(),
            ),
            Some(other) => {
                self.issue(&node.path, &format!("expected an array, found {}", type_name(other)));
                None
            }
            None => Some(Vec::new()),
        }
    }

    /// A list of paths (a single string is accepted as a one-element list), resolved against the
    /// config file's directory.
    pub(crate) fn path_list(&mut self, node: &Node<'_>) -> Option<Vec<PathBuf>> {
        let strings: Vec<String> = match node.value() {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Number(_) | Value::Bool(_)) if override_text(&node.path).is_some() => {
                override_text(&node.path).into_iter().collect()
            }
            Some(Value::Array(items)) => {
                let mut out = Vec::new();
                for (i, v) in items.iter().enumerate() {
                    match v {
                        Value::String(s) => out.push(s.clone()),
                        other => {
                            self.issue(
                                &format!("{}[{i}]", node.path),
                                &format!("expected a path, found {}", type_name(other)),
                            );
                            return None;
                        }
                    }
                }
                out
            }
            Some(other) => {
                self.issue(&node.path, &format!("expected a list of paths, found {}", type_name(other)));
                return None;
            }
            None => Vec::new(),
        };
        if strings.is_empty() {
            self.issue(&node.path, "expected at least one path");
            return None;
        }
        // Found by a probe: "" (an unset variable in an override) resolved to the config's own
        // directory, and every file beside the config was read as data.
        if let Some(i) = strings.iter().position(String::is_empty) {
            let at = if matches!(node.value(), Some(Value::Array(_))) {
                format!("{}[{i}]", node.path)
            } else {
                node.path.clone()
            };
            self.issue(&at, "an empty path (an unset variable?): it would name the config's own directory");
            return None;
        }
        Some(strings.iter().map(|s| self.resolve(s)).collect())
    }

    fn resolve(&self, s: &str) -> PathBuf {
        let p = Path::new(s);
        // An object URL (`s3://bucket/key`) is not relative to the config file.
        if p.is_absolute() || minibatchd_engine::remote::is_remote(p) {
            return p.to_owned();
        }
        // Leading `.` and `..` are applied to a canonical base, so that paths in logs and errors
        // read `/srv/x/state` rather than `/srv/conf/../x/state`. A `..` after a named component
        // stays as written: that component may be a symbolic link, whose `..` is not its parent.
        let mut out = self.base.clone();
        let mut rest = p.components().peekable();
        if self.canonical_base {
            while let Some(c @ (Component::CurDir | Component::ParentDir)) = rest.peek() {
                if *c == Component::ParentDir && !out.pop() {
                    break;
                }
                rest.next();
            }
        }
        out.extend(rest);
        out
    }

    /// Reports the keys of `t` that nobody took, each with the known key it most likely meant.
    pub(crate) fn finish(&mut self, t: Table<'_>) {
        for (k, _) in t.rest {
            let message = match closest(&k, t.asked.iter()) {
                Some(known) => format!("unknown key; did you mean `{known}`?"),
                None => "unknown key".to_owned(),
            };
            self.issue(&join(&t.path, &k), &message);
        }
    }
}

impl<'a> Table<'a> {
    pub(crate) fn key_path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Whether `key` was present (and taken).
    pub(crate) fn had(&self, key: &str) -> bool {
        self.taken.iter().any(|k| k == key)
    }

    pub(crate) fn take(&mut self, key: &str) -> Option<Node<'a>> {
        if !self.asked.iter().any(|k| k == key) {
            self.asked.push(key.to_owned());
        }
        let v = self.rest.remove(key)?;
        self.taken.push(key.to_owned());
        Some(Node { path: join(&self.path, key), value: NodeValue::Owned(v) })
    }

    /// Every remaining entry, in key order.
    pub(crate) fn drain(&mut self) -> Vec<(String, Node<'a>)> {
        let keys: Vec<String> = self.rest.keys().cloned().collect();
        keys.into_iter()
            .filter_map(|k| {
                let n = self.take(&k)?;
                Some((k, n))
            })
            .collect()
    }

    pub(crate) fn string(&mut self, w: &mut Walker, key: &str) -> Option<String> {
        let n = self.take(key)?;
        match n.value() {
            Some(Value::String(s)) => Some(s.clone()),
            // An override parsed as a number or a boolean is the text it was (found by a probe: a
            // directory, file or CTF alias named `2024`, `5` or `true` could not be given).
            Some(Value::Number(_) | Value::Bool(_)) if override_text(&n.path).is_some() => override_text(&n.path),
            Some(other) => {
                w.issue(&n.path, &format!("expected a string, found {}", type_name(other)));
                None
            }
            None => None,
        }
    }

    pub(crate) fn path(&mut self, w: &mut Walker, key: &str) -> Option<PathBuf> {
        self.string(w, key).map(|s| w.resolve(&s))
    }

    pub(crate) fn boolean(&mut self, w: &mut Walker, key: &str) -> Option<bool> {
        let n = self.take(key)?;
        match n.value() {
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::String(s)) if s == "true" || s == "false" => Some(s == "true"),
            Some(other) => {
                w.issue(&n.path, &format!("expected true or false, found {}", type_name(other)));
                None
            }
            None => None,
        }
    }

    /// An unsigned integer in `min..=max`.
    pub(crate) fn uint(&mut self, w: &mut Walker, key: &str, min: u64, max: u64) -> Option<u64> {
        // TOML's integers (and the overrides', parsed as TOML's) end at 2^63 − 1: a larger bound
        // is never reachable, and said as that (found by a probe: "expected a non-negative integer
        // up to 18446744073709551615, found 18446744073709551615").
        let max = max.min(i64::MAX.unsigned_abs());
        let n = self.take(key)?;
        let v = match n.value() {
            Some(Value::Number(num)) => num.as_u64().or_else(|| {
                // An override past i64 arrives as a float (`try_parsing`): its own text is shown
                // (found by a probe: u64::MAX was told "found 1.8446744073709552e+19").
                let shown = override_of(&n.path)
                    .and_then(|var| Some(format!("{} (from {var})", std::env::var(&var).ok()?.trim())))
                    .unwrap_or_else(|| num.to_string());
                w.issue(&n.path, &format!("expected a non-negative integer up to {max}, found {shown}"));
                None
            })?,
            // Environment overrides arrive parsed (`try_parsing`), so a string here is a quoted
            // value in the file — `dim = "4"` is a mistake worth a word, not a number — or an
            // override that is no number (found by a probe: `..__MAX_ERRORS=abc` was told to
            // write numbers without quotes).
            Some(Value::String(s)) => {
                let why = match override_of(&n.path) {
                    Some(var) => format!("from {var}"),
                    None => "write numbers without quotes".to_owned(),
                };
                w.issue(&n.path, &format!("expected a non-negative integer, found the string '{s}' ({why})"));
                return None;
            }
            Some(other) => {
                w.issue(&n.path, &format!("expected a non-negative integer, found {}", type_name(other)));
                return None;
            }
            None => return None,
        };
        if v < min || v > max {
            w.issue(&n.path, &format!("{v} is out of range: expected {min}..={max}"));
            return None;
        }
        Some(v)
    }

    pub(crate) fn usize(&mut self, w: &mut Walker, key: &str, min: usize, max: usize) -> Option<usize> {
        let v = self.uint(w, key, min as u64, max as u64)?;
        usize::try_from(v).ok()
    }
}

/// The known key nearest to `key` if it is near enough to be a slip (case aside, at most 2
/// edits — insert, delete, replace, or swap two neighbours — and fewer than half its length).
fn closest<'k>(key: &str, known: impl Iterator<Item = &'k String>) -> Option<&'k str> {
    let lower = key.to_lowercase();
    let len = lower.chars().count();
    known
        .map(|k| (edits(&lower, k), k.as_str()))
        .filter(|&(d, _)| d <= 2 && 2 * d < len)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

/// The optimal string alignment distance between `a` and `b`, by characters.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

/// The environment variable that overrides the key at `path` (`MINIBATCHD__SECTION__KEY`), if
/// it is set: a value's error then names it rather than the file.
/// The text of the environment override of `path`, if one is set (as the variable spells it).
fn override_text(path: &str) -> Option<String> {
    std::env::var(override_of(path)?).ok()
}

/// The environment overrides of key `path` and, with `below`, of the keys under it, by name.
fn overrides_under(path: &str, below: bool) -> Vec<String> {
    let mut vars: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            let Some(rest) = name.strip_prefix("MINIBATCHD__") else { return false };
            let key = rest.replace("__", ".").to_lowercase();
            let path = path.to_lowercase();
            key == path || (below && key.strip_prefix(&path).is_some_and(|r| r.starts_with('.')))
        })
        .collect();
    vars.sort();
    vars
}

fn override_of(path: &str) -> Option<String> {
    let var = format!("MINIBATCHD__{}", path.replace('.', "__").to_uppercase());
    std::env::var_os(&var).map(|_| var)
}
