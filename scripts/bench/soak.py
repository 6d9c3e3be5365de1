#!/usr/bin/env python3
"""A long soak of the daemon as operators run it: `minibatchd run` scraped by a real Prometheus
(with conf/grafana/alerts.yml loaded) while trainer processes come and go for --minutes.

    scripts/bench/soak.py [--minutes 30] [--workers 3] [--seed 0] [--workdir DIR] [--out DIR]

The trainers are separate Python processes using the real client, one per session, each
"computing" 10-40 us per sample, in a loop chosen by a seeded generator: randomized sessions over two sweeps, named sessions closed halfway
and continued by name from another process, two ranks of a distributed session, a sequential
session of a second dataset, and trainers killed with SIGKILL mid-stream. The data is a CTF file
whose `id` stream numbers its samples, and the memory limit is below the parsed size, so chunks
are evicted and parsed again all along. The daemon gets SIGHUP every few minutes.

Checked, and the script exits 1 when one fails:
* every finished session delivered each sample exactly as often as its sweeps say (the two ranks
  and the two halves of a named session together), the sequential one in file order;
* every query of the dashboard and every alert expression (without its threshold) returns data
  over the whole soak, finite and within its panel's unit (step 15 s, rate window 1 m);
* no alert fired (ALERTS{alertstate="firing"} stayed empty), and no stage restarted;
* the daemon's resident memory, threads and open files do not grow: the last fifth of the soak
  stays within the envelope of its second fifth (+10 % RSS, +4 threads, +8 files), and at the end,
  with no session attached, `minibatchd_session_clients` is 0 and the lingering sessions are at
  most `max_sessions`;
* SIGTERM stops the daemon with exit status 0 and a checkpoint.

Every panel is rendered to PNG under --out (scripts/ops/render_dashboard.py) with samples of RSS,
threads and files (soak.json). Needs the release binary (built here), Prometheus (Debian's package,
scripts/setup.sh) and .venv (numpy, matplotlib).
"""

import argparse
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
import daemon_kit  # noqa: E402  (scripts/lib: the config writer and daemon start every script shares)
from daemon_kit import DAEMON, ROOT  # noqa: E402
from render_dashboard import query_range  # noqa: E402  (one way to ask Prometheus)
SAMPLES = 120_000
DIM = 64
MAX_SESSIONS = 16


def child(spec: dict) -> None:
    """One trainer process: reads as `spec` says and writes the ids it saw to spec["ids"]."""
    sys.path.insert(0, str(ROOT / "clients" / "python"))
    import numpy as np
    import minibatchd

    options = spec["options"]
    source = minibatchd.connect(spec["socket"], timeout=60).open(spec["dataset"], **options)
    ids = []
    limit = spec.get("minibatches")
    for n, mb in enumerate(source):
        ids.append(np.array(mb["id"].values[:, 0], dtype=np.int64))
        mb.release()
        if spec.get("sleep"):
            time.sleep(spec["sleep"])
        if limit is not None and n + 1 >= limit:
            break
    source.close()
    np.save(spec["ids"], np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64))
    print("done", flush=True)


def write_data(path: Path) -> None:
    rng = random.Random(7)
    with path.open("w") as f:
        for i in range(SAMPLES):
            f.write(f"|id {i} |x " + " ".join(f"{rng.random():.4f}" for _ in range(DIM)) + "\n")


def write_config(work: Path, interval: int) -> Path:
    streams = {"id": {"dim": 1, "format": "dense"}, "x": {"dim": DIM, "format": "dense"}}
    return daemon_kit.write_config(work / "minibatchd.toml", {
        "daemon": {"socket": f"{work}/mbd.sock", "metrics_listen": "127.0.0.1:0", "state_dir": f"{work}/state",
                   "memory_limit_bytes": 64 << 20, "ring_slots": 4, "slot_size_bytes": 1 << 20,
                   "session_linger_secs": 120, "max_sessions": MAX_SESSIONS, "checkpoint_interval_secs": interval,
                   "host_memory_reserve_bytes": 0},
        "datasets": {
            "train": {"format": "ctf", "files": [f"{work}/soak.ctf"], "chunk_size_bytes": 1 << 20,
                      "streams": streams, "sampling": {"randomize": True, "window_chunks": 4}},
            "ordered": {"format": "ctf", "files": [f"{work}/soak.ctf"], "chunk_size_bytes": 4 << 20,
                        "streams": streams, "sampling": {"randomize": False}},
        },
    })


