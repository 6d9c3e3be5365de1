"""The PyTorch adapter against a real daemon, with real torch (and torchdata's
StatefulDataLoader): epochs continue the timeline, DataLoader workers and ranks split each sweep
exactly once, state dicts resume mid-epoch exactly, metadata rides along, and a model trains."""

import fcntl
import functools
import gc
import os

import numpy as np
import pytest

from conftest import require, run_example

import minibatchd  # noqa: E402

torch = require("torch")
from torch.utils.data import DataLoader  # noqa: E402

from minibatchd.torch import MinibatchDataLoader, MinibatchIterableDataset  # noqa: E402

SEQUENCES = 120  # conftest.write_data: features' first value is the sequence id


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def ids(item):
    """The sequence ids of a minibatch, in order."""
    f = item["features"]
    starts = f["sequence_offsets"][:-1] if "sequence_offsets" in f else None
    values = f["values"]
    if starts is None:
        return [int(v) for v in values[:, 0]]
    return [int(values[int(s), 0]) for s in starts]


def dump_ids(mbs):
    return [int(seq[0][0]) for mb in mbs for seq in mb["streams"]["features"]["sequences"]]


def item_ids(items):
    return [i for item in items for i in ids(item)]


class Gate:
    """A worker_init_fn that holds the listed DataLoader workers until the test opens it (a
    shared flock the test holds exclusively): a worker that starts late, on cue, without
    sleeping. Pickles as its path and ids, so spawned workers are held too."""

    def __init__(self, path, held):
        self.path, self.held = str(path), frozenset(held)
        self._file = open(self.path, "wb")  # noqa: SIM115 (held until open())
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def __getstate__(self):
        return {"path": self.path, "held": self.held}

    def __setstate__(self, state):
        self.path, self.held, self._file = state["path"], state["held"], None

    def __call__(self, worker_id):
        if worker_id in self.held:
            import signal

            def never_opened(*_):
                raise TimeoutError("the test never opened the gate")

            # A test that fails before opening the gate fails its DataLoader, not the whole run.
            signal.signal(signal.SIGALRM, never_opened)
            signal.alarm(120)
            with open(self.path, "rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH)
            signal.alarm(0)

    def open(self):
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def test_a_pass_is_dump_of_that_sweep_and_passes_continue_the_timeline(daemon):
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=3)
    loader = DataLoader(ds, batch_size=None)
    first, second = list(loader), list(loader)
    assert item_ids(first) == dump_ids(daemon.dump("--minibatch-size", "8", "--seed", "3", "--sweep", "0"))
    assert item_ids(second) == dump_ids(daemon.dump("--minibatch-size", "8", "--seed", "3", "--sweep", "1"))
    assert item_ids(first) != item_ids(second), "two epochs in the same order"
    assert sorted(item_ids(first)) == sorted(item_ids(second)) == list(range(SEQUENCES))
    values = first[0]["features"]["values"]
    assert values.dtype == torch.float32 and values.shape[1] == 3
    meta = [item["meta"] for item in second]
    assert all(m["epoch"] == 1 and m["sweep"] == 1 for m in meta)
    assert [m["end_of_sweep"] for m in meta] == [False] * (len(meta) - 1) + [True]
    assert meta[-1]["position"] == 2 * daemon.dump("--minibatch-size", "100000", "--sweep", "0")[0]["position"]


def test_set_epoch_selects_the_sweep(daemon):
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=5)
    ds.set_epoch(3)
    got = item_ids(DataLoader(ds, batch_size=None))
    assert got == dump_ids(daemon.dump("--minibatch-size", "5", "--sweep", "3"))
    again = item_ids(DataLoader(ds, batch_size=None))
    assert again == dump_ids(daemon.dump("--minibatch-size", "5", "--sweep", "4"))


@pytest.mark.parametrize("workers", [2, 3])
def test_dataloader_workers_split_each_sweep_exactly_once(daemon, workers):
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    for epoch in range(2):
        items = list(loader)
        got = item_ids(items)
        assert sorted(got) == list(range(SEQUENCES)), f"epoch {epoch}"
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        # Worker w is CNTK worker w of `workers` with the global minibatch 8 × `workers`: its
        # items are dump's minibatches for that rank, one for one (a share of 8 samples each,
        # as without workers).
        for w in range(workers):
            mine = [item for item in items if item["meta"]["worker"] == w]
            want = daemon.dump("--minibatch-size", str(8 * workers), "--seed", "1", "--sweep", str(epoch),
                               "--workers", str(workers), "--rank", str(w))
            assert [ids(item) for item in mine] == [dump_ids([mb]) for mb in want]


@pytest.mark.parametrize("workers", [2, 3])
def test_the_owning_loader_reads_its_workers_splits_in_this_process_in_the_dataloaders_order(daemon, workers):
    """MinibatchDataLoader(num_workers=W) reads the W splits in the main process (no item crosses
    between processes): the same items, in the same order, as W worker processes give — one from
    each worker in turn, a worker whose share ended left out (minibatch 5 for each of W workers leaves
    them with different counts) — pass after pass."""
    def run(loader):
        return [[(item["meta"]["worker"], item["meta"]["index"], ids(item)) for item in loader] for _ in range(2)]

    def dataset():
        return MinibatchIterableDataset("train", daemon.socket, minibatch_size=5, seed=5)

    here = MinibatchDataLoader(dataset(), num_workers=workers, prefetch_factor=4, persistent_workers=True)
    assert (here.num_workers, here.split_workers) == (0, workers)
    got = run(here)
    want = run(DataLoader(dataset(), batch_size=None, num_workers=workers))
    assert got == want
    assert run(MinibatchDataLoader(dataset(), num_workers=workers, worker_processes=True)) == want
    counts = {w: sum(1 for item in got[0] if item[0] == w) for w in range(workers)}
    assert len(set(counts.values())) > 1, "the case must have workers with different counts"
    for epoch in got:
        assert sorted(i for *_, batch in epoch for i in batch) == list(range(SEQUENCES))


def test_a_state_taken_at_the_smaller_cut_of_earlier_builds_resumes_each_split_exactly(daemon):
    """Earlier builds cut a worker's items at minibatch_size / W (its session had the global
    minibatch minibatch_size) and recorded no minibatch size in the state: such a state resumes
    every split exactly, the rest of its epoch at that cut (equal steps go on counting its
    minibatches), and the next epoch comes at the rank's share."""
    import minibatchd

    whole = {w: ids_of_splits(daemon, w) for w in range(2)}
    before, local = {}, []
    for w in range(2):
        # The old cut: worker w of 2 with the global minibatch 7 (items of 3 or 4), after 3 of them.
        src = minibatchd.connect(daemon.socket).open("train", minibatch_size=7, seed=6, sweep=0, num_workers=2, rank=w)
        it = iter(src)
        items = [next(it).to_torch() for _ in range(3)]
        assert max(len(item["features"]["values"]) for item in items) <= 4, "the old cut: 3 or 4 samples"
        before[w] = [i for item in items for i in ids(item)]
        local.append({"epoch": 0, "source": src.state(), "worker": w, "workers": 2, "equal_steps": False, "tail": None})
        src.close()
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=6)
    ds.load_state_dict({"epoch": 0, "local": local, "next": 0, "equal_steps": False, "tail": None})
    loader = MinibatchDataLoader(ds, num_workers=2)
    for epoch in range(2):
        after, samples = {w: [] for w in range(2)}, {w: [] for w in range(2)}
        for item in loader:
            after[item["meta"]["worker"]] += ids(item)
            samples[item["meta"]["worker"]].append(len(item["features"]["values"]))
        for w in range(2):
            if epoch == 0:
                assert before[w] + after[w] == whole[w], w
                assert max(samples[w]) <= 4, "the rest of the epoch at the state's cut"
            else:
                assert after[w] == ids_of_splits(daemon, w, sweep=1), w
                assert max(samples[w]) > 4, "the next epoch at the rank's share of 7"


