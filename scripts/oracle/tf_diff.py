#!/usr/bin/env python3
"""TFRecord + tf.train.Example against TensorFlow itself (issue 39): random files written by
TensorFlow's own `tf.io.TFRecordWriter`, read back by `tf.data.TFRecordDataset` and
`tf.io.parse_single_example`, their answers recorded as a corpus that `tests/tfrecord_oracle.rs`
replays against `minibatchd dump` (record by record: floats bitwise, integers exactly, an error
wherever TensorFlow refuses a record or a file) — in the normal test suite, without TensorFlow.

    scripts/oracle/tf_diff.py [--cases 60] [--seed 1] [--out tests/fixtures_tfrecord]
                              [--venv target/tf-venv]

Installs TensorFlow (CPU, from PyPI) into `--venv` when it has none, then re-runs itself there;
writes one directory per case (`data.tfrecord`, `case.json`: the streams' features, the dataset's
precision, and per record TensorFlow's values or its error, or the record where TensorFlow
stops reading a damaged file) and finally runs the replay test, which fails on any difference.

Cases: some files GZIP-compressed by TensorFlow's writer (and `--zlib-cases` more, ZLIB-compressed); 1–4 features of `float32`/`int64`, fixed-length (`tf.io.FixedLenFeature([dim])`, with or
without a default) or var-length (`tf.io.VarLenFeature`); records that lack a feature, hold a
list of the wrong type or length, or an int64 too large for float32; and files damaged by a
flipped byte or a cut tail.

`--kinds sequence` (its own corpus, `tests/fixtures_tfrecord_seq`) adds `bytes` features —
fixed-length (`FixedLenFeature([dim], tf.string)`, with or without a default) and sequences
(`VarLenFeature(tf.string)` or `FixedLenSequenceFeature([], tf.string, allow_missing=True)`), with
random bytes, empty strings and invalid UTF-8 — and numeric sequences
(`FixedLenSequenceFeature([dim], allow_missing=True)`), whose values may be no multiple of `dim`.
"""

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ensure_tensorflow(venv: Path, script: str = __file__) -> None:
    """Re-runs `script` (this one by default) under `venv`'s Python with TensorFlow, making it
    first if needed."""
    try:
        import tensorflow  # noqa: F401

        return
    except ImportError:
        pass
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if subprocess.run([str(py), "-c", "import tensorflow"], capture_output=True).returncode != 0:
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "tensorflow-cpu"], check=True)
    os.execv(str(py), [str(py), script] + sys.argv[1:])


def random_feature(rng: random.Random, k: int) -> dict:
    dtype = rng.choice(["float32", "int64"])
    var = rng.random() < 0.35
    dim = rng.randint(1, 5)
    f = {"stream": f"s{k}", "key": rng.choice([f"s{k}", f"feat/{k}", f"f{k}"]), "dtype": dtype,
         "format": "sparse" if var else "dense", "dim": dim}
    if not var and rng.random() < 0.4:
        if rng.random() < 0.5:
            f["default"] = rng.choice([0, -1, 3]) if dtype == "int64" else rng.choice([0.0, -1.5, 0.25])
        else:
            f["default"] = [rng.randint(-9, 9) if dtype == "int64" else rng.uniform(-4, 4) for _ in range(dim)]
    return f


def random_sequence_feature(rng: random.Random, k: int) -> dict:
    """A feature of the `sequence` corpus: bytes (dense or sequence), a numeric sequence, or a
    numeric feature of the first corpus."""
    key = rng.choice([f"s{k}", f"feat/{k}", f"f{k}"])
    r = rng.random()
    if r < 0.25:
        f = {"stream": f"s{k}", "key": key, "dtype": "bytes", "format": "dense", "dim": rng.randint(1, 3)}
        if rng.random() < 0.4:
            f["default"] = rng.choice(["", "none", "ü"]) if rng.random() < 0.5 else [rng.choice(["a", "", "é"]) for _ in range(f["dim"])]
        return f
    if r < 0.5:
        return {"stream": f"s{k}", "key": key, "dtype": "bytes", "format": "sequence", "dim": 1,
                "tf": rng.choice(["varlen", "sequence"])}
    if r < 0.8:
        return {"stream": f"s{k}", "key": key, "dtype": rng.choice(["float32", "int64"]), "format": "sequence",
                "dim": rng.randint(1, 3)}
    return random_feature(rng, k)


def random_bytes(rng: random.Random, n: int) -> list:
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            out.append(b"")
        elif r < 0.5:
            out.append(rng.choice([b"cat", b"dog", "ünï".encode(), b"a b"]))
        else:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))))
    return out


def random_values(rng: random.Random, f: dict, precision: str, n: int):
    if f["dtype"] == "bytes":
        return random_bytes(rng, n)
    if f["dtype"] == "float32":
        out = []
        for _ in range(n):
            r = rng.random()
            v = -0.0 if r < 0.05 else rng.uniform(-1e6, 1e6) if r < 0.5 else rng.uniform(-2, 2)
            out.append(struct.unpack("<f", struct.pack("<f", v))[0])
        return out
    big = 1 << (24 if precision == "float32" else 53)
    return [rng.choice([rng.randint(-1000, 1000), rng.randint(-big, big), rng.randint(-(1 << 62), 1 << 62)])
            if rng.random() < 0.97 else rng.randint(-big, big) for _ in range(n)]


def message(e: Exception) -> str:
    """TensorFlow's error message without the name of the op that raised it."""
    text = str(e).splitlines()[0]
    return text.split("}} ", 1)[-1][:200]


