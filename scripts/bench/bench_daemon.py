#!/usr/bin/env python3
"""End-to-end daemon benchmark: a separate Python process consumes a dense CTF file through
`minibatchd run` (shared memory, the real Python client).

    scripts/bench/bench_daemon.py [--size-bytes 1073741824] [--minibatch-size 256] [--sweeps 2] [--preload]
                            [--window-chunks N] [--memory-limit BYTES] [--sessions N] [--workdir DIR]

Generates DIR/bench.ctf with `minibatchd-gen ctf-dense` (128 floats + a sparse one-hot label per
line) unless it exists with that size, builds the release binaries, starts the daemon, and runs
the consumer (randomized, `--sweeps` sweeps). Prints samples/s and MB/s per sweep — the first
sweep is cold (CNTK's default window covers the file, so its first minibatch waits for the whole
file to be parsed), later ones find the parsed chunks in the daemon's cache —, the client's
overhead per minibatch (next() on slots that are already filled) and the daemon's RSS. Uses
.venv/bin/python for the consumer if present. With `--preload` the dataset is configured with
`preload = true` and the consumer starts once the daemon has parsed every chunk (a daemon started
ahead of its trainer); the preload time is printed on its own. `--window-chunks 4` with a
`--memory-limit` below the parsed size (e.g. 268435456) measures the parse-bound steady state
of a dataset larger than the cache: every sweep parses the file again, while it is delivered.
`BENCH_FILES_URL=s3://bucket/key` reads the same file from object storage instead (the AWS
environment says where; scripts/bench/bench_objects.py sets it up), and `BENCH_STATE_KEEP=1` keeps the
state directory between runs, and `BENCH_NO_PROBE=1` leaves out the client-overhead probe (its
ring of 258 slots does not fit a small `--memory-limit`). With `--consumer-first` the consumers
start before the daemon (their interpreter, NumPy and the client imported, as a trainer that is up
when its loader starts — CNTK's clock in `scripts/bench/cntk_throughput.py` leaves its imports out the
same way) and connect as soon as it listens; without it they start once it listens, and the user
clock includes their start. `BENCH_TORCH_WORKERS=N` makes the consumer read through the PyTorch
adapter (`MinibatchIterableDataset` in a `DataLoader(batch_size=None, num_workers=N)`, one pass
per sweep) instead of the plain client; it leaves out the client-overhead probe.
`BENCH_TORCH_LOADER=owning` reads it through `MinibatchDataLoader(ds, num_workers=N)` instead, as
README shows it (the N workers' splits read in the consumer's process), and `owning-processes`
through `MinibatchDataLoader(ds, num_workers=N, worker_processes=True)`. `BENCH_JAX=1` reads
through the JAX adapter (`MinibatchIterator`, arrays on the CPU device). `BENCH_CLIENT_DIR=DIR`
imports the Python client from DIR instead of clients/python (A/B runs of a client change).
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
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import daemon_kit  # noqa: E402  (scripts/lib: the config writer and daemon start every script shares)
from daemon_kit import ROOT, wait_for_socket  # noqa: E402

# The daemon binary; BENCH_DAEMON_BIN points at another build for A/B runs.
DAEMON = os.environ.get("BENCH_DAEMON_BIN") or str(daemon_kit.DAEMON)
# Minibatches timed one by one for the client overhead.
PROBE = 256


def consume(sock: str, minibatch_size: int, sweeps: int, wait_for_daemon: bool) -> None:
    sys.path.insert(0, os.environ.get("BENCH_CLIENT_DIR") or str(ROOT / "clients" / "python"))
    import minibatchd

    if wait_for_daemon:
        # A trainer that is up before its loader: its interpreter and imports are done (CNTK's
        # clock leaves out its own the same way); it connects as soon as the daemon listens.
        print("ready", flush=True)
        wait_for_socket(sock, 0.001)

    # The ring depth is the daemon's default (ring_slots) unless BENCH_PREFETCH sets it.
    extra = {"prefetch": int(os.environ["BENCH_PREFETCH"])} if os.environ.get("BENCH_PREFETCH") else {}
    if os.environ.get("BENCH_WINDOW_CHUNKS"):
        extra["window_chunks"] = int(os.environ["BENCH_WINDOW_CHUNKS"])
    if os.environ.get("BENCH_TORCH_WORKERS"):
        consume_torch(sock, minibatch_size, sweeps, int(os.environ["BENCH_TORCH_WORKERS"]), extra)
        return
    if os.environ.get("BENCH_JAX"):
        consume_jax(sock, minibatch_size, sweeps, extra)
        return
    source = minibatchd.connect(sock).open("bench", minibatch_size=minibatch_size, max_sweeps=sweeps, randomize=True, **extra)
    samples = payload = count = 0
    first = None
    per_sweep = []  # (seconds, samples, payload bytes, minibatches) per sweep
    sweep_ends = []  # wall-clock time (Unix seconds) at the end of each sweep
    cpu0, t0 = time.process_time(), time.perf_counter()
    mark, at = (0, 0, 0), t0
    first_unix = None
    for mb in source:
        if first is None:
            first, first_unix = time.perf_counter() - t0, time.time()
        f = mb["features"]
        samples += f.num_samples
        payload += f.values.nbytes + mb["labels"].values.nbytes + mb["labels"].indices.nbytes
        count += 1
        if mb.end_of_sweep:
            now = time.perf_counter()
            per_sweep.append((now - at, samples - mark[0], payload - mark[1], count - mark[2]))
            sweep_ends.append(time.time())
            mark, at = (samples, payload, count), now
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stages = scrape_stages()
    # Client overhead without waits: let a deep ring fill up, then time each next() on ready slots
    # (the time a trainer's loop spends in the client library per minibatch).
    # The main session's window (its chunks must fit the memory limit as well).
    window = {"window_chunks": extra["window_chunks"]} if "window_chunks" in extra else {}
    times = []
    if os.environ.get("BENCH_NO_PROBE"):
        # A small memory limit has no room for the probe's ring of PROBE slots.
        report(count, samples, payload, wall, cpu, first, per_sweep, sweep_ends, stages, first_unix=first_unix)
        return
    # Twice PROBE minibatches through a ring of PROBE + 2 slots: the first PROBE read every slot
    # once (a fresh slot's first read maps its pages: a page fault or two), the second PROBE are
    # timed as a training loop sees them after its first pass through the ring.
    probe = minibatchd.connect(sock).open("bench", minibatch_size=minibatch_size, max_samples=2 * PROBE * minibatch_size, prefetch=PROBE + 2, slot_size_bytes=1 << 18, **window)
    it = iter(probe)
    for _ in range(PROBE):
        _ = next(it)["features"].values
    _ = None
    time.sleep(3.0)
    probe._wait_ns = 0
    while True:
        t1 = time.perf_counter_ns()
        try:
            mb = next(it)
        except StopIteration:
            break
        _ = mb["features"].values
        times.append(time.perf_counter_ns() - t1)
    times.sort()
    ready_us = sum(times) / max(len(times), 1) / 1e3
    median_us = times[len(times) // 2] / 1e3 if times else 0.0
    report(count, samples, payload, wall, cpu, first, per_sweep, sweep_ends, stages,
           probe=(ready_us, median_us, probe._wait_ns / 1e3), first_unix=first_unix)


def report(count, samples, payload, wall, cpu, first, per_sweep, sweep_ends, stages, probe=(0.0, 0.0, 0.0),
           first_unix=None) -> None:
    """The consumer's figures, one JSON line on stdout (`probe`: the client-overhead probe's mean
    and median µs per ready next() and its waits, 0 when it did not run; `first_unix`: when the
    first minibatch arrived, Unix seconds)."""
    print(json.dumps({"minibatches": count, "samples": samples, "payload_bytes": payload, "wall_s": wall, "cpu_s": cpu,
                      "first_unix": first_unix,
                      "first_minibatch_s": first, "ready_next_us": probe[0], "ready_next_median_us": probe[1],
                      "probe_waited_us": probe[2], "per_sweep": per_sweep, "sweep_ends_unix": sweep_ends,
                      "stages": stages}))


def count_passes(items, sweeps: int) -> None:
    """Reads `sweeps` passes over an adapter's `items` (iterated once per sweep), counting the
    samples and bytes of each item's arrays (data only), and reports them."""
    samples = payload = count = 0
    per_sweep, sweep_ends = [], []
    first = None
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(sweeps):
        at, mark = time.perf_counter(), (samples, payload, count)
        for item in items:
            if first is None:
                first = time.perf_counter() - t0
            x = item["features"]["values"]
            samples += x.shape[0]
            payload += x.nbytes + item["labels"]["values"].nbytes + item["labels"]["indices"].nbytes
            count += 1
        per_sweep.append((time.perf_counter() - at, samples - mark[0], payload - mark[1], count - mark[2]))
        sweep_ends.append(time.time())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    report(count, samples, payload, wall, cpu, first, per_sweep, sweep_ends, {})


