"""The daemon agrees with `dump` on the CNTK parity corpus (tests/parity/cases, recorded from the
real CNTK 2.7 by scripts/oracle/cntk_diff.py): for multi-worker cases, a session opened through this
client at every rank delivers exactly what `minibatchd dump` prints for that rank. tests/parity.rs
checks `dump` against CNTK's answers; this closes the loop to the shared-memory path."""

import json
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import minibatchd

from conftest import BIN, DEADLINE, ROOT, Daemon, daemon_section

CORPUS = ROOT / "tests" / "parity" / "cases"
GROUPS = 12


class CorpusDaemon(Daemon):
    """A daemon on a config made of several corpus cases, one dataset each."""

    def __init__(self, tmp: Path, datasets: str):
        self.tmp = tmp
        self.socket = str(tmp / "mbd.sock")
        self.config = tmp / "minibatchd.toml"
        self.config.write_text(daemon_section(tmp, self.socket) + "\n" + datasets)
        self._start()


def arg(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def session_options(args):
    """The `dump` arguments of a fixture as session options."""
    opts = {
        "minibatch_size": int(arg(args, "--minibatch-sizes")),
        "num_workers": int(arg(args, "--workers")),
        "rank": int(arg(args, "--rank")),
        "randomize": arg(args, "--randomize") == "true",
        "seed": int(arg(args, "--seed")),
    }
    for flag, key in (("--window-chunks", "window_chunks"), ("--window-samples", "window_samples"),
                      ("--max-sweeps", "max_sweeps"), ("--max-samples", "max_samples")):
        if flag in args:
            opts[key] = int(arg(args, flag))
    if "--full-sweep" in args:
        opts["full_sweep"] = True
    if "--frame-mode" in args:
        opts["frame_mode"] = True
    return opts


def chosen_groups():
    """Multi-worker groups with one minibatch size and no restore (a session resumes from a
    state, not a raw position), every rank present, spread over the corpus."""
    groups = defaultdict(list)
    for path in sorted(CORPUS.glob("*.json")):
        f = json.loads(path.read_text())
        args = f["args"]
        if int(arg(args, "--workers")) < 2 or "," in arg(args, "--minibatch-sizes"):
            continue
        if "--restore" in args or "--restore-before" in args or f["end"] == "error":
            continue
        groups[f["name"].rsplit("-r", 1)[0]].append(f)
    complete = [g for _, g in sorted(groups.items()) if len(g) == int(arg(g[0]["args"], "--workers"))]
    step = max(1, len(complete) // GROUPS)
    return complete[::step][:GROUPS]


def test_every_rank_of_corpus_cases_gets_what_dump_prints(tmp_path):
    groups = chosen_groups()
    assert len(groups) >= 8, f"only {len(groups)} multi-worker groups in {CORPUS}"
    datasets = []
    for n, group in enumerate(groups):
        case_dir = tmp_path / f"c{n}"
        case_dir.mkdir()
        for name, text in group[0]["files"].items():
            (case_dir / name).write_text(text, newline="")
        config = group[0]["config"].split("\n[datasets.", 1)[1]
        config = "[datasets." + config
        config = re.sub(r"datasets\.d([.\]])", rf"datasets.d{n}\1", config)
        config = config.replace('files = ["', f'files = ["c{n}/')
        datasets.append(config)
    daemon = CorpusDaemon(tmp_path, "\n".join(datasets))
    try:
        client = minibatchd.connect(daemon.socket)
        checked = 0
        for n, group in enumerate(groups):
            for f in group:
                args = f["args"]
                out = subprocess.run([BIN, "dump", "--config", str(daemon.config), "--dataset", f"d{n}", *args],
                                     capture_output=True, text=True, timeout=DEADLINE)
                assert out.returncode == 0, out.stderr
                expected = [json.loads(line) for line in out.stdout.splitlines()]
                source = client.open(f"d{n}", **session_options(args))
                got = []
                for mb in source:
                    got.append(mb.to_dump())
                    if len(got) == int(arg(args, "--num-minibatches")):
                        break
                source.close()
                assert got == expected, f"{f['name']}: the daemon differs from dump"
                checked += 1
        assert checked >= 20
    finally:
        daemon.stop()
