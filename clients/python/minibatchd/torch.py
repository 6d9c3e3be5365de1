"""PyTorch: an ``IterableDataset`` over minibatchd sessions, correct in every ``DataLoader``
setting.

Each pass over the dataset is one epoch, and epoch ``k`` is sweep ``k`` of the CNTK timeline:
iterating again continues the timeline (pass 0 delivers sweep 0, pass 1 sweep 1, ...), and
``set_epoch(k)`` selects sweep ``k`` for the next pass, as ``DistributedSampler.set_epoch`` users
expect. ``MinibatchDataLoader`` (and ``StatefulMinibatchDataLoader``, over torchdata's
``StatefulDataLoader``) owns the epoch: each pass it begins is numbered in the main process and
its workers are told, so every worker of a pass delivers that pass's epoch whatever it does. A
plain ``DataLoader`` works without that: its passes are counted — in the main process, in each
persistent worker, and for new worker processes by worker id (each pass forks one process per
id) — with no timing and no guessing; that count is exact as long as every worker process of a
pass reaches its ``iter()`` (see docs/client.md, "Epochs", for the two cases where one may not).
``DataLoader`` workers split the data: worker ``w`` of rank ``r`` (of ``world`` ranks with
``W`` workers each) is CNTK worker ``r * W + w`` of ``world * W``, so over every worker of every
rank each sweep is delivered exactly once, in an order that depends only on the data, the
sampling options, ``world`` and ``W``. ``MinibatchDataLoader(num_workers=W)`` (``batch_size=None``)
reads the ``W`` splits in the main process, in the order ``W`` worker processes would give them (the daemon
already parses in parallel; an item crossing between processes costs more than reading it);
``worker_processes=True`` makes the processes.

Each item is one minibatch: ``{stream: {"values": tensor, ...}}`` (see ``Stream.torch``) plus
``item["meta"]``: ``{"epoch", "sweep", "end_of_sweep", "position", "index", "worker",
"workers"}``. Use it with ``DataLoader(ds, batch_size=None)``: the daemon already batches. By
default the tensors are copied out of shared memory (``copy=True``) so the slot goes back at
once; ``copy=False`` yields zero-copy tensors that hold the slot while they live.

``state_dict()`` / ``load_state_dict()`` follow torchdata's ``StatefulDataLoader`` protocol,
with 0 or several workers: a loader restored from a state dict continues mid-epoch exactly where
the saved one was.

**Resuming at another world size** (more or fewer ranks or DataLoader workers): gather every
worker's ``state_dict()`` of the earlier run (for example with
``torch.distributed.all_gather_object``), combine them with ``job_state_dict(states)`` and give
that to ``load_state_dict`` on every rank of the new run. Nothing the earlier run delivered comes
again and nothing it did not is lost; the following epochs are those of a fresh run of the new
size.
"""

from __future__ import annotations

import array
import collections
import contextlib
import copy
import fcntl
import inspect
import mmap
import os
import tempfile
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ._adapter import user_options
from ._client import UNTAKE_DEPTH, connect, torchrun_env

META = "meta"


def job_state_dict(states: list) -> Dict[str, Any]:
    """One state dict for a whole earlier run, from every worker's ``state_dict()`` (any order):
    what ``load_state_dict`` takes to continue that run at any world size and number of
    DataLoader workers. Every worker must have been in the same epoch. A (Stateful)
    ``StatefulDataLoader``'s own ``state_dict()`` — one per rank — may stand for its workers'."""
    # Every worker's pass complete (a loader's `_iterator_finished`, a dataset's `finished`): the
    # job resumes as each of them would, with the next epoch (found by a probe: the job state
    # dropped it, and a restored StatefulMinibatchDataLoader gave the saved epoch's empty rest).
    whole = bool(states) and all(st.get("_iterator_finished", st.get("finished")) for st in states)
    states = _dataset_states(states)
    if states and all(isinstance(st.get("source"), dict) and "mixture" in st["source"] for st in states):
        return _mixture_job(states)
    if states and all("worker" not in st and st.get("job") is not None and st["job"] == states[0]["job"]
                      for st in states):
        return dict(states[0])  # nothing taken since the job they were all restored from
    by_worker = {}
    for st in states:
        by_worker[int(st["worker"])] = st
    workers = {int(st["workers"]) for st in states}
    if len(workers) != 1 or sorted(by_worker) != list(range(workers.pop())):
        raise ValueError("job_state_dict needs the state_dict() of every worker of the run, each once")
    ordered = [by_worker[w] for w in sorted(by_worker)]
    extra = {}
    for key in ("equal_steps", "tail", "minibatch_size"):
        values = {st.get(key) for st in ordered}
        if len(values) == 1:
            extra[key] = values.pop()
    epochs = {int(st["epoch"]) for st in ordered}
    if len(epochs) != 1:
        raise ValueError(f"the workers' states are of different epochs: {sorted(epochs)}")
    epoch = epochs.pop()
    if all(st.get("source") is None for st in ordered):
        # Nothing taken since: the job every worker was restored from, as it is, or the epoch
        # from its start (with the run's equal_steps and tail).
        jobs = [st.get("job") for st in ordered]
        if jobs[0] is not None and all(job == jobs[0] for job in jobs):
            return {k: v for k, v in ordered[0].items() if k not in ("worker", "workers")}
        return {"epoch": epoch, "job": None, **extra}
    job = {"epoch": epoch, "job": [_source_or_start(st, ordered, epoch) for st in ordered], **extra}
    if whole:
        job["finished"] = True
    return job


def _source_or_start(st: dict, ordered: list, epoch: int) -> dict:
    """A worker's session state for a job; for a worker that had no minibatch yet (a DataLoader
    worker process that had not yielded when the checkpoint was taken: found by a probe), where
    its session starts — the epoch's first position (or the earlier job's earliest, for a run
    that continued one) — made from another worker's state of the same run, which says the
    sweep's size."""
    if st.get("source") is not None:
        return st["source"]
    other = next(o for o in ordered if o.get("source") is not None)
    size = next((o.get("sweep_size") for o in ordered if o.get("sweep_size") is not None), None)
    if size is None:
        raise ValueError("a worker's state was taken before its first minibatch, and the other states do not say "
                         "the sweep's size (saved by an older build): resume each worker by its own state")
    template = other["source"]
    base = template.get("job")
    start = min(base["positions"]) if base and base.get("positions") else int(epoch) * int(size)
    workers = int(st["workers"])
    worker = {"rank": int(st["worker"]), "of": workers} if workers > 1 else None
    return dict(template, position=start, minibatches=0, worker=worker)


def _mixture_job(states: list) -> Dict[str, Any]:
    """``job_state_dict`` of a mixture's workers: a mixture's state is the same on every worker
    after the same step, and then any worker's resumes every worker of any world size. Workers
    that stopped at different steps (a checkpoint taken when the DataLoader had given the
    trainer items of some workers only) have no common state."""
    epochs = {int(st["epoch"]) for st in states}
    if len(epochs) != 1:
        raise ValueError(f"the workers' states are of different epochs: {sorted(epochs)}")
    mixtures = {repr(st["source"]["mixture"]) for st in states}
    if len(mixtures) != 1:
        raise ValueError(
            "the workers of this mixture stopped at different steps, so no one state resumes them all: take the "
            "checkpoint when every worker has given the trainer as many minibatches (a multiple of the DataLoader's "
            "num_workers items on every rank), or resume at the same world size, each worker by its own state")
    return {"epoch": epochs.pop(), "source": states[0]["source"], "any_worker": True}


def _dataset_states(states: list) -> list:
    """The dataset states in ``states``, where a torchdata ``StatefulDataLoader`` state dict stands
    for the dataset state of each of its workers (or its own, without workers)."""
    out = []
    for st in states:
        if "_snapshot" in st:
            workers = st["_snapshot"].get("_worker_snapshots") or {}
            found = _named_workers(workers)
        elif "dataset_state" in st:
            found = [st["dataset_state"]]
        else:
            found = [st]
        if any(s is None for s in found):
            raise ValueError("a StatefulDataLoader state without its dataset's state: take state_dict() after the "
                             "first minibatch")
        for s in found:
            # Several splits read in one process stand for as many workers.
            out += s["local"] if s.get("local") is not None else [s]
    return out


