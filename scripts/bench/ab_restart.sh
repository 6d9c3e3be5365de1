#!/bin/bash
# A/B of the restart case of scripts/bench/bench_beyond_limit.py: one daemon binary ($1) on the
# state directory a run of that script left (target/bench-beyond-limit: the parsed cache filled
# under a 256 MiB limit), a Python consumer reading SWEEPS (default 8) randomized sweeps of one
# session (minibatch 256, window 4 chunks); prints the seconds of each sweep. Alternate two
# builds' binaries, copied out of target/release, to compare them:
#     scripts/bench/ab_restart.sh /tmp/mbd-before; scripts/bench/ab_restart.sh /tmp/mbd-after; ...
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$1"
SWEEPS="${2:-8}"
WORK="$ROOT/target/bench-beyond-limit"
SOCK="$WORK/mbd.sock"
test -f "$WORK/bench.toml" || { echo "run scripts/bench/bench_beyond_limit.py first" >&2; exit 2; }
rm -f "$SOCK"
PYTHONPATH="$ROOT/clients/python" "$ROOT/.venv/bin/python" - "$SOCK" "$SWEEPS" <<'PY' &
import sys, time
import minibatchd
sock, sweeps = sys.argv[1], int(sys.argv[2])
for _ in range(500):
    try:
        client = minibatchd.connect(sock)
        break
    except Exception:
        time.sleep(0.01)
source = client.open("bench", minibatch_size=256, max_sweeps=sweeps, randomize=True, window_chunks=4)
t, ends = time.perf_counter(), []
for mb in source:
    if mb.end_of_sweep:
        ends.append(time.perf_counter() - t)
print(" ".join(f"{b - a:.3f}" for a, b in zip([0.0] + ends, ends)))
PY
CONSUMER=$!
"$BIN" run --config "$WORK/bench.toml" > "$WORK/ab_restart.log" 2>&1 &
DAEMON=$!
wait "$CONSUMER"
kill -TERM "$DAEMON"
wait "$DAEMON" || true