def test_a_resumed_epoch_keeps_its_cut_so_padded_equal_steps_stay_equal_at_another_number_of_workers(daemon):
    """A job state taken with two DataLoader workers (a global minibatch of 2 × 5) resumed with
    three: the rest of that epoch keeps the global minibatch of 10 its state counted its
    minibatches in (items of 3 or 4 samples, not 5), equal steps with tail="pad" give every
    worker as many items, and every sequence comes once."""
    from minibatchd.torch import job_state_dict

    def dataset():
        return MinibatchIterableDataset("train", daemon.socket, minibatch_size=5, seed=3, equal_steps=True, tail="pad")

    ds = dataset()
    it = iter(MinibatchDataLoader(ds, num_workers=2))
    taken = [next(it) for _ in range(4)]  # two items of each worker
    saved = ds.state_dict()
    assert all(st["minibatch_size"] == 10 for st in saved["local"]), saved
    del it
    resumed = dataset()
    resumed.load_state_dict(job_state_dict(saved["local"]))
    rest = list(MinibatchDataLoader(resumed, num_workers=3))
    counts = {w: sum(1 for item in rest if item["meta"]["worker"] == w) for w in range(3)}
    assert len(set(counts.values())) == 1, counts
    assert max(len(item["features"]["values"]) for item in rest) <= 4, "the state's global minibatch of 10 over 3"
    seen = item_ids(taken) + item_ids(rest)
    assert sorted(seen) == list(range(SEQUENCES))


def ids_of_splits(daemon, worker, sweep=0):
    """The sequence ids of worker ``worker`` of 2's share of ``sweep`` (seed 6), in order."""
    return dump_ids(daemon.dump("--minibatch-size", "14", "--seed", "6", "--sweep", str(sweep), "--workers", "2",
                                "--rank", str(worker)))


@pytest.mark.parametrize("processes", [False, True], ids=["same-loader", "worker-processes"])
def test_a_state_of_splits_read_in_one_process_resumes_each_split(daemon, processes):
    """The state dict of a MinibatchDataLoader reading two splits in the main process holds
    each split's position and whose turn is next: the same loader continues in the
    uninterrupted order; DataLoader worker processes of the same splits each continue from their
    own position, the DataLoader's turns starting again at worker 0."""
    def dataset():
        return MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=6)

    def split_ids(item):
        return item["meta"]["worker"], ids(item)

    uninterrupted = [split_ids(item) for item in MinibatchDataLoader(dataset(), num_workers=2)]
    ds = dataset()
    it = iter(MinibatchDataLoader(ds, num_workers=2))
    taken = [split_ids(next(it)) for _ in range(5)]
    saved = ds.state_dict()
    assert [(st["worker"], st["workers"]) for st in saved["local"]] == [(0, 2), (1, 2)] and saved["next"] == 1
    del it
    resumed = dataset()
    resumed.load_state_dict(saved)
    rest = [split_ids(item) for item in MinibatchDataLoader(resumed, num_workers=2, worker_processes=processes)]
    if not processes:
        assert taken + rest == uninterrupted
        return
    # Each split's remaining items, taken in turn from worker 0, an ended split left out.
    left = [[x for x in uninterrupted if x[0] == w][sum(1 for t in taken if t[0] == w):] for w in (0, 1)]
    want = []
    while any(left):
        for w in (0, 1):
            if left[w]:
                want.append(left[w].pop(0))
    assert rest == want
    assert sorted(i for _, batch in taken + rest for i in batch) == list(range(SEQUENCES))


@pytest.mark.parametrize("saved_with,loaded_with", [("processes", True), (True, "processes")])
def test_a_stateful_loaders_state_loads_in_the_other_mode(daemon, saved_with, loaded_with):
    """A StatefulMinibatchDataLoader state saved with worker processes loads into one reading
    the splits in the main process, and the other way round (torchdata's formats differ): each
    split continues from its own position — every sequence of the epoch exactly once."""
    def loader(mode):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=8)
        return stateful_loader(mode)(ds, batch_size=None, num_workers=2)

    first = loader(saved_with)
    it = iter(first)
    taken = [ids(next(it)) for _ in range(5)]
    saved = first.state_dict()
    del it, first
    resumed = loader(loaded_with)
    resumed.load_state_dict(saved)
    rest = [ids(item) for item in resumed]
    assert sorted(i for batch in taken + rest for i in batch) == list(range(SEQUENCES))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_before_the_resumed_pass_opens_keeps_its_position(daemon, workers):
    """state_dict() after a restore but before the pass's first minibatch (its sessions not
    open yet) is the restored position, not the epoch's start: restored again, nothing twice."""
    cls = stateful_loader(True)

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
        return cls(ds, batch_size=None, num_workers=workers)

    uninterrupted = [ids(item) for item in loader()]
    first = loader()
    it = iter(first)
    taken = [ids(next(it)) for _ in range(5)]
    saved = first.state_dict()
    del it, first
    second = loader()
    second.load_state_dict(saved)
    it = iter(second)
    again = second.state_dict()  # nothing taken since the restore
    del it, second
    third = loader()
    third.load_state_dict(again)
    assert taken + [ids(item) for item in third] == uninterrupted


def test_with_a_batch_size_the_owning_loader_makes_worker_processes(daemon):
    """Each worker process batches its own items, which one process taking the splits in turn
    could not: with a batch_size the loader keeps its worker processes."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=1)
    loader = MinibatchDataLoader(ds, batch_size=2, num_workers=2, collate_fn=lambda items: items)
    assert (loader.num_workers, loader.split_workers) == (2, 2)
    batches = list(loader)
    assert all(len({item["meta"]["worker"] for item in batch}) == 1 for batch in batches)
    assert sorted(i for batch in batches for item in batch for i in ids(item)) == list(range(SEQUENCES))


def test_a_dataset_iterated_here_still_goes_to_spawned_workers(daemon):
    """After a pass in the main process the dataset holds its sessions; a spawned worker's copy
    leaves them behind (their sockets cannot be pickled)."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=1)
    assert sorted(item_ids(list(MinibatchDataLoader(ds)))) == list(range(SEQUENCES))
    items = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    assert {item["meta"]["epoch"] for item in items} == {1}
    assert sorted(item_ids(items)) == list(range(SEQUENCES))


def test_the_owning_loader_refuses_what_only_worker_processes_run(daemon):
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7)
    with pytest.raises(ValueError, match="worker_processes=True"):
        MinibatchDataLoader(ds, num_workers=2, worker_init_fn=lambda _: None)
    loader = MinibatchDataLoader(ds, num_workers=2, worker_init_fn=lambda _: None, worker_processes=True)
    assert (loader.num_workers, loader.split_workers) == (2, 2)


def test_a_new_dataloader_after_persistent_workers_goes_on_with_the_next_epoch(daemon):
    """Persistent workers count their later passes in their own processes; a DataLoader made
    afterwards (Lightning's reload_dataloaders_every_n_epochs) with new workers, or iterated in the
    main process, began at the pass the persistent ones first registered, and delivered epoch 1
    again."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=2)
    persistent = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in range(3):
        items = list(persistent)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
    del persistent
    fresh = list(DataLoader(ds, batch_size=None, num_workers=3))
    assert {item["meta"]["epoch"] for item in fresh} == {3}
    assert sorted(item_ids(fresh)) == list(range(SEQUENCES))
    main = list(DataLoader(ds, batch_size=None))
    assert {item["meta"]["epoch"] for item in main} == {4}
    assert item_ids(main) == dump_ids(daemon.dump("--minibatch-size", "8", "--seed", "2", "--sweep", "4"))
    again = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert {item["meta"]["epoch"] for item in again} == {5}

    # The main process's state_dict() after worker passes only names the next epoch (it was 0:
    # a restore replayed everything), and warns that it holds no position within one.
    plain = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=2)
    for _ in range(2):
        list(DataLoader(plain, batch_size=None, num_workers=2))
    with pytest.warns(UserWarning, match="StatefulDataLoader"):
        assert plain.state_dict()["epoch"] == 2


def test_an_initialized_process_group_without_torchrun_env_gives_the_split(daemon, tmp_path):
    """init_process_group(rank=...) without RANK/WORLD_SIZE in the environment: the dataset takes
    the group's rank and size (every rank delivered the whole sweep before)."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, equal_steps=False)
        assert (ds.world_size, ds.rank) == (1, 0)
    finally:
        dist.destroy_process_group()
    # Outside a group, with a given split, nothing changes.
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, world_size=2, rank=1, equal_steps=False)
    assert (ds.world_size, ds.rank) == (2, 1)


