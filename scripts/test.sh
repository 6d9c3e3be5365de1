#!/usr/bin/env bash
# The one command that runs every test: sets up what is missing, then runs the Rust unit tests of
# every crate of the workspace, the integration, conformance and property tests, the daemon tests
# with the real binary and the Python client (driven from tests/daemon.rs); checks that the
# benchmarks compile, that the tree is formatted (cargo fmt) and lint-free (cargo clippy with the
# workspace's pedantic lints, warnings denied) and that its documentation has no broken links.
# Its last line totals every test run, each failed check counted as one failure:
# "summary: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
if [ -d ../shared/conformance ]; then
  echo "conformance data: ../shared/conformance (CNTK and deepx conformance tests will run)"
else
  echo "conformance data: ../shared/conformance not found — conformance tests will be SKIPPED"
fi
export MINIBATCHD_PYTHON="$PWD/.venv/bin/python"
# A run from a clean clone gains nothing from incremental caches, which would take another
# gigabyte of disk. --no-fail-fast: every test binary runs even after one fails, so the summary
# counts every failure (cargo stops at the first failing binary otherwise).
export CARGO_INCREMENTAL=0
log=$(mktemp)
# Tests that pass without checking (this machine lacks their data or a kernel feature) add a line
# here (tests/support/mod.rs, skipped()); the summary lists them.
export MINIBATCHD_SKIPPED=$(mktemp)
trap 'rm -f "$log" "$MINIBATCHD_SKIPPED"' EXIT
cargo test --locked --no-fail-fast --workspace --lib --bins --tests 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "== checking that the benchmarks build"
cargo bench --locked --no-run -q 2>&1 | tail -5
bench_status=${PIPESTATUS[0]}
passed=$(awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i + 1) ~ /^passed/) n += $i } END { print n + 0 }' "$log")
failed=$(awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i + 1) ~ /^failed/) n += $i } END { print n + 0 }' "$log")
[ "$bench_status" -eq 0 ] || { echo "benchmarks do not build"; failed=$((failed + 1)); status=1; }
echo "== cargo fmt --check"
if ! cargo fmt --all --check >/dev/null 2>&1; then
  cargo fmt --all --check 2>&1 | head -40
  echo "the tree is not formatted: run cargo fmt --all"
  failed=$((failed + 1)); status=1
fi
echo "== cargo clippy (pedantic, warnings denied)"
if ! cargo clippy --locked --workspace --all-targets -q -- -D warnings 2>&1 | tail -40; then
  echo "clippy found warnings"
  failed=$((failed + 1)); status=1
fi
echo "== cargo doc (private items, warnings denied)"
# The code's own documentation: a link to an item renamed or moved is a warning, denied here.
# Links to private items are fine in documentation that includes them.
if ! RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" \
    cargo doc --locked --workspace --no-deps --document-private-items -q 2>&1 | tail -40; then
  echo "cargo doc found warnings"
  failed=$((failed + 1)); status=1
fi
if [ -s "$MINIBATCHD_SKIPPED" ]; then
  echo "== skipped: $(wc -l < "$MINIBATCHD_SKIPPED") test(s) passed without checking (counted as passed below):"
  sort "$MINIBATCHD_SKIPPED" | head -40
fi
echo "summary: ${passed:-0} passed, ${failed:-0} failed"
exit "$status"
