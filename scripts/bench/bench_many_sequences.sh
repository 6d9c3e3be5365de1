#!/usr/bin/env bash
# Many sequences on one node (issue 37, item 4): a generated libsvm file of N short lines
# (`1 1:1`, 6 bytes each), and on it, each on the clock a user sees:
#   * `minibatchd index`: time, peak RSS, the index cache's size on disk; then again, from that
#     cache;
#   * the daemon started on that cache: RSS once the dataset is ready;
#   * one session from the Python client (minibatch 1024, randomized, window of 4 chunks, one
#     sweep): time to its first minibatch from `open`, samples/s over the sweep, the daemon's RSS
#     at the end (its sweep orders included);
#   * with SESSIONS=N, then N sessions open at once, each read for 50 minibatches in turn: the
#     daemon's RSS with them.
#
#     scripts/bench/bench_many_sequences.sh [LINES] [LIMIT_BYTES]    # defaults: 10000000 8589934592
#     MINIBATCHD_BIN=path/to/minibatchd scripts/bench/bench_many_sequences.sh ...
#     MAX_SAMPLES=100000000 ...   # stop the sweep after this many samples (a part of it)
#     SESSIONS=4 ...              # then 4 sessions at once
#     HOST_RESERVE=BYTES ...      # daemon.host_memory_reserve_bytes (default 0: no guard)
set -euo pipefail
cd "$(dirname "$0")/../.."
LINES=${1:-10000000}
LIMIT=${2:-8589934592}
. scripts/lib/daemon.sh
mbd_build
BIN=$MBD_BIN
W=$(mktemp -d)
trap 'mbd_stop; rm -rf "$W"' EXIT
python3 -c "
import sys
line = b'1 1:1\n' * 1000000
n = $LINES
with open('$W/short.txt', 'wb') as f:
    while n > 0:
        k = min(n, 1000000)
        f.write(line[:6 * k])
        n -= k
"
cat > "$W/c.toml" <<TOML
[daemon]
socket = "$W/mbd.sock"
metrics_listen = "127.0.0.1:0"
state_dir = "$W/state"
memory_limit_bytes = $LIMIT
host_memory_reserve_bytes = ${HOST_RESERVE:-0}
[datasets.short]
format = "libsvm"
files = ["$W/short.txt"]
cache_index = true
TOML
/usr/bin/time -f "%e %M" -o "$W/index.time" "$BIN" index --config "$W/c.toml" --dataset short > "$W/index.out"
read -r index_s index_kb < "$W/index.time"
cache_bytes=$(du -sb "$W/state/index" | cut -f1)
echo "$LINES lines ($(du -b "$W/short.txt" | cut -f1) bytes): index ${index_s} s, peak $((index_kb / 1024)) MiB, cache on disk $((cache_bytes / 1048576)) MiB ($(python3 -c "print(f'{$cache_bytes / $LINES:.1f}')") B/seq; $cache_bytes bytes)"
/usr/bin/time -f "%e %M" -o "$W/cached.time" "$BIN" index --config "$W/c.toml" --dataset short > /dev/null
read -r cached_s cached_kb < "$W/cached.time"
echo "index from its cache: ${cached_s} s, peak $((cached_kb / 1024)) MiB"
mbd_start "$W/c.toml" "$W/log"
mbd_wait_log "$W/log" "datasets opened"
ready_kb=$(awk '/VmRSS/ {print $2}' "/proc/$MBD_PID/status")
echo "daemon ready: RSS $((ready_kb / 1024)) MiB"
PYTHONPATH=clients/python .venv/bin/python - "$W/mbd.sock" "${MAX_SAMPLES:-0}" <<'PY'
import sys, time
import minibatchd
client = minibatchd.connect(sys.argv[1])
cap = int(sys.argv[2])
t = time.perf_counter()
s = client.open("short", minibatch_size=1024, max_sweeps=1, randomize=True, window_chunks=4, seed=1)
first, n = None, 0
for mb in s:
    if first is None:
        first = time.perf_counter() - t
    n += mb["__instY"].values.shape[0]
    mb.release()
    if cap and n >= cap:
        break
total = time.perf_counter() - t
what = f"{n} samples (a part of the sweep)" if cap and n >= cap else "sweep"
print(f"session: first minibatch {first:.2f} s after open, {what} {total:.1f} s, {n / total / 1e6:.2f} M samples/s")
PY
echo "daemon after the sweep: RSS $(($(awk '/VmRSS/ {print $2}' "/proc/$MBD_PID/status") / 1024)) MiB, peak $(($(awk '/VmHWM/ {print $2}' "/proc/$MBD_PID/status") / 1024)) MiB"
if [ -n "${SESSIONS:-}" ]; then
  PYTHONPATH=clients/python .venv/bin/python - "$W/mbd.sock" "$SESSIONS" <<'PY'
import sys, time
import minibatchd
client = minibatchd.connect(sys.argv[1])
t = time.perf_counter()
sessions = [iter(client.open("short", minibatch_size=1024, max_sweeps=1, randomize=True, window_chunks=4, seed=s))
            for s in range(int(sys.argv[2]))]
for _ in range(50):
    for s in sessions:
        next(s).release()
print(f"{len(sessions)} sessions open, 50 minibatches each: {time.perf_counter() - t:.1f} s")
PY
  echo "daemon with $SESSIONS sessions: RSS $(($(awk '/VmRSS/ {print $2}' "/proc/$MBD_PID/status") / 1024)) MiB, peak $(($(awk '/VmHWM/ {print $2}' "/proc/$MBD_PID/status") / 1024)) MiB"
fi