def _named_workers(snapshots: dict) -> list:
    """The dataset states of a StatefulDataLoader's worker snapshots (``worker_ID``), each naming
    its worker: a worker that has yielded nothing since a restore keeps the state it was given (a
    job's, which names none: found by a probe, KeyError 'worker'), and takes its rank from the
    others' (global worker ``rank × W + ID`` of ``world × W``)."""
    found = []
    for key, w in snapshots.items():
        tail = str(key).rsplit("_", 1)[-1]
        found.append((int(tail) if tail.isdigit() else None, w.get("dataset_state")))
    count = len(found)
    named = [(i, st) for i, st in found if isinstance(st, dict) and "worker" in st and i is not None]
    if not named or count == 0:
        return [st for _, st in found]
    i, st = named[0]
    rank, total = (int(st["worker"]) - i) // count, int(st["workers"])
    return [st if not isinstance(st, dict) or "worker" in st or i is None
            else dict(st, worker=rank * count + i, workers=total) for i, st in found]


# The daemon's largest minibatch_size (docs/daemon.md, "Session options").
_MAX_MINIBATCH = 2_147_483_647


class MinibatchIterableDataset(IterableDataset):
    """Streams minibatches of ``dataset`` from the daemon at ``socket``, one sweep per pass.

    ``options`` are session options (``minibatch_size`` is required; ``randomize``, windows,
    ``seed``, ``frame_mode``, ``prefetch``, ``slot_size_bytes``; ``full_sweep=True`` is accepted
    and means what a pass does anyway). The epoch limit and the worker split are the dataset's
    to set: ``max_samples``, ``max_sweeps``, ``sweep`` and ``num_workers`` are refused (``rank`` is
    the trainer's rank, the argument below).
    An item holds the rank's share of ``minibatch_size`` with or without DataLoader workers (each
    of ``W`` workers reads its split with the global minibatch ``minibatch_size × W``; a resumed
    epoch keeps the one its state recorded; a mixture's workers share ``minibatch_size``).
    ``use_torchrun_env`` (default True) takes the rank and the world size from torchrun's
    ``RANK``/``WORLD_SIZE``; ``world_size``/``rank`` set them explicitly. ``equal_steps``
    (default: on when the world size is above 1) gives every rank the same number of minibatches
    per epoch, as ``DistributedDataParallel`` needs: every worker of every rank gets as many as
    the one that gets the fewest, and the ragged tails are dropped (the same ones every run; a
    few minibatches a worker when the chunks are many; the daemon warns when far more are);
    ``tail="pad"`` instead gives every worker as many
    as the one that gets the most, the others getting empty minibatches (no sample) at the end:
    nothing dropped. ``resume=`` takes a ``state_dict()`` (or a ``job_state_dict()``) and
    continues from it."""

    def __init__(self, dataset: str, socket: Optional[str] = None, *, copy: bool = True, use_torchrun_env: bool = True,
                 world_size: Optional[int] = None, rank: Optional[int] = None, equal_steps: Optional[bool] = None,
                 **options: Any):
        super().__init__()
        options = user_options(options, "MinibatchIterableDataset",
                               "over ranks and DataLoader workers: world_size=/rank= or torchrun's environment")
        self.dataset = dataset
        self.socket = socket
        self.copy = copy
        self.use_torchrun_env = use_torchrun_env
        if (world_size is None and rank is None and use_torchrun_env and "WORLD_SIZE" not in os.environ
                and torch.distributed.is_available() and torch.distributed.is_initialized()):
            # A process group initialized with an explicit rank (no torchrun environment): its
            # rank and size, taken now, in the process that made the dataset (DataLoader workers
            # may not share the group).
            world_size, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        self.world_size = world_size
        self.rank = rank
        self.equal_steps = equal_steps
        resume = options.pop("resume", None)
        self.options = options
        # Shared by the DataLoader's worker processes (passed to them when they start): which
        # pass is which, so that every worker of a pass delivers the same epoch (see _begin_pass).
        self._shared = _SharedTable(_TABLE_LEN)
        self._shared[_RESUME_GEN] = self._shared[_SEEN_GEN] = -1
        self._shared[_SHAPES:_TABLE_LEN] = [-1] * (_TABLE_LEN - _SHAPES)
        self._gen = (0, 0)  # the generation this copy was made in, and the epoch of its pass 0
        self._last: Optional[Tuple[int, int, int]] = None  # (pid, generation, pass) begun here last
        self._plan: Optional[Tuple[int, int]] = None  # (loader token, pass k) of a MinibatchDataLoader
        self._plan_at: Optional[Tuple[int, int]] = None  # (pid, next k) in a persistent worker
        self._resume: Optional[dict] = None
        self._resume_gen = -1
        self._resume_local = False
        self._source = None
        self._epoch: Optional[int] = None
        self._split: Tuple[int, int] = (0, 1)
        # Set by a MinibatchDataLoader while it makes an iterator that reads its W workers'
        # splits in the main process; then the splits of the current pass with their sessions
        # (None before the pass's first next()), and the split whose turn is next.
        self._local: Optional[int] = None
        # The global minibatch of each split's session this pass (for the state dicts), and
        # whether the dataset's name is a mixture's (None until a session says).
        self._minibatches: List[Optional[int]] = [None]
        self._mixture: Optional[bool] = True if "mixture" in options else None
        self._many: Optional[list] = None
        self._next = 0
        # The state the current pass continues from, whole and per split (None: its epoch's
        # start): its position until its sessions are open.
        self._pending: Tuple[Optional[dict], list] = (None, [])
        # A state saved after a complete pass of this epoch, restored as the start of the next
        # (_load_finished): set_epoch of that very epoch restores it as saved instead.
        self._finished: Optional[Tuple[int, dict]] = None
        self._asked: Optional[int] = None  # the epoch of the latest set_epoch
        # Items yielded in this process, and the sessions of the latest, latest last
        # (_untake_since).
        self._yielded: Tuple[int, Any] = (0, collections.deque(maxlen=UNTAKE_DEPTH))
        # Inside a DataLoader step in this process (_Handed), and the sessions that hold back
        # reporting the items yielded in it (_count_yield).
        self._in_step = False
        self._held: list = []
        self._equal: Optional[bool] = None  # equal_steps and tail of the current pass
        self._tail: Optional[str] = None
        if resume is not None:
            self.load_state_dict(resume)

    # -- epochs ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The next pass delivers sweep ``epoch``; the passes after it continue from there. After
        ``load_state_dict``, ``set_epoch`` of the saved epoch keeps the resume; of another epoch,
        drops it."""
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        self._asked = epoch
        finished, self._finished = self._finished, None
        if finished is not None and finished[0] == epoch:
            # A loop that counts from the saved epoch: that epoch's pass is the rest of it (none),
            # and its next set_epoch the epoch after.
            self.load_state_dict(finished[1])
            return
        # A pending load_state_dict of this very epoch stays (the usual loop calls set_epoch
        # before every pass, the resumed one included); another epoch replaces it.
        resume = self._resume
        keep = resume is not None and not self._resume_local and int(resume.get("epoch", 0)) == epoch
        gen = self._new_generation(epoch, resuming=keep and _applies(resume))
        if keep:
            self._resume_gen = gen
        else:
            self._resume = None

    def _pass_here(self, gen: int, info: Any) -> Optional[int]:
        """The pass this process begins in generation ``gen`` without a loader's plan (under the
        lock), or None for a worker process copied before the latest ``set_epoch`` or
        ``load_state_dict`` (a worker of an abandoned pass that starts late: its first pass is
        one of the generation it was copied in, whose output nobody reads).

        No timing and no guessing: the main process goes on after every pass begun; a persistent
        worker's next pass is its previous one plus one (a DataLoader resumes every persistent
        worker once per ``iter(loader)``); a new worker process with id ``w`` takes the next pass
        that id has not taken (each pass forks one process per worker id), skipping passes
        begun with another number of workers or in the main process (a later DataLoader with more
        workers). So the passes of a plain DataLoader are exact as long as every worker process
        of a pass reaches its ``iter()``: see ``MinibatchDataLoader`` for the cases where one
        may not."""
        sh = self._shared
        first_here = self._last is None or self._last[0] != os.getpid()
        if info is not None and first_here and self._gen[0] != gen:
            return None
        self._sync(gen)
        begun = sh[_BEGUN]
        mine = self._next_pass_here(gen)
        if info is None:
            p = max(mine or 0, begun)
            self._record(p, 0)
            return p
        if info.id >= _MAX_WORKERS:
            raise ValueError(f"at most {_MAX_WORKERS} DataLoader workers per rank")
        if mine is not None:
            p = mine
        else:
            p = sh[_COUNT + info.id]
            while p < begun and self._shape(p) != info.num_workers:
                p += 1
        self._record(p, info.num_workers, info.id)
        return p

    def _sync(self, gen: int) -> None:
        """Forgets the table's passes when the generation changed (under the lock)."""
        sh = self._shared
        if sh[_SEEN_GEN] != gen:
            sh[_SEEN_GEN], sh[_BEGUN] = gen, 0
            sh[_COUNT:_COUNT + _MAX_WORKERS] = [0] * _MAX_WORKERS
            sh[_SHAPES:_PLANS] = [-1] * (2 * _SHAPES_LEN)

    def _shape(self, p: int) -> int:
        """How many workers pass ``p`` was begun with (0: the main process; -1: not known)."""
        sh = self._shared
        at = _SHAPES + 2 * (p % _SHAPES_LEN)
        return sh[at + 1] if sh[at] == p else -1

    def _record(self, p: int, workers: int, worker: Optional[int] = None) -> None:
        """Pass ``p`` begins or goes on here (``workers`` per rank, 0 in the main process; under
        the lock)."""
        sh = self._shared
        if worker is not None:
            sh[_COUNT + worker] = max(sh[_COUNT + worker], p + 1)
        if p >= sh[_BEGUN]:
            sh[_BEGUN] = p + 1
            at = _SHAPES + 2 * (p % _SHAPES_LEN)
            sh[at:at + 2] = [p, workers]

    def _next_pass_here(self, gen: int) -> Optional[int]:
        """The next pass of this process in generation ``gen`` if it began one, else None."""
        last = self._last
        return last[2] + 1 if last is not None and last[0] == os.getpid() and last[1] == gen else None

    def _plan_pass(self, token: int, k: int, workers: int) -> Tuple[list, list, int, tuple]:
        """``MinibatchDataLoader`` begins its ``k``-th pass (main process, before its workers are
        made or resumed): which pass and epoch it is, decided once here, goes into the table
        under the loader's ``token``, and the copies of this dataset the workers get name it.
        Returns what ``_unplan_pass`` needs to take it back."""
        sh = self._shared
        # What a pass begun in this process (no worker processes) changes here, as it begins.
        here = (self._last, self._resume, self._pending)
        with sh.get_lock():
            before = sh[_SEEN_GEN:_PLANS]
            gen = sh[_GEN]
            self._sync(gen)
            p = max(sh[_BEGUN], self._next_pass_here(gen) or 0)
            self._record(p, workers)
            for w in range(min(workers, _MAX_WORKERS)):
                self._record(p, workers, w)
            resumes = int(p == 0 and sh[_RESUME_GEN] == gen)
            at = _PLANS + _PLAN_FIELDS * (sh[_PLAN_AT] % _PLANS_LEN)
            sh[at:at + _PLAN_FIELDS] = [token, k, gen, p, sh[_BASE] + p, resumes]
            sh[_PLAN_AT] += 1
            after = sh[_SEEN_GEN:_PLANS]
        self._plan = (token, k)
        return before, after, at, here

    def _unplan_pass(self, undo: Tuple[list, list, int, tuple]) -> None:
        """Takes back the pass ``_plan_pass`` planned (returning ``undo``) when its iterator was
        never made: the next pass the loader begins is that one again. The pass's plan is voided;
        the table's passes, and what a pass begun in this process took (the last pass, a state to
        resume), go back to before it unless a worker moved the passes meanwhile. (The loader's
        tokens are not compared: one made meanwhile moves no pass.)"""
        before, after, at, here = undo
        sh = self._shared
        tokens = _TOKENS - _SEEN_GEN
        with sh.get_lock():
            sh[at] = 0  # no loader's token
            now = sh[_SEEN_GEN:_PLANS]
            if now[:tokens] + now[tokens + 1:] == after[:tokens] + after[tokens + 1:]:
                before[tokens] = now[tokens]
                sh[_SEEN_GEN:_PLANS] = before
                self._last, self._resume, self._pending = here

    def _new_token(self) -> int:
        sh = self._shared
        with sh.get_lock():
            sh[_TOKENS] += 1
            return sh[_TOKENS]

    def _planned(self, info: Any) -> Optional[Tuple[int, int, int, bool]]:
        """(generation, pass, epoch, resumes) of this pass as its ``MinibatchDataLoader`` planned
        it, or None when no such loader made this iterator (under the lock). A persistent
        worker's n-th pass is its loader's (k0 + n)-th, k0 being the pass it was made in."""
        if self._plan is None:
            return None
        token, k = self._plan
        if info is not None:
            pid, at = os.getpid(), self._plan_at
            if at is not None and at[0] == pid:
                k = at[1]
            self._plan_at = (pid, k + 1)
        sh = self._shared
        for i in range(_PLANS_LEN):
            at = _PLANS + _PLAN_FIELDS * i
            if sh[at] == token and sh[at + 1] == k:
                return sh[at + 2], sh[at + 3], sh[at + 4], bool(sh[at + 5])
        raise RuntimeError(f"minibatchd: pass {k} of this MinibatchDataLoader is no longer in its table "
                           f"(a worker {_PLANS_LEN} passes behind its loader?)")

    def _begin_pass(self) -> Tuple[int, Optional[dict]]:
        """(the epoch this pass delivers, the state it resumes from or None), decided at
        ``iter()``: the DataLoader calls it in every worker when the worker starts (or, with
        persistent workers, when a pass starts), before anything is fetched."""
        info = get_worker_info()
        pid = os.getpid()
        sh = self._shared
        with sh.get_lock():
            resume = None
            if self._resume is not None and self._resume_local:
                # load_state_dict in this worker (torchdata's StatefulDataLoader restoring it):
                # this worker's next pass continues from it — unless the loop's set_epoch named
                # another epoch, which drops the resume as it does in the main process (found by a
                # probe: set_epoch(e + 1) after a state of epoch e gave e's rest, and e + 1 was
                # never read).
                resume, self._resume = self._resume, None
                if self._asked is not None and self._asked != int(resume.get("epoch", 0)):
                    resume = None
            gen = sh[_GEN]
            planned = self._planned(info)
            if planned is not None and info is None and planned[0] != gen:
                # load_state_dict in the main process after the pass was planned (torchdata's
                # StatefulDataLoader restoring a loader without workers): the state decides.
                planned = None
            if planned is not None:
                pass_gen, p, epoch, resumes = planned
            else:
                pass_gen, p = gen, self._pass_here(gen, info)
                if p is None:
                    self._last = (pid, self._gen[0], 0)
                    return self._gen[1], None
                epoch, resumes = sh[_BASE] + p, p == 0 and sh[_RESUME_GEN] == gen
            self._last = (pid, pass_gen, p)
            if resume is None and resumes:
                if self._resume is None or self._resume_gen != pass_gen:
                    raise RuntimeError(
                        "load_state_dict() was called after this DataLoader's persistent workers started, so "
                        "they cannot see the state: call it before the first iter(), or use torchdata's "
                        "StatefulDataLoader")
                resume = self._resume
                if info is None:
                    self._resume = None  # consumed here; forked workers of later passes have p > 0
            if resume is not None:
                epoch = int(resume.get("epoch", 0))
                if pass_gen == gen:
                    sh[_BASE] = epoch - p
            return epoch, resume

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        # Not a generator: the pass is decided here, when the DataLoader makes the iterator,
        # not at the first next() (which a worker of an abandoned pass may never reach).
        splits, world = self._splits_here()
        epoch, resume = self._begin_pass()
        carried = None
        if resume is not None and not _continues(resume):
            # Saved before its first minibatch: that epoch from its start, with the earlier run's
            # equal_steps and tail (found by a probe: a job state of a run that had taken nothing
            # lost them, and the ranks resumed with equal steps on dropped sequences).
            carried, resume = resume, None
        resumes, first = _resumes_of(resume, splits)
        self._epoch, self._source, self._next = epoch, None, first
        # Until this pass opens its sessions, its position is the state it continues from.
        self._pending = (resume, resumes)
        self._split = splits[0]
        options = [self._session_options(epoch, w, n, world, r, carried) for (w, n), r in zip(splits, resumes)]
        self._minibatches = [o.get("minibatch_size") for o in options]
        if len(splits) == 1:
            self._many = None
            return self._stream(epoch, *splits[0], options[0])
        self._many = [(w, n, None) for w, n in splits]
        return self._stream_many(epoch, splits, options, first)

    def _splits_here(self) -> Tuple[list, int]:
        """The (global worker index, global worker count) of each split this iterator reads, and
        the world size: one split in a DataLoader worker process or without workers; ``W`` when
        a ``MinibatchDataLoader`` reads its ``W`` workers' splits in the main process."""
        if self.world_size is not None or self.rank is not None:
            rank, world = self.rank or 0, self.world_size or 1
        elif self.use_torchrun_env:
            rank, world = torchrun_env()
        else:
            rank, world = 0, 1
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is out of range for world size {world}")
        info = get_worker_info()
        if info is not None:
            return [(rank * info.num_workers + info.id, world * info.num_workers)], world
        local = self._local or 1
        return [(rank * local + w, world * local) for w in range(local)], world

    def _session_options(self, epoch: int, worker: int, workers: int, world: int, resume: Optional[dict],
                         carried: Optional[dict] = None) -> dict:
        """The options of the session that delivers worker ``worker`` of ``workers``'s share of
        ``epoch``, continuing from ``resume`` (None: from the epoch's start; ``carried``, a state
        of that start, gives the earlier run's ``equal_steps`` and ``tail``)."""
        options = dict(self.options, sweep=epoch, num_workers=workers, rank=worker)
        asked = options.get("minibatch_size")
        if isinstance(asked, int) and resume is not None:
            # A resumed epoch keeps the global minibatch its state was taken with (equal steps
            # go on counting the state's minibatches); a state of a build that did not record it
            # was taken with minibatch_size itself.
            options["minibatch_size"] = int(resume.get("minibatch_size") or asked)
        elif isinstance(asked, int) and carried is not None and carried.get("minibatch_size") and not self._mixture:
            # An epoch saved before its first minibatch here keeps the global minibatch it had
            # (its other workers' sessions may have taken some with it).
            options["minibatch_size"] = int(carried["minibatch_size"])
        elif isinstance(asked, int) and not self._mixture:
            # A DataLoader worker's items hold what the rank's would without workers: the
            # session's global minibatch is the rank's times its W workers (docs/client.md,
            # "Split"); a worker's stream of samples does not depend on it, only the cut.
            options["minibatch_size"] = asked * (workers // world)
            if options["minibatch_size"] > _MAX_MINIBATCH:
                raise ValueError(f"minibatch_size {asked} with {workers // world} DataLoader workers is a global "
                                 f"minibatch of {options['minibatch_size']}, above the daemon's {_MAX_MINIBATCH}")
        shaped = resume if resume is not None else carried
        equal = self.equal_steps
        if equal is None and shaped is not None and shaped.get("equal_steps") is not None:
            equal = bool(shaped["equal_steps"])  # the earlier run's, so that its state fits
        if equal is None:
            equal = world > 1
        self._equal = equal
        if equal:
            options["equal_steps"] = True
            if "tail" not in options and shaped is not None and shaped.get("tail") is not None:
                options["tail"] = shaped["tail"]  # the earlier run's, as equal_steps above
        else:
            options.pop("tail", None)  # tail only shapes equal steps
        self._tail = options.get("tail")
        if resume is not None and resume.get("job") is not None:
            options["resume_job"] = resume["job"]
        elif resume is not None:
            options["resume"] = resume["source"]
        return options

    def _open(self, split: int, options: dict) -> Any:
        """A session with ``options``; a mixture's keeps sharing ``minibatch_size`` among the
        workers, as its weight schedule counts its global minibatches (docs/mixtures.md): the
        first session of a name not yet known for one is opened again if it is one. The global
        minibatch used is kept for the state dicts."""
        source = connect(self.socket).open(self.dataset, **options)
        self._mixture = source.mixture_sources is not None
        asked = self.options.get("minibatch_size")
        fresh = "resume" not in options and "resume_job" not in options
        if self._mixture and fresh and options.get("minibatch_size") != asked:
            source.close()
            options = dict(options, minibatch_size=asked)
            source = connect(self.socket).open(self.dataset, **options)
        self._minibatches[split] = options.get("minibatch_size")
        return source

    def _stream(self, epoch: int, worker: int, workers: int, options: dict) -> Iterator[Dict[str, Any]]:
        self._source = source = self._open(0, options)
        try:
            while True:
                item = source._next_made(lambda mb: self._item(mb, epoch, worker, workers))
                if item is None:
                    return
                self._count_yield(source)
                yield item
        finally:
            source.close()

    def _stream_many(self, epoch: int, splits: list, options: list, first: int) -> Iterator[Dict[str, Any]]:
        """The items of several splits read in this process, in the order a DataLoader with one
        worker process per split gives them: one from each split in turn, beginning with split
        ``first``, a split that has ended left out."""
        sources: list = []
        try:
            for opts in options:
                sources.append(self._open(len(sources), opts))
            self._many = [(w, n, source) for (w, n), source in zip(splits, sources)]
            ended = [False] * len(splits)
            at = first
            while not all(ended):
                w, at = at, (at + 1) % len(splits)
                if ended[w]:
                    continue
                split = splits[w]
                item = sources[w]._next_made(lambda mb: self._item(mb, epoch, *split))
                if item is None:
                    ended[w] = True
                    continue
                self._next = at
                self._count_yield(sources[w])
                yield item
                failed = sources[w]._failed
                if failed is not None:
                    # Its item was given back (_untake_since): the pass ends here, as one split's
                    # would (found by a probe: the other splits went on serving a turn each).
                    raise failed
        finally:
            for source in sources:
                source.close()

    def _count_yield(self, source: Any) -> None:
        """An item of ``source`` is about to be yielded. Inside a DataLoader step in this process
        its session does not report it taken until the step returns (``_end_step``): the daemon
        never counts an item the step may still give back."""
        count, recent = self._yielded
        recent.append(source)
        self._yielded = (count + 1, recent)
        if self._in_step and source._hold_taken is None:
            source._hold_taken, source._hold_overflowed = source._taken - 1, False
            self._held.append(source)

    def _end_step(self) -> None:
        """The DataLoader step in this process returned or failed: its sessions report what they
        hold again."""
        self._in_step = False
        for source in self._held:
            source._hold_taken = None
        self._held.clear()

    def _untake_since(self, before: int) -> None:
        """The items yielded after the ``before``-th never reached the trainer: an exception
        ended the DataLoader's step between this dataset's yields and the trainer (a
        ``collate_fn``, a ``KeyboardInterrupt`` in the DataLoader's own code) — one item, or the
        ``batch_size`` items of a batch (found by a probe: with ``batch_size=2`` both were counted
        taken, and a checkpoint saved in the handler skipped them). Their minibatches are taken
        back, latest first, as one lost while it was made is (``Source._next_made``): a
        checkpoint saved in the handler continues with them."""
        count, recent = self._yielded
        first = None
        for _ in range(count - before):
            if not recent:
                break
            first = recent.pop()
            first._untake_last()
        self._yielded = (min(count, before), recent)
        if first is not None and self._many is not None:
            # The split of the earliest item given back has its turn again first.
            self._next = next((i for i, (_, _, s) in enumerate(self._many) if s is first), self._next)

    def _item(self, mb: Any, epoch: int, worker: int, workers: int) -> Dict[str, Any]:
        """The item of minibatch ``mb`` of worker ``worker`` of ``workers`` in ``epoch``."""
        if META in mb:
            raise ValueError(f"a stream is named {META!r}, which the torch adapter uses for metadata")
        item: Dict[str, Any]
        if self.copy and get_worker_info() is not None:
            # In a DataLoader worker, one buffer per item, laid out to cross to the main
            # process; in the main process, a NumPy copy per array costs fewer Python steps.
            item = _worker_copy(mb)
            mb.release()
        elif self.copy:
            # A NumPy copy of each array and a tensor on it: a torch clone and the zero-copy
            # tensors' warning filter cost several times as much per array.
            item = {name: {key: torch.from_numpy(arr.copy()) for key, arr in stream.arrays()}
                    for name, stream in mb.streams.items()}
            mb.release()
        else:
            item = mb.to_torch()
        item[META] = {"epoch": epoch, "sweep": mb.sweep, "end_of_sweep": mb.end_of_sweep,
                      "position": mb.position, "index": mb.index, "fingerprint": mb.fingerprint,
                      "worker": worker, "workers": workers}
        if mb.sources is not None:
            # A mixture's minibatch: the source of each sequence, the sources whose sweep
            # ended in it.
            item[META]["sources"] = mb.sources.tolist()
            item[META]["sweeps_ended"] = mb.sweeps_ended
        return item

    # -- checkpoints ----------------------------------------------------------------------------

    def state(self) -> Any:
        """The session state after the last minibatch this process yielded (``None`` before the
        first pass; a list, one per split, when a ``MinibatchDataLoader`` reads several splits in
        this process); ``state_dict()`` is the checkpoint to save."""
        if self._many is not None:
            return [None if source is None else source.state() for _, _, source in self._many]
        return None if self._source is None else self._source.state()

    def state_dict(self) -> Dict[str, Any]:
        """This process's position: the epoch, the session state after the last minibatch
        yielded, and the worker split it was taken at. With DataLoader workers,
        ``StatefulDataLoader`` calls this in each worker and keeps one per worker. After a
        complete pass it is the end of that epoch: a StatefulDataLoader restored from it begins
        the next epoch (torchdata's own protocol; ``set_epoch`` of the saved epoch first gives
        that epoch's rest, none). After ``load_state_dict`` and before the restored pass's first
        minibatch, it is the state loaded."""
        pending = self._pending_load()
        if pending is not None:
            # Restored, and no pass begun from it yet: where the next pass continues (found by a
            # probe: the position was lost, and a resume from this state replayed the epoch).
            # A job's state names this process's worker too, for job_state_dict (found by a probe:
            # a worker process that had not yielded gave the job without it: KeyError).
            if "worker" not in pending and "local" not in pending:
                splits, _ = self._splits_here()
                if len(splits) == 1:
                    pending["worker"], pending["workers"] = splits[0]
            return pending
        worker, workers = self._split
        if self._epoch is None:
            sh = self._shared
            with sh.get_lock():
                gen = sh[_GEN]
                self._sync(gen)
                mine = self._next_pass_here(gen) or 0
                others = sh[_BEGUN]
                epoch = sh[_BASE] + max(mine, others)
            if others > mine and get_worker_info() is None:
                # DataLoader worker processes iterated, and their positions are theirs: this state
                # names the epoch after their latest pass, right at an epoch's end only.
                warnings.warn(
                    "state_dict() of a MinibatchIterableDataset whose passes ran in DataLoader worker "
                    "processes holds only the next epoch, not a position within one: to resume mid-epoch, "
                    "use torchdata's StatefulDataLoader (its state_dict() keeps every worker's)", stacklevel=2)
            source = None
        elif self._unopened() and self._pending[0] is not None:
            # Resumed, but no session of this pass open yet (nothing taken since): where it
            # continues from.
            whole, per_split = self._pending
            return dict(whole if self._many is not None or per_split[0] is None else per_split[0])
        elif self._many is not None:
            # Several splits read here (a MinibatchDataLoader's workers in its main process):
            # each split's own state, and whose turn is next.
            local = [{"epoch": self._epoch, "source": None if source is None else source.state(), "worker": w,
                      "workers": n, "equal_steps": self._equal, "tail": self._tail, "minibatch_size": mb}
                     for (w, n, source), mb in zip(self._many, self._minibatches)]
            return {"epoch": self._epoch, "local": local, "next": self._next, "equal_steps": self._equal,
                    "tail": self._tail}
        else:
            epoch, source = self._epoch, None if self._source is None else self._source.state()
        state = {"epoch": epoch, "source": source, "worker": worker, "workers": workers, "equal_steps": self._equal,
                 "tail": self._tail}
        if self._source is not None and self._source._ended:
            # The pass delivered its whole share: what a restore by torchdata must know.
            state["finished"] = True
        if self._source is not None:
            # For job_state_dict: where a worker that had no minibatch yet starts.
            state["sweep_size"] = self._source.sweep_size
        if self._epoch is not None and self._minibatches and self._minibatches[0] is not None:
            # The global minibatch the session had, or has once it opens: a resume keeps it for
            # the rest of the epoch (found by a probe: a worker that had not opened its session
            # recorded none, and resumed its share at a new minibatch_size, its siblings at the
            # old one).
            state["minibatch_size"] = self._minibatches[0]
        return state

    def _unopened(self) -> bool:
        """Whether the current pass has opened no session yet."""
        if self._many is not None:
            return all(source is None for _, _, source in self._many)
        return self._source is None

    def __getstate__(self) -> Dict[str, Any]:
        # A copy for another process (a spawned DataLoader worker) takes no session of this one.
        state = self.__dict__.copy()
        state["_source"] = state["_many"] = None
        state["_yielded"] = (0, collections.deque(maxlen=UNTAKE_DEPTH))
        state["_in_step"], state["_held"] = False, []
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next pass continues from ``state`` (a ``state_dict()`` or a ``job_state_dict()``):
        the rest of its epoch, then the following epochs. Called in a DataLoader worker (as
        torchdata's ``StatefulDataLoader`` does), it applies to that worker's next pass."""
        if (state.get("finished") and self._asked == int(state.get("epoch", 0)) and _torchdata_restores()
                and not self.__dict__.get("_owned_restore") and get_worker_info() is None):
            # torchdata restores a state saved after a whole pass by making an iterator and
            # throwing it away, then the next: the first takes the restored pass (epoch e's rest,
            # empty), and the loop's set_epoch(e) pass got epoch e + 1, which its set_epoch(e + 1)
            # read again (found by a probe). Said, not served twice. Not in a worker: there the
            # finished state may be one worker's whose loader had not ended its pass, which
            # torchdata restores as the rest of that pass (found by a probe: the refusal's advice,
            # set_epoch(e + 1), then lost that epoch); and a thrown-away iterator's workers' errors
            # reach nobody.
            raise ValueError(
                f"this state was saved after the whole pass of epoch {state.get('epoch')}: torchdata's "
                "StatefulDataLoader restores it as the start of the next epoch, so after set_epoch("
                f"{state.get('epoch')}) that epoch would be read twice: call set_epoch("
                f"{int(state.get('epoch', 0)) + 1}) (the epoch after the saved one) before the first pass, or use "
                "minibatchd.torch.StatefulMinibatchDataLoader, whose set_epoch of the saved epoch gives that "
                "epoch's empty rest")
        self._finished = None
        if get_worker_info() is not None:
            self._resume, self._resume_local = dict(state), True
            return
        gen = self._new_generation(int(state.get("epoch", 0)), resuming=_applies(state))
        self._resume, self._resume_gen, self._resume_local = dict(state), gen, False

    def _load_finished(self, state: Dict[str, Any]) -> None:
        """Restores a state saved after a complete pass of epoch *e* as torchdata's
        ``StatefulDataLoader`` restores one: the next pass is epoch *e* + 1 from its start — unless
        ``set_epoch(e)`` comes first (a loop counting from the saved epoch), which restores the
        state as saved: the rest of epoch *e* (nothing), then *e* + 1 at the next ``set_epoch``."""
        epoch = int(state.get("epoch", 0))
        self.set_epoch(epoch + 1)
        self._finished = (epoch, dict(state))

    def _pending_load(self) -> Optional[Dict[str, Any]]:
        """The state ``load_state_dict`` gave, while no pass has begun from it: what a
        ``state_dict()`` taken before the restored pass's first minibatch must say."""
        resume = self._resume
        if resume is None:
            return None
        if self._resume_local:
            return dict(resume)
        sh = self._shared
        with sh.get_lock():
            gen = sh[_GEN]
            self._sync(gen)
            begun = sh[_BEGUN]
        return dict(resume) if self._resume_gen == gen and begun == 0 else None

    def _new_generation(self, epoch: int, resuming: bool) -> int:
        """Starts a generation whose pass 0 is ``epoch`` (``resuming``: a main-process state
        continues it, which persistent workers started earlier cannot see); returns its number."""
        sh = self._shared
        with sh.get_lock():
            sh[_GEN] += 1
            sh[_BASE] = epoch
            if resuming:
                sh[_RESUME_GEN] = sh[_GEN]
            self._gen = (sh[_GEN], epoch)
            return sh[_GEN]


class _OwnsTheEpoch:
    """What makes a DataLoader own the epoch of a ``MinibatchIterableDataset`` (mixed in before
    the DataLoader class). Every pass the loader begins — a new iterator, or persistent workers
    resumed — is planned in the main process before any worker learns of it: its pass number and
    epoch go into the dataset's shared table under this loader's token and the pass's index
    ``k``, and the workers made for it carry ``(token, k)`` in their copy of the dataset (a
    persistent worker's n-th pass is the n-th after the one it was made in: the loader resumes
    every persistent worker once per pass). Nothing is inferred in the workers, so a worker that
    starts late, never starts, or belongs to an iterator still alive beside a newer one cannot
    move a pass."""

    def __init__(self, dataset: Any, *args: Any, worker_processes: bool = False, **kwargs: Any) -> None:
        if not isinstance(dataset, MinibatchIterableDataset):
            raise TypeError(f"{type(self).__name__} needs a MinibatchIterableDataset, not {type(dataset).__name__}")
        bound = inspect.signature(super().__init__).bind(dataset, *args, **kwargs)
        given = bound.arguments
        given.setdefault("batch_size", None)  # the daemon already batches
        if given["batch_size"] is None and given.get("collate_fn") is None:
            # Items are made of tensors already: DataLoader's default_convert would only walk
            # and copy their dicts (a quarter of the main process's time per item).
            given["collate_fn"] = _as_is
        local = None
        if not worker_processes and given.get("num_workers", 0) > 0 and given["batch_size"] is None:
            # num_workers splits the data as that many worker processes would, and the splits
            # are read here: the daemon parses in parallel, and an item crossing between
            # processes costs more than reading it (docs/client.md, "Workers"). Not with a
            # batch_size: each worker process would batch its own items, which one process
            # taking them in turn cannot.
            if given.get("worker_init_fn") is not None:
                raise ValueError(
                    f"{type(self).__name__} reads its workers' splits in this process, where no worker_init_fn "
                    f"runs: pass worker_processes=True for DataLoader worker processes")
            local = given["num_workers"]
            given["num_workers"] = 0
            for key in ("prefetch_factor", "persistent_workers", "multiprocessing_context", "timeout"):
                given.pop(key, None)  # settings of worker processes, of which there are none
        super().__init__(*bound.args, **bound.kwargs)  # type: ignore[call-arg]
        self._minibatchd_token = self.dataset._new_token()
        self._minibatchd_passes = 0
        self._minibatchd_local = local

    @property
    def split_workers(self) -> int:
        """How many workers' splits of the data this loader reads: ``num_workers`` as given,
        whether they are read in this process (the default) or by worker processes."""
        return self._minibatchd_local or self.num_workers

    def _minibatchd_plan(self) -> Tuple[list, list, int]:
        undo = self.dataset._plan_pass(self._minibatchd_token, self._minibatchd_passes, self.num_workers)
        self._minibatchd_passes += 1
        return undo

    def _get_iterator(self):  # noqa: ANN202 (the DataLoader's own iterator type)
        undo = self._minibatchd_plan()
        self.dataset._local = self._minibatchd_local
        try:
            it = super()._get_iterator()  # type: ignore[misc]
        except BaseException:
            # No iterator was made (an exception, a Ctrl-C while its workers started): no pass
            # began, and the next is this one again. Found by a probe: a checkpoint saved in the
            # handler named the next epoch, and a resume from it never read this one.
            self._minibatchd_passes -= 1
            self.dataset._unplan_pass(undo)
            raise
        finally:
            # Made: the workers' copies keep the plan, later loaders do not.
            self.dataset._plan = self.dataset._local = None
        if self.num_workers == 0:
            # Items made in this process: one the DataLoader took but did not hand over is
            # taken back (found by a probe: a collate_fn or a Ctrl-C in the DataLoader's own
            # code after the dataset's yield, and a checkpoint saved in the handler skipped it).
            return _Handed(it, self.dataset)
        if self.num_workers > 0 and self.persistent_workers:
            # Neither the loader nor the iterator is held by what the iterator keeps: a cycle
            # would keep the persistent worker processes alive after `del loader` until the
            # garbage collector ran (found by a probe); the DataLoader hands `_reset` itself.
            reset, made = type(it)._reset, weakref.ref(it)

            def _reset(loader: Any, *args: Any, **kwargs: Any) -> Any:
                if not kwargs.get("first_iter", args[0] if args else False):
                    loader._minibatchd_plan()  # persistent workers resumed: a pass of its own
                return reset(made(), loader, *args, **kwargs)

            it._reset = _reset
        return it


class _Handed:
    """A DataLoader's in-process iterator whose items count as taken once ``next()`` returns
    them: an exception between the dataset's yield and the return gives the item's minibatch
    back (``MinibatchIterableDataset._untake_since``). Everything else is the iterator's."""

    def __init__(self, it: Any, dataset: "MinibatchIterableDataset") -> None:
        self.__dict__["_it"], self.__dict__["_dataset"] = it, dataset

    def __iter__(self) -> "_Handed":
        return self

    def __next__(self) -> Any:
        dataset = self._dataset
        before = dataset._yielded[0]
        dataset._in_step = True
        try:
            return next(self._it)
        except StopIteration:
            raise
        except BaseException:
            dataset._untake_since(before)
            raise
        finally:
            dataset._end_step()

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._it, name, value)


class MinibatchDataLoader(_OwnsTheEpoch, DataLoader):
    """A ``torch.utils.data.DataLoader`` that owns the epoch of the ``MinibatchIterableDataset``
    it iterates: pass ``k`` of the loader is planned in the main process when the pass begins,
    so its workers deliver one epoch whatever they do — start late, never start (a loop left
    while a worker was still in its ``worker_init_fn``), or run beside a newer iterator. The
    arguments are ``DataLoader``'s; ``batch_size`` defaults to None (the daemon batches), and
    with it ``collate_fn`` to one that gives each item as it is (its tensors need no conversion).

    ``num_workers=W`` (with ``batch_size=None``) splits the data ``W`` ways as ``W`` worker
    processes would, and reads the splits in this process, one item from each in turn as the DataLoader takes them from its
    workers: the same items in the same order, with no process made and no item copied between
    processes (``num_workers`` is then 0 to the DataLoader; ``split_workers`` is ``W``). Worker
    process settings (``prefetch_factor``, ``persistent_workers``, ``multiprocessing_context``,
    ``timeout``) have nothing to set then, and a ``worker_init_fn`` is refused.
    ``worker_processes=True`` makes the ``W`` worker processes instead, and so does a
    ``batch_size`` (each worker process batches its own items). A plain ``DataLoader`` works
    too: see the module's notes for when its passes are exact."""


def __getattr__(name: str) -> Any:
    # torchdata is optional: StatefulMinibatchDataLoader is made on first use.
    if name != "StatefulMinibatchDataLoader":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from torchdata.stateful_dataloader import StatefulDataLoader

    def load_state_dict(self: Any, state_dict: Dict[str, Any]) -> None:
        """torchdata's ``load_state_dict``; a state saved in the other mode — with worker
        processes, or with the workers' splits read in the main process — goes to the dataset,
        and the loader starts a fresh iterator that continues from it (each split from its own
        position; which split comes first, the loader's own). So does a whole run's
        ``job_state_dict(...)`` (another world size or number of workers)."""
        self._minibatchd_restored = None
        if "job" in state_dict and state_dict.get("finished"):
            # A whole run's state after a complete pass: the next epoch, as its own state restores.
            self.dataset._load_finished(state_dict)
            StatefulDataLoader.load_state_dict(self, {})
            self._minibatchd_restored = (int(state_dict.get("epoch", 0)), copy.deepcopy(state_dict), self.dataset._asked)
        elif "job" in state_dict or state_dict.get("any_worker"):
            self.dataset.load_state_dict(state_dict)
        elif ("_snapshot" in state_dict) == (self.num_workers > 0) and state_dict.get("_iterator_finished"):
            # Saved after a whole pass: the next pass is the next epoch, as torchdata restores one
            # (a loop counting from the epoch after the saved one, as examples/torch_train.py
            # does, read one epoch fewer when this pass was the saved epoch's empty rest: found
            # by a probe) — and a loop whose set_epoch(e) names the saved epoch gets that epoch's
            # rest, empty, so it never reads the next epoch twice (found by an earlier probe;
            # torchdata's own iter() would make both).
            whole = _splits_state(_dataset_states([state_dict]))
            self.dataset._load_finished(whole)
            StatefulDataLoader.load_state_dict(self, {})
            self._minibatchd_restored = (int(whole.get("epoch", 0)), copy.deepcopy(state_dict), self.dataset._asked)
        elif ("_snapshot" in state_dict) == (self.num_workers > 0):
            StatefulDataLoader.load_state_dict(self, state_dict)
            # A set_epoch of another epoch before the restored pass drops the resume, as the
            # dataset's own does (found by a probe: the pass of set_epoch(e + 1) gave epoch e's
            # rest, and epoch e + 1 was never read) — see __iter__.
            try:
                epochs = {int(st.get("epoch", 0)) for st in _dataset_states([state_dict])}
                self._minibatchd_resume = (epochs, self.dataset._asked)
            except ValueError:
                pass  # a worker without a dataset state (none begun): torchdata's restore as ever
            # A worker whose split of the saved epoch was done is restored by torchdata too: with
            # this loader that is the rest of a pass, not a whole pass restored as the next epoch
            # (found by a probe: its dataset refused it as if a plain StatefulDataLoader did).
            self.dataset._owned_restore = True
        elif "_snapshot" in state_dict:
            self.dataset.load_state_dict(_splits_state(_dataset_states([state_dict])))
        elif state_dict.get("dataset_state") is not None:
            self.dataset.load_state_dict(state_dict["dataset_state"])
        else:
            raise ValueError("a StatefulDataLoader state without its dataset's state: take state_dict() after the "
                             "first minibatch")

    def state_dict(self: Any) -> Dict[str, Any]:
        """torchdata's ``state_dict``; after ``load_state_dict`` of a state saved after a complete
        pass, and before the restored loader's first pass, the state loaded (found by a probe:
        it said the next epoch from its start, which a loop counting from the saved epoch then
        read twice) — unless ``set_epoch`` has since named an epoch other than the saved one or the
        one after it."""
        restored = self.__dict__.get("_minibatchd_restored")
        if restored is not None:
            epoch, saved, asked = restored
            unbegun = self._iterator is None or self._initial_iter_for_state_dict
            if unbegun and self.dataset._asked in (asked, epoch, epoch + 1):
                return copy.deepcopy(saved)
            self._minibatchd_restored = None
        return StatefulDataLoader.state_dict(self)

    def iterate(self: Any) -> Any:
        """torchdata's ``__iter__``; after ``load_state_dict`` of a state saved mid-epoch, a
        ``set_epoch`` since of an epoch other than the saved one starts that epoch afresh."""
        pending = self.__dict__.get("_minibatchd_resume")
        if pending is not None:
            self._minibatchd_resume = None
            epochs, asked = pending
            now = self.dataset._asked
            if now != asked and now not in epochs:
                self.next_iter_state = None
                if self._initial_iter_for_state_dict:
                    # state_dict() made the restored iterator already: it is not this pass's.
                    self._initial_iter_for_state_dict = False
                    self._iterator = None
        return StatefulDataLoader.__iter__(self)

    cls = type(name, (_OwnsTheEpoch, StatefulDataLoader), {
        "__module__": __name__, "__qualname__": name, "load_state_dict": load_state_dict, "state_dict": state_dict,
        "__iter__": iterate,
        "__doc__": "torchdata's ``StatefulDataLoader`` that owns the epoch, as ``MinibatchDataLoader`` does: "
                   "its ``state_dict()`` keeps every worker's position, and a restored loader goes on exactly.",
    })
    globals()[name] = cls
    return cls


# The shared table of a MinibatchIterableDataset: the generation (bumped by set_epoch and
# load_state_dict in the main process), the epoch of its pass 0, the generation a main-process
# load_state_dict set; the generation the pass bookkeeping belongs to, the number of passes begun
# in it, and the last token given to a MinibatchDataLoader; then, by worker id, the next pass each
# id's new worker processes take; the number of workers of the last passes begun (a ring of
# (pass, workers)); and the last passes MinibatchDataLoaders planned (a ring of (token, k,
# generation, pass, epoch, resumes)).
_GEN, _BASE, _RESUME_GEN, _SEEN_GEN, _BEGUN, _TOKENS, _PLAN_AT = range(7)
_MAX_WORKERS = 512
_COUNT = 7
_SHAPES_LEN = 16
_SHAPES = _COUNT + _MAX_WORKERS
_PLANS_LEN = 64
_PLAN_FIELDS = 6
_PLANS = _SHAPES + 2 * _SHAPES_LEN
_TABLE_LEN = _PLANS + _PLAN_FIELDS * _PLANS_LEN


# A worker's item up to this size crosses to the main process as bytes through the DataLoader's
# pipe; a larger one as one shared-memory segment (see _worker_copy).
_PIPE_ITEM_BYTES = 1 << 20


def _worker_copy(mb: Any) -> Dict[str, Any]:
    """A DataLoader worker's copy of minibatch ``mb`` (arrays on the ring slot), laid out to cross
    to the main process cheaply: every array copied into one buffer, each at a 64-byte boundary,
    and the item's tensors views on it. PyTorch would hand each tensor's storage over as a
    shared-memory segment of its own, with a file descriptor passed for each; up to
    ``_PIPE_ITEM_BYTES`` the buffer is a ``bytearray`` that pickles as one string through the
    pipe the item travels anyway (``_PipedItem``), above it a tensor, handed over as one segment.
    The copy and the views are NumPy's (a torch operation costs several times as much per call).
    In the main process the tensors are views on that one buffer: a tensor kept from an item keeps
    the whole item's memory (clone it to keep it alone)."""
    arrays = [(name, key, arr) for name, stream in mb.streams.items() for key, arr in stream.arrays()]
    spans = [(arr.nbytes + 63) & ~63 for _, _, arr in arrays]
    total = sum(spans)
    out: Dict[str, Any] = {name: {} for name in mb.streams}
    at = 0
    if total > _PIPE_ITEM_BYTES:
        # Views on one tensor's storage, which PyTorch shares once.
        base = torch.empty(total, dtype=torch.uint8)
        for (name, key, arr), span in zip(arrays, spans):
            view = base[at:at + arr.nbytes].view(torch.from_numpy(arr[:0]).dtype).view(arr.shape)
            np.copyto(view.numpy(), arr)
            out[name][key] = view
            at += span
        return out
    blob = bytearray(total)
    buf = np.frombuffer(blob, dtype=np.uint8)
    table, made = [], []
    for (name, key, arr), span in zip(arrays, spans):
        view = buf[at:at + arr.nbytes].view(arr.dtype).reshape(arr.shape)
        np.copyto(view, arr)
        tensor = torch.from_numpy(view)
        out[name][key] = tensor
        table.append((name, key, arr.dtype.str, arr.shape, at, arr.nbytes))
        made.append(tensor)
        at += span
    return _PipedItem(out, blob, table, made)


class _PipedItem(dict):
    """An item whose tensors are views on one ``bytearray``: it pickles as that buffer and a
    table of (stream, name, dtype, shape, offset, bytes), and unpickles as a plain dict of
    tensors on the unpickled buffer — one copy through the pipe instead of a shared-memory
    segment per tensor. If a ``collate_fn`` in the worker changed a stream (a tensor replaced or
    added), it pickles as a plain dict, as PyTorch would anyway."""

    __slots__ = ("_blob", "_table", "_made")

    def __init__(self, items: Dict[str, Any], blob: bytearray, table: list, made: list) -> None:
        super().__init__(items)
        self._blob, self._table, self._made = blob, table, made

    def __copy__(self) -> "_PipedItem":
        return _PipedItem(self, self._blob, self._table, self._made)

    def __reduce__(self) -> Tuple[Any, tuple]:
        streams = {name for name, *_ in self._table}
        dicts = [self.get(s) for s in streams]
        # Every stream still a dict holding exactly the tensors made, no more.
        unchanged = (all(isinstance(d, dict) for d in dicts) and sum(map(len, dicts)) == len(self._made)
                     and all(self[name].get(key) is t for (name, key, *_), t in zip(self._table, self._made)))
        if not unchanged:
            return dict, (dict(self),)
        rest = {s: d for s, d in self.items() if s not in streams}
        return _unpiped, (self._blob, self._table, rest)


def _unpiped(blob: bytearray, table: list, rest: dict) -> Dict[str, Any]:
    """The main process's item from a ``_PipedItem``'s buffer and table: tensors on ``blob``."""
    buf = np.frombuffer(blob, dtype=np.uint8)
    out: Dict[str, Any] = {}
    for name, key, dtype, shape, at, nbytes in table:
        out.setdefault(name, {})[key] = torch.from_numpy(buf[at:at + nbytes].view(np.dtype(dtype)).reshape(shape))
    out.update(rest)
    return out


def _splits_state(states: list) -> Dict[str, Any]:
    """One state for the workers' ``states`` (each worker's ``state_dict()``, as worker processes
    keep them), as a loader reading those splits in one process saves it: each split resumes
    from its own."""
    if len(states) == 1:
        return dict(states[0])
    epochs = {int(st["epoch"]) for st in states}
    if len(epochs) != 1:
        raise ValueError(f"the workers' states are of different epochs: {sorted(epochs)}")
    return {"epoch": epochs.pop(), "local": list(states), "next": 0, "equal_steps": states[0].get("equal_steps"),
            "tail": states[0].get("tail")}


def _as_is(item: Any) -> Any:
    """The owning loaders' ``collate_fn`` with ``batch_size=None``: the item as the dataset made
    it (its tensors need no conversion)."""
    return item


def _torchdata_restores() -> bool:
    """Whether ``load_state_dict`` was called by torchdata's ``StatefulDataLoader`` restoring its
    iterator (its dataset state goes through ``try_to_deserialize``), not by the trainer."""
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    return caller is not None and str(caller.f_globals.get("__name__", "")).startswith("torchdata.")


def _applies(state: dict) -> bool:
    """Whether the next pass takes something from a loaded state: a session to continue, or the
    earlier run's ``equal_steps`` and ``tail`` for an epoch it had not begun."""
    return _continues(state) or state.get("equal_steps") is not None or state.get("tail") is not None


def _continues(state: dict) -> bool:
    """Whether a state resumes a session (a worker's, any of several splits', or a whole job's),
    rather than only naming the epoch to start."""
    return (state.get("source") is not None or state.get("job") is not None
            or any(_continues(st) for st in state.get("local") or ()))


def _resumes_of(resume: Optional[dict], splits: list) -> Tuple[list, int]:
    """The state each of ``splits`` (global worker index and count) continues from (None: its
    epoch's start), and the split whose turn is first, for a pass that continues from
    ``resume``. A state of several splits read in one process gives each split its own when it
    has them all — in that process, or in DataLoader worker processes of the same split —
    and is otherwise combined into a job's state, which resumes any split."""
    n = len(splits)
    if resume is None:
        return [None] * n, 0
    if resume.get("local") is not None:
        by_split = {(int(st["worker"]), int(st["workers"])): st for st in resume["local"]}
        if all(split in by_split for split in splits):
            mine = [by_split[split] for split in splits]
            first = int(resume.get("next", 0)) if n == len(by_split) else 0
            return [st if _continues(st) else None for st in mine], first % n
        try:
            resume = job_state_dict(resume["local"])
        except ValueError as e:
            raise ValueError(
                f"this state holds workers {min(by_split)[0]}-{max(by_split)[0]} of {min(by_split)[1]}, read in one "
                f"process; to resume them as other splits, give load_state_dict a job_state_dict() of every "
                f"rank's state ({e})") from e
    if resume.get("job") is not None or resume.get("any_worker"):
        return [resume] * n, 0
    if n == 1 and (resume.get("worker"), resume.get("workers")) == splits[0]:
        return [resume], 0
    here = (f"worker {splits[0][0]} of {splits[0][1]}" if n == 1
            else f"workers {splits[0][0]}-{splits[-1][0]} of {splits[0][1]}")
    raise ValueError(
        f"this state belongs to worker {resume.get('worker')} of {resume.get('workers')}; this is {here}: to "
        f"resume at another world size or number of DataLoader workers, give load_state_dict a job_state_dict() "
        f"of every worker's state")


class _SharedTable:
    """int64 slots that every process of a DataLoader shares, whatever its multiprocessing start
    method (fork, spawn, forkserver): a small 0600 file under /dev/shm, mapped by each process and
    locked with ``flock``. It pickles as its path; the process that made it removes it when the
    dataset is collected. (A ``multiprocessing.Array`` made in the default context cannot be
    passed to spawned workers.)"""

    def __init__(self, n: int):
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="minibatchd-torch-", dir=shm)
        try:
            os.ftruncate(fd, 8 * n)
        finally:
            os.close(fd)
        self._path, self._n, self._pid, self._file, self._view = path, n, -1, None, None
        self._owner = weakref.finalize(self, _remove_if_owner, path, os.getpid())

    def __getstate__(self) -> dict:
        return {"path": self._path, "n": self._n}

    def __setstate__(self, state: dict) -> None:
        self._path, self._n, self._pid, self._file, self._view = state["path"], state["n"], -1, None, None

    def _slots(self) -> memoryview:
        # Opened again in each process: a forked child must not share the parent's open file,
        # whose flock would then be the parent's too.
        if self._pid != os.getpid():
            self._file = open(self._path, "r+b")  # noqa: SIM115 (kept open with the mapping)
            # Closed with the table (found by a probe: a ResourceWarning for every process's file).
            weakref.finalize(self, self._file.close)
            self._view = memoryview(mmap.mmap(self._file.fileno(), 8 * self._n)).cast("q")
            self._threads = threading.Lock()  # flock excludes processes, not threads of one
            self._pid = os.getpid()
        return self._view

    @contextlib.contextmanager
    def get_lock(self) -> Iterator[None]:
        self._slots()
        with self._threads:
            fcntl.flock(self._file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._file, fcntl.LOCK_UN)

    def __getitem__(self, i):
        v = self._slots()[i]
        return v.tolist() if isinstance(i, slice) else v

    def __setitem__(self, i, value) -> None:
        if isinstance(i, slice):
            self._slots()[i] = array.array("q", value)
        else:
            self._slots()[i] = value


def _remove_if_owner(path: str, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            os.unlink(path)
