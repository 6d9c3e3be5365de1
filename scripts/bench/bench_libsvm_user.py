#!/usr/bin/env python3
"""libsvm on the clock a user sees: from `minibatchd run` on a cold state directory (index pass
included) to the last minibatch a separate Python consumer receives, against xgboost's
`DMatrix("FILE?format=libsvm")` of the same file at the same threads, in alternated runs.

    scripts/bench/bench_libsvm_user.py [--file F | --size-bytes N] [--threads 2] [--runs 3]
                                       [--minibatch-size 1024] [--randomize]

The file is `target/bench-libsvm/criteo-N.svm` (made by `minibatchd-parse-rate generate`: a label
and 39 sparse features per line, Criteo-like) unless `--file` names one; it is read once first,
so both read from the page cache. Both clocks leave out the interpreter's start and imports: the
consumer is started first (Python, NumPy and the client imported), prints `ready`, and connects
as soon as the daemon listens; xgboost's clock starts after `import xgboost`. minibatchd reads
one sweep in file order (`--randomize`: CNTK's default randomization) with the daemon's
`parser_threads` = `--threads`. xgboost is installed into .venv when missing (the comparison is
skipped, and said so, when it cannot be). Prints each run and the medians.
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

CONSUMER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy, minibatchd
from daemon_kit import wait_for_socket
sock, mb_size, randomize = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
print("ready", flush=True)
wait_for_socket(sock, 0.001)
src = minibatchd.connect(sock).open("svm", minibatch_size=mb_size, max_sweeps=1, randomize=randomize)
first = None
samples = 0
for mb in src:
    if first is None:
        first = time.time()
    samples += mb["__instY"].num_samples
print(json.dumps({"first": first, "last": time.time(), "samples": samples}))
"""

XGB = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import xgboost as xgb
t = time.perf_counter()
d = xgb.DMatrix(f"{sys.argv[1]}?format=libsvm", nthread=int(sys.argv[2]))
print(json.dumps({"secs": time.perf_counter() - t, "rows": d.num_row(), "version": xgb.__version__}))
"""


def run_minibatchd(a, data: Path, work: Path) -> dict:
    """One cold run: empty state directory, consumer first, daemon started; seconds from the
    daemon's start to the consumer's first and last minibatch."""
    shutil.rmtree(work / "state", ignore_errors=True)
    sock = work / "mbd.sock"
    cfg = daemon_kit.write_config(work / "svm.toml", {
        "daemon": {"socket": str(sock), "state_dir": str(work / "state"), "metrics_listen": "127.0.0.1:0",
                   "parser_threads": a.threads},
        # The dataset's default order is the sessions' (a cold start parses in its index pass
        # only where that order needs every chunk before the first minibatch: docs/daemon.md).
        "datasets": {"svm": {"format": "libsvm", "files": [str(data)], "sampling": {"randomize": a.randomize}}},
    })
    r, t0 = daemon_kit.consumer_first(cfg, [PY, "-c", CONSUMER, str(ROOT / "clients" / "python"), str(sock),
                                            str(a.minibatch_size), "1" if a.randomize else "0"], binary=DAEMON)
    return {"first": r["first"] - t0, "last": r["last"] - t0, "samples": r["samples"]}


def run_xgboost(a, data: Path) -> dict:
    out = subprocess.run([PY, "-c", XGB, str(data), str(a.threads)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", help="a libsvm file (default: a generated Criteo-like one of --size-bytes)")
    ap.add_argument("--size-bytes", type=int, default=1 << 29)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--minibatch-size", type=int, default=1024)
    ap.add_argument("--randomize", action="store_true")
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-libsvm"))
    a = ap.parse_args()
    # Absolute, as every path the daemon's configuration names: it resolves a relative one against
    # its own directory (a relative --workdir once left the consumer waiting for a socket that was
    # made elsewhere).
    work = Path(a.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = (Path(a.file) if a.file else work / f"criteo-{a.size_bytes}.svm").resolve()
    if not data.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "minibatchd-bench-tools", "--bin", "minibatchd-parse-rate"], check=True, cwd=ROOT)
        subprocess.run([str(ROOT / "target" / "release" / "minibatchd-parse-rate"), "generate", str(data), str(a.size_bytes)], check=True)
    with open(data, "rb") as f:
        while f.read(1 << 24):
            pass
    have_xgb = subprocess.run([PY, "-c", "import xgboost"], capture_output=True).returncode == 0
    if not have_xgb:
        subprocess.run([PY, "-m", "pip", "install", "--quiet", "xgboost"], capture_output=True)
        have_xgb = subprocess.run([PY, "-c", "import xgboost"], capture_output=True).returncode == 0
    size_mb = data.stat().st_size / 1e6
    order = "randomized" if a.randomize else "in file order"
    print(f"file: {data} ({size_mb:.0f} MB), {a.threads} thread(s), minibatch {a.minibatch_size}, one sweep {order}, {os.cpu_count()} cores")
    mbd, xgb = [], []
    for k in range(a.runs):
        m = run_minibatchd(a, data, work)
        mbd.append(m)
        line = f"run {k + 1}: minibatchd first minibatch {m['first']:.3f} s, last {m['last']:.3f} s ({m['samples']} samples)"
        if have_xgb:
            x = run_xgboost(a, data)
            xgb.append(x)
            line += f"; xgboost {x['version']} DMatrix {x['secs']:.3f} s ({x['rows']} rows): {x['secs'] / m['last']:.2f}x"
        print(line, flush=True)
    last = statistics.median(m["last"] for m in mbd)
    print(f"median: minibatchd (user clock, from `minibatchd run` to the last minibatch) {last:.3f} s, "
          f"first minibatch {statistics.median(m['first'] for m in mbd):.3f} s")
    if have_xgb:
        ratios = sorted(x["secs"] / m["last"] for m, x in zip(mbd, xgb))
        print(f"median: xgboost DMatrix {statistics.median(x['secs'] for x in xgb):.3f} s; "
              f"ratio xgboost / minibatchd {statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})")
    else:
        print("xgboost is not installable into the environment: no comparison")


if __name__ == "__main__":
    main()
