#!/usr/bin/env python3
"""CSV against TensorFlow itself (issue 39): random files read by `tf.data.TextLineDataset`
(after `skip_header_lines` lines) and each line by `tf.io.decode_csv`, their answers recorded as
a corpus that `tests/csv_oracle.rs` replays against `minibatchd dump` (record by record: floats
bitwise after the dataset's precision, integers exactly, an error wherever TensorFlow refuses a
record) — in the normal test suite, without TensorFlow.

    scripts/oracle/tf_csv.py [--cases 60] [--seed 1] [--out tests/fixtures_csv]
                             [--venv target/tf-venv]

Installs TensorFlow (CPU, from PyPI) into `--venv` when it has none (as `tf_diff.py`), then
re-runs itself there; writes one directory per case (`data.csv`, `case.json`: the options, the
streams, the precision, and per record TensorFlow's values per column or its error) and finally
runs the replay test.

Cases: 1–6 columns of `float32`, `float64`, `int32`, `int64` or text (a column no stream reads),
delimiters `,` `;` `|` and tab, quoting on or off, `na_value` "", "NA" or "?", 0–2 header lines;
fields written plainly, quoted (with doubled quotes inside), with spaces, signs, exponents,
hexadecimal floats, `inf` and `nan` in several spellings, numbers beyond the type's range, empty,
`na_value`, bad numbers, broken quotes; ragged rows, empty lines and `\\r` in lines.

`--kinds strings` (its own corpus, `tests/fixtures_csv_text`) also reads the text columns, as
`string` streams of one or two columns, required or with a default string.
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

TYPES = ["float32", "float64", "int32", "int64", "text"]
# What a text field holds (`--kinds strings` adds spaces, non-ASCII, a quote and a tab).
TEXTS = ["hello", "a b", "x-1", "42", ""]


def number(rng: random.Random, dtype: str) -> str:
    if dtype.startswith("int"):
        bits = 32 if dtype == "int32" else 64
        v = rng.choice([rng.randint(-1000, 1000)] * 6 + [(1 << 24) + 1, -(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                        1 << (bits - 1), rng.randint(-(1 << 40), 1 << 40)])
        s = str(v)
        if rng.random() < 0.1 and v >= 0:
            s = "+" + s
        if rng.random() < 0.1:
            s = "00" + s if v >= 0 else s
        return s
    v = rng.choice([rng.uniform(-100, 100), rng.uniform(-1, 1) * 10 ** rng.randint(-40, 40), 0.1, 6.8e38])
    return rng.choice([repr(v), f"{v:.3e}", f"{v:g}", ".5", "5.", "-0.0", "1e400", "-1e400", "1e-50", "0x10", "0x1p3",
                       "-0x1.8p1", "inf", "-inf", "Infinity", "nan", "NaN", "+2.5", "1E5"])


def field(rng: random.Random, dtype: str, na: str, delim: str, quotes: bool) -> str:
    r = rng.random()
    if r < 0.04:
        text = ""
    elif r < 0.07 and na:
        text = na
    elif r < 0.1:
        text = rng.choice(["abc", "1x", "--1", "1e", " ", "1.2.3", "0x", "1_0", "..", "+-2", "1 2"])
    elif dtype == "text":
        text = rng.choice(TEXTS)
    else:
        text = number(rng, dtype)
        if rng.random() < 0.15:
            text = rng.choice([" ", "\t", "  "]) + text + rng.choice(["", " "])
    if quotes and rng.random() < 0.2:
        if rng.random() < 0.05:
            return '"' + text  # a broken quote
        return '"' + text.replace('"', '""') + '"'
    if quotes and rng.random() < 0.01:
        return text + '"'
    if rng.random() < 0.01:
        return text + "\r"
    return text.replace(delim, "")


def make_case(rng: random.Random, case_dir: Path, kinds: str = "numeric") -> dict:
    ncols = rng.randint(1, 6)
    col_types = [rng.choice(TYPES) for _ in range(ncols)]
    delim = rng.choice([",", ",", ";", "|", "\t"])
    quotes = rng.random() < 0.85
    na = rng.choice(["", "", "NA", "?"])
    header = rng.choice([0, 0, 1, 2])
    streams = []
    numeric = [c for c in range(ncols) if col_types[c] != "text"]
    rng.shuffle(numeric)
    k = 0
    while numeric:
        dtype = col_types[numeric[0]]
        cols = [c for c in numeric if col_types[c] == dtype][: rng.randint(1, 3)]
        numeric = [c for c in numeric if c not in cols]
        s = {"name": f"s{k}", "dtype": dtype, "columns": cols}
        if rng.random() < 0.5:
            s["default"] = rng.choice([0, -1, 7]) if dtype.startswith("int") else rng.choice([0.0, -1.5, 0.25])
        streams.append(s)
        k += 1
    text = [c for c in range(ncols) if col_types[c] == "text"] if kinds == "strings" else []
    rng.shuffle(text)
    while text:
        cols = text[: rng.randint(1, 2)]
        text = text[len(cols):]
        s = {"name": f"s{k}", "dtype": "string", "columns": cols}
        if rng.random() < 0.5:
            s["default"] = rng.choice(["", "none", "ü"])
        streams.append(s)
        k += 1
    lines = [f"header {i}{delim}x" for i in range(header)]
    for _ in range(rng.randint(1, 25)):
        r = rng.random()
        if r < 0.05:
            lines.append("")
            continue
        n = ncols + (rng.choice([-1, 1]) if r < 0.1 else 0)
        lines.append(delim.join(field(rng, col_types[c % ncols], na, delim, quotes) for c in range(max(n, 0))))
    text = "\n".join(lines) + ("\n" if rng.random() < 0.8 else "")
    (case_dir / "data.csv").write_bytes(text.encode())
    return {"columns": ncols, "column_types": col_types, "field_delim": delim, "use_quote_delim": quotes,
            "na_value": na, "skip_header_lines": header, "streams": streams,
            "precision": rng.choice(["float32", "float32", "float64"])}


def tf_answers(case: dict, path: Path) -> list:
    import tensorflow as tf

    defaults = []
    for c, t in enumerate(case["column_types"]):
        stream = next((s for s in case["streams"] if c in s["columns"]), None)
        tf_type = tf.string if t == "text" else getattr(tf, t)
        if stream is None:
            defaults.append([""])
        elif "default" in stream:
            defaults.append(tf.constant([stream["default"]], tf_type))
        else:
            defaults.append(tf.constant([], tf_type))
    out = []
    for line in tf.data.TextLineDataset([str(path)]).skip(case["skip_header_lines"]):
        try:
            cols = tf.io.decode_csv(line, defaults, field_delim=case["field_delim"],
                                    use_quote_delim=case["use_quote_delim"], na_value=case["na_value"])
        except tf.errors.InvalidArgumentError as e:
            out.append({"error": e.message.split("\n")[0][:200]})
            continue
        values = {}
        read = {c for s in case["streams"] for c in s["columns"]}
        for c, t in enumerate(case["column_types"]):
            if t == "text":
                if c in read:
                    values[str(c)] = cols[c].numpy().hex()  # the bytes, as hex
                continue
            v = cols[c].numpy()
            if t.startswith("float"):
                values[str(c)] = struct.unpack("<Q", struct.pack("<d", float(v)))[0]
            else:
                values[str(c)] = int(v)
        out.append({"values": values})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures_csv"))
    ap.add_argument("--venv", default=str(ROOT / "target" / "tf-venv"))
    ap.add_argument("--kinds", choices=["numeric", "strings"], default="numeric",
                    help="strings: read text columns as string streams too (record into tests/fixtures_csv_text)")
    args = ap.parse_args()
    ensure_tensorflow(Path(args.venv), __file__)
    import tensorflow as tf

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    rng = random.Random(args.seed)
    if args.kinds == "strings":
        TEXTS.extend([" sp ", "ünï", "q\"t", "\t"])
    for i in range(args.cases):
        d = out / f"case_{i:03d}"
        d.mkdir(parents=True)
        case = make_case(rng, d, args.kinds)
        case["records"] = tf_answers(case, d / "data.csv")
        case["tensorflow"] = tf.__version__
        (d / "case.json").write_text(json.dumps(case, indent=1) + "\n")
    print(f"wrote {args.cases} cases to {out}; replaying them against minibatchd dump")
    sys.exit(subprocess.run(["cargo", "test", "-q", "--test", "csv_oracle"], cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
