"""A weighted mixture served by the daemon (docs/mixtures.md) through the Python client, the torch
adapter and the JAX adapter: every worker gets what `minibatchd dump --mixture` prints for it,
epoch after epoch; a state resumes at another world size, and the next epoch from the last
state; a StatefulDataLoader resumes mid-epoch exactly, at the same world size from each worker's
own state and at another from one common state; the end-to-end example runs."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, DEADLINE, Daemon, daemon_section, require, run_example, write_data

import minibatchd

torch = require("torch")

from minibatchd.torch import MinibatchDataLoader, MinibatchIterableDataset, job_state_dict  # noqa: E402


class MixtureDaemon(Daemon):
    """The test daemon's `train` (120 CTF sequences of 1..=4 samples, randomized) and `extra` (40
    one-sample sequences in file order; first feature 1000 + its line), mixed 3 : 1 as `blend`,
    whose epoch ends with the first source to end its sweep."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        write_data(tmp / "data.ctf")
        (tmp / "extra.ctf").write_text("".join(f"|F {1000 + i} 0 0 |L {i % 6}:1\n" for i in range(40)))
        self.socket = str(tmp / "mbd.sock")
        self.config = tmp / "minibatchd.toml"
        streams = lambda d: (f'[datasets.{d}.streams.features]\nalias = "F"\ndim = 3\nformat = "dense"\n'
                             f'[datasets.{d}.streams.labels]\nalias = "L"\ndim = 6\nformat = "sparse"\n')
        self.config.write_text(daemon_section(tmp, self.socket) + f"""
[datasets.train]
format = "ctf"
files = ["{tmp}/data.ctf"]
chunk_size_bytes = 256
{streams("train")}[datasets.train.sampling]
window_chunks = 3
seed = 0

[datasets.extra]
format = "ctf"
files = ["{tmp}/extra.ctf"]
chunk_size_bytes = 128
{streams("extra")}[datasets.extra.sampling]
randomize = false

[mixtures.blend]
datasets = ["train", "extra"]
weights = [3, 1]
epoch = "first_sweep_end"
""")
        self._start()

    def dump_mixture(self, *args: str) -> list:
        out = subprocess.run([BIN, "dump", "--config", str(self.config), "--mixture", "blend", "--ledger", *args],
                             capture_output=True, text=True, timeout=DEADLINE)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture
def mixture(tmp_path):
    d = MixtureDaemon(tmp_path)
    yield d
    d.stop()


def next_epoch(state: dict) -> dict:
    """The mixture's state at the start of the next epoch (`MixtureState::next_epoch`)."""
    return dict(state, step=0, slots=0, samples=0, ended=False)


def by_worker(items: list) -> dict:
    out: dict = {}
    for item in items:
        meta = item["meta"]
        out.setdefault(meta["worker"], []).append(meta)
    return out


def test_the_client_reads_each_worker_and_resumes_any_state_at_any_world_size(mixture):
    client_of = lambda: minibatchd.Client(mixture.socket)
    src = client_of().open("blend", minibatch_size=5)
    assert [s["dataset"] for s in src.mixture_sources] == ["train", "extra"]
    assert src.sweep_size == sum(s["sweep_size"] for s in src.mixture_sources)
    whole = []
    states = []
    for mb in src:
        whole.append((mb.fingerprint, mb.sources.tolist(), mb["features"].values.copy()))
        states.append(src.state())
    want = mixture.dump_mixture("--minibatch-size", "5")
    assert [w[0] for w in whole] == [e["fingerprint"] for e in want]
    assert [w[1] for w in whole] == [[s[0] for s in e["sequences"]] for e in want]
    # The `extra` lines hold 1000 + their index as the first feature; `train` sequences their id.
    for (_, sources, values), e in zip(whole, want):
        firsts = [int(v) for v in values[:, 0]]
        extra = [1000 + index for source, _, index in e["sequences"] if source == 1]
        assert [f for f in firsts if f >= 1000] == extra
    assert [s["mixture"] for s in states] == [e["state"] for e in want]
    # A state from the middle resumes three workers; each gets what dump prints from it.
    cut = len(states) // 2
    for rank in range(3):
        src = client_of().open("blend", minibatch_size=5, num_workers=3, rank=rank, resume=states[cut])
        got = [mb.fingerprint for mb in src]
        rest = mixture.dump_mixture("--minibatch-size", "5", "--workers", "3", "--rank", str(rank),
                                    "--restore-state", json.dumps(states[cut]["mixture"]))
        assert got == [e["fingerprint"] for e in rest], rank
    # The same mixture given at open instead of configured.
    adhoc = client_of().open("adhoc", minibatch_size=5, weights=[3, 1],
                             mixture={"datasets": ["train", "extra"], "epoch": "first_sweep_end"})
    assert [mb.fingerprint for mb in adhoc] == [w[0] for w in whole]
    # The next epoch: the last state with its epoch's counts restarted, or `sweep=1`.
    last = dict(states[-1], mixture=next_epoch(states[-1]["mixture"]), position=0, minibatches=0)
    resumed = [mb.fingerprint for mb in client_of().open("blend", minibatch_size=5, resume=last)]
    opened = [mb.fingerprint for mb in client_of().open("blend", minibatch_size=5, sweep=1)]
    epoch1 = mixture.dump_mixture("--minibatch-size", "5", "--sweep", "1")
    assert resumed == opened == [e["fingerprint"] for e in epoch1]