class Soak:
    def __init__(self, a, work: Path, sock: str):
        self.a, self.work, self.sock = a, work, sock
        self.failures: list[str] = []
        self.done: dict[str, int] = {}
        self.lock = threading.Lock()
        self.seq = 0

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)
        print(f"FAIL {what}", flush=True)

    def count(self, what: str) -> None:
        with self.lock:
            self.done[what] = self.done.get(what, 0) + 1

    def spawn(self, dataset: str, options: dict, minibatches=None, sleep=0.0):
        with self.lock:
            self.seq += 1
            ids = self.work / f"ids-{self.seq}.npy"
        spec = {"socket": self.sock, "dataset": dataset, "options": options, "ids": str(ids),
                "minibatches": minibatches, "sleep": sleep}
        p = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "clients/python")))
        return p, ids

    def finish(self, what: str, p, ids: Path):
        import numpy as np
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            self.fail(f"{what}: trainer exited {p.returncode}: {err.strip()[-300:]}")
            return None
        got = np.load(ids)
        ids.unlink()
        return got

    def exactly(self, what: str, got, times: int) -> None:
        import numpy as np
        counts = np.bincount(got, minlength=SAMPLES)
        if len(counts) != SAMPLES or not (counts == times).all():
            bad = np.nonzero(counts != times)[0][:5]
            self.fail(f"{what}: not every sample {times}x (ids {bad.tolist()} seen {counts[bad].tolist()} times)")
        else:
            self.count(what)

    def worker(self, w: int, deadline: float) -> None:
        import numpy as np
        rng = random.Random(self.a.seed * 1000 + w)
        n = 0
        while time.time() < deadline and len(self.failures) < 20:
            n += 1
            scenario = rng.choice(["sweeps", "sweeps", "resume", "ranks", "ordered", "killed"])
            mbs = rng.choice([32, 64, 256])
            # A trainer's compute per minibatch: 10-40 us per sample (a small model on a CPU).
            sleep = mbs * rng.choice([10e-6, 20e-6, 40e-6])
            seed = rng.randrange(1 << 20)
            try:
                if scenario == "sweeps":
                    p, ids = self.spawn("train", {"minibatch_size": mbs, "max_sweeps": 2, "seed": seed}, sleep=sleep)
                    got = self.finish(scenario, p, ids)
                    if got is not None:
                        self.exactly(scenario, got, 2)
                elif scenario == "resume":
                    name = f"soak-{w}-{n}"
                    opts = {"minibatch_size": mbs, "full_sweep": True, "seed": seed, "session": name}
                    p, ids = self.spawn("train", opts, minibatches=rng.randrange(1, SAMPLES // mbs), sleep=sleep)
                    first = self.finish(scenario, p, ids)
                    p, ids = self.spawn("train", opts, sleep=sleep)
                    rest = self.finish(scenario, p, ids)
                    if first is not None and rest is not None:
                        self.exactly(scenario, np.concatenate([first, rest]), 1)
                elif scenario == "ranks":
                    parts = [self.spawn("train", {"minibatch_size": mbs, "full_sweep": True, "seed": seed,
                                                  "num_workers": 2, "rank": r}, sleep=sleep) for r in (0, 1)]
                    got = [self.finish(scenario, p, ids) for p, ids in parts]
                    if all(g is not None for g in got):
                        self.exactly(scenario, np.concatenate(got), 1)
                elif scenario == "ordered":
                    p, ids = self.spawn("ordered", {"minibatch_size": mbs, "full_sweep": True}, sleep=sleep)
                    got = self.finish(scenario, p, ids)
                    if got is not None:
                        if len(got) != SAMPLES or not (got == np.arange(SAMPLES)).all():
                            self.fail(f"ordered: not the file's order ({len(got)} samples)")
                        else:
                            self.count(scenario)
                else:
                    p, ids = self.spawn("train", {"minibatch_size": mbs, "max_sweeps": 3, "seed": seed}, sleep=0.001)
                    time.sleep(rng.uniform(0.3, 3.0))
                    p.kill()
                    p.communicate()
                    ids.unlink(missing_ok=True)
                    self.count(scenario)
            except Exception as e:  # a broken trainer is a finding, not the end of the soak
                self.fail(f"{scenario}: {e!r}")


def alert_value(expr: str) -> str:
    if expr.startswith("absent(") and expr.endswith(")"):
        return expr[len("absent("):-1]
    cut = max((expr.rfind(op) for op in (" > ", " < ", " == ")), default=-1)
    if cut >= 0:
        try:
            float(expr[cut + 3:].strip())
            return expr[:cut]
        except ValueError:
            pass
    return expr


def check_queries(base: str, start: float, end: float) -> list[str]:
    """Every dashboard query and alert expression over the soak: data, finite, within its unit."""
    problems = []
    dash = json.loads((ROOT / "conf/grafana/minibatchd.json").read_text())
    exprs = []
    for panel in dash["panels"]:
        if panel.get("type") == "row":
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        by_ref = {}
        for o in panel.get("fieldConfig", {}).get("overrides", []):
            if o.get("matcher", {}).get("id") == "byFrameRefID":
                for prop in o.get("properties", []):
                    if prop.get("id") == "unit":
                        by_ref[o["matcher"]["options"]] = prop["value"]
        for t in panel.get("targets", []):
            e = t["expr"].replace("$instance", ".*").replace("$dataset", ".*").replace("$__rate_interval", "1m")
            exprs.append((f"panel {panel['title']!r} {t.get('legendFormat', '')}", e, by_ref.get(t.get("refId"), unit)))
    for line in (ROOT / "conf/grafana/alerts.yml").read_text().splitlines():
        line = line.strip()
        if line.startswith("expr: "):
            exprs.append((f"alert {line[6:]}", alert_value(line[6:]), "short"))
    for what, e, unit in exprs:
        try:
            result = query_range(base, e, start, end, 15)
        except Exception as err:
            problems.append(f"{what}: {err}")
            continue
        points = 0
        for series in result:
            for _, text in series["values"]:
                x = float(text)
                points += 1
                if not math.isfinite(x):
                    problems.append(f"{what}: {text} for {series['metric']}")
                    break
                if unit == "percentunit" and not -1e-9 <= x <= 1 + 1e-9 or unit in ("bytes", "Bps", "s", "ops", "reqps", "cps") and x < 0:
                    problems.append(f"{what}: {x} outside the unit {unit} for {series['metric']}")
                    break
        if points == 0:
            problems.append(f"{what}: no data over the soak")
    print(f"{len(exprs)} queries over {end - start:.0f} s: {len(problems)} problems", flush=True)
    return problems


def proc_sample(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    field = {l.split(":")[0]: l.split(":")[1].strip() for l in status.splitlines() if ":" in l}
    return {"t": time.time(), "rss": int(field["VmRSS"].split()[0]) * 1024, "threads": int(field["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def scrape(addr: str) -> dict:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(metrics: dict, prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k == prefix or k.startswith(prefix + "{"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=str(ROOT / "target/soak"))
    ap.add_argument("--out", default=str(ROOT / "target/soak/out"))
    ap.add_argument("--reload-every", type=float, default=240)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    work, out = Path(a.workdir).resolve(), Path(a.out).resolve()
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "--bin", "minibatchd"], cwd=ROOT, check=True)
    write_data(work / "soak.ctf")
    cfg = write_config(work, 5)
    log = (work / "daemon.log").open("w")
    daemon = daemon_kit.spawn(cfg, log=log)
    addr_file = work / "state/metrics.addr"
    t0 = time.time()
    while not addr_file.exists():
        if time.time() - t0 > 120 or daemon.poll() is not None:
            sys.exit(f"the daemon did not start: see {work / 'daemon.log'}")
        time.sleep(0.2)
    addr = addr_file.read_text().strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prom_dir = work / "prometheus"
    prom_dir.mkdir()
    (prom_dir / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n"
        f"rule_files:\n  - {ROOT / 'conf/grafana/alerts.yml'}\n"
        f"scrape_configs:\n  - job_name: minibatchd\n    static_configs:\n      - targets: [\"{addr}\"]\n")
    prom = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={prom_dir / 'prometheus.yml'}",
                             f"--storage.tsdb.path={prom_dir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    soak = Soak(a, work, str(work / "mbd.sock"))
    samples = []
    try:
        start = time.time()
        deadline = start + a.minutes * 60
        workers = [threading.Thread(target=soak.worker, args=(w, deadline)) for w in range(a.workers)]
        for t in workers:
            t.start()
        next_reload, interval = start + a.reload_every, 5
        while any(t.is_alive() for t in workers):
            samples.append(proc_sample(daemon.pid))
            if time.time() >= next_reload:
                interval = 11 - interval  # 5 <-> 6: a real change each time
                write_config(work, interval)
                daemon.send_signal(signal.SIGHUP)
                next_reload += a.reload_every
            if daemon.poll() is not None:
                soak.fail(f"the daemon exited with {daemon.returncode}")
                break
            time.sleep(10)
        for t in workers:
            t.join()
        time.sleep(15)  # two scrapes with every client gone
        samples.append(proc_sample(daemon.pid))
        end = time.time()
        m = scrape(addr)
        if total(m, "minibatchd_session_clients") != 0:
            soak.fail(f"minibatchd_session_clients is {total(m, 'minibatchd_session_clients')} with no client attached")
        lingering = m.get('minibatchd_sessions{state="lingering"}', 0)
        if lingering > MAX_SESSIONS:
            soak.fail(f"{lingering} lingering sessions, more than max_sessions = {MAX_SESSIONS}")
        if total(m, "minibatchd_stage_restarts_total") != 0:
            soak.fail(f"{total(m, 'minibatchd_stage_restarts_total')} stage restarts")
        reloads = m.get('minibatchd_config_reloads_total{result="success"}', 0)
        for p in check_queries(base, start, end):
            soak.fail(p)
        firing = query_range(base, 'ALERTS{alertstate="firing"}', start, end, 15)
        for series in firing:
            soak.fail(f"alert fired: {series['metric']}")
        # Growth: the last fifth against the second fifth (the first holds the cold start).
        span = end - start
        second = [s for s in samples if start + span / 5 <= s["t"] < start + 2 * span / 5]
        last = [s for s in samples if s["t"] >= end - span / 5]
        growth = {}
        if second and last:
            for key, slack in (("rss", None), ("threads", 4), ("fds", 8)):
                envelope = max(s[key] for s in second)
                peak = max(s[key] for s in last)
                limit = envelope * 1.10 if slack is None else envelope + slack
                growth[key] = {"second_fifth_max": envelope, "last_fifth_max": peak}
                if peak > limit:
                    soak.fail(f"{key} grew: {envelope} in the second fifth, {peak} in the last")
        subprocess.run([sys.executable, str(ROOT / "scripts/ops/render_dashboard.py"), "--prometheus", base, "--out", str(out),
                        "--start", f"{start:.0f}", "--end", f"{end:.0f}"], check=True, stdout=subprocess.DEVNULL)
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(timeout=120)
        if rc != 0:
            soak.fail(f"SIGTERM: exit status {rc}")
        if not (work / "state/checkpoint.json").exists():
            soak.fail("no checkpoint after SIGTERM")
        summary = {"minutes": round(span / 60, 1), "workers": a.workers, "sessions": soak.done, "reloads": reloads,
                   "minibatches": total(m, "minibatchd_session_minibatches_total"),
                   "chunks_parsed": total(m, "minibatchd_chunks_parsed_total"),
                   "cache_evictions": total(m, "minibatchd_chunk_cache_evictions_total"),
                   "lingering": lingering, "growth": growth, "failures": soak.failures,
                   "rss_mib": [round(s["rss"] / 2**20, 1) for s in samples[:: max(1, len(samples) // 30)]]}
        (out / "soak.json").write_text(json.dumps({**summary, "samples": samples}, indent=1))
        print(json.dumps(summary, indent=1))
    finally:
        if daemon.poll() is None:
            daemon.kill()
        prom.terminate()
        prom.wait()
    sys.exit(1 if soak.failures else 0)


if __name__ == "__main__":
    main()