def test_a_late_worker_of_a_replaced_iterator_does_not_split_the_new_pass(daemon, tmp_path):
    """`it = iter(loader)` again while the old iterator's worker 1 has not begun its pass (held in
    its worker_init_fn) and the old iterator is still alive: MinibatchDataLoader planned each
    pass when it began, so the new iterator's workers deliver epoch 1 exactly once, and the old
    worker, released afterwards, keeps to epoch 0."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=4)
    gate = Gate(tmp_path / "gate", held={1})
    loader = MinibatchDataLoader(ds, num_workers=2, worker_init_fn=gate, worker_processes=True)
    old = iter(loader)
    first = next(old)
    assert first["meta"]["epoch"] == 0
    loader.worker_init_fn = None
    items = list(iter(loader))
    assert {item["meta"]["epoch"] for item in items} == {1}
    assert sorted(item_ids(items)) == list(range(SEQUENCES))
    gate.open()
    late = next(old)  # worker 1 of the old iterator, begun now
    assert late["meta"]["epoch"] == 0 and late["meta"]["worker"] == 1
    del old
    again = list(loader)
    assert {item["meta"]["epoch"] for item in again} == {2}


def test_ranks_times_workers_split_each_sweep_exactly_once(daemon):
    seen = []
    for rank in range(2):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, world_size=2, rank=rank, equal_steps=False)
        items = list(DataLoader(ds, batch_size=None, num_workers=2))
        assert {item["meta"]["workers"] for item in items} == {4}
        assert {item["meta"]["worker"] for item in items} == {2 * rank, 2 * rank + 1}
        seen += item_ids(items)
    assert sorted(seen) == list(range(SEQUENCES))


def test_limits_and_splits_are_the_adapters_own(daemon):
    for bad in (dict(max_sweeps=2), dict(max_samples=10), dict(num_workers=2), dict(sweep=1), dict(session="s")):
        with pytest.raises(ValueError):
            MinibatchIterableDataset("train", daemon.socket, minibatch_size=4, **bad)
    with pytest.raises(ValueError):
        MinibatchIterableDataset("train", daemon.socket)


def processes(cls):
    """``cls`` (an owning loader) with DataLoader worker processes instead of its workers' splits
    read in the main process."""
    return functools.partial(cls, worker_processes=True)


def stateful_loader(owning):
    """torchdata's StatefulDataLoader (owning False), StatefulMinibatchDataLoader reading its
    workers' splits in the main process (True), or with worker processes ("processes")."""
    require("torchdata")
    if owning:
        from minibatchd.torch import StatefulMinibatchDataLoader
        return processes(StatefulMinibatchDataLoader) if owning == "processes" else StatefulMinibatchDataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader
    return StatefulDataLoader


OWNING = pytest.mark.parametrize("owning", [False, True, "processes"], ids=[
    "StatefulDataLoader", "StatefulMinibatchDataLoader", "StatefulMinibatchDataLoader-processes"])


def test_a_worker_that_had_not_opened_keeps_the_epochs_minibatch_on_resume(daemon):
    """Found by a probe: resumed with another minibatch_size, a worker process whose session
    had not opened when the state was saved (its state recorded no global minibatch) cut the
    rest of its share at the new size, its sibling at the old one. The epoch keeps the
    minibatch it had in every worker."""
    cls = stateful_loader("processes")

    def loader(minibatch_size):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=minibatch_size, seed=2)
        return cls(ds, batch_size=None, num_workers=2)

    def key(item):
        return item["meta"]["worker"], tuple(ids(item))

    uninterrupted = sorted(key(item) for item in loader(7))
    first = loader(7)
    it = iter(first)
    taken = key(next(it))
    saved = first.state_dict()
    states = saved["_snapshot"]["_worker_snapshots"]
    assert {w: st["dataset_state"].get("minibatch_size") for w, st in states.items()} == {
        "worker_0": 14, "worker_1": 14}, states
    del it, first
    resumed = loader(3)
    resumed.load_state_dict(saved)
    rest = [key(item) for item in resumed]
    assert sorted([taken] + rest) == uninterrupted


@OWNING
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_stateful_dataloader_resumes_mid_epoch_exactly(daemon, workers, owning):
    cls = stateful_loader(owning)

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
        return cls(ds, batch_size=None, num_workers=workers)

    reference = loader()
    uninterrupted = [ids(item) for _ in range(2) for item in reference]

    first = loader()
    taken, it = [], iter(first)
    for _ in range(9):
        taken.append(ids(next(it)))
    saved = first.state_dict()
    del it, first

    resumed = loader()
    resumed.load_state_dict(saved)
    rest = [ids(item) for item in resumed]          # the rest of epoch 0
    rest += [ids(item) for item in resumed]         # epoch 1
    assert taken + rest == uninterrupted


@pytest.mark.parametrize("workers,owning", [(0, True), (2, True), (2, "processes")],
                         ids=["no-workers", "splits", "processes"])
def test_a_stateful_loaders_state_after_a_whole_pass_resumes_with_the_next_epoch_once(daemon, workers, owning):
    """Found by a probe: a StatefulMinibatchDataLoader state saved after its pass ended, restored,
    then the usual loop from the saved epoch (set_epoch(0), set_epoch(1)) served sweep 1 twice —
    torchdata's iter() made a fresh iterator at once after the finished one. The restored loader
    finishes the (empty) pass of epoch 0, then serves epoch 1 once."""
    cls = stateful_loader(owning)
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    loader = cls(ds, batch_size=None, num_workers=workers)
    ds.set_epoch(0)
    assert sorted(item_ids(list(loader))) == list(range(SEQUENCES))
    saved = loader.state_dict()
    del loader, ds
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    loader = cls(ds, batch_size=None, num_workers=workers)
    loader.load_state_dict(saved)
    passes = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        passes.append(list(loader))
    assert passes[0] == [], "the rest of epoch 0 is empty"
    assert {item["meta"]["epoch"] for item in passes[1]} == {1}
    assert sorted(item_ids(passes[1])) == list(range(SEQUENCES)), "epoch 1 once"


def test_a_plain_stateful_loaders_state_after_a_whole_pass_is_not_read_twice_after_set_epoch_of_its_epoch(daemon):
    """Found by a probe: torchdata's own StatefulDataLoader (no workers), restored from a state
    saved after the whole pass of epoch 0, then the loop from the saved epoch — set_epoch(0),
    set_epoch(1) — got epoch 1 twice: torchdata restores such a state by making an iterator and
    throwing it away (it takes the restored, empty pass), then the next. That loop is refused with
    what to do; the loop from the epoch after the saved one reads each epoch once."""
    cls = stateful_loader(False)
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    loader = cls(ds, batch_size=None, num_workers=0)
    ds.set_epoch(0)
    assert sorted(item_ids(list(loader))) == list(range(SEQUENCES))
    saved = loader.state_dict()
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    loader = cls(ds, batch_size=None, num_workers=0)
    loader.load_state_dict(saved)
    ds.set_epoch(0)
    with pytest.raises(ValueError, match=r"call set_epoch\(1\)"):
        list(loader)
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    loader = cls(ds, batch_size=None, num_workers=0)
    loader.load_state_dict(saved)
    passes = []
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        passes.append(list(loader))
    assert [{item["meta"]["epoch"] for item in p} for p in passes] == [{1}, {2}]
    assert all(sorted(item_ids(p)) == list(range(SEQUENCES)) for p in passes)


@pytest.mark.parametrize("workers,owning", [(0, True), (2, True), (2, "processes")],
                         ids=["no-workers", "splits", "processes"])
def test_a_state_after_a_whole_pass_restored_without_set_epoch_begins_the_next_epoch(daemon, workers, owning):
    """Found by a probe: examples/torch_train.py, resumed from its end-of-epoch checkpoint, read
    one epoch fewer — its loop counts from the epoch after the saved one and calls no set_epoch,
    and the restored loader's first pass was the saved epoch's empty rest. As torchdata restores
    such a state, the next pass is the next epoch."""
    cls = stateful_loader(owning)
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    loader = cls(ds, batch_size=None, num_workers=workers)
    reference = [list(loader) for _ in range(3)]
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    first = cls(ds, batch_size=None, num_workers=workers)
    assert [ids(i) for i in first] == [ids(i) for i in reference[0]]
    saved = first.state_dict()
    del first, ds
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    resumed = cls(ds, batch_size=None, num_workers=workers)
    resumed.load_state_dict(saved)
    after = [list(resumed) for _ in range(2)]
    assert [[ids(i) for i in p] for p in after] == [[ids(i) for i in p] for p in reference[1:]]
    assert {i["meta"]["epoch"] for i in after[0]} == {1}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_dict_taken_after_a_restore_and_before_its_first_item_is_the_state_restored(daemon, workers):
    """Found by a probe: the dataset's state_dict() after load_state_dict() and before the
    restored pass's first item said {"epoch": e, "source": None}, and a resume from it replayed
    the epoch from its start (a checkpoint saved at once after a restore: preempted again, a save
    at each epoch's start). torchdata's loaders kept theirs."""

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
        return ds, MinibatchDataLoader(ds, num_workers=workers)

    _, reference = loader()
    uninterrupted = [ids(item) for item in reference]
    ds, first = loader()
    it = iter(first)
    taken = [ids(next(it)) for _ in range(5)]
    saved = ds.state_dict()
    del it, first
    ds, _ = loader()
    ds.load_state_dict(saved)
    resaved = ds.state_dict()
    assert resaved == saved
    ds, third = loader()
    ds.load_state_dict(resaved)
    rest = [ids(item) for item in third]
    assert taken + rest == uninterrupted, "nothing repeated, nothing skipped"


