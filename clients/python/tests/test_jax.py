"""The JAX adapter against a real daemon, with real (CPU) jax: passes are sweeps, processes split
each sweep, state dicts resume mid-epoch exactly, and examples/jax_train.py trains and resumes."""

import json

import pytest

from conftest import require, run_example

jax = require("jax")
from minibatchd.jax import MinibatchIterator  # noqa: E402

SEQUENCES = 120


def ids(items):
    out = []
    for item in items:
        f = item["features"]
        for start in list(f["sequence_offsets"])[:-1]:
            out.append(int(f["values"][int(start), 0]))
    return out


def dump_ids(mbs):
    return [int(seq[0][0]) for mb in mbs for seq in mb["streams"]["features"]["sequences"]]


def test_passes_are_sweeps_as_jax_arrays(daemon):
    it = MinibatchIterator("train", daemon.socket, minibatch_size=8, seed=2)
    first, second = list(it), list(it)
    assert ids(first) == dump_ids(daemon.dump("--minibatch-size", "8", "--seed", "2", "--sweep", "0"))
    assert ids(second) == dump_ids(daemon.dump("--minibatch-size", "8", "--seed", "2", "--sweep", "1"))
    assert isinstance(first[0]["features"]["values"], jax.Array)
    assert first[0]["features"]["values"].dtype == jax.numpy.float32
    assert [i["meta"]["epoch"] for i in second] == [1] * len(second)
    it.set_epoch(5)
    assert ids(list(it)) == dump_ids(daemon.dump("--minibatch-size", "8", "--seed", "2", "--sweep", "5"))


def test_processes_split_each_sweep_with_equal_steps(daemon):
    runs = [list(MinibatchIterator("train", daemon.socket, minibatch_size=10, process_index=p, process_count=3)) for p in range(3)]
    assert len({len(r) for r in runs}) == 1
    seen = [i for r in runs for i in ids(r)]
    assert len(seen) == len(set(seen))
    for p, r in enumerate(runs):
        want = daemon.dump("--minibatch-size", "10", "--sweep", "0", "--workers", "3", "--rank", str(p), "--equal-steps")
        assert ids(r) == dump_ids(want)
    whole = [list(MinibatchIterator("train", daemon.socket, minibatch_size=10, process_index=p, process_count=3,
                                    equal_steps=False)) for p in range(3)]
    assert sorted(i for r in whole for i in ids(r)) == list(range(SEQUENCES))
    # `tail` shapes equal steps only: one process (no equal steps) takes it too, as the torch
    # adapter does, so that one script serves 1 and N processes (found by a probe: refused).
    one = list(MinibatchIterator("train", daemon.socket, minibatch_size=10, process_index=0, process_count=1, tail="pad"))
    assert ids(one) == dump_ids(daemon.dump("--minibatch-size", "10", "--sweep", "0"))


def test_state_dict_resumes_mid_epoch(daemon):
    it = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    uninterrupted = ids(list(it)) + ids(list(it))
    first = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    taken = []
    for n, item in enumerate(first):
        taken += ids([item])
        if n == 5:
            saved = first.state_dict()
            break
    again = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    again.load_state_dict(saved)
    # Saved again at once, before any item (found by a probe: the state said epoch 0, source
    # None, and a resume from it replayed everything since).
    assert again.state_dict() == saved
    assert taken + ids(list(again)) + ids(list(again)) == uninterrupted


def test_set_epoch_after_load_state_dict_keeps_the_saved_epoch_and_drops_another(daemon):
    """Found by a probe: the pending resume overrode `set_epoch`, so a loop resumed "from the next
    epoch" got the saved epoch's empty rest and never epoch 1, and `set_epoch(2)` after a mid-epoch
    state got epoch 0's rest labelled epoch 0."""
    sweep = lambda k: dump_ids(daemon.dump("--minibatch-size", "7", "--seed", "1", "--sweep", str(k)))
    first = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    items = []
    for item in first:
        items.append(item)
        last = first.state_dict()  # a per-step checkpoint: the last one is at the epoch's end
        if len(items) == 4:
            middle = first.state_dict()
    assert last["source"] is not None and ids(items) == sweep(0)
    it = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    it.load_state_dict(last)
    for epoch in (1, 2):
        it.set_epoch(epoch)
        got = list(it)
        assert ids(got) == sweep(epoch), epoch
        assert {i["meta"]["epoch"] for i in got} == {epoch}
    it = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    it.load_state_dict(middle)
    it.set_epoch(2)
    assert ids(list(it)) == sweep(2)
    # The saved epoch keeps the resume: its rest, then the next epoch.
    it = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    it.load_state_dict(middle)
    it.set_epoch(0)
    assert ids(items[:4]) + ids(list(it)) == sweep(0)
    assert ids(list(it)) == sweep(1)
    # Found by a probe: saved once the epoch's pass was complete (after the inner loop), a loop
    # that counts from the saved epoch got that epoch again whole; as with the PyTorch adapter,
    # its rest is empty and the next pass the epoch after.
    done = first.state_dict()
    assert (done["epoch"], done["source"], done["finished"]) == (1, None, 0), done
    it = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    it.load_state_dict(done)
    got = []
    for epoch in (0, 1):
        it.set_epoch(epoch)
        got.append(ids(list(it)))
    assert got == [[], sweep(1)], [len(g) for g in got]
    # Without set_epoch, the next pass is the epoch after.
    it = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    it.load_state_dict(done)
    assert ids(list(it)) == sweep(1)


class Interrupt(BaseException):
    """Stands for a KeyboardInterrupt (which pytest would take for the user's)."""


