#!/usr/bin/env python3
"""Peers side by side on one dense CTF file, in one run: CNTK 2.7, a PyTorch DataLoader parsing
the text with NumPy (0 and 2 workers), and minibatchd — cold (text parsed), warm (second sweep,
chunks in memory), after a restart from the parsed cache, after a restart with
that cache off, and a dataset larger than the memory limit (every sweep loads its chunks again)
with and without it. Prints samples/s, MB/s of text, peak RSS and each figure's ratio to CNTK 2.7
in the same run; with --runs N the kinds alternate and the median and range are printed. The
figures on the user's clock (from the start of the loader — CNTK's constructor, `minibatchd run` on
an empty state directory — to the last minibatch, index pass included) are printed first and
compared with each other; the others leave the index pass out (and say so) and are compared with
CNTK's on that clock.

    scripts/bench/bench_peers.py [--size-bytes 1073741824] [--runs 3] [--minibatch-size 256]
                           [--only cntk,torch0,torch2,adapter0,adapter2,loader0,loader2,jax,mbd] [--libsvm]

The file is minibatchd-gen's ctf-dense (128 floats and a one-hot label of 10 classes per line),
as in scripts/bench/bench_daemon.py, which runs every minibatchd figure (a separate Python consumer,
randomized, CNTK's default window). CNTK runs from the oracle
(`../shared/tools/cntk-oracle/setup.sh`; ORACLE_HOME, default /tmp/cntk-oracle) through
scripts/bench/cntk_throughput.py; when it is not set up the script says so and prints no ratio.
The PyTorch loader is what a user writes without minibatchd: an IterableDataset that splits the
file by byte ranges over the workers and parses each line with NumPy (`np.fromstring`), batched
by the DataLoader — in file order, which spares it the randomization the others do. `adapter0`
and `adapter2` read minibatchd through its PyTorch adapter (`MinibatchIterableDataset` in a
`DataLoader(batch_size=None, num_workers=0 or 2)`, as README shows it), after a restart on the
persisted chunks, consumer up before the daemon; `loader0` and `loader2` the same through
`MinibatchDataLoader(ds, num_workers=0 or 2)`, as README shows it (its workers' splits read in the
consumer's process); `jax` the same through the JAX adapter (`MinibatchIterator`, arrays
copied to the CPU device).
--libsvm adds scripts/bench/bench_libsvm.sh (minibatchd's libsvm parse against xgboost's at 2 threads,
on its own Criteo-like file). Figures are from the same run only: the machine's speed moves
between runs.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The clock a user sees: from the start of the loader (CNTK's `MinibatchSource` constructor,
# which indexes the file; `minibatchd run` on an empty state directory) to the last minibatch.
USER = "on the user's clock"
CNTK_USER = f"CNTK 2.7, first sweep {USER}: from before its MinibatchSource constructor (its index pass included)"
CNTK_SWEEP = "CNTK 2.7, first sweep (from its first next_minibatch, its index pass left out)"
ORACLE = Path(os.environ.get("ORACLE_HOME", "/tmp/cntk-oracle"))
DIM, CLASSES = 128, 10


def run_child(cmd, env=None, cwd=None):
    """Runs cmd; returns (stdout, stderr); exits with its stderr if it fails."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, text=True)
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{err[-3000:]}")
    return out, err


def peak_rss_mib(cmd, env=None):
    """Runs cmd under /usr/bin/time -f %M when present; returns (stdout, peak RSS MiB or None)."""
    timer = Path("/usr/bin/time")
    if timer.exists():
        out, err = run_child([str(timer), "-f", "MAXRSS %M"] + cmd, env=env)
        m = re.findall(r"MAXRSS (\d+)", err)
        return out, (int(m[-1]) / 1024 if m else None)
    out, _ = run_child(cmd, env=env)
    return out, None


