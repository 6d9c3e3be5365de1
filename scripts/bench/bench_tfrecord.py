#!/usr/bin/env python3
"""TFRecord + tf.train.Example on the clock a user sees: minibatchd against tf.data's
`TFRecordDataset` + batched `parse_example` (AUTOTUNE), on the same file, in alternated runs.

    scripts/bench/bench_tfrecord.py [--size-bytes 268435456] [--runs 3] [--minibatch-size 256]
                                    [--venv target/tf-venv]

The file (`target/bench-tfrecord/examples-N.tfrecord`) holds records of 64 float32 values
(`x`) and an int64 label (`y`), written by TensorFlow's own writer. Both consumers are Python
processes started first (interpreter and imports done, as a trainer that is up), whose clocks
start when they are told to go: tf.data's from before it builds its pipeline
(`TFRecordDataset(file).batch(B).map(parse_example, AUTOTUNE).prefetch(AUTOTUNE)`, every batch
turned into NumPy arrays), minibatchd's from `minibatchd run` on an empty state directory (index
pass included) with the consumer connecting as soon as it listens; both read one pass in file
order. TensorFlow is installed into `--venv` when missing. Prints each run and the medians.
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

GENERATE = r"""
import sys, numpy as np, tensorflow as tf
path, size = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(1)
written = 0
with tf.io.TFRecordWriter(path) as w:
    while written < size:
        x = rng.standard_normal((1024, 64)).astype(np.float32)
        y = rng.integers(0, 10, 1024)
        for i in range(1024):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])),
            }))
            s = ex.SerializeToString()
            w.write(s)
            written += len(s) + 16
"""

TF_CONSUMER = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
path, batch = sys.argv[1], int(sys.argv[2])
spec = {"x": tf.io.FixedLenFeature([64], tf.float32), "y": tf.io.FixedLenFeature([1], tf.int64)}
print("ready", flush=True)
sys.stdin.readline()
t0 = time.time()
ds = tf.data.TFRecordDataset(path).batch(batch).map(lambda s: tf.io.parse_example(s, spec),
    num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
n = 0
first = None
for b in ds:
    x, y = b["x"].numpy(), b["y"].numpy()
    if first is None:
        first = time.time() - t0
    n += x.shape[0]
print(json.dumps({"secs": time.time() - t0, "first": first, "samples": n, "version": tf.__version__}))
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


def ensure_tf(venv: Path) -> str:
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if subprocess.run([str(py), "-c", "import tensorflow"], capture_output=True).returncode != 0:
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "tensorflow-cpu"], check=True)
    return str(py)


def run_tf(tf_py: str, data: Path, batch: int) -> dict:
    return daemon_kit.go_when_told([tf_py, "-c", TF_CONSUMER, str(data), str(batch)])


def run_mbd(data: Path, work: Path, batch: int) -> dict:
    shutil.rmtree(work / "state", ignore_errors=True)
    sock = work / "mbd.sock"
    cfg = daemon_kit.write_config(work / "t.toml", {
        "daemon": {"socket": str(sock), "state_dir": str(work / "state"), "metrics_listen": "127.0.0.1:0"},
        "datasets": {"t": {"format": "tfrecord", "files": [str(data)], "streams": {
            "x": {"format": "dense", "dim": 64},
            "y": {"format": "dense", "dim": 1, "dtype": "int64"},
        }}},
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
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-tfrecord"))
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    tf_py = ensure_tf(Path(a.venv))
    data = work / f"examples-{a.size_bytes}.tfrecord"
    if not data.exists():
        subprocess.run([tf_py, "-c", GENERATE, str(data), str(a.size_bytes)], check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    with open(data, "rb") as f:
        while f.read(1 << 24):
            pass
    print(f"file: {data} ({data.stat().st_size / 1e6:.0f} MB, 64 float32 + an int64 label per record), "
          f"minibatch {a.minibatch_size}, one pass in file order, {os.cpu_count()} cores")
    ratios, tfs, mbds = [], [], []
    for k in range(a.runs):
        t = run_tf(tf_py, data, a.minibatch_size)
        m = run_mbd(data, work, a.minibatch_size)
        if t["samples"] != m["samples"]:
            sys.exit(f"tf.data read {t['samples']} records, minibatchd {m['samples']}")
        tfs.append(t["secs"])
        mbds.append(m["secs"])
        ratios.append(t["secs"] / m["secs"])
        print(f"run {k + 1}: tf.data {t['version']} {t['secs']:.3f} s (first batch {t['first']:.3f} s), "
              f"minibatchd {m['secs']:.3f} s (first {m['first']:.3f} s), {m['samples']} records: {ratios[-1]:.2f}x", flush=True)
    print(f"median: tf.data {statistics.median(tfs):.3f} s, minibatchd {statistics.median(mbds):.3f} s; "
          f"ratio {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
