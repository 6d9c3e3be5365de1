#!/usr/bin/env python3
"""Fixed-length records + decode_raw against TensorFlow itself (issue 39): random files read by
`tf.data.FixedLengthRecordDataset` and each stream's slice of a record by `tf.io.decode_raw`,
their answers recorded as a corpus that `tests/fixed_oracle.rs` replays against `minibatchd
dump` (record by record: floats bitwise after the dataset's precision, integers exactly, and an
error wherever TensorFlow refuses a file) — in the normal test suite, without TensorFlow.

    scripts/oracle/tf_fixed.py [--cases 40] [--seed 1] [--out tests/fixtures_fixed]
                               [--venv target/tf-venv]

Installs TensorFlow (CPU, from PyPI) into `--venv` when it has none (as `tf_diff.py`), then
re-runs itself there; writes one directory per case (`data.bin`, `case.json`: the layout, the
streams, the precision, and TensorFlow's values per record and stream, or its error for the
file) and finally runs the replay test.

Cases: records of 1–40 bytes with headers and footers of 0–7 bytes; 1–3 streams of every
`decode_raw` type (int8 … int64, float16, bfloat16, float32, float64, bool), either byte order, at random
offsets; integers beyond what float32 holds; files whose body is not a whole number of records,
or no record. Float values are finite (the replay reads `dump`'s JSON, which spells NaN
`NaN`); NaN and infinities are unit-tested.
"""

import argparse
import json
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tf_diff import ROOT, ensure_tensorflow  # noqa: E402

# decode_raw's types (TensorFlow has no uint32 or uint64 there: minibatchd's are unit-tested);
# name: (size, struct code). bfloat16 values are written as float32's upper half.
TYPES = {
    "int8": (1, "b"), "uint8": (1, "B"), "int16": (2, "h"), "uint16": (2, "H"), "int32": (4, "i"),
    "int64": (8, "q"), "float16": (2, "e"), "bfloat16": (2, "H"), "float32": (4, "f"), "float64": (8, "d"),
    "bool": (1, "B"),
}


def random_value(rng: random.Random, dtype: str):
    size, code = TYPES[dtype]
    if dtype == "bool":
        return rng.choice([0, 1, rng.randint(0, 255)])
    if dtype == "bfloat16":
        f = random_value(rng, "float32")
        return struct.unpack("<I", struct.pack("<f", f))[0] >> 16
    if dtype.startswith("float"):
        return rng.choice([0.0, -0.0, 1.5, -2.25, rng.uniform(-1e3, 1e3), rng.uniform(-1, 1) * 10 ** rng.randint(-6, 4)])
    bits = size * 8
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if not dtype.startswith("u") else (0, (1 << bits) - 1)
    if rng.random() < 0.2:
        return rng.choice([lo, hi, 0, (1 << 24) + 1 if hi > (1 << 24) else hi])
    return rng.randint(max(lo, -1000), min(hi, 1000))


def make_case(rng: random.Random, case_dir: Path) -> dict:
    streams = []
    offset = rng.randint(0, 3)
    for k in range(rng.randint(1, 3)):
        dtype = rng.choice(list(TYPES))
        dim = rng.randint(1, 4)
        streams.append({"name": f"s{k}", "dtype": dtype, "offset": offset, "dim": dim,
                        "little_endian": rng.random() < 0.7})
        offset += dim * TYPES[dtype][0] + rng.randint(0, 2)
    record_bytes = offset + rng.randint(0, 3)
    header, footer = rng.choice([0, 0, rng.randint(1, 7)]), rng.choice([0, 0, rng.randint(1, 7)])
    records = rng.randint(1, 12)
    body = bytearray()
    for _ in range(records):
        rec = bytearray(rng.randbytes(record_bytes))
        for s in streams:
            size, code = TYPES[s["dtype"]]
            order = "<" if s["little_endian"] else ">"
            for j in range(s["dim"]):
                v = random_value(rng, s["dtype"])
                struct.pack_into(order + code, rec, s["offset"] + j * size, v)
        body += rec
    damage = rng.random()
    if damage < 0.1:
        body = body[: len(body) - rng.randint(1, record_bytes - 1)] if record_bytes > 1 else body
    elif damage < 0.13:
        body = bytearray()
    data = rng.randbytes(header) + bytes(body) + rng.randbytes(footer)
    (case_dir / "data.bin").write_bytes(data)
    return {"record_bytes": record_bytes, "header_bytes": header, "footer_bytes": footer, "streams": streams,
            "precision": rng.choice(["float32", "float32", "float64"])}


def tf_answers(case: dict, path: Path) -> dict:
    import tensorflow as tf

    ds = tf.data.FixedLengthRecordDataset([str(path)], record_bytes=case["record_bytes"],
                                          header_bytes=case["header_bytes"], footer_bytes=case["footer_bytes"])
    try:
        records = [r.numpy() for r in ds]
    except tf.errors.InvalidArgumentError as e:
        return {"file_error": e.message.split("\n")[0][:300]}
    if not records:
        return {"file_error": "no record"}
    out = []
    for rec in records:
        per = {}
        for s in case["streams"]:
            part = rec[s["offset"]: s["offset"] + s["dim"] * TYPES[s["dtype"]][0]]
            values = tf.io.decode_raw(part, getattr(tf, s["dtype"]), little_endian=s["little_endian"]).numpy()
            if s["dtype"] == "bool":
                per[s["name"]] = [int(bool(v)) for v in values]
            elif s["dtype"].startswith("float") or s["dtype"] == "bfloat16":
                # float64 bits of TensorFlow's value (a float16 or float32 widens exactly).
                per[s["name"]] = [struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in values]
            else:
                per[s["name"]] = [int(v) for v in values]
        out.append(per)
    return {"records": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures_fixed"))
    ap.add_argument("--venv", default=str(ROOT / "target" / "tf-venv"))
    args = ap.parse_args()
    ensure_tensorflow(Path(args.venv), __file__)
    import tensorflow as tf

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    rng = random.Random(args.seed)
    for i in range(args.cases):
        d = out / f"case_{i:03d}"
        d.mkdir(parents=True)
        case = make_case(rng, d)
        case.update(tf_answers(case, d / "data.bin"))
        case["tensorflow"] = tf.__version__
        (d / "case.json").write_text(json.dumps(case, indent=1) + "\n")
    print(f"wrote {args.cases} cases to {out}; replaying them against minibatchd dump")
    sys.exit(subprocess.run(["cargo", "test", "-q", "--test", "fixed_oracle"], cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
