//! Golden fixtures: `tests/fixtures/<case>/` holds the data, a `config.toml`, a `case.toml`
//! (`args` for `minibatchd dump`, the expected `exit` status and `stderr_contains` fragments)
//! and, for successful cases, `expected.jsonl`: the exact dump output (the runner:
//! `support::golden`).
//!
//! The cases cover the edge cases of `reference/cntk-ctf-semantics.md` §6 that need no
//! randomization. Each expected file was produced by the binary and then checked by hand against
//! the reference (regenerate with `MINIBATCHD_BLESS=1 cargo test --test golden`, then review the
//! diff: a changed golden file is a changed behaviour).

mod support;

use support::golden::Suite;

#[test]
fn golden_fixtures() {
    Suite { dir: "tests/fixtures", min_cases: 40, what: "golden fixtures" }.run();
}
