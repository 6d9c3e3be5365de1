"""What the Python scripts under scripts/ share: where the repository and its release binary
are, a daemon configuration written from tables, and the daemon started and waited for.

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
    import daemon_kit

    cfg = daemon_kit.write_config(work / "m.toml", {
        "daemon": {"socket": str(work / "mbd.sock"), "state_dir": str(work / "state")},
        "datasets": {"train": {"format": "ctf", "files": [str(data)],
                               "streams": {"x": {"dim": 3, "format": "dense"}}}},
    })
    daemon = daemon_kit.spawn(cfg)
    daemon_kit.wait_for_socket(str(work / "mbd.sock"), 0.05, daemon)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

ROOT = Path(__file__).resolve().parents[2]
DAEMON = ROOT / "target" / "release" / "minibatchd"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML value for {v!r}")


def toml(tables: Dict[str, Any], prefix: str = "") -> str:
    """TOML text of nested tables (`{"daemon": {...}, "datasets": {"t": {..., "streams":
    {...}}}}`): each table's values, then its subtables under dotted headers."""
    out = []
    scalars = {k: v for k, v in tables.items() if not isinstance(v, dict)}
    if prefix and scalars:
        out.append(f"[{prefix}]")
    out += [f"{k} = {_value(v)}" for k, v in scalars.items()]
    if out:
        out.append("")
    for k, v in tables.items():
        if isinstance(v, dict):
            out.append(toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out)


def write_config(path: Path, tables: Dict[str, Any]) -> Path:
    """Writes `tables` as the daemon configuration `path`; returns `path`."""
    path.write_text(toml(tables))
    return path


def spawn(config: Path, *, binary: Path = DAEMON, env: Optional[dict] = None, log=None) -> subprocess.Popen:
    """`minibatchd run --config CONFIG`, not waited for (`env` added to the environment; `log`,
    a file, takes its stdout and stderr)."""
    out = {} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}
    return subprocess.Popen([str(binary), "run", "--config", str(config)], env=dict(os.environ, **(env or {})), **out)


def wait_for_socket(sock: str, interval: float, daemon: Optional[subprocess.Popen] = None,
                    deadline: float = 300) -> None:
    """Until the daemon accepts a connection on `sock`, looking every `interval` seconds; exits
    if `daemon` (a process, when given) ends first, or when nothing listens there within
    `deadline` seconds (the daemon listens at once and indexes behind its socket, so a longer
    wait means the socket is elsewhere — a relative path in a configuration is resolved against
    the configuration's directory — and a benchmark would otherwise wait until it is killed)."""
    until = time.monotonic() + deadline
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            return
        except OSError:
            if daemon is not None and daemon.poll() is not None:
                sys.exit("the daemon exited")
            if time.monotonic() > until:
                sys.exit(f"nothing listened on {sock} within {deadline:g} s")
            time.sleep(interval)


def stop(daemon: subprocess.Popen, timeout: float = 60) -> int:
    """SIGTERM (the daemon checkpoints and exits), then its exit status; SIGKILL after `timeout`."""
    daemon.terminate()
    try:
        return daemon.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        daemon.kill()
        return daemon.wait()


def consumer_first(config: Path, consumer: list, *, binary=DAEMON, timeout: float = 1200) -> tuple:
    """The user's clock with a trainer that is up first: starts `consumer` (a command that prints
    `ready` once its imports are done, then connects as soon as the daemon listens and prints one
    JSON object), then `minibatchd run --config CONFIG`; returns (the consumer's JSON, the Unix
    time the daemon was started). Exits when the consumer fails; stops the daemon either way."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts" / "lib"))
    proc = subprocess.Popen(consumer, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        sys.exit(f"the consumer failed: {proc.communicate()[1]}")
    t0 = time.time()
    daemon = spawn(config, binary=binary, env={"MINIBATCHD_LOG": "warn"})
    try:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            sys.exit(f"the consumer failed:\n{err}")
        return json.loads(out), t0
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def go_when_told(argv: list, timeout: float = 1200) -> dict:
    """Runs a peer's consumer (`argv`) that prints `ready` once its imports are done and waits for
    a line on stdin before its clock starts; tells it to go and returns the JSON object of its
    last output line (the bench scripts' peers: tf.data, pyarrow)."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        sys.exit(f"a consumer failed: {p.communicate()[1][-2000:]}")
    out, err = p.communicate("go\n", timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"a consumer failed: {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])

