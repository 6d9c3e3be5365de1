#!/usr/bin/env python3
"""A dataset twice `memory_limit_bytes`, against CNTK 2.7 on the same file, on the clock a user
sees (issue 37, item 5):

    .venv/bin/python scripts/bench/bench_beyond_limit.py [--size-bytes 536870912] [--runs 3]
                                                   [--window-chunks 4] [--minibatch-size 256]

One dense CTF file (`minibatchd-gen ctf-dense`: 128 floats and a one-hot label of 10 classes per
line), `memory_limit_bytes` half its size. First one cold sweep of `minibatchd` from an empty
state directory under that limit (it parses the text and fills the parsed cache —
under the same limit, as a user's first run would), then, alternated `--runs` times:

* CNTK 2.7 (`scripts/bench/cntk_throughput.py` under the oracle of ../shared/tools/cntk-oracle, its
  setup.sh run first; ORACLE_HOME, default /tmp/cntk-oracle), three sweeps, the same window in
  chunks: its clock starts before its `MinibatchSource` constructor, which indexes the file;
* minibatchd after a restart (`scripts/bench/bench_daemon.py --consumer-first`, state directory kept):
  three sweeps of one session; its clock starts at `minibatchd run` (the index cache, the
  connection and `open` included). The consumer process is started before it, its interpreter,
  NumPy and the client imported — as CNTK's clock starts after `import cntk` — and connects as soon
  as the daemon listens.

Prints, per run and as medians: (a) the first sweep after the restart, samples/s on the user's
clock (process start to the sweep's last minibatch) and the ratio to CNTK's first sweep on its
clock; (b) the third sweep of the session, samples/s of that sweep alone, and the ratio to CNTK's
third sweep. Needs the release binaries (built by bench_daemon.py).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(cmd, env=None) -> str:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def cntk(data: Path, minibatch: int, window: int) -> dict:
    home = Path(os.environ.get("ORACLE_HOME", "/tmp/cntk-oracle"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(home / "mpishim"))
    out = run([str(home / "venv36/bin/python"), str(ROOT / "scripts/bench/cntk_throughput.py"), str(data), "128", "10",
               str(minibatch), "3", str(window)], env)
    r = json.loads(out.strip().splitlines()[-1])
    (s0, n0), _, (s2, n2) = r["per_sweep"]
    return {"first": n0 / (r["build_s"] + s0), "third": n2 / s2}


def mbd(work: Path, size: int, minibatch: int, window: int, limit: int, sweeps: int, keep: bool) -> dict:
    env = dict(os.environ, BENCH_NO_PROBE="1")
    if keep:
        env["BENCH_STATE_KEEP"] = "1"
    else:
        env.pop("BENCH_STATE_KEEP", None)
    out = run([sys.executable, str(ROOT / "scripts/bench/bench_daemon.py"), "--workdir", str(work), "--size-bytes", str(size),
               "--minibatch-size", str(minibatch), "--window-chunks", str(window), "--memory-limit", str(limit),
               "--sweeps", str(sweeps), "--consumer-first"], env)
    samples = int(re.search(r"minibatches: \d+, samples: (\d+)", out).group(1)) // sweeps
    ends = [float(x) for x in re.findall(r"^user clock: sweep \d+ ended ([\d.]+) s", out, re.M)]
    rates = [float(m.replace(",", "")) for m in re.findall(r"^sweep \d+ \([^)]*\): ([\d,]+) samples/s", out, re.M)]
    peak = re.search(r"\(peak (\d+) MiB\)", out)
    first_mb = re.search(r"^user clock: first minibatch ([\d.]+) s", out, re.M)
    return {"first": samples / ends[0], "third": rates[2] if len(rates) > 2 else None, "out": out,
            "peak_mib": int(peak.group(1)) if peak else None,
            # Where a slow run's time went: before its first minibatch, or in the sweeps.
            "first_minibatch_s": float(first_mb.group(1)) if first_mb else None, "ends_s": ends}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-bytes", type=int, default=512 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window-chunks", type=int, default=4)
    ap.add_argument("--minibatch-size", type=int, default=256)
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-beyond-limit"))
    a = ap.parse_args()
    work = Path(a.workdir)
    limit = a.size_bytes // 2
    shutil.rmtree(work / "state", ignore_errors=True)
    cold = mbd(work, a.size_bytes, a.minibatch_size, a.window_chunks, limit, 1, keep=False)
    entries = sum(p.stat().st_size for p in (work / "state" / "parsed").glob("*.mbp"))
    print(f"file {a.size_bytes >> 20} MiB, memory_limit_bytes {limit >> 20} MiB, window {a.window_chunks} chunks, "
          f"minibatch {a.minibatch_size}; the cold sweep left {entries / 1e6:.0f} MB of persisted entries "
          f"(cold sweep {cold['first']:,.0f} samples/s on the user's clock)")
    rows = []
    for k in range(a.runs):
        c = cntk(work / "bench.ctf", a.minibatch_size, a.window_chunks)
        m = mbd(work, a.size_bytes, a.minibatch_size, a.window_chunks, limit, 3, keep=True)
        rows.append((c, m))
        print(f"run {k + 1}: CNTK first {c['first']:,.0f} third {c['third']:,.0f} samples/s; minibatchd after a "
              f"restart first {m['first']:,.0f} ({m['first'] / c['first']:.1f}x), third {m['third']:,.0f} "
              f"({m['third'] / c['third']:.1f}x); peak RSS {m['peak_mib']} MiB; first minibatch at "
              f"{m['first_minibatch_s']} s, sweeps ended at " + ", ".join(f"{e:.3f}" for e in m["ends_s"]) + " s")
    for kind in ("first", "third"):
        ratios = [m[kind] / c[kind] for c, m in rows]
        print(f"{kind} sweep: median {statistics.median(ratios):.1f}x CNTK 2.7 (runs: "
              + ", ".join(f"{r:.1f}" for r in ratios) + f"); minibatchd median {statistics.median(m[kind] for _, m in rows):,.0f} "
              f"samples/s, CNTK median {statistics.median(c[kind] for c, _ in rows):,.0f}")


if __name__ == "__main__":
    main()
