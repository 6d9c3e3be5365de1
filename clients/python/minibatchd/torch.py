"""PyTorch: an ``IterableDataset`` over minibatchd sessions, correct in every ``DataLoader``
setting.

Each pass over the dataset is one epoch, and epoch ``k`` is sweep ``k`` of the CNTK timeline:
iterating again continues the timeline (pass 0 delivers sweep 0, pass 1 sweep 1, ...), and
``set_epoch(k)`` selects sweep ``k`` for the next pass, as ``DistributedSampler.set_epoch`` users
expect. Which pass a DataLoader worker is in is decided when its iterator is made, and every
worker of a pass agrees on it (the pass's base seed, and whether its workers were forked together
or still run): a loop left before some workers fetched anything still counts as one pass.
``DataLoader`` workers split the data: worker ``w`` of rank ``r`` (of ``world`` ranks with
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

import array
import contextlib
import fcntl
import mmap
import os
import tempfile
import threading
import warnings
import weakref
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
    ordered = [by_worker[w] for w in sorted(by_worker)]
    extra = {}
    for key in ("equal_steps", "tail"):
        values = {st.get(key) for st in ordered}
        if len(values) == 1:
            extra[key] = values.pop()
    epochs = {int(st["epoch"]) for st in ordered}
    if len(epochs) != 1:
        raise ValueError(f"the workers' states are of different epochs: {sorted(epochs)}")
    if any(st.get("source") is None for st in ordered):
        raise ValueError("a worker's state was taken before its first minibatch: resume each worker by its own state")
    return {"epoch": epochs.pop(), "job": [st["source"] for st in ordered], **extra}


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
        self._shared[_HIST:_TABLE_LEN] = [-1] * (3 * _HIST_LEN)
        self._last: Optional[Tuple[int, int, int]] = None  # (pid, generation, pass) begun here last
        self._resume: Optional[dict] = None
        self._resume_gen = -1
        self._resume_local = False
        self._source = None
        self._epoch: Optional[int] = None
        self._split: Tuple[int, int] = (0, 1)
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
        # A pending load_state_dict of this very epoch stays (the usual loop calls set_epoch
        # before every pass, the resumed one included); another epoch replaces it.
        resume = self._resume
        keep = resume is not None and not self._resume_local and int(resume.get("epoch", 0)) == epoch
        gen = self._new_generation(epoch, resuming=keep and _continues(resume))
        if keep:
            self._resume_gen = gen
        else:
            self._resume = None

    def _split_of_this_worker(self) -> Tuple[int, int, int]:
        """(global worker index, global worker count, world size)."""
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
        return rank * per_rank + worker, world * per_rank, world

    def _pass_of_a_new_worker(self, gen: int, info: Any) -> Tuple[Optional[int], Optional[int]]:
        """The pass of a worker process's first ``iter()`` in generation ``gen`` (under the lock),
        or ``(None, epoch)`` for a late worker of an earlier pass (its seed is one of the last
        passes' and not the current one's).

        A DataLoader draws one base seed per ``iter(loader)`` and gives it to every worker of that
        pass (``info.seed - info.id``). A worker joins the current pass when it has the current
        pass's seed, its worker id has not started in that pass yet, and a worker of that pass
        is still running or it was forked with them (a worker slow to set up); otherwise it
        begins the next pass. So a pass whose other workers never fetched anything (a loop left
        early) still counts once, and a DataLoader re-created with the same generator seed every
        epoch still moves on: the previous pass's workers have exited by then."""
        sh = self._shared
        if info.id >= _MAX_WORKERS:
            raise ValueError(f"at most {_MAX_WORKERS} DataLoader workers per rank")
        seed = (info.seed - info.id) & _SEED_MASK
        current = self._current_pass(gen)
        pids = [pid for pid in sh[_PIDS:_PIDS + _MAX_WORKERS] if pid]
        started = _start_ticks(os.getpid())
        # A worker of the current pass that starts late (slow setup) was forked with the others.
        forked_together = started is not None and abs(started - sh[_CUR_START]) <= _TOGETHER_TICKS
        joins = (current >= 0 and sh[_CUR_SEED] == seed and sh[_PIDS + info.id] == 0
                 and (forked_together or any(_pid_alive(pid) for pid in pids)))
        if not joins and seed != sh[_CUR_SEED]:
            # A worker of an earlier pass starting late (its iterator kept alive while a new one
            # began, or torn down while it set up): that pass's epoch, and the current pass goes
            # on undisturbed — it began the next pass and split the current one before.
            # (It was forked with that pass's first worker: a later DataLoader whose seed repeats
            # an earlier one's begins a pass of its own.)
            for i in range(_HIST_LEN):
                h = _HIST + 3 * i
                if sh[h] == seed and started is not None and abs(started - sh[h + 2]) <= _TOGETHER_TICKS:
                    return None, sh[h + 1]
        if not joins:
            current += 1
            self._start_pass(current, seed, started)
            at = sh[_HIST_AT] % _HIST_LEN
            sh[_HIST + 3 * at:_HIST + 3 * at + 3] = [seed, sh[_BASE] + current, sh[_CUR_START]]
            sh[_HIST_AT] = at + 1
        sh[_PIDS + info.id] = os.getpid()
        return current, None

    def _current_pass(self, gen: int) -> int:
        """The latest pass begun in generation ``gen`` by any process (-1 for none; under the
        lock). The table's pass is forgotten when the generation changes."""
        sh = self._shared
        if sh[_SEEN_GEN] != gen:
            sh[_SEEN_GEN], sh[_CUR] = gen, -1
            sh[_PIDS:_PIDS + _MAX_WORKERS] = [0] * _MAX_WORKERS
        return sh[_CUR]

    def _start_pass(self, p: int, seed: int, started: Optional[int]) -> None:
        """Pass ``p`` is the table's current one, with base ``seed``, its first worker started at
        ``started`` (clock ticks) and no worker registered yet (under the lock)."""
        sh = self._shared
        sh[_CUR], sh[_CUR_SEED], sh[_CUR_START] = p, seed, started if started is not None else -(1 << 40)
        sh[_PIDS:_PIDS + _MAX_WORKERS] = [0] * _MAX_WORKERS

    def _note_pass(self, gen: int, p: int) -> None:
        """Pass ``p`` of generation ``gen`` began in a process that is not a new worker (the main
        process, or a persistent worker): new worker processes begin after it, never join it
        (under the lock)."""
        if p > self._current_pass(gen):
            # No new worker's seed is -1: the next new worker begins pass p + 1.
            self._start_pass(p, -1, None)

    def _next_pass_here(self, gen: int) -> Optional[int]:
        """The next pass of this process in generation ``gen`` if it began one, else None."""
        last = self._last
        return last[2] + 1 if last is not None and last[0] == os.getpid() and last[1] == gen else None

    def _begin_pass(self) -> Tuple[int, Optional[dict]]:
        """(the epoch this pass delivers, the state it resumes from or None), decided at
        ``iter()``: the DataLoader calls it in every worker when the worker starts (or, with
        persistent workers, when a pass starts), before anything is fetched."""
        info = get_worker_info()
        pid = os.getpid()
        sh = self._shared
        with sh.get_lock():
            gen = sh[_GEN]
            resume = None
            if self._resume is not None and self._resume_local:
                # load_state_dict in this worker (torchdata's StatefulDataLoader restoring it):
                # this worker's next pass continues from it.
                resume, self._resume = self._resume, None
            mine = self._next_pass_here(gen)
            if info is None:
                # The main process (no workers): after its own passes and after any that worker
                # processes of another DataLoader over this dataset began.
                p = max(mine or 0, self._current_pass(gen) + 1)
                self._note_pass(gen, p)
            elif mine is not None:
                p = mine                 # a persistent worker's next pass (its group moves as one)
                self._note_pass(gen, p)  # so that a new DataLoader's workers begin after it
            else:
                p, earlier = self._pass_of_a_new_worker(gen, info)
                if p is None:
                    self._last = None
                    return earlier, None
            self._last = (pid, gen, p)
            if resume is None and p == 0 and self._resume is not None and self._resume_gen == gen:
                resume = self._resume
                if info is None:
                    self._resume = None  # consumed here; forked workers of later passes have p > 0
            elif resume is None and p == 0 and sh[_RESUME_GEN] == gen:
                raise RuntimeError(
                    "load_state_dict() was called after this DataLoader's persistent workers started, so they "
                    "cannot see the state: call it before the first iter(), or use torchdata's StatefulDataLoader")
            if resume is not None:
                sh[_BASE] = int(resume.get("epoch", 0)) - p
            return sh[_BASE] + p, resume

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        # Not a generator: the pass is decided here, when the DataLoader makes the iterator,
        # not at the first next() (which a worker of an abandoned pass may never reach).
        worker, workers, world = self._split_of_this_worker()
        epoch, resume = self._begin_pass()
        if resume is not None and not _continues(resume):
            resume = None  # saved before its first minibatch: that epoch from its start
        if resume is not None and "job" not in resume and (resume.get("worker"), resume.get("workers")) != (worker, workers):
            raise ValueError(
                f"this state belongs to worker {resume.get('worker')} of {resume.get('workers')}; "
                f"this is worker {worker} of {workers}: to resume at another world size or number of "
                f"DataLoader workers, give load_state_dict a job_state_dict() of every worker's state")
        self._epoch, self._split, self._source = epoch, (worker, workers), None
        options = dict(self.options, sweep=epoch, num_workers=workers, rank=worker)
        equal = self.equal_steps
        if equal is None and resume is not None and resume.get("equal_steps") is not None:
            equal = bool(resume["equal_steps"])  # the earlier run's, so that its state fits
        if equal is None:
            equal = world > 1
        self._equal = equal
        if equal:
            options["equal_steps"] = True
            if "tail" not in options and resume is not None and resume.get("tail") is not None:
                options["tail"] = resume["tail"]  # the earlier run's, as equal_steps above
        else:
            options.pop("tail", None)  # tail only shapes equal steps
        self._tail = options.get("tail")
        if resume is not None and resume.get("job") is not None:
            options["resume_job"] = resume["job"]
        elif resume is not None:
            options["resume"] = resume["source"]
        return self._stream(epoch, worker, workers, options)

    def _stream(self, epoch: int, worker: int, workers: int, options: dict) -> Iterator[Dict[str, Any]]:
        client = connect(self.socket)
        self._source = source = client.open(self.dataset, **options)
        try:
            for mb in source:
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
            source.close()

    # -- checkpoints ----------------------------------------------------------------------------

    def state(self) -> Optional[dict]:
        """The session state after the last minibatch this process yielded (``None`` before the
        first pass); ``state_dict()`` is the checkpoint to save."""
        return None if self._source is None else self._source.state()

    def state_dict(self) -> Dict[str, Any]:
        """This process's position: the epoch, the session state after the last minibatch
        yielded, and the worker split it was taken at. With DataLoader workers,
        ``StatefulDataLoader`` calls this in each worker and keeps one per worker. After a
        complete pass it is the end of that epoch: a StatefulDataLoader restored from it finishes
        that (empty) pass and goes on with the next epoch."""
        worker, workers = self._split
        if self._epoch is None:
            sh = self._shared
            with sh.get_lock():
                gen = sh[_GEN]
                mine = self._next_pass_here(gen) or 0
                others = self._current_pass(gen) + 1
                epoch = sh[_BASE] + max(mine, others)
            if others > mine and get_worker_info() is None:
                # DataLoader worker processes iterated, and their positions are theirs: this state
                # names the epoch after their latest pass, right at an epoch's end only.
                warnings.warn(
                    "state_dict() of a MinibatchIterableDataset whose passes ran in DataLoader worker "
                    "processes holds only the next epoch, not a position within one: to resume mid-epoch, "
                    "use torchdata's StatefulDataLoader (its state_dict() keeps every worker's)", stacklevel=2)
            source = None
        else:
            epoch, source = self._epoch, None if self._source is None else self._source.state()
        return {"epoch": epoch, "source": source, "worker": worker, "workers": workers, "equal_steps": self._equal,
                "tail": self._tail}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next pass continues from ``state`` (a ``state_dict()`` or a ``job_state_dict()``):
        the rest of its epoch, then the following epochs. Called in a DataLoader worker (as
        torchdata's ``StatefulDataLoader`` does), it applies to that worker's next pass."""
        if get_worker_info() is not None:
            self._resume, self._resume_local = dict(state), True
            return
        gen = self._new_generation(int(state.get("epoch", 0)), resuming=_continues(state))
        self._resume, self._resume_gen, self._resume_local = dict(state), gen, False

    def _new_generation(self, epoch: int, resuming: bool) -> int:
        """Starts a generation whose pass 0 is ``epoch`` (``resuming``: a main-process state
        continues it, which persistent workers started earlier cannot see); returns its number."""
        sh = self._shared
        with sh.get_lock():
            sh[_GEN] += 1
            sh[_BASE] = epoch
            if resuming:
                sh[_RESUME_GEN] = sh[_GEN]
            return sh[_GEN]


# The shared table of a MinibatchIterableDataset: generation (bumped by set_epoch and
# load_state_dict), epoch of its pass 0, the generation a main-process load_state_dict set, and
# the current pass of new worker processes: its generation, number, base seed, the start time
# of its first worker and the pids of its workers by worker id.
_GEN, _BASE, _RESUME_GEN, _SEEN_GEN, _CUR, _CUR_SEED, _CUR_START, _PIDS = range(8)
# Workers forked within this many clock ticks (a DataLoader forks a pass's workers in one loop).
_TOGETHER_TICKS = max(1, (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100) // 4)
_MAX_WORKERS = 512
# The base seed, epoch and first worker's start of the last passes new workers began (a ring), so
# that a worker of an earlier pass that starts late joins it instead of beginning another.
_HIST_LEN = 16
_HIST_AT = _PIDS + _MAX_WORKERS
_HIST = _HIST_AT + 1
_TABLE_LEN = _HIST + 3 * _HIST_LEN
_SEED_MASK = (1 << 62) - 1


def _continues(state: dict) -> bool:
    """Whether a state resumes a session (a worker's, or a whole job's), rather than only naming
    the epoch to start."""
    return state.get("source") is not None or state.get("job") is not None


def _proc_stat(pid: int) -> list:
    """The fields of ``/proc/PID/stat`` after the command name (state first); raises OSError."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2:].split()


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    try:
        return _proc_stat(pid)[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def _start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started, in clock ticks since boot (Linux), else None."""
    try:
        return int(_proc_stat(pid)[19])
    except (OSError, ValueError, IndexError):
        return None


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
