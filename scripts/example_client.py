#!/usr/bin/env python3
"""Reads one randomized sweep of the bundled example through a running daemon and prints a line
per minibatch, then checks that the session's minibatches equal `minibatchd dump` with the same
options. Used by scripts/run-example.sh; run it yourself against any daemon:

    PYTHONPATH=clients/python .venv/bin/python scripts/example_client.py SOCKET
"""
import json
import subprocess
import sys
from pathlib import Path

import minibatchd

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    sock = sys.argv[1]
    client = minibatchd.connect(sock)
    source = client.open("train", minibatch_size=8, full_sweep=True, seed=0)
    got = []
    for mb in source:
        x = mb["features"].values
        labels = mb["labels"]
        print(f"minibatch {len(got):2d}: {x.shape[0]:2d} samples in {len(mb['features'].sequence_offsets) - 1} sequences, "
              f"{labels.indices.shape[0]} labels, position {source.state()['position']}")
        got.append(mb.to_dump())
        mb.release()
    dump = subprocess.run(
        [str(ROOT / "target/release/minibatchd"), "dump", "--config", str(ROOT / "conf/example.toml"), "--dataset", "train",
         "--minibatch-size", "8", "--full-sweep", "--seed", "0"],
        check=True, capture_output=True, text=True).stdout
    expected = [json.loads(line) for line in dump.splitlines()]
    print(f"{len(got)} minibatches through shared memory; identical to `minibatchd dump`: {got == expected}")
    sys.exit(0 if got == expected else 1)


if __name__ == "__main__":
    main()
