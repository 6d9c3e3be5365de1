"""Fixtures: a real `minibatchd run` daemon on a temp dir with generated CTF data.

The binary comes from $MINIBATCHD_BIN (set by the Rust test that drives this suite), else
target/debug/minibatchd of this checkout."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def require(module: str):
    """Imports a dependency of the client's optional parts (torch, torchdata, jax). It never
    skips: scripts/setup.sh installs every test dependency (clients/python/requirements-test.txt),
    so a missing one is a broken setup and fails the test, saying how to mend it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module} is a test dependency: run scripts/setup.sh (it installs "
                          f"clients/python/requirements-test.txt into .venv)") from e
BIN = os.environ.get("MINIBATCHD_BIN") or str(ROOT / "target" / "debug" / "minibatchd")
DEADLINE = 60.0


def write_data(path: Path) -> None:
    """120 sequences of 1..=4 samples; features dense dim 3 (first value = sequence id), labels
    sparse dim 6 on each sequence's first line."""
    lines = []
    for i in range(120):
        for j in range(1 + i % 4):
            line = f"{i} |F {i} {j}.25 -{j}e-2"
            if j == 0:
                line += f" |L {i % 6}:1 {(i + 3) % 6}:0.5"
            lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def daemon_section(tmp: Path, socket_path: str) -> str:
    """The `[daemon]` table of the test daemons' configs."""
    return f"""[daemon]
socket = "{socket_path}"
metrics_listen = "127.0.0.1:0"
state_dir = "{tmp}/state"
memory_limit_bytes = 268435456
ring_slots = 4
slot_size_bytes = 65536
# Sessions a test leaves open would hold the daemon's stop for the default 5 s.
shutdown_grace_secs = 1
"""


def run_example(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs examples/SCRIPT with this interpreter and the client on its path (no torchrun
    environment), and checks that it succeeded."""
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT / "clients" / "python"), JAX_PLATFORMS="cpu")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


class Daemon:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        data = tmp / "data.ctf"
        write_data(data)
        self.socket = str(tmp / "mbd.sock")
        self.config = tmp / "minibatchd.toml"
        self.config.write_text(
            daemon_section(tmp, self.socket)
            + f"""
[datasets.train]
format = "ctf"
files = ["{data}"]
chunk_size_bytes = 256

[datasets.train.streams.features]
alias = "F"
dim = 3
format = "dense"

[datasets.train.streams.labels]
alias = "L"
dim = 6
format = "sparse"

[datasets.train.sampling]
randomize = true
window_chunks = 3
seed = 0
"""
        )
        self._start()

    def _start(self) -> None:
        """Starts the daemon on `self.config` and waits for its socket."""
        env = dict(os.environ, MINIBATCHD_LOG="warn")
        self.proc = subprocess.Popen([BIN, "run", "--config", str(self.config)], env=env, stdin=subprocess.DEVNULL)
        start = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("the daemon exited at start")
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.socket)
                s.close()
                break
            except OSError:
                if time.monotonic() - start > DEADLINE:
                    raise RuntimeError("the daemon did not open its socket")
                time.sleep(0.02)

    def dump(self, *args: str) -> list:
        import json

        out = subprocess.run([BIN, "dump", "--config", str(self.config), "--dataset", "train", *args], capture_output=True, text=True, timeout=DEADLINE)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path)
    yield d
    d.stop()