def test_an_exception_while_an_item_is_made_takes_its_minibatch_back(daemon, monkeypatch):
    """As for the torch adapter (found by a probe there): a KeyboardInterrupt while an item's
    arrays were made lost the minibatch while state_dict() counted it."""
    uninterrupted = ids(list(MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)))
    made = MinibatchIterator._item
    calls = []

    def item_or_interrupt(self, mb, epoch):
        calls.append(mb.index)
        if len(calls) == 4:
            raise Interrupt
        return made(self, mb, epoch)

    monkeypatch.setattr(MinibatchIterator, "_item", item_or_interrupt)
    first = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    taken, it = [], iter(first)
    with pytest.raises(Interrupt):
        while True:
            taken += ids([next(it)])
    saved = first.state_dict()
    monkeypatch.setattr(MinibatchIterator, "_item", made)
    again = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    again.load_state_dict(saved)
    assert taken + ids(list(again)) == uninterrupted, "the interrupted minibatch comes first on resume"


def test_a_pass_that_cannot_open_is_not_begun(daemon, monkeypatch):
    """Found by a probe: when a pass's open failed (the daemon stopped, a Ctrl-C during the open),
    its epoch counted as begun, and a checkpoint saved in the handler named the previous one
    finished and this one skipped. The state still names this epoch, whole."""
    import minibatchd.jax as adapter
    sweep = lambda k: dump_ids(daemon.dump("--minibatch-size", "7", "--seed", "1", "--sweep", str(k)))
    it = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    assert ids(list(it)) == sweep(0)

    def refused(*args, **kwargs):
        raise Interrupt

    with monkeypatch.context() as m:
        m.setattr(adapter, "connect", refused)
        with pytest.raises(Interrupt):
            list(it)
    saved = it.state_dict()
    assert (saved["epoch"], saved.get("finished")) == (1, 0), saved
    assert ids(list(it)) == sweep(1), "the failed pass is the next one"
    again = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    again.load_state_dict(saved)
    assert ids(list(again)) == sweep(1)


def test_a_whole_pass_state_restored_and_saved_again_is_the_state_loaded(daemon):
    """Found by a probe: restored from a state saved after a whole pass and saved again before the
    next pass, the state lost `finished`, and the loop counting from the saved epoch read that
    epoch again whole."""
    sweep = lambda k: dump_ids(daemon.dump("--minibatch-size", "7", "--seed", "1", "--sweep", str(k)))
    first = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    first.set_epoch(0)
    list(first)
    saved = first.state_dict()
    again = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    again.load_state_dict(saved)
    assert again.state_dict() == saved
    last = MinibatchIterator("train", daemon.socket, minibatch_size=7, seed=1)
    last.load_state_dict(again.state_dict())
    got = []
    for epoch in (0, 1):
        last.set_epoch(epoch)
        got.append(ids(list(last)))
    assert got == [[], sweep(1)]


def test_jax_example_trains_and_resumes_exactly(daemon, tmp_path):
    def run(name, *extra):
        run_example("jax_train.py", "--socket", daemon.socket, "--dataset", "train", "--minibatch-size", "9",
                    "--epochs", "2", "--checkpoint-every", "5", "--checkpoint", str(tmp_path / f"{name}.pkl"),
                    "--step-log", str(tmp_path / f"{name}.jsonl"), *extra)
        return [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]

    whole = run("whole")
    run("cut", "--stop-after", "13")
    resumed = run("cut")
    key = lambda s: (s["step"], s["epoch"], s["index"], s["position"], s["samples"])  # noqa: E731
    assert [key(s) for s in resumed[13:]] == [key(s) for s in whole[10:]]
    assert all(abs(a["loss"] - b["loss"]) < 1e-6 for a, b in zip(resumed[13:], whole[10:]))
    epoch_loss = [sum(s["loss"] for s in whole if s["epoch"] == e) for e in range(2)]
    assert epoch_loss[1] < epoch_loss[0]


def test_64_bit_values_are_refused_while_x64_is_off_and_delivered_with_it(tmp_path):
    """Found by a probe: with JAX's default 32-bit types, deepx's uint64 feature ids were narrowed
    (2^40 + 125 became 125, another feature's id) without a word. The iterator refuses such a
    stream while x64 is off, saying how to enable it; with x64 on the ids arrive whole. 32-bit
    streams are delivered either way."""
    from conftest import Daemon
    from minibatchd import MinibatchdError

    d = Daemon(tmp_path)
    d.stop()
    svm = tmp_path / "wide.svm"
    svm.write_text("1 1099511627901:0.5 125:1\n0 3:0.25\n")
    d.config.write_text(d.config.read_text() + f'\n[datasets.wide]\nformat = "libsvm"\nfiles = ["{svm}"]\n'
                        '[datasets.wide.sampling]\nrandomize = false\n')
    d._start()
    was = bool(jax.config.jax_enable_x64)
    try:
        jax.config.update("jax_enable_x64", False)
        with pytest.raises(MinibatchdError) as e:
            list(MinibatchIterator("wide", d.socket, minibatch_size=2, full_sweep=True))
        assert e.value.code == "client_jax_x64" and "uint64" in str(e.value) and "jax_enable_x64" in str(e.value)
        assert ids(list(MinibatchIterator("train", d.socket, minibatch_size=8, full_sweep=True)))
        jax.config.update("jax_enable_x64", True)
        items = list(MinibatchIterator("wide", d.socket, minibatch_size=2, full_sweep=True))
        (stream,) = [k for k in items[0] if k != "meta" and "indices" in items[0][k]]
        got = [int(i) for item in items for i in item[stream]["indices"]]
        assert got == [1099511627901, 125, 3], got
    finally:
        jax.config.update("jax_enable_x64", was)
        d.stop()
