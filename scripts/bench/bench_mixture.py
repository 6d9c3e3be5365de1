#!/usr/bin/env python3
"""A mixture of two datasets against one dataset, through the daemon and the Python client.

    scripts/bench/bench_mixture.py [--size-bytes 134217728] [--minibatch-size 256] [--runs 3] [--workdir DIR]

Generates two dense CTF files of `--size-bytes` each with `minibatchd-gen ctf-dense` (128 floats
and a one-hot label per line; the second a line longer, so that the files differ), builds the
release binaries, and for each run, alternating: starts `minibatchd run` on a cold state
directory and reads, in a separate Python process with the plain client, (1) one sweep of the
first dataset alone (`full_sweep`), or (2) one epoch of the mixture of both, weights 1 : 1,
`epoch = "first_sweep_end"` (about one sweep of each). Every dataset randomized with CNTK's
default window (the whole file). Both clocks are the user's: from `minibatchd run` to the last
minibatch the consumer receives (index pass, parse and delivery included); then a second pass in
the same daemon, warm (parsed chunks in memory). Prints samples/s of each, and the mixture's over
the single dataset's, per run and the medians.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import daemon_kit  # noqa: E402
from daemon_kit import ROOT  # noqa: E402

# The daemon binary; BENCH_DAEMON_BIN points at another build for A/B runs.
DAEMON = os.environ.get("BENCH_DAEMON_BIN") or str(daemon_kit.DAEMON)

CONSUMER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import minibatchd
sock, name, size = sys.argv[2], sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
out = []
for attempt in range(2):
    while True:
        try:
            client = minibatchd.Client(sock)
            break
        except OSError:
            time.sleep(0.005)
    options = {"minibatch_size": size}
    if name != "blend":
        options["full_sweep"] = True
    start, samples = time.time(), 0
    src = client.open(name, **options)
    for mb in src:
        samples += len(mb["features"].values)
    out.append({"samples": samples, "start": start, "end": time.time()})
    src.close()
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-bytes", type=int, default=128 << 20)
    ap.add_argument("--minibatch-size", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-mixture"))
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "-q", "--bin", "minibatchd", "-p", "minibatchd", "-p",
                    "minibatchd-bench-tools"], cwd=ROOT, check=True)
    gen = ROOT / "target" / "release" / "minibatchd-gen"
    files = []
    for i, size in enumerate([args.size_bytes, args.size_bytes + 700]):
        f = work / f"part{i}.ctf"
        if not f.exists() or f.stat().st_size < size:
            subprocess.run([str(gen), "ctf-dense", str(f), str(size)], check=True)
        files.append(f)
    python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
    streams = {"features": {"dim": 128, "format": "dense"}, "labels": {"dim": 10, "format": "sparse"}}
    results = {"single": [], "mixture": []}
    for run in range(args.runs):
        for what in (["single", "mixture"] if run % 2 == 0 else ["mixture", "single"]):
            with tempfile.TemporaryDirectory(dir=work) as d:
                state = Path(d)
                cfg = daemon_kit.write_config(state / "m.toml", {
                    "daemon": {"socket": str(state / "mbd.sock"), "state_dir": str(state / "state"),
                               "metrics_listen": "127.0.0.1:0"},
                    "datasets": {f"d{i}": {"format": "ctf", "files": [str(f)], "streams": streams}
                                 for i, f in enumerate(files)},
                    "mixtures": {"blend": {"datasets": ["d0", "d1"], "weights": [1, 1], "epoch": "first_sweep_end"}},
                })
                name = "blend" if what == "mixture" else "d0"
                consumer = [python, "-c", CONSUMER, str(ROOT / "clients" / "python"), str(state / "mbd.sock"), name,
                            str(args.minibatch_size)]
                (cold, warm), t0 = daemon_kit.consumer_first(cfg, consumer, binary=DAEMON)
                rec = {"cold": cold["samples"] / (cold["end"] - t0),
                       "warm": warm["samples"] / (warm["end"] - warm["start"]), "samples": cold["samples"]}
                results[what].append(rec)
                print(json.dumps({"run": run, "what": what, **{k: round(v) for k, v in rec.items()}}), flush=True)
    for clock in ("cold", "warm"):
        single = statistics.median(r[clock] for r in results["single"])
        mixture = statistics.median(r[clock] for r in results["mixture"])
        ratios = [m[clock] / s[clock] for m, s in zip(results["mixture"], results["single"])]
        print(f"{clock}: single {single:,.0f} samples/s, mixture {mixture:,.0f} samples/s, mixture / single "
              f"{mixture / single:.2f} (per run {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
