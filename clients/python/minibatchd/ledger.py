"""The data-order ledger: prove what a training run saw, step by step.

Every minibatch carries a fingerprint (``Minibatch.fingerprint``, ``item["meta"]["fingerprint"]``
in the adapters): 16 hex digits naming which sequences it holds, in which order, from which
sweep. A trainer records ``Minibatch.ledger_entry()`` (or the adapters' ``meta``) per step; the
daemon's ``minibatchd dump --ledger`` prints, without a trainer, what any (config, options, rank,
world size) must see, with the sequences behind each fingerprint. Compare the two:

    want = expected("conf/minibatchd.toml", "train", minibatch_size=256, sweep=0, workers=8, rank=3)
    step = first_divergence(recorded, want)          # None: the run saw exactly that
    once = exactly_once([expected(..., rank=r) for r in range(8)])   # every sequence once per sweep

A mixture of datasets (``docs/mixtures.md``) has a ledger of its own shape, ``[source, sweep,
index]`` per sequence: ``expected_mixture`` runs ``minibatchd dump --mixture --ledger``, and
``exactly_once`` then counts per ``(source, sweep)``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter, defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence

_FLAGS = {
    "minibatch_size": "--minibatch-size", "max_samples": "--max-samples", "max_sweeps": "--max-sweeps",
    "sweep": "--sweep", "randomize": "--randomize", "window_chunks": "--window-chunks",
    "window_samples": "--window-samples", "seed": "--seed", "workers": "--workers", "rank": "--rank",
    "restore": "--restore", "num_minibatches": "--num-minibatches", "tail": "--tail",
}
_SWITCHES = {"full_sweep": "--full-sweep", "frame_mode": "--frame-mode", "equal_steps": "--equal-steps"}


def expected(config: str, dataset: str, *, binary: Optional[str] = None, **options: Any) -> List[Dict[str, Any]]:
    """The ledger ``minibatchd dump --ledger`` prints for these options (``workers``/``rank`` for
    the split; the other keys as the session options). ``binary`` defaults to
    ``$MINIBATCHD_BIN`` or ``minibatchd`` on the PATH."""
    args = [binary or os.environ.get("MINIBATCHD_BIN") or "minibatchd", "dump", "--config", str(config),
            "--dataset", dataset, "--ledger"]
    for key, value in options.items():
        if key in _SWITCHES:
            if value:
                args.append(_SWITCHES[key])
        elif key in _FLAGS:
            args += [_FLAGS[key], str(value).lower() if isinstance(value, bool) else str(value)]
        else:
            raise ValueError(f"unknown ledger option {key!r}")
    return _run_ledger(args)


_MIXTURE_FLAGS = {
    "minibatch_size": "--minibatch-size", "max_samples": "--max-samples", "workers": "--workers",
    "rank": "--rank", "num_minibatches": "--num-minibatches", "sweep": "--sweep",
}


def expected_mixture(config: str, mixture: str, *, binary: Optional[str] = None,
                     restore_state: Optional[Dict[str, Any]] = None, **options: Any) -> List[Dict[str, Any]]:
    """The ledger ``minibatchd dump --mixture NAME --ledger`` prints: per minibatch its step, the
    sources whose sweep ended in it, the fingerprint, ``[source, sweep, index]`` per sequence and
    the ``state`` after it, which ``restore_state`` takes to continue from there (at any
    ``workers``). ``sweep=K`` is the mixture's epoch K, as a session opened with ``sweep=K``
    (or the torch adapter's epoch K) gets it."""
    args = [binary or os.environ.get("MINIBATCHD_BIN") or "minibatchd", "dump", "--config", str(config),
            "--mixture", mixture, "--ledger"]
    for key, value in options.items():
        if key not in _MIXTURE_FLAGS:
            raise ValueError(f"unknown mixture ledger option {key!r} (each source samples with its dataset's "
                             "[sampling]; the options are " + ", ".join(sorted(_MIXTURE_FLAGS)) + ")")
        args += [_MIXTURE_FLAGS[key], str(value)]
    if restore_state is not None:
        args += ["--restore-state", json.dumps(restore_state)]
    return _run_ledger(args)


def _run_ledger(args: List[str]) -> List[Dict[str, Any]]:
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise RuntimeError(f"minibatchd.ledger runs the daemon's binary, and {args[0]!r} was not found: pass binary=, "
                           "set MINIBATCHD_BIN, or put minibatchd on the PATH") from None
    if out.returncode != 0:
        raise RuntimeError(f"minibatchd dump --ledger failed: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def first_divergence(recorded: Sequence[Dict[str, Any]], want: Sequence[Dict[str, Any]]) -> Optional[int]:
    """The first step at which ``recorded`` (entries with ``fingerprint``, in step order) differs
    from ``want``, or where one of them ends before the other; ``None`` when they are equal."""
    for step, (a, b) in enumerate(zip(recorded, want)):
        if a["fingerprint"] != b["fingerprint"]:
            return step
    return None if len(recorded) == len(want) else min(len(recorded), len(want))


def exactly_once(ledgers: Iterable[Sequence[Dict[str, Any]]]) -> Dict[Any, Counter]:
    """Per sweep, how often each sequence occurs over the given ledgers (one per rank or worker,
    from ``expected``). Every count is 1 when the ranks together saw each sequence exactly once
    in that sweep; a sequence that is missing does not appear. A minibatch that crosses sweep
    ends counts each sequence under its own sweep (``next_sweeps_at``). For a mixture's ledgers (from
    ``expected_mixture``) the keys are ``(source, sweep)``: each source's sweeps, counted apart."""
    counts: Dict[Any, Counter] = defaultdict(Counter)
    for ledger in ledgers:
        for entry in ledger:
            if "sequences" not in entry:
                # Found by a probe: entries from ``Minibatch.ledger_entry()`` raised a bare KeyError.
                raise ValueError("exactly_once counts the sequences of ledgers from expected() (or expected_mixture()), "
                                 "whose entries list them; a trainer's recorded entries (ledger_entry()) hold "
                                 "fingerprints: compare them with expected() by first_divergence()")
            if "sweep" in entry:
                # A minibatch that crosses sweep ends: each later sweep's sequences under it.
                sequences, starts = entry["sequences"], entry.get("next_sweeps_at") or []
                bounds = [0, *starts, len(sequences)]
                for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
                    counts[entry["sweep"] + k].update(sequences[lo:hi])
            else:
                for source, sweep, index in entry["sequences"]:
                    counts[(source, sweep)][index] += 1
    return dict(counts)