class Interrupt(BaseException):
    """Stands for a KeyboardInterrupt (which pytest would take for the user's)."""


def test_an_exception_while_an_item_is_made_takes_its_minibatch_back(daemon, monkeypatch):
    """Found by a probe: a KeyboardInterrupt inside the loader's next(), while the item was
    copied, lost that minibatch, while state_dict() (saved in the handler) counted it: the resume
    skipped it. The minibatch is taken back: the state is before it, and the resume delivers it."""
    from minibatchd import torch as adapter
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    uninterrupted = [ids(item) for item in MinibatchDataLoader(ds, num_workers=0)]
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    loader = MinibatchDataLoader(ds, num_workers=0)
    made = adapter.MinibatchIterableDataset._item
    calls = []

    def item_or_interrupt(self, mb, *args):
        calls.append(mb.index)
        if len(calls) == 4:
            raise Interrupt
        return made(self, mb, *args)

    monkeypatch.setattr(adapter.MinibatchIterableDataset, "_item", item_or_interrupt)
    taken, it = [], iter(loader)
    with pytest.raises(Interrupt):
        while True:
            taken.append(ids(next(it)))
    saved = ds.state_dict()
    monkeypatch.setattr(adapter.MinibatchIterableDataset, "_item", made)
    del it, loader
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    resumed = MinibatchDataLoader(ds, num_workers=0)
    ds.load_state_dict(saved)
    rest = [ids(item) for item in resumed]
    assert len(taken) == 3
    assert taken + rest == uninterrupted, "the interrupted minibatch comes first on resume"


@pytest.mark.parametrize("owning", [False, True], ids=["MinibatchDataLoader", "StatefulMinibatchDataLoader"])
@pytest.mark.parametrize("workers", [0, 2], ids=["no-workers", "splits"])
def test_an_exception_after_the_yield_takes_the_minibatch_back(daemon, workers, owning):
    """Found by a probe: an exception in the DataLoader's own step after the dataset's yield (a
    collate_fn, a Ctrl-C in torch's profiler scope) lost that minibatch, while state_dict() saved
    in the handler counted it: the resume skipped it. It is taken back; the resume delivers it."""
    cls = stateful_loader(True) if owning else MinibatchDataLoader
    calls = []

    def collate(item):
        calls.append(1)
        if len(calls) == 4:
            raise Interrupt
        return item

    def loader(collate_fn=None):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
        return ds, cls(ds, num_workers=workers, collate_fn=collate_fn)

    uninterrupted = [ids(item) for item in loader()[1]]
    ds, first = loader(collate)
    taken, it = [], iter(first)
    with pytest.raises(Interrupt):
        while True:
            taken.append(ids(next(it)))
    # The pass ends there, whichever split's item it was (found by a probe: with splits read
    # here, the others served a turn each first, out of order).
    with pytest.raises(minibatchd.MinibatchdError) as e:
        next(it)
    assert e.value.code == "client_interrupted", e.value
    saved = first.state_dict() if owning else ds.state_dict()
    del it, first
    ds, resumed = loader()
    (resumed if owning else ds).load_state_dict(saved)
    rest = [ids(item) for item in resumed]
    assert len(taken) == 3
    assert sorted(taken + rest) == sorted(uninterrupted) and taken + rest == uninterrupted


@pytest.mark.parametrize("batch", [2, 5], ids=["batch-2", "batch-over-half-the-ring"])
@pytest.mark.parametrize("owning", [False, True], ids=["MinibatchDataLoader", "StatefulMinibatchDataLoader"])
def test_an_exception_in_a_batch_step_takes_all_its_minibatches_back(daemon, owning, batch):
    """Found by a probe: with ``batch_size=2`` in this process, an exception in the DataLoader's
    step after the dataset yielded both minibatches of a batch gave neither back, while
    state_dict() saved in the handler counted both: the resume skipped them. Both are taken
    back; the resume delivers them first. A batch of more minibatches than half the ring (4
    slots) neither waits for ever nor skips."""
    cls = stateful_loader(True) if owning else MinibatchDataLoader
    calls = []

    def collate(items):
        calls.append(len(items))
        if len(calls) == 3:
            raise Interrupt
        return items

    def loader(collate_fn):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2, prefetch=4)
        return ds, cls(ds, batch_size=batch, num_workers=0, collate_fn=collate_fn)

    uninterrupted = [ids(item) for batch in loader(lambda items: items)[1] for item in batch]
    ds, first = loader(collate)
    taken, it = [], iter(first)
    with pytest.raises(Interrupt):
        while True:
            taken.extend(ids(item) for item in next(it))
    assert calls == [batch] * 3, calls
    saved = first.state_dict() if owning else ds.state_dict()
    del it, first
    ds, resumed = loader(lambda items: items)
    (resumed if owning else ds).load_state_dict(saved)
    rest = [ids(item) for batch in resumed for item in batch]
    assert len(taken) == 2 * batch
    assert taken + rest == uninterrupted


@pytest.mark.parametrize("workers,owning", [(0, True), (2, True), (2, "processes")],
                         ids=["no-workers", "splits", "processes"])
def test_a_whole_pass_state_restored_and_saved_again_is_the_state_loaded(daemon, workers, owning):
    """Found by a probe: a StatefulMinibatchDataLoader restored from a state saved after a whole
    pass, and saved again before its first pass (with or without set_epoch of the saved epoch),
    gave a state of the next epoch from its start, which the loop counting from the saved epoch
    read twice after a second restore; with set_epoch first, the second restore was refused with
    advice to use the very loader it was. The state saved again is the state loaded."""
    cls = stateful_loader(owning)

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
        return ds, cls(ds, batch_size=None, num_workers=workers)

    ds, first = loader()
    ds.set_epoch(0)
    list(first)
    saved = first.state_dict()
    for set_first in (False, True):
        ds, again = loader()
        again.load_state_dict(saved)
        if set_first:
            ds.set_epoch(0)
        resaved = again.state_dict()
        ds, last = loader()
        last.load_state_dict(resaved)
        passes = []
        for epoch in (0, 1, 2):
            ds.set_epoch(epoch)
            passes.append(list(last))
        assert passes[0] == [], set_first
        assert [{item["meta"]["epoch"] for item in p} for p in passes[1:]] == [{1}, {2}], set_first
        assert all(sorted(item_ids(p)) == list(range(SEQUENCES)) for p in passes[1:])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_job_state_after_a_whole_pass_resumes_with_the_next_epoch(daemon, workers):
    """Found by a probe: job_state_dict of states saved after a whole pass dropped that the pass
    was complete, so a StatefulMinibatchDataLoader restored from it at another number of workers
    gave the saved epoch's empty rest where its own state gives the next epoch: the loop of
    examples/torch_train.py (resume at the saved epoch + 1, no set_epoch) lost its last epoch."""
    from minibatchd.torch import job_state_dict
    cls = stateful_loader(True)
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    first = cls(ds, batch_size=None, num_workers=workers)
    list(first)
    job = job_state_dict([first.state_dict()])
    assert job.get("finished") is True, job
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
    resumed = cls(ds, batch_size=None, num_workers=2 - workers)
    resumed.load_state_dict(job)
    passes = [list(resumed), list(resumed)]
    assert [{item["meta"]["epoch"] for item in p} for p in passes] == [{1}, {2}]
    assert all(sorted(item_ids(p)) == list(range(SEQUENCES)) for p in passes)


@pytest.mark.parametrize("workers,owning", [(0, True), (2, True), (2, "processes")],
                         ids=["no-workers", "splits", "processes"])