def consume_torch(sock: str, minibatch_size: int, sweeps: int, workers: int, extra: dict) -> None:
    """The consumer through the PyTorch adapter, as README shows it: `MinibatchIterableDataset`
    in a `DataLoader(batch_size=None, num_workers=workers)`, one pass per sweep; the tensors are
    only counted (data only)."""
    from torch.utils.data import DataLoader

    from minibatchd.torch import MinibatchDataLoader, MinibatchIterableDataset

    ds = MinibatchIterableDataset("bench", socket=sock, minibatch_size=minibatch_size, randomize=True,
                                  use_torchrun_env=False, **extra)
    kind = os.environ.get("BENCH_TORCH_LOADER", "dataloader")
    if kind == "dataloader":
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
    else:
        loader = MinibatchDataLoader(ds, num_workers=workers, worker_processes=kind == "owning-processes")
    count_passes(loader, sweeps)


def consume_jax(sock: str, minibatch_size: int, sweeps: int, extra: dict) -> None:
    """The consumer through the JAX adapter (`MinibatchIterator`, one pass per sweep, arrays
    copied to the default device, here the CPU); the arrays are only counted (data only)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from minibatchd.jax import MinibatchIterator

    it = MinibatchIterator("bench", socket=sock, minibatch_size=minibatch_size, randomize=True, process_index=0,
                           process_count=1, **extra)
    count_passes(it, sweeps)


def scrape_stages() -> dict:
    """Where the daemon's time went during the main loop (its metrics, before the probe)."""
    addr_file = os.environ.get("BENCH_METRICS_ADDR_FILE")
    if not addr_file:
        return {}
    addr = Path(addr_file).read_text().strip()
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    wanted = {
        "minibatchd_session_producer_blocked_seconds_total": "producer waited for a free slot",
        "minibatchd_session_chunk_wait_seconds_total": "producer waited for parsed chunks",
        "minibatchd_session_consumer_wait_seconds_total": "client waited for a minibatch",
    }
    out = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in wanted:
            out[wanted[name]] = out.get(wanted[name], 0.0) + float(line.split()[-1])
        elif name == "minibatchd_stage_busy_seconds_total":
            stage = line.split('stage="')[1].split('"')[0]
            out[f"busy: {stage}"] = float(line.split()[-1])
    return out


