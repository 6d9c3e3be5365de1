#!/bin/bash
# Peak RSS of a cold pass over chunks small enough that their parsed columns come from the
# allocator's heaps (2 MiB of text, under glibc's 4 MiB mapping threshold the daemon sets), under
# a memory limit smaller than the parsed data: 150 MB of dense CTF (64 values a line, 1.1 M lines,
# ~290 MB parsed), memory_limit_bytes 100 MiB, a cold state directory (the parsed cache filling
# as the pass goes), one session of two randomized sweeps (window 20 chunks, minibatch 2048, 1 MiB slots)
# read by a Python consumer. Prints the daemon's VmHWM and the session's seconds. PARSED_CACHE=0
# runs it with the parsed cache off. Alternate two builds' binaries to compare them:
#     scripts/bench/rss_small_chunks.sh /tmp/mbd-before; scripts/bench/rss_small_chunks.sh /tmp/mbd-after
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$1"
WORK="$ROOT/target/bench-rss-small"
SOCK="$WORK/mbd.sock"
mkdir -p "$WORK"
if [ ! -f "$WORK/data.ctf" ]; then
    "$ROOT/.venv/bin/python" - "$WORK/data.ctf" <<'PY'
import sys
import numpy as np
lines, dim = 1_100_000, 64
with open(sys.argv[1], "wb") as out:
    for start in range(0, lines, 100_000):
        ids = np.arange(start, min(lines, start + 100_000))
        digits = ((ids[:, None] + np.arange(dim)[None, :]) % 10 + 48).astype(np.uint8)
        body = np.full((len(ids), 2 * dim), 32, dtype=np.uint8)
        body[:, 0::2] = digits
        body[:, -1] = 10
        out.write(b"".join(b"|F " + row.tobytes() for row in body))
PY
fi
cat > "$WORK/bench.toml" <<TOML
[daemon]
socket = "$SOCK"
metrics_listen = "127.0.0.1:0"
state_dir = "$WORK/state"
memory_limit_bytes = 104857600
parser_threads = 2
parsed_cache_bytes = ${PARSED_CACHE:-1073741824}

[datasets.big]
format = "ctf"
files = ["$WORK/data.ctf"]
chunk_size_bytes = 2097152
cache_index = false

[datasets.big.streams.features]
alias = "F"
dim = 64
format = "dense"
TOML
rm -rf "$WORK/state" "$SOCK"
"$BIN" run --config "$WORK/bench.toml" > "$WORK/daemon.log" 2>&1 &
DAEMON=$!
PYTHONPATH="$ROOT/clients/python" "$ROOT/.venv/bin/python" - "$SOCK" <<'PY'
import sys, time
import minibatchd
for _ in range(500):
    try:
        client = minibatchd.connect(sys.argv[1])
        break
    except Exception:
        time.sleep(0.01)
t = time.perf_counter()
for _ in range(100):
    try:
        source = client.open("big", minibatch_size=2048, max_sweeps=2, seed=1, window_chunks=20, prefetch=4,
                             slot_size_bytes=1 << 20)
        break
    except minibatchd.MinibatchdError as e:
        if e.code != "dataset_indexing":
            raise
        time.sleep(0.05)
n = sum(mb["features"].values.shape[0] for mb in source)
print(f"samples {n} seconds {time.perf_counter() - t:.2f}", end=" ")
PY
grep VmHWM "/proc/$DAEMON/status" | tr -s ' \t' ' '
kill -TERM "$DAEMON"
wait "$DAEMON" || true