def test_an_iterator_that_was_never_made_begins_no_pass(daemon, monkeypatch, workers, owning):
    """Found by a probe: a Ctrl-C while StatefulMinibatchDataLoader's iter() made its iterator
    (starting its worker processes) counted the pass all the same: the checkpoint saved in the
    handler named epoch 1, and the resume never read epoch 0. A pass whose iterator was never made
    is not begun: the checkpoint resumes epoch 0 from its start, and the loader's next pass is
    epoch 0 too."""
    import torch.utils.data.dataloader as torch_loader
    import torchdata.stateful_dataloader.stateful_dataloader as stateful
    cls = stateful_loader(owning)

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
        return cls(ds, batch_size=None, num_workers=workers)

    uninterrupted = [[ids(item) for item in p] for p in (lambda r: [list(r), list(r)])(loader())]
    kinds = [stateful._StatefulSingleProcessDataLoaderIter, stateful._StatefulMultiProcessingDataLoaderIter,
             torch_loader._SingleProcessDataLoaderIter, torch_loader._MultiProcessingDataLoaderIter]

    def interrupted(self, *args, **kwargs):
        raise Interrupt

    first = loader()
    with monkeypatch.context() as m:
        for kind in kinds:
            m.setattr(kind, "__init__", interrupted)
        with pytest.raises(Interrupt):
            iter(first)
    # A loader made in the handler (a token more in the dataset's table) moves no pass.
    cls(first.dataset, batch_size=None, num_workers=workers)
    saved = first.state_dict()
    assert [ids(item) for item in first] == uninterrupted[0], "the loader's next pass is epoch 0"
    resumed = loader()
    resumed.load_state_dict(saved)
    assert [[ids(item) for item in resumed] for _ in range(2)] == uninterrupted, "epoch 0, then epoch 1"


@pytest.mark.parametrize("owning", [False, True], ids=["DataLoader", "MinibatchDataLoader"])
@pytest.mark.parametrize("workers,taken,persistent", [(3, 0, False), (2, 1, False), (3, 2, True)])
def test_a_pass_left_early_counts_once_for_every_worker(daemon, tmp_path, workers, taken, persistent, owning):
    """A loop left after `taken` minibatches (max_steps, an exception) while the other workers
    were still in their worker_init_fn: they begin that pass when they are let go, and the next
    passes are epochs 1 and 2 on every worker, each exactly once."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=5, seed=3)
    gate = Gate(tmp_path / "gate", held=range(max(taken, 1), workers))
    loader = (processes(MinibatchDataLoader) if owning else DataLoader)(
        ds, batch_size=None, num_workers=workers, worker_init_fn=gate, persistent_workers=persistent)
    it = iter(loader)
    for _ in range(taken):
        next(it)
    gate.open()
    del it
    for epoch in (1, 2):
        items = list(loader)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        assert sorted(item_ids(items)) == list(range(SEQUENCES)), f"epoch {epoch}"


def test_with_the_owning_loader_a_worker_that_never_began_its_pass_moves_nothing(daemon, tmp_path):
    """The case a plain DataLoader cannot tell from a late worker: the loop is left while worker 1
    is still held, and the DataLoader, after waiting for it, terminates it before it began its
    pass. MinibatchDataLoader planned every pass, so the next passes are still epochs 1 and 2."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=5, seed=3)
    gate = Gate(tmp_path / "gate", held={1})
    loader = MinibatchDataLoader(ds, num_workers=2, worker_init_fn=gate, worker_processes=True)
    it = iter(loader)
    assert next(it)["meta"]["epoch"] == 0
    del it  # worker 1 is terminated in its worker_init_fn
    gate.open()
    for epoch in (1, 2):
        items = list(loader)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        assert sorted(item_ids(items)) == list(range(SEQUENCES)), f"epoch {epoch}"


@pytest.mark.parametrize("context,owning", [("spawn", False), ("spawn", True), ("forkserver", True)])
def test_spawned_workers_share_the_pass_table(daemon, context, owning):
    """Workers started with the spawn or forkserver method (the shared table is a mapped file,
    not a fork-context lock): each pass is one epoch, exactly once."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=1)
    loader = (processes(MinibatchDataLoader) if owning else DataLoader)(
        ds, batch_size=None, num_workers=2, multiprocessing_context=context, persistent_workers=owning)
    for epoch in range(2):
        items = list(loader)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        assert sorted(item_ids(items)) == list(range(SEQUENCES))


def test_a_dataloader_recreated_with_the_same_seed_still_moves_on(daemon):
    """A DataLoader made anew each epoch with the same generator seed gives every pass the same
    base seed; the passes still continue the timeline."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=4)
    seen = []
    for epoch in range(3):
        loader = DataLoader(ds, batch_size=None, num_workers=2, generator=torch.Generator().manual_seed(7))
        items = list(loader)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        seen.append(item_ids(items))
        assert sorted(seen[-1]) == list(range(SEQUENCES))
    assert seen[0] != seen[1] != seen[2]


@OWNING
@pytest.mark.parametrize("persistent", [False, True])
def test_a_checkpoint_early_in_a_later_epoch_resumes_exactly(daemon, persistent, owning):
    """StatefulDataLoader with two workers, saved one step into epoch 1 (one worker has not
    delivered anything of it yet): the resumed run ends epoch 1 and gives epoch 2, exactly once."""
    cls = stateful_loader(owning)

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=2)
        return cls(ds, batch_size=None, num_workers=2, persistent_workers=persistent)

    first = loader()
    list(first)
    it = iter(first)
    taken = [next(it)]
    saved = first.state_dict()
    del it, first
    resumed = loader()
    resumed.load_state_dict(saved)
    rest = list(resumed)
    assert {item["meta"]["epoch"] for item in rest} == {1}
    assert sorted(item_ids(taken + rest)) == list(range(SEQUENCES))
    after = list(resumed)
    assert {item["meta"]["epoch"] for item in after} == {2}
    assert sorted(item_ids(after)) == list(range(SEQUENCES))


def test_load_state_dict_with_plain_dataloader_workers_resumes_one_pass_only(daemon):
    """load_state_dict, then a plain DataLoader with forked workers: the first pass is the rest
    of the saved epoch, the next ones the following epochs (not the resumed pass again)."""
    from minibatchd.torch import job_state_dict

    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=4, seed=6)
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    job = job_state_dict([ds.state_dict()])
    resumed = MinibatchIterableDataset("train", daemon.socket, minibatch_size=4, seed=6)
    resumed.load_state_dict(job)
    loader = DataLoader(resumed, batch_size=None, num_workers=2)
    rest = list(loader)
    assert sorted(item_ids(first + rest)) == list(range(SEQUENCES))
    for epoch in (1, 2):
        items = list(loader)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        assert sorted(item_ids(items)) == list(range(SEQUENCES))


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_of_the_saved_epoch_keeps_a_pending_resume(daemon, workers):
    """The DistributedSampler habit — set_epoch(e) before every pass — after load_state_dict of
    a state saved in epoch e: the rest of e, nothing again; set_epoch of another epoch drops it."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=4, seed=6)
    ds.set_epoch(1)
    it = iter(ds)
    first = [next(it) for _ in range(6)]
    saved = ds.state_dict()
    assert saved["epoch"] == 1
    resumed = MinibatchIterableDataset("train", daemon.socket, minibatch_size=4, seed=6)
    resumed.load_state_dict(saved)
    loader = DataLoader(resumed, batch_size=None, num_workers=workers)
    if workers:
        from minibatchd.torch import job_state_dict
        resumed.load_state_dict(job_state_dict([saved]))
    resumed.set_epoch(1)
    rest = list(loader)
    assert {item["meta"]["epoch"] for item in rest} == {1}
    assert sorted(item_ids(first + rest)) == list(range(SEQUENCES))
    resumed.set_epoch(2)
    assert sorted(item_ids(list(loader))) == list(range(SEQUENCES))
    other = MinibatchIterableDataset("train", daemon.socket, minibatch_size=4, seed=6)
    other.load_state_dict(saved)
    other.set_epoch(3)
    items = list(DataLoader(other, batch_size=None))
    assert {item["meta"]["epoch"] for item in items} == {3}
    assert sorted(item_ids(items)) == list(range(SEQUENCES))


def test_a_job_state_resumes_between_one_rank_and_two_with_default_options(daemon):
    """equal_steps defaults to on with several ranks and off with one; a job state carries the
    earlier run's choice (and tail), so resuming 2 -> 1 and 1 -> 2 ranks needs no option."""
    from minibatchd.torch import job_state_dict

    states, first = [], []
    for rank in range(2):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=8, world_size=2, rank=rank, tail="pad")
        it = iter(ds)
        first += [next(it) for _ in range(2 + rank)]
        states.append(ds.state_dict())
    one = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=8, world_size=1, rank=0)
    one.load_state_dict(job_state_dict(states))
    assert sorted(item_ids(first + list(one))) == list(range(SEQUENCES))

    single = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=8, world_size=1, rank=0, tail="pad")
    it = iter(single)
    head = [next(it) for _ in range(3)]
    job = job_state_dict([single.state_dict()])
    rest = []
    for rank in range(2):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=8, world_size=2, rank=rank)
        ds.load_state_dict(job)
        rest += list(ds)
    assert sorted(item_ids(head + rest)) == list(range(SEQUENCES))