def make_case(rng: random.Random, tf, out: Path, i: int, zlib: bool = False, kinds: str = "numeric") -> None:
    pick = random_sequence_feature if kinds == "sequence" else random_feature
    features = [pick(rng, k) for k in range(rng.randint(1, 4))]
    precision = rng.choice(["float32", "float64"])
    spec = {}
    for f in features:
        dt = {"float32": tf.float32, "int64": tf.int64, "bytes": tf.string}[f["dtype"]]
        if f["format"] == "sparse" or f.get("tf") == "varlen":
            spec[f["key"]] = tf.io.VarLenFeature(dt)
        elif f["format"] == "sequence":
            shape = [] if f["dtype"] == "bytes" else [f["dim"]]
            spec[f["key"]] = tf.io.FixedLenSequenceFeature(shape, dt, allow_missing=True)
        else:
            default = f.get("default")
            if isinstance(default, (int, float, str)):
                default = [default] * f["dim"]
            if f["dtype"] == "bytes" and default is not None:
                default = [d.encode() for d in default]
            spec[f["key"]] = tf.io.FixedLenFeature([f["dim"]], dt, default_value=default)
    records = []
    for _ in range(rng.randint(1, 20)):
        ex = tf.train.Example()
        for f in features:
            r = rng.random()
            if r < 0.12:
                continue  # missing
            if f["format"] == "dense":
                n = f["dim"]
            elif f["format"] == "sequence":
                n = f["dim"] * rng.randint(0, 4)
            else:
                n = rng.randint(0, f["dim"])
            if r < 0.2:  # perhaps a wrong length
                n = rng.randint(0, f["dim"] * 2 + 2 if kinds == "sequence" else f["dim"] + 2)
            kind = f["dtype"]
            if r > 0.96:  # the wrong type
                if kinds == "sequence":
                    kind = rng.choice([k for k in ("float32", "int64", "bytes") if k != kind])
                else:
                    kind = "int64" if kind == "float32" else "float32"
            feat = ex.features.feature[f["key"]]
            vals = random_values(rng, dict(f, dtype=kind), precision, n)
            if kind == "float32":
                feat.float_list.value.extend(vals)
            elif kind == "int64":
                feat.int64_list.value.extend(vals)
            else:
                feat.bytes_list.value.extend(vals)
        if rng.random() < 0.1:
            ex.features.feature["unused"].bytes_list.value.append(b"x")
        records.append(ex.SerializeToString(deterministic=True))  # map entries in key order: reproducible files
    d = out / f"case_{i:03d}"
    d.mkdir(parents=True)
    # Some files GZIP-compressed by TensorFlow's writer (compression_type="GZIP").
    gzip = rng.random() < 0.15
    # Or ZLIB-compressed (compression_type="ZLIB"; the cases after --cases, --zlib-cases of them).
    compression = "ZLIB" if zlib else "GZIP" if gzip else None
    path = d / {"ZLIB": "data.tfrecord.zlib", "GZIP": "data.tfrecord.gz", None: "data.tfrecord"}[compression]
    with tf.io.TFRecordWriter(str(path), options=compression) as w:
        for r in records:
            w.write(r)
    damage = None
    data = bytearray(path.read_bytes())
    if not gzip and not zlib and rng.random() < 0.2 and len(data) > 16:
        if rng.random() < 0.5:
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
            damage = {"flipped": at}
        else:
            cut = rng.randrange(1, len(data))
            data = data[:cut]
            damage = {"cut_to": cut}
        path.write_bytes(bytes(data))
    answers = []
    stopped = None
    try:
        for k, raw in enumerate(tf.data.TFRecordDataset(str(path), compression_type=compression or "")):
            try:
                parsed = tf.io.parse_single_example(raw, spec)
            except (tf.errors.InvalidArgumentError, ValueError) as e:
                answers.append({"error": message(e)})
                continue
            rec = {}
            for f in features:
                t = parsed[f["key"]]
                sparse = f["format"] == "sparse" or f.get("tf") == "varlen"
                vals = (t.values if sparse else t).numpy().reshape(-1).tolist()
                if f["dtype"] == "bytes":
                    vals = [v.hex() for v in vals]  # the bytes, as hex
                if f["dtype"] == "float32":
                    vals = [struct.unpack("<I", struct.pack("<f", v))[0] for v in vals]  # bits
                rec[f["stream"]] = vals
            answers.append({"values": rec})
    except tf.errors.DataLossError as e:
        stopped = {"after_records": len(answers), "error": message(e)}
    case = {"file": path.name, "features": features, "precision": precision, "damage": damage, "records": answers, "stopped": stopped,
            "tensorflow": tf.__version__}
    (d / "case.json").write_text(json.dumps(case) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures_tfrecord"))
    ap.add_argument("--venv", default=str(ROOT / "target" / "tf-venv"))
    ap.add_argument("--zlib-cases", type=int, default=0, help="more cases, ZLIB-compressed, after --cases")
    ap.add_argument("--no-replay", action="store_true", help="record only; do not run the replay test")
    ap.add_argument("--kinds", choices=["numeric", "sequence"], default="numeric",
                    help="numeric: float32/int64 fixed- and var-length features (tests/fixtures_tfrecord); sequence: "
                         "bytes features and sequences too (record it into tests/fixtures_tfrecord_seq)")
    a = ap.parse_args()
    ensure_tensorflow(Path(a.venv))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    rng = random.Random(a.seed)
    for i in range(a.cases):
        make_case(rng, tf, out, i, kinds=a.kinds)
    for j in range(a.zlib_cases):
        make_case(random.Random(a.seed * 1000 + j), tf, out, a.cases + j, zlib=True)
    print(f"{a.cases + a.zlib_cases} cases recorded in {out} (TensorFlow {tf.__version__})")
    if not a.no_replay:
        subprocess.run(["cargo", "test", "-q", "--test", "tfrecord_oracle"], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