def torch_consume(path: str, workers: int, minibatch: int) -> None:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class CtfText(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            n, k = (info.num_workers, info.id) if info else (1, 0)
            size = os.path.getsize(path)
            start, end = size * k // n, size * (k + 1) // n
            with open(path, "rb") as f:
                if start:
                    f.seek(start - 1)
                    f.readline()  # to the start of the next line
                pos = f.tell()
                while pos < end:
                    line = f.readline()
                    if not line:
                        break
                    pos += len(line)
                    feats, labels = line.split(b"|labels")
                    x = np.fromstring(feats[len(b"|features"):].decode(), dtype=np.float32, sep=" ")
                    y = int(labels.split(b":", 1)[0])
                    yield torch.from_numpy(x), y

    loader = DataLoader(CtfText(), batch_size=minibatch, num_workers=workers)
    samples = 0
    t0 = time.perf_counter()
    first = None
    for x, y in loader:
        if first is None:
            first = time.perf_counter() - t0
        samples += x.shape[0]
    wall = time.perf_counter() - t0
    print(json.dumps({"samples": samples, "wall_s": wall, "first_minibatch_s": first, "torch": torch.__version__}))


def mbd(work: Path, size: int, minibatch: int, extra_args, env_extra, keep_state: bool):
    env = dict(os.environ, **env_extra)
    if keep_state:
        env["BENCH_STATE_KEEP"] = "1"
    else:
        env.pop("BENCH_STATE_KEEP", None)
    cmd = [sys.executable, str(ROOT / "scripts/bench/bench_daemon.py"), "--size-bytes", str(size), "--minibatch-size", str(minibatch), "--workdir", str(work)] + extra_args
    out, _ = run_child(cmd, env=env)
    sweeps = [float(m.replace(",", "")) for m in re.findall(r"^sweep \d+ \([^)]*\): ([\d,]+) samples/s", out, re.M)]
    peak = re.search(r"peak (\d+) MiB", out)
    cpu = re.search(r"then sweeps and probe ([\d.]+) s user, ([\d.]+) s system", out)
    client = re.search(r"([\d.]+) us median per next\(\)", out)
    user = re.search(r"^user clock: sweep 0 ended ([\d.]+) s after minibatchd run", out, re.M)
    first = re.search(r"^user clock: first minibatch ([\d.]+) s after minibatchd run", out, re.M)
    return {"sweeps": sweeps, "peak_mib": float(peak.group(1)) if peak else None, "out": out,
            "user_s": float(user.group(1)) if user else None,
            "first_s": float(first.group(1)) if first else None,
            "cpu_s": float(cpu.group(1)) + float(cpu.group(2)) if cpu else None,
            "client_median_us": float(client.group(1)) if client else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-bytes", type=int, default=1 << 30)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--minibatch-size", type=int, default=256)
    ap.add_argument("--only", default="cntk,torch0,torch2,mbd")
    ap.add_argument("--libsvm", action="store_true")
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-peers"))
    ap.add_argument("--torch-consume", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_consume:
        torch_consume(a.torch_consume, a.workers, a.minibatch_size)
        return
    sys.path.insert(0, str(ROOT / "scripts" / "bench"))
    from bench_daemon import prepare  # the same file and build as every minibatchd figure

    work = Path(a.workdir).resolve()  # the config written there names paths relative to itself
    data = prepare(work, a.size_bytes)
    text_mb = data.stat().st_size / 1e6
    with open(data, "rb") as f:
        samples_total = sum(1 for _ in f)
    only = set(a.only.split(","))
    cntk_py = ORACLE / "venv36/bin/python"
    have_cntk = "cntk" in only and cntk_py.exists()
    if "cntk" in only and not have_cntk:
        print(f"CNTK 2.7 is not set up ({cntk_py} missing: run ../shared/tools/cntk-oracle/setup.sh): no CNTK figures, no ratios")
    py = ROOT / ".venv/bin/python"
    py = str(py) if py.exists() else sys.executable
    results = {}  # kind -> list of (samples/s, peak MiB)

    def add(kind, rate, peak, note=None):
        results.setdefault(kind, []).append((rate, peak, note))

    def restarted(through, env_extra):
        """Two sweeps read through an adapter (`through`, set by `env_extra`) by a consumer up
        before the daemon, restarted on its persisted chunks (a cold run fills them first if the
        state is empty)."""
        if not (work / "state" / "parsed").exists():
            mbd(work, a.size_bytes, a.minibatch_size, ["--sweeps", "1"], {}, keep_state=False)
        ad = mbd(work, a.size_bytes, a.minibatch_size, ["--sweeps", "2", "--consumer-first"],
                 dict(env_extra, BENCH_NO_PROBE="1"), keep_state=True)
        add(f"minibatchd through {through}, first sweep after a restart", ad["sweeps"][0], ad["peak_mib"])
        add(f"minibatchd through {through}, second sweep", ad["sweeps"][1], ad["peak_mib"])

    # Seconds to the first minibatch on the user's clock (CNTK: its constructor, which indexes
    # the file, and its first next_minibatch; minibatchd: from `minibatchd run`, cold).
    firsts: dict = {}

    for run in range(a.runs):
        subprocess.run(["cat", str(data)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        if have_cntk:
            env = dict(os.environ, LD_LIBRARY_PATH=str(ORACLE / "mpishim"), PYTHONWARNINGS="ignore")
            out, peak = peak_rss_mib([str(cntk_py), "-W", "ignore", str(ROOT / "scripts/bench/cntk_throughput.py"), str(data), str(DIM), str(CLASSES), str(a.minibatch_size), "1"], env=env)
            r = json.loads(out.strip().splitlines()[-1])
            secs, n = r["per_sweep"][0]
            add(CNTK_USER, n / (r["build_s"] + secs), peak)
            if r.get("first_minibatch_s") is not None:
                firsts.setdefault("CNTK 2.7", []).append(r["build_s"] + r["first_minibatch_s"])
            add(CNTK_SWEEP, n / secs, peak)
        for w in (0, 2):
            if f"torch{w}" in only:
                out, peak = peak_rss_mib([py, __file__, "--torch-consume", str(data), "--workers", str(w), "--minibatch-size", str(a.minibatch_size)])
                r = json.loads(out.strip().splitlines()[-1])
                add(f"PyTorch DataLoader + NumPy, {w} workers (file order)", r["samples"] / r["wall_s"], peak)
            if f"adapter{w}" in only:
                # minibatchd through its PyTorch adapter in a DataLoader of w workers.
                restarted(f"MinibatchIterableDataset, DataLoader of {w} workers", {"BENCH_TORCH_WORKERS": str(w)})
            if f"loader{w}" in only:
                # The same through MinibatchDataLoader, which reads its workers' splits here.
                restarted(f"MinibatchDataLoader(num_workers={w})",
                          {"BENCH_TORCH_WORKERS": str(w), "BENCH_TORCH_LOADER": "owning"})
        if "jax" in only:
            restarted("the JAX adapter (MinibatchIterator)", {"BENCH_JAX": "1"})
        if "mbd" in only:
            cold = mbd(work, a.size_bytes, a.minibatch_size, ["--sweeps", "2", "--consumer-first"], {}, keep_state=False)
            if cold["first_s"] is not None:
                firsts.setdefault("minibatchd cold", []).append(cold["first_s"])
            add(f"minibatchd cold {USER}: from `minibatchd run` on an empty state directory (index pass, open and parse included) to the sweep's last minibatch",
                samples_total / cold["user_s"], cold["peak_mib"])
            add("minibatchd cold (text parsed, chunks persisted; from the first minibatch asked, index pass left out)", cold["sweeps"][0], cold["peak_mib"], cold)
            add("minibatchd warm (second sweep, chunks in memory)", cold["sweeps"][1], cold["peak_mib"])
            restart = mbd(work, a.size_bytes, a.minibatch_size, ["--sweeps", "1"], {}, keep_state=True)
            add("minibatchd after a restart, persisted parsed chunks", restart["sweeps"][0], restart["peak_mib"], restart)
            off = mbd(work, a.size_bytes, a.minibatch_size, ["--sweeps", "1"], {"MINIBATCHD__DAEMON__PARSED_CACHE_BYTES": "0"}, keep_state=True)
            add("minibatchd after a restart, parsed cache off (parsed again)", off["sweeps"][0], off["peak_mib"])
            small = ["--sweeps", "3", "--window-chunks", "4", "--memory-limit", str(384 << 20)]
            big = mbd(work, a.size_bytes, a.minibatch_size, small, {}, keep_state=True)
            add("minibatchd, parsed data larger than a 384 MiB memory limit, sweeps 2-3 (persisted chunks)", statistics.mean(big["sweeps"][1:]), big["peak_mib"])
            big_off = mbd(work, a.size_bytes, a.minibatch_size, small, {"MINIBATCHD__DAEMON__PARSED_CACHE_BYTES": "0"}, keep_state=True)
            add("minibatchd, parsed data larger than a 384 MiB memory limit, sweeps 2-3 (parsed again)", statistics.mean(big_off["sweeps"][1:]), big_off["peak_mib"])
        print(f"run {run + 1}: " + "; ".join(f"{k} {v[-1][0]:,.0f}" for k, v in results.items()), flush=True)

    print(f"\nfile: {data} ({text_mb:,.0f} MB, {DIM} floats + a one-hot label per line), minibatch {a.minibatch_size}, {os.cpu_count()} cores, {a.runs} run(s) alternated")
    def base_for(kind):
        # A figure on the user's clock is compared with CNTK's on the same clock.
        ref = CNTK_USER if USER in kind else CNTK_SWEEP
        return statistics.median(r for r, _, _ in results[ref]) if ref in results else None

    if firsts:
        print("time to the first minibatch " + USER + ", median (range): " + "; ".join(
            f"{k} {statistics.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})" for k, v in firsts.items()))
    # The user's clock first; the narrower figures after it, labelled by what they leave out.
    for kind, rows in sorted(results.items(), key=lambda kv: USER not in kv[0]):
        rates = [r for r, _, _ in rows]
        med = statistics.median(rates)
        peaks = [p for _, p, _ in rows if p]
        base = base_for(kind)
        ratio = f", {med / base:.1f}x CNTK 2.7" if base else ""
        spread = f" ({min(rates):,.0f}-{max(rates):,.0f})" if len(rates) > 1 else ""
        peak = f", peak RSS {max(peaks):,.0f} MiB" if peaks else ""
        print(f"{kind}: {med:,.0f} samples/s{spread}, {med / samples_total * text_mb:,.0f} MB/s of text{ratio}{peak}")
    for kind in ("minibatchd cold (text parsed, chunks persisted; from the first minibatch asked, index pass left out)", "minibatchd after a restart, persisted parsed chunks"):
        for _, _, note in results.get(kind, []):
            if isinstance(note, dict):
                print(f"  {kind}: daemon CPU {note['cpu_s']:.2f} s over the sweeps and probe; client median {note['client_median_us']:.1f} us per next()")
    if a.libsvm:
        print("\n== libsvm: scripts/bench/bench_libsvm.sh (2 threads)")
        out, _ = run_child(["bash", str(ROOT / "scripts/bench/bench_libsvm.sh")], env=dict(os.environ, SIZE=str(a.size_bytes), THREADS="2"))
        print("\n".join(l for l in out.splitlines() if "MB/s" in l or "ratio" in l))


if __name__ == "__main__":
    main()
