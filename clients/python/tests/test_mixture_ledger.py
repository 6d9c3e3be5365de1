"""The ledger of a mixture of datasets through minibatchd.ledger (docs/mixtures.md): the expected
ledger per rank, exactly once per (source, sweep), and a resume from a line's state at another
world size that continues the run."""

from pathlib import Path

from conftest import BIN
from minibatchd import ledger


def write_config(tmp: Path) -> Path:
    (tmp / "a.ctf").write_text("".join(f"|F {i} 0\n" for i in range(17)))
    (tmp / "b.ctf").write_text("".join(f"|F {i} 1\n" for i in range(5)))
    streams = lambda d: f'[datasets.{d}.streams.features]\nalias = "F"\ndim = 2\nformat = "dense"\n'
    config = tmp / "mix.toml"
    config.write_text(f"""[daemon]
state_dir = "{tmp}/state"
[datasets.a]
format = "ctf"
files = ["a.ctf"]
chunk_size_bytes = 40
{streams("a")}[datasets.a.sampling]
window_chunks = 2
seed = 9
[datasets.b]
format = "ctf"
files = ["b.ctf"]
{streams("b")}
[mixtures.ab]
datasets = ["a", "b"]
weights = [3, 1]
epoch = "first_sweep_end"
""")
    return config


def test_a_mixtures_ledger_per_rank_is_exactly_once_per_source_sweep(tmp_path):
    config = write_config(tmp_path)
    whole = ledger.expected_mixture(str(config), "ab", binary=BIN, minibatch_size=3)
    ranks = [ledger.expected_mixture(str(config), "ab", binary=BIN, minibatch_size=3, workers=3, rank=r)
             for r in range(3)]
    assert all(len(r) == len(whole) for r in ranks), "every rank takes the same steps"
    ended = whole[-1]["sweeps_ended"]
    assert len(ended) == 1
    once = ledger.exactly_once(ranks)
    assert once == ledger.exactly_once([whole])
    counts = once[(ended[0], 0)]
    size = 17 if ended[0] == 0 else 5
    assert sorted(counts) == list(range(size)) and set(counts.values()) == {1}
    assert all(set(c.values()) == {1} for c in once.values()), "no sequence twice in a sweep"


def test_a_mixtures_ledger_resumes_from_a_lines_state_at_another_world_size(tmp_path):
    config = write_config(tmp_path)
    whole = ledger.expected_mixture(str(config), "ab", binary=BIN, minibatch_size=2)
    cut = len(whole) // 2
    tail = [ledger.expected_mixture(str(config), "ab", binary=BIN, minibatch_size=2, workers=2, rank=r,
                                    restore_state=whole[cut]["state"]) for r in range(2)]
    assert [e["state"] for e in tail[0]] == [e["state"] for e in whole[cut + 1:]]
    rest = [tuple(s) for e in whole[cut + 1:] for s in e["sequences"]]
    dealt = [tuple(s) for step in zip(*tail) for s in interleave(step)]
    assert dealt == rest
    assert ledger.first_divergence(whole[cut + 1:], whole[cut + 1:]) is None


def interleave(entries):
    """One step's sequences of every rank, in slot order (slot g is rank g mod ranks)."""
    first = entries[0]["state"]["slots"] - sum(len(e["sequences"]) for e in entries)
    taken = [0] * len(entries)
    out = []
    for g in range(first, entries[0]["state"]["slots"]):
        r = g % len(entries)
        out.append(entries[r]["sequences"][taken[r]])
        taken[r] += 1
    return out
