#!/usr/bin/env python3
"""CSV of numbers on the clock a user sees: minibatchd against tf.data's `TextLineDataset` +
batched `decode_csv` (AUTOTUNE) and against `pyarrow.csv.read_csv`, on the same file, in
alternated runs.

    scripts/bench/bench_csv.py [--size-bytes 268435456] [--runs 3] [--minibatch-size 256]
                               [--venv target/tf-venv]

The file (`target/bench-csv/numbers-N.csv`) has a header line and rows of 32 float columns
(four decimals) and an integer label. Every consumer is a Python process started first
(interpreter and imports done, as a trainer that is up), whose clock starts when it is told to
go: tf.data's before it builds `TextLineDataset(file).skip(1).batch(B).map(decode_csv,
AUTOTUNE).prefetch(AUTOTUNE)` and turns every batch into NumPy; pyarrow's before `read_csv`
(all threads) and the conversion of its columns to one NumPy array; minibatchd's from `minibatchd
run` on an empty state directory (index pass included), the consumer connecting as soon as it
listens and reading one pass in file order. TensorFlow and pyarrow are installed into `--venv`
when missing. Prints each run and the medians.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import daemon_kit  # noqa: E402
from daemon_kit import ROOT  # noqa: E402

PY = os.environ.get("PYTHON") or str(ROOT / ".venv" / "bin" / "python")
DAEMON = os.environ.get("BENCH_DAEMON_BIN") or str(daemon_kit.DAEMON)
COLUMNS = 33

GENERATE = r"""
import sys, numpy as np
path, size = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(1)
with open(path, "w") as f:
    f.write(",".join([f"f{i}" for i in range(32)] + ["label"]) + "\n")
    while f.tell() < size:
        x = rng.standard_normal((4096, 32))
        y = rng.integers(0, 10, 4096)
        f.write("".join(",".join(f"{v:.4f}" for v in row) + f",{l}\n" for row, l in zip(x, y)))
"""

TF_CONSUMER = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
path, batch = sys.argv[1], int(sys.argv[2])
defaults = [[0.0]] * 32 + [[0]]
print("ready", flush=True)
sys.stdin.readline()
t0 = time.time()
ds = tf.data.TextLineDataset(path).skip(1).batch(batch).map(lambda l: tf.io.decode_csv(l, defaults),
    num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
n = 0
first = None
for cols in ds:
    x = tf.stack(cols[:32], axis=1).numpy()
    y = cols[32].numpy()
    if first is None:
        first = time.time() - t0
    n += x.shape[0]
print(json.dumps({"secs": time.time() - t0, "first": first, "samples": n, "version": tf.__version__}))
"""

ARROW_CONSUMER = r"""
import json, sys, time
import numpy as np, pyarrow, pyarrow.csv as csv
path = sys.argv[1]
print("ready", flush=True)
sys.stdin.readline()
t0 = time.time()
types = {f"f{i}": pyarrow.float32() for i in range(32)}
table = csv.read_csv(path, convert_options=csv.ConvertOptions(column_types=types))
read = time.time() - t0
x = np.column_stack([table.column(i).to_numpy() for i in range(32)])
y = table.column(32).to_numpy()
print(json.dumps({"secs": time.time() - t0, "read": read, "samples": len(y), "version": pyarrow.__version__}))
"""

MBD_CONSUMER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy, minibatchd
from daemon_kit import wait_for_socket
sock, batch = sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
wait_for_socket(sock, 0.001)
src = minibatchd.connect(sock).open("t", minibatch_size=batch, max_sweeps=1, randomize=False)
n = 0
first = None
for mb in src:
    x = mb["x"].values
    if first is None:
        first = time.time()
    n += x.shape[0]
