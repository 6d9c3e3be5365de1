#!/usr/bin/env bash
# Sets up, builds and runs the main job: the daemon on the bundled example config and data
# (conf/example.toml). A demo trainer (scripts/example_client.py) reads one randomized sweep
# through shared memory and checks it against `minibatchd dump`; the daemon then keeps serving
# in the foreground (its socket: target/example/minibatchd.sock) until Ctrl-C (SIGINT), when it
# writes its checkpoint and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked
mkdir -p target/example
SOCK=target/example/minibatchd.sock
target/release/minibatchd validate --config conf/example.toml
target/release/minibatchd run --config conf/example.toml &
DAEMON=$!
trap 'kill -INT $DAEMON 2>/dev/null; wait $DAEMON' INT TERM
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
PYTHONPATH=clients/python .venv/bin/python scripts/example_client.py "$SOCK"
echo "minibatchd is serving conf/example.toml on $SOCK — Ctrl-C to stop"
wait $DAEMON
