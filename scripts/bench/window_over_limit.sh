#!/usr/bin/env bash
# A randomization window larger than memory_limit_bytes: starts the release daemon on FILE (the
# dense CTF of scripts/bench/bench_daemon.py: 128 floats + a 10-class sparse label per line) with only
# that limit, opens one session with the default window (minibatch 256, one sweep) from the
# Python client, and prints how it ended (refused at open, or failed or served while reading)
# and the daemon's peak RSS (VmHWM).
#
#     scripts/bench/window_over_limit.sh [FILE] [LIMIT_BYTES]      # defaults: /work/bd/bench.ctf 402653184
#     WINDOW_SAMPLES=N scripts/bench/window_over_limit.sh ...      # a sample window instead (estimated at open
#                                                            # only when it is more than twice the file's samples)
#     WINDOW_CHUNKS=N MAX_SWEEPS=K scripts/bench/window_over_limit.sh ...   # a window in chunks; K sweeps (default 1)
#     MINIBATCHD_BIN=path/to/minibatchd scripts/bench/window_over_limit.sh ...  # another build (A/B)
set -euo pipefail
cd "$(dirname "$0")/../.."
FILE=${1:-/work/bd/bench.ctf}
LIMIT=${2:-402653184}
. scripts/lib/daemon.sh
W=$(mktemp -d)
trap 'mbd_stop; rm -rf "$W"' EXIT
cat > "$W/m.toml" <<T
[daemon]
socket = "$W/mbd.sock"
state_dir = "$W/state"
memory_limit_bytes = $LIMIT
[datasets.bench]
format = "ctf"
files = ["$FILE"]
[datasets.bench.streams.features]
dim = 128
format = "dense"
[datasets.bench.streams.labels]
dim = 10
format = "sparse"
T
mbd_start "$W/m.toml" "$W/log"
PYTHONPATH=clients/python .venv/bin/python - "$W/mbd.sock" <<'PY'
import os, sys, time
import minibatchd
for _ in range(100):
    try:
        client = minibatchd.connect(sys.argv[1])
        break
    except minibatchd.MinibatchdError:
        time.sleep(0.1)
window = {"window_samples": int(os.environ["WINDOW_SAMPLES"])} if os.environ.get("WINDOW_SAMPLES") else {}
if os.environ.get("WINDOW_CHUNKS"):
    window = {"window_chunks": int(os.environ["WINDOW_CHUNKS"])}
sweeps = int(os.environ.get("MAX_SWEEPS", "1"))
t, n = time.perf_counter(), 0
try:
    while True:
        try:
            s = client.open("bench", minibatch_size=256, max_sweeps=sweeps, **window)
            break
        except minibatchd.MinibatchdError as e:
            if e.code != "dataset_indexing":
                raise
            time.sleep(0.05)
    print(f"opened after {time.perf_counter() - t:.2f} s")
    for mb in s:
        n += 1
    print(f"served all {sweeps} sweep(s): {n} minibatches in {time.perf_counter() - t:.2f} s")
except minibatchd.MinibatchdError as e:
    print(f"failed after {time.perf_counter() - t:.2f} s and {n} minibatches: {e}")
PY
grep VmHWM "/proc/$MBD_PID/status"
curl -s "http://$(cat "$W/state/metrics.addr")/metrics" |
    grep -E '^minibatchd_(session_minibatches_in_parts_total|cache_refused_loads_total|session_memory_wait_seconds_total)' || true