def daemon_cpu_s(pid: int) -> tuple:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def rss_kib(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            out[k] = int(v.split()[0])
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages"):
            out["AnonHugePages"] = int(line.split(":")[1].split()[0])
    return out


def prepare(work: Path, size_bytes: int) -> Path:
    """Builds the release binaries and makes `work/bench.ctf` (minibatchd-gen ctf-dense: 128
    floats and a one-hot label of 10 classes per line) unless one of about that size is there."""
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "--workspace", "--bins"], cwd=ROOT, check=True)
    data = work / "bench.ctf"
    if not data.exists() or abs(data.stat().st_size - size_bytes) > size_bytes // 10:
        subprocess.run([str(ROOT / "target/release/minibatchd-gen"), "ctf-dense", str(data), str(size_bytes), "128", "10"], check=True)
    return data


def spawn_consumers(a, sock: str, work: Path, wait: bool) -> list:
    """The consumer processes, one per session; with `wait` they import everything, say `ready`
    and wait for the daemon's socket."""
    py = ROOT / ".venv/bin/python"
    py = str(py) if py.exists() else sys.executable
    env = dict(os.environ, BENCH_WINDOW_CHUNKS=str(a.window_chunks or ""), BENCH_METRICS_ADDR_FILE=str(work / "state" / "metrics.addr"))
    cmd = [py, __file__, "--consume", sock, "--minibatch-size", str(a.minibatch_size), "--sweeps", str(a.sweeps)]
    if wait:
        cmd.append("--wait-for-daemon")
    return [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(a.sessions)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-bytes", type=int, default=1 << 30)
    ap.add_argument("--minibatch-size", type=int, default=256)
    ap.add_argument("--sweeps", type=int, default=2)
    ap.add_argument("--preload", action="store_true")
    ap.add_argument("--window-chunks", type=int, help="the session's randomization window (default: CNTK's 128 chunks)")
    ap.add_argument("--memory-limit", type=int, default=8 << 30, help="memory_limit_bytes (default 8 GiB: the parsed file fits)")
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-daemon"))
    ap.add_argument("--sessions", type=int, default=1, help="consumers at once, each a process with its own session (the figures printed are the first one's; all sessions' total samples/s on its own line)")
    ap.add_argument("--consumer-first", action="store_true", help="start the consumers (interpreter, NumPy, the client imported) before the daemon, as a trainer that is up when its loader starts; without it they start once the daemon listens, and the user clock includes their start")
    ap.add_argument("--consume", help=argparse.SUPPRESS)
    ap.add_argument("--wait-for-daemon", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.consume:
        consume(a.consume, a.minibatch_size, a.sweeps, a.wait_for_daemon)
        return
    if a.consumer_first and a.preload:
        sys.exit("--consumer-first and --preload exclude each other (a preload runs before the consumer starts)")
    work = Path(a.workdir).resolve()  # the config written there names paths relative to itself
    data = prepare(work, a.size_bytes)
    # A fresh state dir: a checkpoint from an earlier run (another file size) would restore
    # sessions that no longer match the data.
    if not os.environ.get("BENCH_STATE_KEEP"):
        shutil.rmtree(work / "state", ignore_errors=True)
    files = os.environ.get("BENCH_FILES_URL") or str(data)
    sock = str(work / "mbd.sock")
    cfg = daemon_kit.write_config(work / "bench.toml", {
        "daemon": {"socket": sock, "metrics_listen": "127.0.0.1:0", "state_dir": f"{work}/state",
                   "memory_limit_bytes": a.memory_limit},
        "datasets": {"bench": {"format": "ctf", "files": [files], "preload": a.preload, "streams": {
            "features": {"dim": 128, "format": "dense"},
            "labels": {"dim": 10, "format": "sparse"},
        }}},
    })
    consumers = None
    if a.consumer_first:
        consumers = spawn_consumers(a, sock, work, wait=True)
        for c in consumers:
            if c.stdout.readline().strip() != "ready":
                sys.exit(f"a consumer failed before the daemon started:\n{c.communicate()[1]}")
    t0 = time.perf_counter()
    t0_unix = time.time()
    daemon = daemon_kit.spawn(cfg, binary=DAEMON, env={"MINIBATCHD_LOG": "warn"})
    try:
        wait_for_socket(sock, 0.05, daemon)
        index_s = time.perf_counter() - t0
        cpu_at_start = daemon_cpu_s(daemon.pid)
        preload_s = None
        if a.preload:
            out = subprocess.run([DAEMON, "index", "--config", str(cfg), "--dataset", "bench"], check=True, capture_output=True, text=True).stdout.split()
            chunks = float(out[out.index("chunks") - 1]) if "chunks" in out else float(out[-2])
            addr = (work / "state" / "metrics.addr").read_text().strip()
            # Until every chunk is cached, or the count stops growing for 10 s (the preload
            # stopped at the memory budget): the consumer then starts on what is there.
            last, since = -1.0, time.perf_counter()
            while True:
                text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
                held = [float(l.split()[-1]) for l in text.splitlines() if l.startswith("minibatchd_chunk_cache_chunks ")]
                now = held[0] if held else 0.0
                if now >= chunks:
                    break
                if now != last:
                    last, since = now, time.perf_counter()
                elif time.perf_counter() - since > 10:
                    print(f"preload stalled at {now:.0f} of {chunks:.0f} chunks (memory budget?); starting the consumer", file=sys.stderr)
                    break
                if daemon.poll() is not None:
                    sys.exit("the daemon exited")
                time.sleep(0.05)
            preload_s = time.perf_counter() - t0 - index_s
        if consumers is None:
            consumers = spawn_consumers(a, sock, work, wait=False)
        outs = [c.communicate() for c in consumers]
        for c, (_, err) in zip(consumers, outs):
            if c.returncode != 0:
                sys.exit(f"a consumer failed:\n{err}")
        all_r = [json.loads(o) for o, _ in outs]
        r = all_r[0]
        mem = rss_kib(daemon.pid)
        daemon_cpu = daemon_cpu_s(daemon.pid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    window = f"window {a.window_chunks} chunks" if a.window_chunks else "CNTK's default window"
    print(f"file: {files} ({data.stat().st_size / 2**20:.0f} MiB), minibatch {a.minibatch_size}, randomized, {window}, memory limit {a.memory_limit / 2**20:.0f} MiB, {a.sweeps} sweep(s), {os.cpu_count()} cores")
    print(f"daemon start (index pass or cache): {index_s:.2f} s")
    if preload_s is not None:
        print(f"preload (every chunk parsed before the consumer starts): {preload_s:.2f} s")
    print(f"minibatches: {r['minibatches']}, samples: {r['samples']}, first minibatch after {r['first_minibatch_s']:.3f} s")
    for k, (secs, n, payload, mbs) in enumerate(r["per_sweep"]):
        kind = ("first, chunks preloaded" if a.preload else "cold: parses the file") if k == 0 else "later"
        print(f"sweep {k} ({kind}): {n / secs:,.0f} samples/s, {payload / secs / 1e6:,.1f} MB/s of minibatch payload, {data.stat().st_size / secs / 1e6:,.1f} MB/s of text ({mbs} minibatches in {secs:.2f} s)")
    print(f"all sweeps: {r['samples'] / r['wall_s']:,.0f} samples/s over {r['wall_s']:.2f} s")
    # The clock a user sees: from `minibatchd run` (index pass or its cache, the consumer's start
    # and `open` included) to the end of each sweep.
    if r.get("first_unix"):
        print(f"user clock: first minibatch {r['first_unix'] - t0_unix:.3f} s after minibatchd run")
    for k, end in enumerate(r.get("sweep_ends_unix", [])):
        print(f"user clock: sweep {k} ended {end - t0_unix:.3f} s after minibatchd run")
    if a.sessions > 1:
        total = sum(x["samples"] for x in all_r) / max(x["wall_s"] for x in all_r)
        print(f"{a.sessions} sessions at once: {total:,.0f} samples/s in all (first sweep of each: " + ", ".join(f"{x['per_sweep'][0][1] / x['per_sweep'][0][0]:,.0f}" for x in all_r) + " samples/s)")
    print(f"client overhead: {r['ready_next_us']:.1f} us mean, {r['ready_next_median_us']:.1f} us median per next() on a ready slot ({PROBE} timed; {r['probe_waited_us']:.0f} us of waits among them); {r['cpu_s'] / r['minibatches'] * 1e6:.1f} us consumer CPU (user+sys, blocking waits included) per minibatch")
    if r.get("stages"):
        print("daemon time during the sweeps (s): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["stages"].items())))
    print(f"daemon CPU: start and index pass {cpu_at_start[0]:.2f} s user, {cpu_at_start[1]:.2f} s system; then sweeps and probe {daemon_cpu[0] - cpu_at_start[0]:.2f} s user, {daemon_cpu[1] - cpu_at_start[1]:.2f} s system")
    print(f"daemon RSS at end: {mem.get('VmRSS', 0) / 1024:.0f} MiB (peak {mem.get('VmHWM', 0) / 1024:.0f} MiB), {mem.get('AnonHugePages', 0) / 1024:.0f} MiB of it in transparent huge pages")


if __name__ == "__main__":
    main()
