"""PyTorch: an ``IterableDataset`` over minibatchd sessions, correct in every ``DataLoader``
setting.

Each pass over the dataset is one epoch, and epoch ``k`` is sweep ``k`` of the CNTK timeline:
iterating again continues the timeline (pass 0 delivers sweep 0, pass 1 sweep 1, ...), and
``set_epoch(k)`` selects sweep ``k`` for the next pass, as ``DistributedSampler.set_epoch`` users
expect. ``DataLoader`` workers split the data: worker ``w`` of rank ``r`` (of ``world`` ranks with
``W`` workers each) is CNTK worker ``r * W + w`` of ``world * W``, so over every worker of every
rank each sweep is delivered exactly once, in an order that depends only on the data, the
sampling options, ``world`` and ``W``.

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

import multiprocessing
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._adapter import user_options
from ._client import connect, torchrun_env

META = "meta"


def job_state_dict(states: list) -> Dict[str, Any]:
    """One state dict for a whole earlier run, from every worker's ``state_dict()`` (any order):
    what ``load_state_dict`` takes to continue that run at any world size and number of
    DataLoader workers. Every worker must have been in the same epoch."""
    by_worker = {}
    for st in states:
        by_worker[int(st["worker"])] = st
    workers = {int(st["workers"]) for st in states}
    if len(workers) != 1 or sorted(by_worker) != list(range(workers.pop())):
        raise ValueError("job_state_dict needs the state_dict() of every worker of the run, each once")
    epochs = {int(st["epoch"]) for st in states}
    if len(epochs) != 1:
        raise ValueError(f"the workers' states are of different epochs: {sorted(epochs)}")
    ordered = [by_worker[w] for w in sorted(by_worker)]
    if any(st.get("source") is None for st in ordered):
        raise ValueError("a worker's state was taken before its first minibatch: resume each worker by its own state")
    return {"epoch": epochs.pop(), "job": [st["source"] for st in ordered]}


class MinibatchIterableDataset(IterableDataset):
    """Streams minibatches of ``dataset`` from the daemon at ``socket``, one sweep per pass.

    ``options`` are session options (``minibatch_size`` is required; ``randomize``, windows,
    ``seed``, ``frame_mode``, ``prefetch``, ``slot_size_bytes``; ``full_sweep=True`` is accepted
    and means what a pass does anyway). The epoch limit and the worker split are the dataset's
    to set: ``max_samples``, ``max_sweeps``, ``sweep``, ``num_workers`` and ``rank`` are refused.
    ``use_torchrun_env`` (default True) takes the rank and the world size from torchrun's
    ``RANK``/``WORLD_SIZE``; ``world_size``/``rank`` set them explicitly. ``equal_steps``
    (default: on when the world size is above 1) gives every rank the same number of minibatches
    per epoch, as ``DistributedDataParallel`` needs: every worker of every rank gets as many as
    the one that gets the fewest, and the ragged tails are dropped (at most a few minibatches a
    worker per epoch; the same ones every run); ``tail="pad"`` instead gives every worker as many
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
        self.world_size = world_size
        self.rank = rank
        self.equal_steps = equal_steps
        resume = options.pop("resume", None)
        self.options = options
        # Shared by the DataLoader's worker processes (passed to them when they start): the
        # epoch of pass 0 and how many worker passes have started since. Pass p of W workers
        # (p = started // W) delivers sweep `base + p`, whichever worker starts first.
        self._base = multiprocessing.Value("q", 0)
        self._started = multiprocessing.Value("q", 0)
        self._resume: Optional[dict] = resume
        self._source = None
        self._epoch: Optional[int] = None
        self._split: Tuple[int, int] = (0, 1)

    # -- epochs ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The next pass delivers sweep ``epoch``; the passes after it continue from there."""
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        with self._base.get_lock():
            self._base.value = epoch
            self._started.value = 0

    def _split_of_this_worker(self) -> Tuple[int, int, int, int]:
        """(global worker index, global worker count, DataLoader workers per rank, world size)."""
        if self.world_size is not None or self.rank is not None:
            rank, world = self.rank or 0, self.world_size or 1
        elif self.use_torchrun_env:
            rank, world = torchrun_env()
        else:
            rank, world = 0, 1
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is out of range for world size {world}")
        info = get_worker_info()
        per_rank, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return rank * per_rank + worker, world * per_rank, per_rank, world

    def _begin_pass(self, per_rank: int, resume: Optional[dict]) -> int:
        with self._base.get_lock():
            p = self._started.value // per_rank
            self._started.value += 1
            if resume is not None:
                # Every worker of this pass resumes the same epoch: the passes after it go on
                # from there.
                self._base.value = int(resume["epoch"]) - p
            return self._base.value + p

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        worker, workers, per_rank, world = self._split_of_this_worker()
        resume, self._resume = self._resume, None
        if resume is not None and "job" not in resume and (resume.get("worker"), resume.get("workers")) != (worker, workers):
            raise ValueError(
                f"this state belongs to worker {resume.get('worker')} of {resume.get('workers')}; "
                f"this is worker {worker} of {workers}: to resume at another world size or number of "
                f"DataLoader workers, give load_state_dict a job_state_dict() of every worker's state")
        epoch = self._begin_pass(per_rank, resume)
        self._epoch, self._split = epoch, (worker, workers)
        options = dict(self.options, sweep=epoch, num_workers=workers, rank=worker)
        if self.equal_steps if self.equal_steps is not None else world > 1:
            options["equal_steps"] = True
        if resume is not None and resume.get("job") is not None:
            options["resume_job"] = resume["job"]
        elif resume is not None and resume.get("source") is not None:
            options["resume"] = resume["source"]
        client = connect(self.socket)
        self._source = client.open(self.dataset, **options)
        try:
            for mb in self._source:
                item: Dict[str, Any] = mb.to_torch()
                if META in item:
                    raise ValueError(f"a stream is named {META!r}, which the torch adapter uses for metadata")
                if self.copy:
                    item = {s: {k: t.clone() for k, t in d.items()} for s, d in item.items()}
                    mb.release()
                item[META] = {"epoch": epoch, "sweep": mb.sweep, "end_of_sweep": mb.end_of_sweep,
                              "position": mb.position, "index": mb.index, "fingerprint": mb.fingerprint,
                              "worker": worker, "workers": workers}
                yield item
        finally:
            self._source.close()

    # -- checkpoints ----------------------------------------------------------------------------

    def state(self) -> Optional[dict]:
        """The session state after the last minibatch this process yielded (``None`` before the
        first pass); ``state_dict()`` is the checkpoint to save."""
        return None if self._source is None else self._source.state()

    def state_dict(self) -> Dict[str, Any]:
        """This process's position: the epoch, the session state after the last minibatch
        yielded, and the worker split it was taken at. With DataLoader workers,
        ``StatefulDataLoader`` calls this in each worker and keeps one per worker."""
        worker, workers = self._split
        source = None if self._source is None else self._source.state()
        if self._epoch is None:
            with self._base.get_lock():
                epoch = self._base.value
        else:
            epoch = self._epoch
        return {"epoch": epoch, "source": source, "worker": worker, "workers": workers}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next pass continues from ``state`` (a ``state_dict()``): the rest of its epoch,
        then the following epochs."""
        if state.get("source") is None and state.get("job") is None:
            # Saved before the first minibatch: start that epoch from its beginning.
            self.set_epoch(int(state.get("epoch", 0)))
            return
        self._resume = dict(state)