def test_to_dump_of_a_mixture_minibatch_is_its_dump_line(mixture):
    """Found by a probe: `to_dump()` gave a mixture's minibatch a dataset's shape, so it never
    compared equal to the `dump --mixture` line `docs/dump.md` says it equals."""
    out = subprocess.run([BIN, "dump", "--config", str(mixture.config), "--mixture", "blend", "--minibatch-size", "5",
                          "--workers", "2", "--rank", "1"], capture_output=True, text=True, timeout=DEADLINE)
    assert out.returncode == 0, out.stderr
    want = [json.loads(line) for line in out.stdout.splitlines()]
    src = minibatchd.Client(mixture.socket).open("blend", minibatch_size=5, num_workers=2, rank=1)
    got, states = [], []
    for mb in src:
        got.append(mb.to_dump())
        states.append(src.state())
    assert len(got) == len(want) > 3
    assert got == want
    # From a state in the middle: the steps go on from it.
    src = minibatchd.Client(mixture.socket).open("blend", minibatch_size=5, num_workers=2, rank=1, resume=states[2])
    assert [mb.to_dump() for mb in src] == want[3:]


def test_the_jax_adapter_reads_a_mixture(mixture):
    require("jax")
    from minibatchd.jax import MinibatchIterator

    for processes in (1, 2):
        for p in range(processes):
            it = MinibatchIterator("blend", mixture.socket, minibatch_size=7, process_index=p,
                                   process_count=processes)
            for epoch in range(2):
                got = [item["meta"] for item in it]
                want = mixture.dump_mixture("--minibatch-size", "7", "--workers", str(processes), "--rank", str(p),
                                            "--sweep", str(epoch))
                assert [m["fingerprint"] for m in got] == [e["fingerprint"] for e in want], (processes, p, epoch)
                assert [m["sources"] for m in got] == [[s[0] for s in e["sequences"]] for e in want]


def test_every_dataloader_worker_gets_what_dump_prints_epoch_after_epoch(mixture):
    ds = MinibatchIterableDataset("blend", mixture.socket, minibatch_size=8, use_torchrun_env=False)
    loader = MinibatchDataLoader(ds, num_workers=2)
    start = None
    for epoch in range(3):
        items = list(loader)
        got = by_worker(items)
        restore = ["--restore-state", json.dumps(next_epoch(start))] if start is not None else []
        for w in range(2):
            want = mixture.dump_mixture("--minibatch-size", "8", "--workers", "2", "--rank", str(w), *restore)
            assert [m["fingerprint"] for m in got[w]] == [e["fingerprint"] for e in want], (epoch, w)
            assert [m["sources"] for m in got[w]] == [[s[0] for s in e["sequences"]] for e in want]
            assert all(m["epoch"] == epoch for m in got[w])
        whole = mixture.dump_mixture("--minibatch-size", "8", *restore)
        assert whole[-1]["state"]["ended"] and len(whole[-1]["sweeps_ended"]) == 1
        # Each sequence of a source's sweep comes at most once in an epoch, and the source that
        # ended the epoch delivered its whole sweep.
        seen: dict = {}
        for e in whole:
            for source, sweep, index in e["sequences"]:
                seen.setdefault((source, sweep), []).append(index)
        assert all(len(v) == len(set(v)) for v in seen.values())
        start = whole[-1]["state"]


def test_a_stateful_loader_resumes_exactly_and_one_common_state_at_another_world_size(mixture):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def dataset():
        return MinibatchIterableDataset("blend", mixture.socket, minibatch_size=6, use_torchrun_env=False)

    loader = StatefulDataLoader(dataset(), batch_size=None, num_workers=2)
    it = iter(loader)
    seen = [next(it)["meta"] for _ in range(4)]  # two steps of each worker
    saved = loader.state_dict()
    rest = [item["meta"] for item in it]
    # The same world size: each worker from its own state.
    again = StatefulDataLoader(dataset(), batch_size=None, num_workers=2)
    again.load_state_dict(saved)
    assert [item["meta"]["fingerprint"] for item in again] == [m["fingerprint"] for m in rest]

    # Three workers from the one state every worker had after the same step.
    job = job_state_dict([saved])
    ds = dataset()
    ds.load_state_dict(job)
    wider = by_worker(list(MinibatchDataLoader(ds, num_workers=3)))
    state = job["source"]["mixture"]
    assert state["step"] == 2 and {m["index"] for m in seen} == {0, 1}
    for w in range(3):
        want = mixture.dump_mixture("--minibatch-size", "6", "--workers", "3", "--rank", str(w),
                                    "--restore-state", json.dumps(state))
        assert [m["fingerprint"] for m in wider[w]] == [e["fingerprint"] for e in want], w
        assert wider[w][0]["index"] == 2, "minibatches are numbered on"

    # Workers that stopped at different steps have no common state.
    uneven = StatefulDataLoader(dataset(), batch_size=None, num_workers=2)
    it = iter(uneven)
    for _ in range(3):
        next(it)
    with pytest.raises(ValueError, match="different steps"):
        job_state_dict([uneven.state_dict()])


def test_the_mixture_example_trains_on_a_ctf_and_a_libsvm_derived_dataset():
    out = run_example("mixture_torch.py")
    assert "exactly once" in out.stdout, out.stdout


def test_weights_that_are_not_finite_are_refused_by_the_client_saying_so(mixture):
    """Found by a probe: ``weights=[nan, 1]`` went out as ``NaN``, which is not JSON, and the daemon
    answered an unreadable message. The client says what is wrong before sending."""
    for bad in (float("nan"), float("inf")):
        with pytest.raises(minibatchd.MinibatchdError) as e:
            minibatchd.Client(mixture.socket).open("blend", minibatch_size=5, weights=[bad, 1.0])
        assert e.value.code == "invalid_options" and "NaN or an infinity" in str(e.value), e.value
    src = minibatchd.Client(mixture.socket).open("blend", minibatch_size=5, weights=[1.0, 1.0])
    assert next(iter(src)).fingerprint
