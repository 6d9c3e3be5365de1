#!/usr/bin/env bash
# Sets up, builds and runs the main job on the bundled example config and data: one full sweep of
# randomized minibatches of 8 samples, printed as JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked
exec target/release/minibatchd dump --config conf/example.toml --dataset train --minibatch-size 8 --full-sweep "$@"
