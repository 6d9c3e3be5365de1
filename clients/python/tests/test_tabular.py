"""CSV and fixed-length record datasets served by the daemon (issue 39): the Python client
receives their columns and typed slices as dense arrays, every record once per sweep, and after a
restart the same session reads the persisted parsed chunks unchanged. What TensorFlow reads from
such files is checked by tests/csv_oracle.rs and tests/fixed_oracle.rs."""

import struct
import urllib.request

import numpy as np

import minibatchd
from conftest import Daemon, daemon_section


def _daemon(tmp_path) -> Daemon:
    (tmp_path / "a.csv").write_text("id,x,label\n" + "".join(f"{i},\"{i}.5\",{i % 4}\n" for i in range(150)))
    (tmp_path / "r.bin").write_bytes(b"HDR" + b"".join(struct.pack("<Hf", i, -i / 8) for i in range(120)))
    d = Daemon.__new__(Daemon)
    d.tmp, d.socket, d.config = tmp_path, str(tmp_path / "mbd.sock"), tmp_path / "minibatchd.toml"
    d.config.write_text(daemon_section(tmp_path, d.socket) + f"""
[datasets.c]
format = "csv"
files = ["{tmp_path / 'a.csv'}"]
columns = 3
skip_header_lines = 1
chunk_size_bytes = 400
[datasets.c.streams.features]
columns = [1, 0]
[datasets.c.streams.label]
columns = [2]
dtype = "int64"

[datasets.f]
format = "fixed_length"
files = ["{tmp_path / 'r.bin'}"]
record_bytes = 6
header_bytes = 3
chunk_size_bytes = 120
[datasets.f.streams.id]
dtype = "uint16"
dim = 1
[datasets.f.streams.value]
dtype = "float32"
offset = 2
""")
    return d


def _csv_rows(d: Daemon, **options) -> list:
    src = minibatchd.connect(d.socket).open("c", minibatch_size=16, **options)
    rows = []
    for mb in src:
        f, y = np.asarray(mb["features"].values), np.asarray(mb["label"].values)
        assert f.shape[1] == 2 and y.shape[1] == 1
        rows += [(float(a), float(b), float(c)) for (a, b), (c,) in zip(f, y)]
    src.close()
    return rows


def test_csv_and_fixed_length_datasets_are_served_every_record_once(tmp_path):
    d = _daemon(tmp_path)
    d._start()
    try:
        rows = _csv_rows(d, max_sweeps=1, seed=5)
        assert sorted(int(i) for _, i, _ in rows) == list(range(150))
        assert all(x == i + 0.5 and y == int(i) % 4 for x, i, y in rows)
        assert [int(i) for _, i, _ in rows] != list(range(150)), "randomized"
        src = minibatchd.connect(d.socket).open("f", minibatch_size=10, max_sweeps=2, seed=1)
        ids = []
        for mb in src:
            i, v = np.asarray(mb["id"].values)[:, 0], np.asarray(mb["value"].values)[:, 0]
            assert np.array_equal(v, (-i / 8).astype(np.float32))
            ids += i.astype(int).tolist()
        src.close()
        assert sorted(ids[:120]) == list(range(120)) and sorted(ids[120:]) == list(range(120))
    finally:
        d.stop()


def test_a_csv_dataset_after_a_restart_reads_its_persisted_chunks_unchanged(tmp_path):
    d = _daemon(tmp_path)
    d._start()
    try:
        first = _csv_rows(d, max_sweeps=1, seed=11)
    finally:
        d.stop()
    d._start()
    try:
        again = _csv_rows(d, max_sweeps=1, seed=11)
        addr = (tmp_path / "state" / "metrics.addr").read_text().strip()
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    finally:
        d.stop()
    assert again == first
    hits = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("minibatchd_parsed_cache_hits_total")]
    assert hits and hits[0] > 0, "the second run read its chunks from the parsed cache"


def test_csv_string_columns_reach_the_client_as_written(tmp_path):
    """`string` columns: a strings stream of one sample per column, each field's bytes as they
    are (quotes undone, spaces and non-ASCII kept), an empty field its default."""
    names = ["ann", " bo ", 'c"d', "", "zoë"]
    lines = "".join(f'{i},"{names[i % 5].replace(chr(34), chr(34) * 2)}",t{i}\n' for i in range(40))
    (tmp_path / "s.csv").write_bytes(lines.encode())
    d = Daemon.__new__(Daemon)
    d.tmp, d.socket, d.config = tmp_path, str(tmp_path / "mbd.sock"), tmp_path / "minibatchd.toml"
    d.config.write_text(daemon_section(tmp_path, d.socket) + f"""
[datasets.s]
format = "csv"
files = ["{tmp_path / 's.csv'}"]
columns = 3
chunk_size_bytes = 200
[datasets.s.streams.id]
columns = [0]
dtype = "int64"
[datasets.s.streams.text]
columns = [1, 2]
dtype = "string"
default = "?"
""")
    d._start()
    try:
        src = minibatchd.connect(d.socket).open("s", minibatch_size=7, max_sweeps=1, seed=2)
        seen = []
        for mb in src:
            ids = np.asarray(mb["id"].values)[:, 0].astype(int).tolist()
            text = mb["text"]
            assert text.kind == "strings" and text.sequence_offsets.tolist() == list(range(0, 2 * len(ids) + 1, 2))
            strings = text.byte_strings()
            for q, i in enumerate(ids):
                assert strings[2 * q] == (names[i % 5] or "?").encode()
                assert strings[2 * q + 1] == f"t{i}".encode()
                seen.append(i)
        src.close()
    finally:
        d.stop()
    assert sorted(seen) == list(range(40)) and seen != list(range(40))


def test_whole_files_reach_the_client_as_their_bytes_and_paths(tmp_path):
    """`format = "whole_file"`: every file one record, `contents` its exact bytes and `path`
    its name; a randomized sweep gives each file once, and a restart serves the same."""
    (tmp_path / "img").mkdir()
    want = {}
    for i in range(30):
        data = bytes([0xFF, 0xD8, i]) + bytes((i * k) % 256 for k in range(i * 50)) if i % 5 else b""
        p = tmp_path / "img" / f"{i:02d}.jpg"
        p.write_bytes(data)
        want[str(p)] = data
    d = Daemon.__new__(Daemon)
    d.tmp, d.socket, d.config = tmp_path, str(tmp_path / "mbd.sock"), tmp_path / "minibatchd.toml"
    d.config.write_text(daemon_section(tmp_path, d.socket) + f"""
[datasets.w]
format = "whole_file"
files = ["{tmp_path / 'img' / '*.jpg'}"]
[datasets.w.sampling]
window_samples = 1000
""")

    def read():
        src = minibatchd.connect(d.socket).open("w", minibatch_size=4, max_sweeps=1, seed=3)
        got = []
        for mb in src:
            assert mb["contents"].kind == "strings" and mb["path"].kind == "strings"
            got += zip((p.decode() for p in mb["path"].byte_strings()), mb["contents"].byte_strings())
        src.close()
        return got

    d._start()
    try:
        first = read()
    finally:
        d.stop()
    assert dict(first) == want and len(first) == len(want)
    assert [p for p, _ in first] != sorted(want), "randomized"
    d._start()
    try:
        assert read() == first
    finally:
        d.stop()