def test_a_model_trains_on_it(daemon):
    torch.manual_seed(0)
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=16, seed=0)
    loader = DataLoader(ds, batch_size=None)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(6):
        total, n = 0.0, 0
        for item in loader:
            x = item["features"]["values"][:, 1:]        # the sample's two small features
            y = 3.0 * x[:, :1] - 2.0 * x[:, 1:] + 0.5     # a linear target of them
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item() * len(x), n + len(x)
        losses.append(total / n)
    assert losses[-1] < losses[0] / 4, losses


def test_equal_steps_give_every_rank_the_same_count(daemon):
    counts, seen = [], []
    for rank in range(3):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=10, seed=4, world_size=3, rank=rank)
        items = list(DataLoader(ds, batch_size=None, num_workers=2))
        counts.append(len(items))
        seen += item_ids(items)
        # Each worker's minibatches are dump's for its rank of 6, cut to the common count: a
        # worker's items hold what its rank's would without workers (the global minibatch 10
        # times the rank's 2 workers).
        for w in range(2):
            want = daemon.dump("--minibatch-size", "20", "--seed", "4", "--sweep", "0", "--workers", "6",
                               "--rank", str(2 * rank + w), "--equal-steps")
            assert item_ids([i for i in items if i["meta"]["worker"] == 2 * rank + w]) == dump_ids(want)
    assert len(set(counts)) == 1, counts
    assert len(seen) == len(set(seen)), "a sequence came twice"
    uncut = [len(daemon.dump("--minibatch-size", "20", "--seed", "4", "--sweep", "0", "--workers", "6", "--rank", str(r)))
             for r in range(6)]
    assert len(set(uncut)) > 1, "this case should have a ragged tail to cut"
    assert counts[0] == 2 * min(uncut)


def test_torchrun_ddp_example_two_ranks_equal_steps(daemon, tmp_path):
    """examples/torch_ddp.py under torchrun: two processes, gloo, DistributedDataParallel. Both
    ranks run the same number of steps per epoch (else DDP would hang: the timeout catches it),
    each rank's minibatches are dump's for its rank with equal steps, and the loss falls."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    log = tmp_path / "log"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "clients" / "python"), OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(ROOT / "examples" / "torch_ddp.py"), "--socket", daemon.socket, "--dataset", "train",
         "--minibatch-size", "10", "--epochs", "3", "--step-log", str(log)],
        capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    ranks = [json.loads((log / f"rank-{r}.json").read_text()) for r in range(2)]
    for epoch in range(3):
        counts = [sum(1 for s in r["steps"] if s["epoch"] == epoch) for r in ranks]
        assert counts[0] == counts[1] > 0, counts
        for r in ranks:
            want = daemon.dump("--minibatch-size", "10", "--seed", "0", "--sweep", str(epoch), "--workers", "2",
                               "--rank", str(r["rank"]), "--equal-steps")
            got = [(s["position"], s["samples"]) for s in r["steps"] if s["epoch"] == epoch]
            assert got == [(m["position"], m["streams"]["features"]["num_samples"]) for m in want]
    # The ledger: each step's fingerprint is the expected one, and no sequence reached both ranks.
    from minibatchd import ledger

    for epoch in range(3):
        want = [ledger.expected(daemon.config, "train", minibatch_size=10, seed=0, sweep=epoch, workers=2, rank=r,
                                equal_steps=True) for r in range(2)]
        for r, rank in enumerate(ranks):
            got = [s for s in rank["steps"] if s["epoch"] == epoch]
            assert ledger.first_divergence(got, want[r]) is None
        counts = ledger.exactly_once(want)[epoch]
        assert set(counts.values()) == {1} and len(counts) > SEQUENCES * 0.8
    losses = ranks[0]["losses"]
    assert losses == ranks[1]["losses"] and losses[-1] < losses[0], losses


@pytest.mark.parametrize("workers", [0, 2])
def test_training_example_resumes_from_its_checkpoint_exactly(daemon, tmp_path, workers):
    """examples/torch_train.py stopped after 13 steps (checkpoints every 5) and started again
    sees exactly the minibatches an uninterrupted run sees after step 10."""
    import json

    require("torchdata")

    def run(name, *extra):
        run_example("torch_train.py", "--socket", daemon.socket, "--dataset", "train", "--minibatch-size", "9",
                    "--epochs", "2", "--workers", str(workers), "--checkpoint-every", "5",
                    "--checkpoint", str(tmp_path / f"{name}.pt"), "--step-log", str(tmp_path / f"{name}.jsonl"), *extra)
        return [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]

    whole = run("whole")
    run("cut", "--stop-after", "13")
    resumed = run("cut")
    after = [s for s in resumed if s["step"] > 13]
    assert len(whole) > 20
    key = lambda s: (s["step"], s["epoch"], s["worker"], s["index"], s["position"], s["samples"])  # noqa: E731
    # Steps 11..13 ran twice (after the checkpoint at 10): the second time, identically.
    assert [key(s) for s in resumed[13:]] == [key(s) for s in whole[10:]]
    assert after and all(abs(a["loss"] - b["loss"]) < 1e-6 for a, b in zip(resumed[16:], whole[13:]))


def test_the_ledger_proves_what_each_worker_saw(daemon):
    """Every item's fingerprint is the one `dump --ledger` gives for its worker; over the workers
    each sequence comes once; a run on other options diverges at the first differing step."""
    from minibatchd import ledger

    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=6)
    items = list(DataLoader(ds, batch_size=None, num_workers=2))
    # Worker w is worker w of 2 with the global minibatch 8 × 2: its items hold 8 samples.
    want = {w: ledger.expected(daemon.config, "train", minibatch_size=16, seed=6, sweep=0, workers=2, rank=w)
            for w in range(2)}
    for w in range(2):
        recorded = [i["meta"] for i in items if i["meta"]["worker"] == w]
        assert ledger.first_divergence(recorded, want[w]) is None
        assert [i["meta"]["fingerprint"] for i in items if i["meta"]["worker"] == w] == [e["fingerprint"] for e in want[w]]
    counts = ledger.exactly_once(want.values())
    assert set(counts) == {0} and sorted(counts[0]) == list(range(SEQUENCES)) and set(counts[0].values()) == {1}
    other = ledger.expected(daemon.config, "train", minibatch_size=8, seed=7, sweep=0, workers=2, rank=0)
    assert ledger.first_divergence(other, want[0]) == 0


def test_a_run_resumes_at_another_world_size_exactly(daemon):
    """Two ranks stop after a ragged number of minibatches; their state dicts, combined with
    job_state_dict, resume the epoch on three ranks with two DataLoader workers each: over both
    runs every sequence of the sweep comes exactly once, and the padded tail (tail="pad") gives
    every rank of the second run the same number of minibatches."""
    from minibatchd.torch import job_state_dict

    first, states = [], []
    for rank, take in ((0, 3), (1, 5)):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=5, world_size=2, rank=rank,
                                      tail="pad")
        it = iter(ds)
        first += [next(it) for _ in range(take)]
        states.append(ds.state_dict())
    job = job_state_dict(states)
    assert [s["position"] for s in job["job"]] == [s["source"]["position"] for s in states]
    second, counts = [], []
    for rank in range(3):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=5, world_size=3, rank=rank,
                                      tail="pad")
        ds.load_state_dict(job)
        items = list(DataLoader(ds, batch_size=None, num_workers=2))
        per_worker = {}
        for item in items:
            per_worker[item["meta"]["worker"]] = per_worker.get(item["meta"]["worker"], 0) + 1
        counts += list(per_worker.values())
        second += items
    seen = item_ids(first) + item_ids(second)
    assert sorted(seen) == list(range(SEQUENCES)), "each sequence of the sweep exactly once over both runs"
    assert len(set(counts)) == 1, f"unequal step counts after the resume: {counts}"
    with pytest.raises(ValueError, match="every worker"):
        job_state_dict(states[:1] + states[:1])


@pytest.mark.parametrize("pipe_limit", [1 << 20, 0], ids=["piped", "shared-memory"])
def test_a_workers_item_is_one_buffer_and_crosses_as_one(monkeypatch, pipe_limit):
    """In a DataLoader worker the adapter copies a minibatch's arrays into one buffer, each at a
    64-byte boundary, which crosses to the main process as one string through the pipe (small
    items) or one shared-memory segment (large ones): after the DataLoader's own pickling, every
    value, dtype and shape as before, empty arrays and empty streams included."""
    from multiprocessing.reduction import ForkingPickler
    from types import SimpleNamespace

    import minibatchd.torch as adapter
    from minibatchd._client import STREAM_ARRAYS

    monkeypatch.setattr(adapter, "_PIPE_ITEM_BYTES", pipe_limit)

    def stream(**arrays):
        # A Stream's arrays by name, and arrays(): those it has, in STREAM_ARRAYS order.
        return SimpleNamespace(**{k: arrays.get(k) for k in STREAM_ARRAYS},
                               arrays=lambda: [(k, arrays[k]) for k in STREAM_ARRAYS if arrays.get(k) is not None])

    mb = SimpleNamespace(streams={
        "features": stream(values=np.arange(12, dtype=np.float32).reshape(3, 4),
                           sequence_offsets=np.array([0, 1, 3], dtype=np.int64)),
        "labels": stream(indices=np.array([5, 0, 9], dtype=np.int32), values=np.ones(3, dtype=np.float64),
                         sample_offsets=np.array([0, 1, 2, 3], dtype=np.int64)),
        "ids": stream(values=np.empty(0, dtype=np.uint8), offsets=np.zeros(1, dtype=np.int64)),
        "nothing": stream(),
    })
    copied = adapter._worker_copy(mb)
    copied["meta"] = {"epoch": 3, "worker": 1}
    if pipe_limit:  # one bytearray (a tensor from NumPy has a storage of its own)
        start = np.frombuffer(copied._blob, dtype=np.uint8).ctypes.data
        buffers = lambda t: start <= t.data_ptr() < start + len(copied._blob)  # noqa: E731
    else:  # one tensor storage
        buffers = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    storages = set()
    for s, st in mb.streams.items():
        want = {k: getattr(st, k) for k in STREAM_ARRAYS if getattr(st, k) is not None}
        assert set(copied[s]) == set(want), s
        for k, a in want.items():
            c = copied[s][k]
            assert isinstance(c, torch.Tensor) and c.shape == a.shape and np.array_equal(c.numpy(), a), (s, k)
            assert c.numpy().dtype == a.dtype, (s, k)
            if a.size:
                storages.add(buffers(c))
                assert (c.data_ptr() - next(iter(copied["features"].values())).data_ptr()) % 64 == 0, (s, k)
    assert len(storages) == 1 and storages != {False}
    mb.streams["features"].values[0, 0] = 99.0
    assert copied["features"]["values"][0, 0] == 0.0, "a copy, not a view on the slot"
    # What the main process gets from the DataLoader's queue.
    got = ForkingPickler.loads(bytes(ForkingPickler.dumps(copied)))
    assert type(got) is dict and got["meta"] == {"epoch": 3, "worker": 1} and got["nothing"] == {}
    for s, d in copied.items():
        if s != "meta":
            assert set(got[s]) == set(d), s
            for k, t in d.items():
                assert got[s][k].dtype == t.dtype and torch.equal(got[s][k], t), (s, k)
    if pipe_limit:
        assert type(copied) is not dict, "small items cross through the pipe"
        # A worker-side collate_fn that put a tensor of its own in: a plain dict, still equal.
        copied["features"]["values"] = torch.zeros(2, 2)
        again = ForkingPickler.loads(bytes(ForkingPickler.dumps(copied)))
        assert torch.equal(again["features"]["values"], torch.zeros(2, 2))
        assert torch.equal(again["labels"]["indices"], torch.tensor([5, 0, 9], dtype=torch.int32))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_loaders_own_state_dict_resumes_at_another_world_size(daemon, workers):
    """job_state_dict takes StatefulMinibatchDataLoader.state_dict() as it comes (one per rank),
    not only the workers' dataset states dug out of its snapshot: the run resumes on one rank
    without workers with nothing repeated and nothing lost."""
    from minibatchd.torch import StatefulMinibatchDataLoader, job_state_dict

    require("torchdata")
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9)
    loader = StatefulMinibatchDataLoader(ds, num_workers=workers)
    it = iter(loader)
    first = [next(it) for _ in range(5)]
    saved = loader.state_dict()
    del it, loader
    resumed = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9)
    resumed.load_state_dict(job_state_dict([saved]))
    rest = list(MinibatchDataLoader(resumed))
    assert sorted(item_ids(first + rest)) == list(range(SEQUENCES))
    assert {item["meta"]["epoch"] for item in rest} == {0}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_loader_loads_a_job_state_itself(daemon, workers):
    """docs/multi-node.md has every rank call ``load_state_dict(job_state_dict(all_states))``:
    on the StatefulMinibatchDataLoader, not only on its dataset (found by a probe: torchdata's
    own load_state_dict failed on it with "State doesn't contain key '_num_yielded'"). Two ranks
    stop after different numbers of minibatches; one rank's loader continues the run."""
    from minibatchd.torch import StatefulMinibatchDataLoader, job_state_dict

    require("torchdata")
    states, first = [], []
    for rank in range(2):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9, world_size=2, rank=rank,
                                      tail="pad")
        loader = StatefulMinibatchDataLoader(ds, num_workers=workers)
        it = iter(loader)
        first += [next(it) for _ in range(2 + rank)]
        states.append(loader.state_dict())
        del it, loader
    one = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9, world_size=1, rank=0)
    loader = StatefulMinibatchDataLoader(one, num_workers=workers)
    loader.load_state_dict(job_state_dict(states))
    rest = list(loader)
    assert sorted(item_ids(first + rest)) == list(range(SEQUENCES))


