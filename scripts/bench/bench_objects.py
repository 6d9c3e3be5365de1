#!/usr/bin/env python3
"""The daemon benchmark (scripts/bench/bench_daemon.py: the 1 GiB dense CTF file, a separate Python
consumer, randomized, minibatch 256) on local files and on the same files in object storage
behind 20 ms of added latency, alternated in one run. The file is cut at line ends into objects
of --object-bytes if given (default: one object, the file itself); the local baseline reads the
same files from a local directory.

    scripts/bench/bench_objects.py [--size-bytes 1073741824] [--delay-ms 20] [--runs 3] [--sweeps 1]

The S3 server (--server) is minibatchd-bench-s3 (crates/bench-tools/src/bin/bench_s3.rs: a directory served over
the S3 API, the latency added to every request by the server itself; default), or, behind
scripts/dev/s3_fault_proxy.py --delay-ms, moto's server mode from the project's .venv (pure Python,
about 70 MB/s per request here, and a ranged GET costs in proportion to the whole object) or
s3s-fs (`cargo install s3s-fs@0.14.1 --features binary`, which hashes the whole object for every
request: about 100 MB/s for 32 MiB objects). With the last two the server, not minibatchd, bounds
the result on a 2-core machine. Each object-storage
run starts cold: a fresh state directory (no object cache, no local index) and no shared
index in the bucket, so its first sweep includes the streaming index pass as the local run's
includes the local one; a second figure is taken with the shared index present (a second node).
Prints samples/s of the first sweep for each run, the median of each kind, and the ratio.
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
BUCKET = "bench"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not answer on port {port}")


def first_sweep(out: str) -> float:
    for line in out.splitlines():
        if line.startswith("sweep 0"):
            return float(line.split("): ", 1)[1].split("samples/s")[0].replace(",", "").strip())
    sys.exit(f"no sweep 0 in:\n{out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-bytes", type=int, default=1 << 30)
    ap.add_argument("--delay-ms", type=float, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sweeps", type=int, default=1)
    ap.add_argument("--workdir", default=str(ROOT / "target" / "bench-objects"))
    ap.add_argument("--server", choices=["bench", "s3s-fs", "moto"], default="bench",
                    help="bench: minibatchd-bench-s3 (default); s3s-fs or moto behind scripts/dev/s3_fault_proxy.py")
    ap.add_argument("--object-bytes", type=int, default=0,
                    help="cut the file (at line ends) into objects of about this size (0: one object, the file itself); "
                         "the local baseline reads the same files from a local directory")
    a = ap.parse_args()
    work = Path(a.workdir).resolve()  # the config written there names paths relative to itself
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "--workspace", "--bins"], cwd=ROOT, check=True)
    data = work / "bench.ctf"
    if not data.exists() or abs(data.stat().st_size - a.size_bytes) > a.size_bytes // 10:
        subprocess.run([str(ROOT / "target/release/minibatchd-gen"), "ctf-dense", str(data), str(a.size_bytes), "128", "10"], check=True)

    # The same bytes as objects of about --object-bytes each (at line ends), in a local directory
    # (the baseline) and in the bucket's directory of the file-system server.
    store = work / "s3root"
    split = store / BUCKET / "split"
    stamp = split / f".from-{data.stat().st_size}-{a.object_bytes}"
    if a.object_bytes == 0 and not stamp.exists():
        shutil.rmtree(split, ignore_errors=True)
        split.mkdir(parents=True)
        os.link(data, split / "part-0000.ctf")
        stamp.touch()
    elif not stamp.exists():
        shutil.rmtree(split, ignore_errors=True)
        split.mkdir(parents=True)
        with open(data, "rb") as f:
            n, carry = 0, b""
            while True:
                block = f.read(a.object_bytes)
                if not block and not carry:
                    break
                piece = carry + block
                cut = piece.rfind(b"\n") + 1 if block else len(piece)
                piece, carry = piece[:cut], piece[cut:]
                (split / f"part-{n:04d}.ctf").write_bytes(piece)
                n += 1
        stamp.touch()
    parts = sorted(split.glob("part-*.ctf"))
    server_port, proxy_port = free_port(), free_port()
    s3s = shutil.which("s3s-fs") or str(Path.home() / ".cargo/bin/s3s-fs")
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy_port}", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_CONFIG_FILE="/nonexistent")
    if a.server == "bench":
        kind = "minibatchd-bench-s3"
        server = subprocess.Popen([str(ROOT / "target/release/minibatchd-bench-s3"), "--root", str(store), "--port",
                                   str(server_port), "--delay-ms", str(a.delay_ms)])
    elif a.server == "s3s-fs":
        kind = "s3s-fs"
        (store / BUCKET).mkdir(parents=True, exist_ok=True)
        server = subprocess.Popen([s3s, "--host", "127.0.0.1", "--port", str(server_port), "--access-key", "bench",
                                   "--secret-key", "bench", str(store)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        kind = "moto (pure Python: its own speed bounds the result)"
        server = subprocess.Popen([str(Path(PY).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(server_port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [server]
    try:
        wait_port(server_port, server, "the S3 server")
        if a.server == "bench":
            # The server adds the latency itself.
            env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{server_port}"
        else:
            proxy = subprocess.Popen([PY, str(ROOT / "scripts/dev/s3_fault_proxy.py"), "--listen", str(proxy_port), "--upstream",
                                      f"127.0.0.1:{server_port}", "--delay-ms", str(a.delay_ms)])
            procs.append(proxy)
            wait_port(proxy_port, proxy, "the latency proxy")
        if kind.startswith("moto"):
            up = ("import boto3, sys, os; s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='b', "
                  "aws_secret_access_key='b', region_name='us-east-1'); s3.create_bucket(Bucket=sys.argv[2]); "
                  "[s3.upload_file(p, sys.argv[2], 'split/' + os.path.basename(p)) for p in sys.argv[3:]]")
            subprocess.run([PY, "-c", up, f"http://127.0.0.1:{server_port}", BUCKET, *map(str, parts)], check=True)

        def drop_shared_indexes() -> None:
            for p in split.glob("*.mbdidx*"):
                p.unlink()
            if kind.startswith("moto"):
                rm = ("import boto3, sys; s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='b', "
                      "aws_secret_access_key='b', region_name='us-east-1'); "
                      "[s3.delete_object(Bucket=sys.argv[2], Key=o['Key']) for o in s3.list_objects_v2(Bucket=sys.argv[2]).get('Contents', []) if '.mbdidx' in o['Key']]")
                subprocess.run([PY, "-c", rm, f"http://127.0.0.1:{server_port}", BUCKET], check=True)

        def bench(url: str) -> str:
            e = dict(env, BENCH_FILES_URL=url)
            out = subprocess.run([PY, str(ROOT / "scripts/bench/bench_daemon.py"), "--size-bytes", str(a.size_bytes), "--sweeps",
                                  str(a.sweeps), "--workdir", str(work)], env=e, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"the benchmark failed:\n{out.stdout}\n{out.stderr}")
            return out.stdout

        url = f"s3://{BUCKET}/split/part-*.ctf"
        local, cold, shared = [], [], []
        for run in range(a.runs):
            local.append(first_sweep(bench(str(split / "part-*.ctf"))))
            drop_shared_indexes()
            cold.append(first_sweep(bench(url)))
            shared.append(first_sweep(bench(url)))
            print(f"run {run + 1}: local {local[-1]:,.0f}, object storage cold {cold[-1]:,.0f}, "
                  f"with the shared index {shared[-1]:,.0f} samples/s in the first sweep", flush=True)
        ml, mc, ms = statistics.median(local), statistics.median(cold), statistics.median(shared)
        print(f"server: {kind}; {a.delay_ms:g} ms added to every request; {data.stat().st_size / 2**20:.0f} MiB in "
              f"{len(parts)} objects (and the same local files); "
              f"{os.cpu_count()} cores; {a.runs} runs alternated")
        print(f"first sweep, median samples/s: local {ml:,.0f} ({min(local):,.0f}-{max(local):,.0f}); "
              f"object storage cold {mc:,.0f} ({min(cold):,.0f}-{max(cold):,.0f}), ratio {mc / ml:.2f}; "
              f"with the shared index {ms:,.0f} ({min(shared):,.0f}-{max(shared):,.0f}), ratio {ms / ml:.2f}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
