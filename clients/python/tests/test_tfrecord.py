"""A TFRecord dataset of tf.train.Example records served by the daemon (issue 39): the Python
client receives fixed-length features as dense arrays and var-length ones as sparse streams, every
record once per sweep. The files are written here with the
TFRecord framing (masked CRC-32C) and the Example wire format, without TensorFlow; what TensorFlow
itself reads from such files is checked by tests/tfrecord_oracle.rs."""

import struct
import urllib.request

import numpy as np

import minibatchd
from conftest import Daemon, daemon_section


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = _crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(i: int) -> bytes:
    floats = _field(1, struct.pack("<2f", i, i + 0.25))
    ints = _field(1, b"".join(_varint(t) for t in range(i % 3)))
    entries = _field(1, _field(1, b"x") + _field(2, _field(2, floats)))
    entries += _field(1, _field(1, b"tags") + _field(2, _field(3, ints)))
    return _field(1, entries)


def _frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(length)) + data + struct.pack("<I", _masked(data))


def _daemon(tmp_path) -> Daemon:
    d = Daemon.__new__(Daemon)
    d.tmp, d.socket, d.config = tmp_path, str(tmp_path / "mbd.sock"), tmp_path / "minibatchd.toml"
    d.config.write_text(daemon_section(tmp_path, d.socket) + f"""
[datasets.t]
format = "tfrecord"
files = ["{tmp_path / 'a.tfrecord'}"]
chunk_size_bytes = 300

[datasets.t.streams.x]
format = "dense"
dim = 2

[datasets.t.streams.tags]
dtype = "int64"
format = "sparse"
dim = 4
""")
    return d


def _read(d: Daemon, **options) -> list:
    """(first x value, x, tags) of every sample of a session with `options`."""
    src = minibatchd.connect(d.socket).open("t", minibatch_size=8, **options)
    out = []
    for mb in src:
        tags = mb["tags"]
        for k in range(mb["x"].num_samples):
            start, end = tags.sample_offsets[k], tags.sample_offsets[k + 1]
            out.append((tuple(np.asarray(mb["x"].values[k]).tolist()), tuple(np.asarray(tags.values[start:end]).tolist())))
    src.close()
    return out


def test_a_tfrecord_dataset_after_a_restart_reads_its_persisted_chunks_unchanged(tmp_path):
    """The persisted parsed-chunk cache holds a TFRecord dataset's chunks: after a restart the
    same session options give the same samples, read from the cache's entries."""
    (tmp_path / "a.tfrecord").write_bytes(b"".join(_frame(_example(i)) for i in range(200)))
    d = _daemon(tmp_path)
    d._start()
    try:
        first = _read(d, max_sweeps=1, seed=11)
    finally:
        d.stop()
    entries = list((tmp_path / "state" / "parsed").rglob("*"))
    assert any(e.is_file() and e.stat().st_size > 0 for e in entries), entries
    d._start()
    try:
        again = _read(d, max_sweeps=1, seed=11)
        addr = (tmp_path / "state" / "metrics.addr").read_text().strip()
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    finally:
        d.stop()
    assert again == first
    hits = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("minibatchd_parsed_cache_hits_total")]
    assert hits and hits[0] > 0, "the second run read its chunks from the persisted cache"
    assert sorted(x[0] for x, _ in first) == list(range(200))


def test_a_tfrecord_dataset_is_served_dense_and_sparse_every_record_once(tmp_path):
    records = 50
    (tmp_path / "a.tfrecord").write_bytes(b"".join(_frame(_example(i)) for i in range(records)))
    d = _daemon(tmp_path)
    d._start()
    try:
        src = minibatchd.connect(d.socket).open("t", minibatch_size=8, max_sweeps=2, seed=3)
        seen = []
        for mb in src:
            x = mb["x"].values
            assert x.shape[1] == 2
            tags = mb["tags"]
            for row, k in zip(np.asarray(x), range(mb["x"].num_samples)):
                i = int(row[0])
                assert row[1] == i + 0.25
                start, end = tags.sample_offsets[k], tags.sample_offsets[k + 1]
                assert list(np.asarray(tags.values[start:end])) == list(range(i % 3))
                seen.append(i)
        assert sorted(seen[:records]) == list(range(records))
        assert sorted(seen[records:]) == list(range(records))
        assert seen[:records] != list(range(records)), "randomized"
    finally:
        d.stop()