@pytest.mark.parametrize("taken", [0, 1, 2])
def test_a_job_state_of_worker_processes_that_have_not_all_yielded_resumes_exactly(daemon, taken):
    """Found by a probe: job_state_dict refused the state of a StatefulMinibatchDataLoader with
    worker processes taken before each worker had yielded ("a worker's state was taken before its
    first minibatch"), where the same loader reading its splits in one process was taken. A worker
    without a minibatch yet starts at its epoch's first position, and the job keeps the run's
    equal_steps (off on one rank) even when nothing was taken (found by a later probe: the ranks
    resumed with equal steps on and dropped sequences). The run continues on one rank with two
    worker processes, and the job of that — one of its workers not yet started (found by the
    later probe: KeyError 'worker') — goes on: every sequence once."""
    import collections

    import minibatchd
    from minibatchd.torch import StatefulMinibatchDataLoader, job_state_dict

    require("torchdata")
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9)
    loader = StatefulMinibatchDataLoader(ds, num_workers=3, worker_processes=True)
    ds.set_epoch(1)
    it = iter(loader)
    first = [next(it) for _ in range(taken)]
    assert len({item["meta"]["worker"] for item in first}) < 3, "some worker has not yielded"
    job = job_state_dict([loader.state_dict()])
    del it, loader
    if taken == 0:
        # Nothing taken: the epoch from its start on two ranks, with the run's equal steps (off).
        both = []
        for rank in range(2):
            fresh = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9, world_size=2, rank=rank)
            fresh.load_state_dict(job)
            both += list(fresh)
        assert sorted(item_ids(both)) == list(range(SEQUENCES)), "no ragged tail dropped"
    # Continued on one rank with two worker processes, one of which has not yielded when the
    # checkpoint is taken: job_state_dict takes it, and the daemon refuses that job at another
    # world size while a worker is still in the first job's ragged band, saying so; the loader's
    # own state resumes it at the same worker count.
    again = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9)
    loader = StatefulMinibatchDataLoader(again, num_workers=2, worker_processes=True)
    loader.load_state_dict(job)
    it = iter(loader)
    rest = [next(it)]
    saved = loader.state_dict()
    second = job_state_dict([saved])
    del it, loader
    if taken == 0:
        # The first job took nothing: no band, so the second resumes at another world size.
        second_rank_rest = []
        for rank in range(2):
            elsewhere = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9, world_size=2,
                                                 rank=rank)
            elsewhere.load_state_dict(second)
            second_rank_rest += list(elsewhere)
    else:
        elsewhere = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9, world_size=2, rank=0)
        elsewhere.load_state_dict(second)
        with pytest.raises(minibatchd.MinibatchdError, match="ragged band"):
            list(elsewhere)
        last = MinibatchIterableDataset("train", daemon.socket, minibatch_size=6, seed=9)
        loader = StatefulMinibatchDataLoader(last, num_workers=2, worker_processes=True)
        loader.load_state_dict(saved)
        second_rank_rest = list(loader)
    counts = collections.Counter(item_ids(first + rest + second_rank_rest))
    assert sorted(counts) == list(range(SEQUENCES)) and set(counts.values()) == {1}, (job, second, counts)
    assert {item["meta"]["epoch"] for item in first + rest + second_rank_rest} == {1}


