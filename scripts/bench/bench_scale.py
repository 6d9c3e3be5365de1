#!/usr/bin/env python3
"""How minibatchd's time and memory grow: with the dataset's size, the number of concurrent
sessions and the randomization window. Every row is a scripts/bench/bench_daemon.py run (dense CTF,
128 floats + a one-hot label per line, randomized, minibatch 256, separate Python consumers),
cold: a fresh state directory, so the first sweep parses the text (and persists the parsed
chunks). Prints one table row per case: daemon start (index pass), the first and second sweep's
samples/s, the daemon's peak RSS against memory_limit_bytes.

    scripts/bench/bench_scale.py [--sizes 0.25,1,4] [--sessions 1,2,4,8] [--windows 4,16,128] [--memory-limit BYTES]

Sizes in GiB; the session and window cases use 1 GiB. With --memory-limit the cases run with that
limit (default 8 GiB: the parsed data of 4 GiB fits).
"""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(size: int, extra, memory_limit: int) -> dict:
    work = ROOT / "target" / f"bench-scale-{size}"
    cmd = [sys.executable, str(ROOT / "scripts/bench/bench_daemon.py"), "--size-bytes", str(size), "--sweeps", "2", "--memory-limit", str(memory_limit), "--workdir", str(work)] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "BENCH_STATE_KEEP"})
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    o = out.stdout
    sweeps = [float(m.replace(",", "")) for m in re.findall(r"^sweep \d+ \([^)]*\): ([\d,]+) samples/s", o, re.M)]
    start = float(re.search(r"daemon start \(index pass or cache\): ([\d.]+) s", o).group(1))
    peak = float(re.search(r"peak (\d+) MiB", o).group(1))
    total = re.search(r"sessions at once: ([\d,]+) samples/s in all", o)
    text_mb = float(re.search(r"\((\d+) MiB\)", o).group(1))
    return {"sweeps": sweeps, "start": start, "peak": peak, "total": float(total.group(1).replace(",", "")) if total else None, "mib": text_mb}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0.25,1,4")
    ap.add_argument("--sessions", default="1,2,4,8")
    ap.add_argument("--windows", default="4,16,128")
    ap.add_argument("--memory-limit", type=int, default=8 << 30)
    a = ap.parse_args()
    lim = a.memory_limit
    print(f"{os.cpu_count()} cores; memory_limit_bytes {lim / 2**20:.0f} MiB; cold runs (fresh state directory)")
    print("| case | text | daemon start s | first sweep samples/s | second sweep samples/s | all sessions samples/s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")

    def row(case, r):
        s = r["sweeps"] + [float("nan")] * 2
        total = f"{r['total']:,.0f}" if r["total"] else "—"
        print(f"| {case} | {r['mib']:.0f} MiB | {r['start']:.2f} | {s[0]:,.0f} | {s[1]:,.0f} | {total} | {r['peak']:.0f} |", flush=True)

    for gib in a.sizes.split(","):
        if gib:
            row(f"size {gib} GiB", run(int(float(gib) * (1 << 30)), [], lim))
    for n in a.sessions.split(","):
        if n:
            row(f"{n} session(s), 1 GiB", run(1 << 30, ["--sessions", n], lim))
    for w in a.windows.split(","):
        if w:
            row(f"window {w} chunks, 1 GiB", run(1 << 30, ["--window-chunks", w], lim))


if __name__ == "__main__":
    main()
