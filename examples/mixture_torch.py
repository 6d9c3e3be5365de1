#!/usr/bin/env python3
"""A weighted mixture of two datasets trained with PyTorch, checked against the ledger.

Self-contained: in a temporary directory it writes a CTF dataset (`web`) and a libsvm file,
converts the libsvm file to CTF (`clicks`: a CTF dataset and a libsvm one have different kinds of
sparse streams, so a libsvm file joins a mixture as CTF — see docs/mixtures.md), configures the
mixture `blend` (3 : 1; an epoch ends when the first source ends its sweep), starts `minibatchd
run` on it, and trains a linear classifier for a few epochs through `MinibatchDataLoader` with two
DataLoader workers. Then it proves what the run saw: each worker's fingerprints, epoch by epoch,
are what `minibatchd dump --mixture blend --ledger` prints for that worker, and over each epoch
every sequence of each source's sweep came at most once — the source that ended the epoch, its
whole sweep exactly once.

    python examples/mixture_torch.py [--binary target/release/minibatchd] [--epochs 3]
"""

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from minibatchd import ledger
from minibatchd.torch import MinibatchDataLoader, MinibatchIterableDataset


def write_data(tmp: Path, rng: random.Random) -> None:
    """`web.ctf`: 600 lines, 4 features and a class; `clicks.svm`: 300 libsvm lines (label, then
    `id:value` of 4 features), converted to `clicks.ctf` with the same streams."""
    with open(tmp / "web.ctf", "w") as f:
        for _ in range(600):
            x = [rng.uniform(-1, 1) for _ in range(4)]
            f.write(f"|features {' '.join(f'{v:.4f}' for v in x)} |label {int(x[0] + x[1] > 0)}:1\n")
    with open(tmp / "clicks.svm", "w") as f:
        for _ in range(300):
            x = [rng.uniform(-1, 1) for _ in range(4)]
            f.write(f"{int(x[2] - x[3] > 0)} " + " ".join(f"{i}:{v:.4f}" for i, v in enumerate(x) if v != 0) + "\n")
    with open(tmp / "clicks.svm") as src, open(tmp / "clicks.ctf", "w") as dst:
        for line in src:
            label, *features = line.split()
            dense = [0.0] * 4
            for feature in features:
                i, v = feature.split(":")
                dense[int(i)] = float(v)
            dst.write(f"|features {' '.join(f'{v:.4f}' for v in dense)} |label {label}:1\n")


def write_config(tmp: Path) -> Path:
    streams = lambda d: (f'[datasets.{d}.streams.features]\nalias = "features"\ndim = 4\nformat = "dense"\n'
                         f'[datasets.{d}.streams.label]\nalias = "label"\ndim = 2\nformat = "sparse"\n')
    config = tmp / "minibatchd.toml"
    config.write_text(f"""[daemon]
socket = "{tmp}/mbd.sock"
state_dir = "{tmp}/state"
metrics_listen = "127.0.0.1:0"
shutdown_grace_secs = 1

[datasets.web]
format = "ctf"
files = ["{tmp}/web.ctf"]
chunk_size_bytes = 4096
{streams("web")}[datasets.web.sampling]
window_chunks = 4
seed = 1

[datasets.clicks]
format = "ctf"
files = ["{tmp}/clicks.ctf"]
chunk_size_bytes = 2048
{streams("clicks")}
[mixtures.blend]
datasets = ["web", "clicks"]
weights = [3, 1]
epoch = "first_sweep_end"
""")
    return config


def start_daemon(binary: str, config: Path, sock: str) -> subprocess.Popen:
    daemon = subprocess.Popen([binary, "run", "--config", str(config)], env=dict(os.environ, MINIBATCHD_LOG="warn"),
                              stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        if daemon.poll() is not None:
            sys.exit("the daemon exited at start")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            return daemon
        except OSError:
            if time.monotonic() > deadline:
                daemon.kill()
                sys.exit("the daemon did not open its socket")
            time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("MINIBATCHD_BIN") or "minibatchd")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--minibatch-size", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        write_data(tmp, random.Random(7))
        config = write_config(tmp)
        daemon = start_daemon(args.binary, config, str(tmp / "mbd.sock"))
        try:
            seen = train(args, str(tmp / "mbd.sock"))
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
        check(args, config, seen)


def train(args: argparse.Namespace, sock: str) -> list:
    """Trains; returns, per epoch, each worker's recorded `meta` in step order."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ds = MinibatchIterableDataset("blend", sock, minibatch_size=args.minibatch_size, use_torchrun_env=False)
    loader = MinibatchDataLoader(ds, num_workers=2)
    seen = []
    for epoch in range(args.epochs):
        recorded: dict = {0: [], 1: []}
        total, correct = 0.0, 0
        for item in loader:
            x, y = item["features"]["values"], item["label"]["indices"].long()
            if len(x) == 0:
                continue  # a worker's share of a minibatch of fewer sequences than workers
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(x)
            correct += int((logits.argmax(1) == y).sum())
            recorded[item["meta"]["worker"]].append(item["meta"])
        samples = sum(len(m["sources"]) for w in recorded.values() for m in w)
        from_clicks = sum(m["sources"].count(1) for w in recorded.values() for m in w)
        print(f"epoch {epoch}: {samples} samples ({from_clicks} from clicks), loss {total / samples:.3f}, "
              f"accuracy {correct / samples:.3f}")
        seen.append(recorded)
    return seen


def check(args: argparse.Namespace, config: Path, seen: list) -> None:
    """Each worker saw what the ledger says; over the run every sweep a source completed came
    whole and exactly once, the sweep in progress at most once."""
    everything = []
    for epoch, recorded in enumerate(seen):
        want = [ledger.expected_mixture(str(config), "blend", binary=args.binary, minibatch_size=args.minibatch_size,
                                        workers=2, rank=w, sweep=epoch) for w in range(2)]
        for w in range(2):
            # Empty shares (a minibatch of fewer sequences than workers) were skipped in training.
            step = ledger.first_divergence(recorded[w], [e for e in want[w] if e["sequences"]])
            if step is not None:
                sys.exit(f"epoch {epoch}, worker {w}: the run diverges from the ledger at step {step}")
        if len(want[0][-1]["sweeps_ended"]) != 1:
            sys.exit(f"epoch {epoch} did not end with one source's sweep")
        everything.extend(want)
    once = ledger.exactly_once(everything)
    sizes = {0: 600, 1: 300}
    for (source, sweep), counts in sorted(once.items()):
        if any(n != 1 for n in counts.values()):
            sys.exit(f"source {source}, sweep {sweep}: a sequence came twice")
        last = max(s for src, s in once if src == source)
        if sweep < last and len(counts) != sizes[source]:
            sys.exit(f"source {source}, sweep {sweep}: {len(counts)} of {sizes[source]} sequences")
    print(f"{len(seen)} epochs: every worker saw what the ledger says; every sweep of each source exactly once")


if __name__ == "__main__":
    main()
