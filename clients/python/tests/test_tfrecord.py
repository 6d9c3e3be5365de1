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


def _image(i: int) -> bytes:
    """Record i's binary blob: not UTF-8 (a JPEG's first bytes), of i % 7 + 3 bytes."""
    return bytes([0xFF, 0xD8, i % 256] + [(i * 31 + k) % 256 for k in range(i % 7)])


def _example_with_bytes(i: int) -> bytes:
    """`id` int64, `image` one binary blob, `words` i % 3 byte strings, `steps` 2 * (i % 4)
    floats (a sequence of i % 4 samples of 2)."""
    entries = _field(1, _field(1, b"id") + _field(2, _field(3, _field(1, _varint(i)))))
    entries += _field(1, _field(1, b"image") + _field(2, _field(1, _field(1, _image(i)))))
    words = b"".join(_field(1, f"w{i}.{k}".encode()) for k in range(i % 3))
    entries += _field(1, _field(1, b"words") + _field(2, _field(1, words)))
    steps = struct.pack(f"<{2 * (i % 4)}f", *[i + k / 4 for k in range(2 * (i % 4))])
    entries += _field(1, _field(1, b"steps") + _field(2, _field(2, _field(1, steps))))
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

[datasets.b]
format = "tfrecord"
files = ["{tmp_path / 'b.tfrecord'}"]
chunk_size_bytes = 400

[datasets.b.streams.id]
dtype = "int64"
format = "dense"
dim = 1

[datasets.b.streams.image]
dtype = "bytes"
format = "dense"
dim = 1

[datasets.b.streams.words]
dtype = "bytes"
format = "sequence"

[datasets.b.streams.steps]
format = "sequence"
dim = 2
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
    """The parsed cache holds a TFRecord dataset's chunks: after a restart the
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
    assert hits and hits[0] > 0, "the second run read its chunks from the parsed cache"
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


def _read_bytes_dataset(d: Daemon) -> list:
    """(id, image, words, steps) of every record of one randomized sweep of dataset `b`."""
    src = minibatchd.connect(d.socket).open("b", minibatch_size=16, max_sweeps=1, seed=4)
    out = []
    for mb in src:
        ids = np.asarray(mb["id"].values)[:, 0].astype(int).tolist()
        image, words, steps = mb["image"], mb["words"], mb["steps"]
        assert image.kind == "strings" and steps.kind == "dense" and steps.values.shape[1] == 2
        blobs, texts = image.byte_strings(), words.byte_strings()
        wo, so = words.sequence_offsets.tolist(), steps.sequence_offsets.tolist()
        assert len(blobs) == len(ids) == len(wo) - 1 == len(so) - 1, "a record is one sequence in every stream"
        for q, i in enumerate(ids):
            rows = np.asarray(steps.values[so[q] : so[q + 1]]).reshape(-1).tolist()
            out.append((i, blobs[q], tuple(texts[wo[q] : wo[q + 1]]), tuple(rows)))
    src.close()
    return out


def test_bytes_and_sequence_features_are_served_as_written_and_survive_a_restart(tmp_path):
    """A bytes feature reaches the client byte for byte (`byte_strings()`), a bytes sequence as
    its strings, a numeric sequence as `dim`-value samples; every record once per sweep; after a
    restart the persisted chunks give the same."""
    records = 90
    (tmp_path / "b.tfrecord").write_bytes(b"".join(_frame(_example_with_bytes(i)) for i in range(records)))
    d = _daemon(tmp_path)
    d._start()
    try:
        first = _read_bytes_dataset(d)
    finally:
        d.stop()
    assert sorted(r[0] for r in first) == list(range(records))
    assert [r[0] for r in first] != list(range(records)), "randomized"
    for i, blob, words, steps in first:
        assert blob == _image(i)
        assert words == tuple(f"w{i}.{k}".encode() for k in range(i % 3))
        assert steps == tuple(i + k / 4 for k in range(2 * (i % 4)))
    d._start()
    try:
        again = _read_bytes_dataset(d)
    finally:
        d.stop()
    assert again == first