print(json.dumps({"first": first, "last": time.time(), "samples": n}))
"""


def ensure_venv(venv: Path) -> str:
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for module, package in (("tensorflow", "tensorflow-cpu"), ("pyarrow", "pyarrow")):
        if subprocess.run([str(py), "-c", f"import {module}"], capture_output=True).returncode != 0:
            subprocess.run([str(py), "-m", "pip", "install", "--quiet", package], check=True)
    return str(py)


def run_consumer(py: str, script: str, *args: str) -> dict:
    return daemon_kit.go_when_told([py, "-c", script, *args])


def run_mbd(data: Path, work: Path, batch: int) -> dict:
    shutil.rmtree(work / "state", ignore_errors=True)
    sock = work / "mbd.sock"
    cfg = daemon_kit.write_config(work / "t.toml", {
        "daemon": {"socket": str(sock), "state_dir": str(work / "state"), "metrics_listen": "127.0.0.1:0"},
        "datasets": {"t": {"format": "csv", "files": [str(data)], "columns": COLUMNS, "skip_header_lines": 1,
                           "streams": {"x": {"columns": list(range(32))},
                                       "y": {"columns": [32], "dtype": "int64"}}}},
    })
    r, t0 = daemon_kit.consumer_first(cfg, [PY, "-c", MBD_CONSUMER, str(ROOT / "clients" / "python"), str(sock),
                                            str(batch)], binary=DAEMON)
    return {"secs": r["last"] - t0, "first": r["first"] - t0, "samples": r["samples"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-bytes", type=int, default=256 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--minibatch-size", type=int, default=256)
    ap.add_argument("--venv", default=str(ROOT / "target" / "tf-venv"))
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-csv"))
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    py = ensure_venv(Path(a.venv))
    data = work / f"numbers-{a.size_bytes}.csv"
    if not data.exists():
        subprocess.run([py, "-c", GENERATE, str(data), str(a.size_bytes)], check=True)
    with open(data, "rb") as f:
        while f.read(1 << 24):
            pass
    print(f"file: {data} ({data.stat().st_size / 1e6:.0f} MB, 32 floats + an integer label per line), "
          f"minibatch {a.minibatch_size}, one pass in file order, {os.cpu_count()} cores")
    rows = {"tf.data": [], "pyarrow": [], "minibatchd": []}
    for k in range(a.runs):
        t = run_consumer(py, TF_CONSUMER, str(data), str(a.minibatch_size))
        p = run_consumer(py, ARROW_CONSUMER, str(data))
        m = run_mbd(data, work, a.minibatch_size)
        if not t["samples"] == p["samples"] == m["samples"]:
            sys.exit(f"rows read: tf.data {t['samples']}, pyarrow {p['samples']}, minibatchd {m['samples']}")
        rows["tf.data"].append(t["secs"])
        rows["pyarrow"].append(p["secs"])
        rows["minibatchd"].append(m["secs"])
        rows.setdefault("pyarrow read_csv alone", []).append(p["read"])
        print(f"run {k + 1}: tf.data {t['version']} {t['secs']:.3f} s, pyarrow {p['version']} {p['secs']:.3f} s "
              f"(read_csv alone {p['read']:.3f} s), "
              f"minibatchd {m['secs']:.3f} s (first minibatch {m['first']:.3f} s), {m['samples']} rows: "
              f"{t['secs'] / m['secs']:.2f}x tf.data, {p['secs'] / m['secs']:.2f}x pyarrow", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    vs_tf = [t / m for t, m in zip(rows["tf.data"], rows["minibatchd"])]
    vs_pa = [p / m for p, m in zip(rows["pyarrow"], rows["minibatchd"])]
    vs_read = [r / m for r, m in zip(rows["pyarrow read_csv alone"], rows["minibatchd"])]
    print(f"median: tf.data {med['tf.data']:.3f} s, pyarrow {med['pyarrow']:.3f} s (read_csv alone "
          f"{med['pyarrow read_csv alone']:.3f} s: {statistics.median(vs_read):.2f}x), minibatchd {med['minibatchd']:.3f} s; "
          f"{statistics.median(vs_tf):.2f}x tf.data ({min(vs_tf):.2f}-{max(vs_tf):.2f}), "
          f"{statistics.median(vs_pa):.2f}x pyarrow ({min(vs_pa):.2f}-{max(vs_pa):.2f})")


if __name__ == "__main__":
    main()
