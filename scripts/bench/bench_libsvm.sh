#!/usr/bin/env bash
# libsvm parse rate: minibatchd versus xgboost's libsvm parser (dmlc-core), at equal threads, on a
# generated Criteo-like file (a label and 39 features per line; benches/support/criteo_gen.rs).
# A narrower clock than a user's (the parse alone, the daemon and its delivery left out): for
# the user's clock — `minibatchd run` to a Python consumer's last minibatch, index pass included
# — run scripts/bench/bench_libsvm_user.py, which compares that with xgboost's DMatrix.
#
#   scripts/bench/bench_libsvm.sh                 # 1 GiB, 2 threads
#   SIZE=268435456 THREADS=1 scripts/bench/bench_libsvm.sh
#
# minibatchd: `Dataset::open` (the line index pass, cached in a state directory) and then every
# 32 MiB chunk read and decoded into columnar buffers by THREADS threads (src/bin/
# parse_rate.rs); the "parse" figure is that second phase, with the index cached from the
# first run. xgboost: `DMatrix("FILE?format=libsvm", nthread=THREADS)` from .venv (installed with
# `python -m pip install xgboost` when missing; if that fails the comparison is skipped and said
# so). The file is read once beforehand so both read from the page cache. Timings vary with the
# load of the machine: run it on an idle one and compare figures from the same run only.
set -euo pipefail
cd "$(dirname "$0")/../.."

SIZE=${SIZE:-1073741824}
THREADS=${THREADS:-2}
DIR=${BENCH_DIR:-target/bench-libsvm}
FILE="$DIR/criteo-$SIZE.svm"
STATE="$DIR/state"
PY=${PYTHON:-.venv/bin/python}

cargo build --release -p minibatchd-bench-tools --bin minibatchd-parse-rate
BIN=target/release/minibatchd-parse-rate
mkdir -p "$DIR"
if [ ! -f "$FILE" ]; then
  echo "generating $FILE ($SIZE bytes)"
  "$BIN" generate "$FILE" "$SIZE"
fi
cat "$FILE" > /dev/null

echo "== minibatchd (first run: index pass + parse)"
rm -rf "$STATE"
"$BIN" parse "$FILE" "$THREADS" 33554432 "$STATE"
echo "== minibatchd (index cached)"
MBD=$("$BIN" parse "$FILE" "$THREADS" 33554432 "$STATE")
echo "$MBD"

if ! "$PY" -c 'import xgboost' 2>/dev/null; then
  "$PY" -m pip install --quiet xgboost >/dev/null 2>&1 || true
fi
if "$PY" -c 'import xgboost' 2>/dev/null; then
  echo "== xgboost"
  XGB=$("$PY" - "$FILE" "$THREADS" <<'PYEOF'
import os, sys, time, warnings
warnings.filterwarnings("ignore")
import xgboost as xgb
path, threads = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
d = xgb.DMatrix(f"{path}?format=libsvm", nthread=threads)
s = time.perf_counter() - t
mb = os.path.getsize(path) / 1e6
print(f"xgboost {xgb.__version__} libsvm: {mb:.0f} MB, {d.num_row()} rows, {threads} thread(s): {s:.2f} s ({mb / s:.0f} MB/s)")
PYEOF
)
  echo "$XGB"
  m=$(echo "$MBD" | sed -n 's/.*parse [0-9.]* s (\([0-9]*\) MB\/s).*/\1/p')
  x=$(echo "$XGB" | sed -n 's/.*(\([0-9]*\) MB\/s).*/\1/p')
  if [ -n "$m" ] && [ -n "$x" ] && [ "$x" -gt 0 ]; then
    echo "ratio minibatchd/xgboost at $THREADS thread(s): $(awk -v m="$m" -v x="$x" 'BEGIN { printf "%.2f", m / x }')x"
  fi
else
  echo "xgboost is not installable into $PY (pip install failed): no comparison"
fi