def test_the_ledger_of_a_padded_run_is_what_every_rank_saw(daemon):
    """tail="pad": the ledger (dump --equal-steps --tail pad) has the padding's empty minibatches
    too, so each rank's recorded fingerprints, padding included, are the expected ones; a missing
    binary is named."""
    from minibatchd import ledger

    lengths, padded = set(), 0
    for rank in range(3):
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=10, seed=4, world_size=3, rank=rank,
                                      tail="pad")
        items = list(MinibatchDataLoader(ds))
        want = ledger.expected(daemon.config, "train", minibatch_size=10, seed=4, sweep=0, workers=3, rank=rank,
                               equal_steps=True, tail="pad")
        assert ledger.first_divergence([i["meta"] for i in items], want) is None
        lengths.add(len(want))
        padded += sum(1 for e in want if not e["sequences"])
    assert len(lengths) == 1 and padded > 0, (lengths, padded)
    with pytest.raises(RuntimeError, match="MINIBATCHD_BIN"):
        ledger.expected(daemon.config, "train", binary="/nonexistent/minibatchd", minibatch_size=10)


@pytest.mark.parametrize("persistent", [False, True])
def test_the_owning_loader_follows_set_epoch_before_every_pass(daemon, tmp_path, persistent):
    """The DistributedSampler habit with MinibatchDataLoader: set_epoch(e) before each pass, a
    pass left after one minibatch while the other worker had not begun (held), epochs skipped:
    every pass is the epoch set, each worker's share exactly dump's."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=5, seed=5)
    gate = Gate(tmp_path / "gate", held={1})
    loader = MinibatchDataLoader(ds, num_workers=2, persistent_workers=persistent, worker_init_fn=gate,
                                 worker_processes=True)
    ds.set_epoch(2)
    it = iter(loader)
    assert next(it)["meta"]["epoch"] == 2
    gate.open()
    del it
    for epoch in (3, 4, 7):
        ds.set_epoch(epoch)
        items = list(loader)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        for w in range(2):
            want = daemon.dump("--minibatch-size", "8", "--seed", "5", "--sweep", str(epoch), "--workers", "2",
                               "--rank", str(w))
            assert item_ids([i for i in items if i["meta"]["worker"] == w]) == dump_ids(want), (epoch, w)


def test_persistent_workers_end_with_their_loader_without_the_garbage_collector(daemon):
    """Found by a probe: the persistent worker processes of a ``MinibatchDataLoader`` outlived
    ``del loader`` until the garbage collector ran (a cycle through the iterator's ``_reset``)."""
    ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=5)
    loader = MinibatchDataLoader(ds, num_workers=2, persistent_workers=True, worker_processes=True)
    assert len(list(loader)) > 0 and len(list(loader)) > 0, "two passes on the same workers"
    workers = [w for w in loader._iterator._workers]
    assert all(w.is_alive() for w in workers)
    gc.disable()
    try:
        del loader
        for w in workers:
            w.join(timeout=30)
        assert not any(w.is_alive() for w in workers), "the workers outlived their loader"
    finally:
        gc.enable()


def test_the_shared_table_closes_its_file_with_it():
    """Found by a probe: each process's handle on the table's /dev/shm file was left to the
    garbage collector, with a ResourceWarning ("unclosed file")."""
    import gc
    import warnings
    from minibatchd.torch import _SharedTable
    table = _SharedTable(4)
    table[1] = 7
    assert table[1] == 7
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del table
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


@pytest.mark.parametrize("owning", [True, "processes"], ids=["splits", "processes"])
def test_set_epoch_of_another_epoch_drops_a_stateful_loaders_mid_epoch_resume(daemon, owning):
    """Found by a probe: a StatefulMinibatchDataLoader restored from a state saved mid-epoch e,
    then set_epoch(e + 1), gave the rest of e in that pass, and e + 1 was never read. As
    docs/client.md says, set_epoch of another epoch drops the resume: the pass is e + 1, whole."""
    cls = stateful_loader(owning)

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=8, seed=3)
        return ds, cls(ds, batch_size=None, num_workers=2)

    ds, first = loader()
    ds.set_epoch(1)
    it = iter(first)
    for _ in range(3):
        next(it)
    saved = first.state_dict()
    del it, first
    ds, resumed = loader()
    resumed.load_state_dict(saved)
    ds.set_epoch(2)
    items = list(resumed)
    assert {item["meta"]["epoch"] for item in items} == {2}
    assert sorted(item_ids(items)) == list(range(SEQUENCES))


def test_a_stateful_loader_restores_a_worker_that_had_finished_its_split_with_set_epoch(daemon):
    """Found by a probe: with worker processes, a state saved when one worker had delivered its
    whole split of epoch e and the other had not, restored with the loop's set_epoch(e), failed
    in the finished worker ("saved after the whole pass ... call set_epoch(e + 1)") — a refusal
    meant for torchdata's own loader. Here the state is made so (worker 1's snapshot taken from
    the same epoch's end): the finished worker gives nothing, the other the rest of its split."""
    cls = stateful_loader("processes")

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=3)
        return ds, cls(ds, batch_size=None, num_workers=2)

    def key(item):
        return item["meta"]["worker"], tuple(ids(item))

    ds, whole = loader()
    ds.set_epoch(1)
    full = [key(item) for item in whole]
    ended = whole.state_dict()["_snapshot"]["_worker_snapshots"]["worker_1"]
    assert ended["dataset_state"].get("finished"), ended
    ds, first = loader()
    ds.set_epoch(1)
    it = iter(first)
    got = [key(next(it)) for _ in range(10)]
    saved = first.state_dict()
    del it, first
    saved["_snapshot"]["_worker_snapshots"]["worker_1"] = ended
    ds, resumed = loader()
    resumed.load_state_dict(saved)
    ds.set_epoch(1)
    rest = [key(item) for item in resumed]
    assert rest == [k for k in full if k[0] == 0 and k not in got]


@pytest.mark.parametrize("next_epoch_first", [False, True], ids=["set_epoch(e)", "set_epoch(e+1)"])
def test_torchdatas_loader_restores_a_state_taken_at_its_last_item_with_either_loop(daemon, next_epoch_first):
    """Found by a probe: torchdata's own StatefulDataLoader with three worker processes, its
    state taken at the last item of epoch e (before the loop saw the pass end, so the loader had
    not finished but the worker that gave that item had). Restored with set_epoch(e), the
    finished worker refused ("saved after the whole pass ... call set_epoch(e + 1)"); following
    that advice, the pass of set_epoch(e + 1) delivered nothing — the workers took epoch e's
    rest — and epoch e + 1 was lost without a word. Now either loop is exact: set_epoch(e) gives
    e's rest (nothing), set_epoch of another epoch drops the resume, as docs/client.md says."""
    cls = stateful_loader(False)

    def loader():
        ds = MinibatchIterableDataset("train", daemon.socket, minibatch_size=7, seed=3)
        return ds, cls(ds, batch_size=None, num_workers=3)

    ds, whole = loader()
    ds.set_epoch(1)
    count = len(list(whole))
    ds, first = loader()
    ds.set_epoch(1)
    it = iter(first)
    got = [next(it) for _ in range(count)]
    saved = first.state_dict()
    del it, first
    assert sorted(item_ids(got)) == list(range(SEQUENCES))
    workers = saved["_snapshot"]["_worker_snapshots"].values()
    assert not saved["_iterator_finished"] and any(w["dataset_state"].get("finished") for w in workers), saved
    ds, resumed = loader()
    resumed.load_state_dict(saved)
    if not next_epoch_first:
        ds.set_epoch(1)
        assert list(resumed) == []
    for epoch in (2, 3):
        ds.set_epoch(epoch)
        items = list(resumed)
        assert {item["meta"]["epoch"] for item in items} == {epoch}
        assert sorted(item_ids(items)) == list(range(SEQUENCES)), epoch
