#!/usr/bin/env python3
"""End-to-end daemon benchmark: a separate Python process consumes a dense CTF file through
`minibatchd run` (shared memory, the real Python client).

    scripts/bench_daemon.py [--size-bytes 1073741824] [--minibatch-size 256] [--workdir DIR]

Generates DIR/bench.ctf with `minibatchd-gen ctf-dense` (128 floats + a sparse one-hot label per
line) unless it exists with that size, builds the release binaries, starts the daemon, and runs
the consumer (randomized, one full sweep). Prints samples/s, MB/s of minibatch payload,
per-minibatch client overhead (the consumer's CPU time / minibatches: the client library's cost,
waits excluded) and the daemon's RSS. Uses .venv/bin/python for the consumer if present.
"""

import argparse
import shutil
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def consume(sock: str, minibatch_size: int) -> None:
    sys.path.insert(0, str(ROOT / "clients" / "python"))
    import minibatchd

    # The ring depth is the daemon's default (ring_slots) unless BENCH_PREFETCH sets it.
    extra = {"prefetch": int(os.environ["BENCH_PREFETCH"])} if os.environ.get("BENCH_PREFETCH") else {}
    source = minibatchd.connect(sock).open("bench", minibatch_size=minibatch_size, full_sweep=True, randomize=True, **extra)
    samples = payload = count = 0
    first = None
    cpu0, t0 = time.process_time(), time.perf_counter()
    for mb in source:
        if first is None:
            first = time.perf_counter() - t0
        f = mb["features"]
        samples += f.num_samples
        payload += f.values.nbytes + mb["labels"].values.nbytes + mb["labels"].indices.nbytes
        count += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    # Client overhead without waits: let a deep ring fill up, then time next() on ready slots.
    probe = minibatchd.connect(sock).open("bench", minibatch_size=minibatch_size, max_samples=64 * minibatch_size, prefetch=66, slot_size_bytes=1 << 18)
    next(probe)
    time.sleep(2.0)
    n, t1 = 0, time.perf_counter()
    for mb in probe:
        _ = mb["features"].values
        n += 1
    ready_us = (time.perf_counter() - t1) / max(n, 1) * 1e6
    print(json.dumps({"minibatches": count, "samples": samples, "payload_bytes": payload, "wall_s": wall, "cpu_s": cpu, "first_minibatch_s": first, "ready_next_us": ready_us}))


def rss_kib(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            out[k] = int(v.split()[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-bytes", type=int, default=1 << 30)
    ap.add_argument("--minibatch-size", type=int, default=256)
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-daemon"))
    ap.add_argument("--consume", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.consume:
        consume(a.consume, a.minibatch_size)
        return
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "--bins"], cwd=ROOT, check=True)
    data = work / "bench.ctf"
    if not data.exists() or abs(data.stat().st_size - a.size_bytes) > a.size_bytes // 10:
        subprocess.run([str(ROOT / "target/release/minibatchd-gen"), "ctf-dense", str(data), str(a.size_bytes), "128", "10"], check=True)
    # A fresh state dir: a checkpoint from an earlier run (another file size) would restore
    # sessions that no longer match the data.
    shutil.rmtree(work / "state", ignore_errors=True)
    sock = str(work / "mbd.sock")
    cfg = work / "bench.toml"
    cfg.write_text(
        f"""[daemon]
socket = "{sock}"
metrics_listen = "127.0.0.1:0"
state_dir = "{work}/state"
memory_limit_bytes = 8589934592

[datasets.bench]
format = "ctf"
files = ["{data}"]

[datasets.bench.streams.features]
dim = 128
format = "dense"

[datasets.bench.streams.labels]
dim = 10
format = "sparse"
"""
    )
    t0 = time.perf_counter()
    daemon = subprocess.Popen([str(ROOT / "target/release/minibatchd"), "run", "--config", str(cfg)], env=dict(os.environ, MINIBATCHD_LOG="warn"))
    try:
        while True:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.close()
                break
            except OSError:
                if daemon.poll() is not None:
                    sys.exit("the daemon exited")
                time.sleep(0.05)
        index_s = time.perf_counter() - t0
        py = ROOT / ".venv/bin/python"
        py = str(py) if py.exists() else sys.executable
        out = subprocess.run([py, __file__, "--consume", sock, "--minibatch-size", str(a.minibatch_size)], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        mem = rss_kib(daemon.pid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    print(f"file: {data} ({data.stat().st_size / 2**20:.0f} MiB), minibatch {a.minibatch_size}, randomized, one sweep, {os.cpu_count()} cores")
    print(f"daemon start (index pass or cache): {index_s:.2f} s")
    print(f"minibatches: {r['minibatches']}, samples: {r['samples']}, first minibatch after {r['first_minibatch_s']:.3f} s")
    print(f"throughput: {r['samples'] / r['wall_s']:,.0f} samples/s, {r['payload_bytes'] / r['wall_s'] / 1e6:,.1f} MB/s of minibatch payload, {data.stat().st_size / r['wall_s'] / 1e6:,.1f} MB/s of text")
    print(f"client overhead: {r['ready_next_us']:.1f} us per next() on a ready slot; {r['cpu_s'] / r['minibatches'] * 1e6:.1f} us consumer CPU (user+sys, blocking waits included) per minibatch")
    print(f"daemon RSS at end: {mem.get('VmRSS', 0) / 1024:.0f} MiB (peak {mem.get('VmHWM', 0) / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
