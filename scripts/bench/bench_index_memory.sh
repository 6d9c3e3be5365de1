#!/usr/bin/env bash
# Index memory per sequence (#15 item 3): the peak RSS of `minibatchd index` and of the daemon
# on a libsvm file of short lines, against the number of sequences: `index` builds and writes
# the index cache, the daemon then loads it. Prints one line per run.
#
#   scripts/bench/bench_index_memory.sh [MB]      (default 200 MB; needs the release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
MB=${1:-200}
BIN=${MINIBATCHD_BIN:-target/release/minibatchd}
[ -x "$BIN" ] || cargo build --release
DIR=$(mktemp -d)
trap 'kill $(cat "$DIR/pid" 2>/dev/null) 2>/dev/null && sleep 0.5; rm -rf "$DIR"' EXIT
LINES=$((MB * 1000 * 1000 / 6))
python3 -c "import sys; sys.stdout.write('1 1:1\n' * $LINES)" > "$DIR/short.txt"
cat > "$DIR/c.toml" <<TOML
[daemon]
socket = "$DIR/mbd.sock"
metrics_listen = "127.0.0.1:0"
state_dir = "$DIR/state"
memory_limit_bytes = 17179869184
host_memory_reserve_bytes = 0
[datasets.short]
format = "libsvm"
files = ["$DIR/short.txt"]
cache_index = true
TOML
peak_kb() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1; }
idle_kb=$(peak_kb "$BIN" validate --config "$DIR/c.toml")
index_kb=$(peak_kb "$BIN" index --config "$DIR/c.toml" --dataset short)
"$BIN" run --config "$DIR/c.toml" 2> "$DIR/log" & echo $! > "$DIR/pid"
until grep -q "datasets opened" "$DIR/log"; do sleep 0.2; done
daemon_kb=$(awk '/VmHWM/ {print $2}' /proc/$(cat "$DIR/pid")/status)
index_bytes=$(grep -o 'index_bytes=[0-9]*' "$DIR/log" | cut -d= -f2)
elapsed_ms=$(grep -o 'dataset ready.*elapsed_ms=[0-9]*' "$DIR/log" | grep -o 'elapsed_ms=[0-9]*' | cut -d= -f2)
awk -v n="$LINES" -v mb="$MB" -v i="$index_kb" -v d="$daemon_kb" -v v="$idle_kb" -v b="$index_bytes" -v t="$elapsed_ms" 'BEGIN {
  printf "%d MB, %d sequences: index command peak %.0f MB (%.1f B/seq over validate %.0f MB); daemon peak %.0f MB (%.1f B/seq), index_bytes %.1f B/seq, indexed in %.1f s\n",
    mb, n, i/1024, (i-v)*1024/n, v/1024, d/1024, (d-v)*1024/n, b/n, t/1000 }'
