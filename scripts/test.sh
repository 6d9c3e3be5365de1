#!/usr/bin/env bash
# The one command that runs every test: sets up what is missing, then runs the Rust unit,
# integration, conformance and property tests and the Python client tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
if [ -d ../shared/conformance ]; then
  echo "conformance data: ../shared/conformance (CNTK and deepx conformance tests will run)"
else
  echo "conformance data: ../shared/conformance not found — conformance tests will be SKIPPED"
fi
export MINIBATCHD_PYTHON="$PWD/.venv/bin/python"
cargo test --all-targets --locked 2>&1
