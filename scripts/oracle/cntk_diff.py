#!/usr/bin/env python3
"""Differential test of `minibatchd dump` against the real CNTK 2.7 `MinibatchSource`.

Generates random CTF datasets and MinibatchSource configurations, runs each case through the CNTK
2.7 oracle (../shared/tools/cntk-oracle, set up with its setup.sh) and through `minibatchd dump`,
and compares every minibatch: checkpoint position, end_of_sweep, per-stream sample and sequence
counts, values (dense within 1 ulp of float32; sparse after CNTK's Value -> scipy normalization:
duplicate indices summed, indices sorted, explicit zeros dropped) and errors.

    scripts/oracle/cntk_diff.py --cases 3000 --seed 1            # run, print a summary
    scripts/oracle/cntk_diff.py --cases 200 --seed 7 --record tests/parity/cases
                                                          # also record clean cases as fixtures
    scripts/oracle/cntk_diff.py --replay tests/parity/cases      # re-run recorded cases (no oracle)

Cases are generated in groups: a multi-worker configuration is run at every rank, and the union of
all ranks is checked to hold every sequence exactly once per whole sweep, on both sides. When CNTK
itself breaks that promise (it sometimes repeats a sequence in a sweep after the first, see the
oracle's README), the case is reported as `cntk_broken` and compared only over the first sweep:
minibatchd stays exactly-once there (docs/differences.md). A CNTK crash (SIGSEGV, seen with
several deserializers) is reported as `cntk_crash` and says nothing.

Environment: ORACLE_HOME (default /tmp/cntk-oracle), ORACLE_DIR (default
../shared/tools/cntk-oracle), MINIBATCHD (default target/release/minibatchd).
Exit status: 0 when every case agrees (or CNTK is broken or crashed), 1 otherwise.
"""
import argparse
import concurrent.futures
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATASET = "d"


# ---------------------------------------------------------------- case generation

def gen_value(rng):
    """A dense value in one of CNTK's number forms (mostly plain decimals)."""
    r = rng.random()
    if r < 0.45:
        return str(rng.randint(-99, 99))
    if r < 0.85:
        return "%.*f" % (rng.randint(1, 4), rng.uniform(-50, 50))
    if r < 0.95:
        return "%de%d" % (rng.randint(-9, 9), rng.randint(-5, 5))
    return rng.choice(["0", "-0", "1.5E+2", "+3", "7e0"])


def gen_streams(rng):
    n = rng.choice([1, 1, 2, 2, 2, 3])
    aliases = ["F", "L", "x1", "lab", "S"]
    rng.shuffle(aliases)
    streams = []
    for i in range(n):
        sparse = rng.random() < 0.35
        dim = rng.randint(1, 12) if sparse else rng.randint(1, 4)
        name = ["features", "labels", "extra"][i]
        alias = aliases[i] if rng.random() < 0.7 else name
        streams.append({"name": name, "alias": alias, "dim": dim, "sparse": sparse})
    if rng.random() < 0.1:
        rng.choice(streams)["defines_mb_size"] = True
    return streams


def sample_text(rng, stream, tag):
    """One sample of `stream`; `tag` (an int or None) makes the sample unique."""
    if stream["sparse"]:
        k = rng.randint(0 if tag is None else 1, min(4, stream["dim"]))
        entries = []
        tag_idx = rng.randrange(stream["dim"])
        for j in range(k):
            if j == 0 and tag is not None:
                entries.append("%d:%s" % (tag_idx, tag + 1))
                continue
            idx = rng.randrange(stream["dim"])
            if tag is not None and idx == tag_idx:
                continue  # nothing may be summed into the tag
            entries.append("%d:%s" % (idx, gen_value(rng)))
        if rng.random() < 0.05 and len(entries) > (tag is not None):
            entries.append(entries[-1])  # a duplicate index: CNTK's conversion sums it
        return " ".join(entries)
    vals = [gen_value(rng) for _ in range(stream["dim"])]
    if tag is not None:
        vals[0] = str(tag + 0.25)
    return " ".join(vals)


def gen_source_text(rng, streams, lengths, id_mode, keys, crlf, errors, tag_every_line=False):
    """CTF text for sequences of the given nominal lengths. Returns (text, errors injected)."""
    lines = []
    injected = 0
    # One stream is on every line (the defines_mb_size one if any), so that a sequence of n lines
    # has n samples; a sequence whose streams all have fewer samples than lines costs an error.
    full = next((i for i, st in enumerate(streams) if st.get("defines_mb_size")), 0)
    for s, n in enumerate(lengths):
        for ln in range(n):
            parts = []
            for si, st in enumerate(streams):
                # Every stream on the first line of a sequence (else CNTK's "Input is empty"
                # fatal error); later lines carry each other stream with some probability.
                if ln > 0 and si != full and rng.random() < 0.3:
                    continue
                tag = keys[s] if si == 0 and (ln == 0 or tag_every_line) else None
                parts.append("|%s %s" % (st["alias"], sample_text(rng, st, tag)))
            if ln > 0 and not parts:
                st = streams[0]
                parts.append("|%s %s" % (st["alias"], sample_text(rng, st, None)))
            if ln > 0 and errors and rng.random() < errors:
                # A malformed token on a later line: one error unit, the sample is discarded.
                bad = rng.choice(["1.2.3", "abc", "--1", "4:", ":5"])
                parts.append("|%s %s" % (streams[-1]["alias"], bad))
                injected += 1
            if rng.random() < 0.03:
                parts.append("|# a comment")
            sep = rng.choice([" ", " ", "\t", "  "])
            prefix = ("%d " % keys[s]) if id_mode else ""
            lines.append(prefix + sep.join(parts))
    eol = "\r\n" if crlf else "\n"
    return eol.join(lines) + (eol if rng.random() < 0.9 else ""), injected


def gen_group(rng, gid):
    """One dataset and configuration; a list of cases, one per rank."""
    big = rng.random() < 0.1
    nseq = rng.randint(100, 400) if big else rng.randint(1, 40)
    seq_kind = rng.random()
    frame_mode = False
    if seq_kind < 0.35:
        lengths = [1] * nseq
        frame_mode = rng.random() < 0.25
    elif seq_kind < 0.8:
        lengths = [rng.randint(1, 4) for _ in range(nseq)]
    else:
        lengths = [rng.choice([1, 1, 2, 3, 7, 12]) for _ in range(nseq)]
    id_mode = not all(n == 1 for n in lengths) or rng.random() < 0.5
    skip_ids = (not id_mode) and rng.random() < 0.2
    if skip_ids:
        id_mode = True  # ids written, and ignored by skipSequenceIds
    keys = list(range(nseq))
    crlf = rng.random() < 0.15
    err_rate = 0.05 if rng.random() < 0.12 else 0.0
    streams = gen_streams(rng)
    if any(s.get("defines_mb_size") for s in streams):
        frame_mode = False
    several = (not big) and id_mode and (not skip_ids) and len(streams) >= 2 and rng.random() < 0.12
    files = {}
    sources = []
    errors_total = 0
    if several:
        split = rng.randint(1, len(streams) - 1)
        parts = [streams[:split], streams[split:]]
        for sts in parts:
            # Every line of a source starts with its sequence's key (a dense first stream), so a
            # sample joined from another key shows.
            sts[0]["sparse"] = False
            sts[0]["dim"] = min(sts[0]["dim"], 4)
        for i, sts in enumerate(parts):
            text, inj = gen_source_text(rng, sts, lengths, True, keys, crlf, err_rate, tag_every_line=True)
            errors_total += inj
            fname = "s%d.ctf" % i
            files[fname] = text
            sources.append({"file": fname, "skip_sequence_ids": False, "streams": sts})
    else:
        text, inj = gen_source_text(rng, streams, lengths, id_mode, keys, crlf, err_rate)
        errors_total += inj
        files["data.ctf"] = text
        sources.append({"file": "data.ctf", "skip_sequence_ids": skip_ids, "streams": streams})
    size = max(len(t) for t in files.values())
    chunk = rng.choice([1, 8, 30, 64, 100, 200, 500, 2000, size, size * 4, 1 << 25])
    if big:
        chunk = rng.choice([1, 16, 40, 100])
    max_errors = rng.choice([0, errors_total, errors_total + 2, 1000]) if errors_total else 0

    randomize = rng.random() < 0.75
    wr = rng.random()
    if wr < 0.1:
        window = None
    elif wr < 0.55:
        window = ["chunks", rng.choice([0, 1, 1, 2, 3, 4, 7, 20, 1000])]
    else:
        window = ["samples", rng.choice([0, 1, 2, 3, 5, 8, 15, 30, 100, 100000])]
    seed = rng.choice([0, 0, 1, 2, 3, rng.randrange(1 << 32)])

    sweep_size_guess = sum(lengths)
    lr = rng.random()
    if lr < 0.4:
        limit = ["sweeps", rng.choice([1, 2, 2, 3, 4, 6] if not big else [2, 3, 5])]
    elif lr < 0.6:
        limit = ["samples", rng.randint(1, max(1, sweep_size_guess * rng.choice([1, 2, 3])))]
    elif lr < 0.75:
        limit = ["full"]
    else:
        limit = ["infinite"]
    sizes = [rng.choice([1, 2, 3, 4, 5, 8, 16, 32, 100]) for _ in range(rng.choice([1, 1, 2, 3]))]
    if big:
        sizes = [rng.choice([8, 16, 32, 64]) for _ in range(rng.choice([1, 2]))]
    workers = rng.choice([1, 1, 1, 2, 2, 3, 4])
    num_mb = rng.choice([10, 30, 60]) if limit[0] == "infinite" else 600

    restore_at_start = None
    restore_before = []
    if errors_total:
        # Malformed data only without seeks: the seek-free reference that tells CNTK's own order
        # needs every sequence's nominal length, which a discarded sample hides.
        sizes = sizes[:1]
    rr = 1.0 if errors_total else rng.random()
    if rr < 0.15:
        restore_at_start = rng.randint(0, max(0, sweep_size_guess * 2))
    elif rr < 0.35:
        i = rng.randint(1, 8)
        restore_before = [[i, rng.randint(0, max(0, sweep_size_guess * 2))]]

    base = {
        "files": files, "sources": sources, "chunk_size_bytes": chunk, "max_errors": max_errors,
        "randomize": randomize, "window": window, "seed": seed, "limit": limit,
        "minibatch_sizes": sizes, "num_minibatches": num_mb, "workers": workers,
        "restore_at_start": restore_at_start, "restore_before": restore_before,
        "frame_mode": frame_mode, "unique_first_samples": errors_total == 0,
    }
    cases = []
    for rank in range(workers):
        c = dict(base)
        c["rank"] = rank
        c["name"] = "g%s-r%d" % (gid, rank)
        cases.append(c)
    return cases


# ---------------------------------------------------------------- the two sides

def oracle_config(case, d):
    deser = []
    for src in case["sources"]:
        deser.append({
            "file": os.path.join(d, src["file"]),
            "streams": [dict(s) for s in src["streams"]],
            "options": {"chunkSizeInBytes": case["chunk_size_bytes"], "maxErrors": case["max_errors"],
                        "skipSequenceIds": src["skip_sequence_ids"], "cacheIndex": False},
        })
    cfg = {"deserializers": deser, "randomize": case["randomize"], "randomization_seed": case["seed"],
           "frame_mode": case["frame_mode"], "minibatch_sizes": case["minibatch_sizes"],
           "num_minibatches": case["num_minibatches"], "num_workers": case["workers"],
           "worker_rank": case["rank"], "trace_level": 0}
    w = case["window"]
    if w and w[0] == "chunks":
        cfg["randomization_window_in_chunks"] = w[1]
    elif w and w[0] == "samples":
        cfg["randomization_window_in_samples"] = w[1]
    lim = case["limit"]
    if lim[0] == "sweeps":
        cfg["max_sweeps"] = lim[1]
    elif lim[0] == "samples":
        cfg["max_samples"] = lim[1]
    elif lim[0] == "full":
        cfg["max_samples"] = "FULL_DATA_SWEEP"
    if case["restore_at_start"] is not None:
        cfg["restore_at_start"] = {"minibatchSourcePosition": case["restore_at_start"]}
    if case["restore_before"]:
        cfg["restore_before"] = {str(i): {"minibatchSourcePosition": p} for i, p in case["restore_before"]}
    return cfg


def toml_str(s):
    return json.dumps(s)


def minibatchd_config(case):
    out = ["[daemon]", 'state_dir = "state"', "", "[datasets.%s]" % DATASET, 'format = "ctf"',
           "chunk_size_bytes = %d" % case["chunk_size_bytes"], "max_errors = %d" % case["max_errors"],
           "cache_index = false", ""]
    several = len(case["sources"]) > 1
    for src in case["sources"]:
        prefix = "datasets.%s" % DATASET
        if several:
            out.append("[[%s.sources]]" % prefix)
            prefix += ".sources"
        out.append("files = [%s]" % toml_str(src["file"]))
        if src["skip_sequence_ids"]:
            out.append("skip_sequence_ids = true")
        for s in src["streams"]:
            out.append("[%s.streams.%s]" % (prefix, s["name"]))
            out.append("alias = %s" % toml_str(s["alias"]))
            out.append("dim = %d" % s["dim"])
            out.append('format = "%s"' % ("sparse" if s["sparse"] else "dense"))
            if s.get("defines_mb_size"):
                out.append("defines_mb_size = true")
        out.append("")
    return "\n".join(out) + "\n"


def dump_args(case):
    args = ["--minibatch-sizes", ",".join(str(x) for x in case["minibatch_sizes"]),
            "--num-minibatches", str(case["num_minibatches"]),
            "--workers", str(case["workers"]), "--rank", str(case["rank"]),
            "--randomize", "true" if case["randomize"] else "false",
            "--seed", str(case["seed"])]
    w = case["window"]
    if case["randomize"]:
        if w is None:
            args += ["--window-chunks", "128"]
        elif w[0] == "chunks":
            args += ["--window-chunks", str(w[1])]
        else:
            args += ["--window-samples", str(w[1])]
    lim = case["limit"]
    if lim[0] == "sweeps":
        args += ["--max-sweeps", str(lim[1])]
    elif lim[0] == "samples":
        args += ["--max-samples", str(lim[1])]
    elif lim[0] == "full":
        args += ["--full-sweep"]
    if case["frame_mode"]:
        args += ["--frame-mode"]
    if case["restore_at_start"] is not None:
        args += ["--restore", str(case["restore_at_start"])]
    for i, p in case["restore_before"]:
        args += ["--restore-before", "%d:%d" % (i, p)]
    return args


def write_case_files(case, d):
    for name, text in case["files"].items():
        with open(os.path.join(d, name), "w", newline="") as f:
            f.write(text)
    with open(os.path.join(d, "config.toml"), "w") as f:
        f.write(minibatchd_config(case))


def run_dump(binary, case, d):
    cmd = [binary, "dump", "--config", os.path.join(d, "config.toml"), "--dataset", DATASET] + dump_args(case)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    mbs = [json.loads(x) for x in p.stdout.decode().splitlines() if x.strip()]
    return {"minibatches": mbs, "exit": p.returncode, "stderr": p.stderr.decode(errors="replace")[-2000:]}


class Oracle:
    """A long-lived oracle batch process; restarted after a crash."""

    def __init__(self):
        home = os.environ.get("ORACLE_HOME", "/tmp/cntk-oracle")
        self.python = os.path.join(home, "venv36", "bin", "python")
        self.oracle_dir = os.environ.get("ORACLE_DIR", os.path.join(ROOT, "..", "shared", "tools", "cntk-oracle"))
        self.env = dict(os.environ)
        self.env["LD_LIBRARY_PATH"] = os.path.join(home, "mpishim") + (
            ":" + self.env["LD_LIBRARY_PATH"] if self.env.get("LD_LIBRARY_PATH") else "")
        self.env["PYTHONWARNINGS"] = "ignore"
        if not os.path.exists(self.python):
            sys.exit("the CNTK oracle is not set up: run ../shared/tools/cntk-oracle/setup.sh")
        self.proc = None

    def _start(self):
        self.proc = subprocess.Popen(
            [self.python, "-W", "ignore", os.path.join(ROOT, "scripts", "oracle", "cntk_oracle_batch.py"), self.oracle_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env)

    def run(self, cfg):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write((json.dumps({"id": 0, "cfg": cfg}) + "\n").encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.proc = None
            return None  # crashed
        return json.loads(line)["lines"]

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


# ---------------------------------------------------------------- normalization and comparison

def f32_bits(x):
    if isinstance(x, str):
        x = float(x)
    return struct.unpack("<i", struct.pack("<f", x))[0]


def f32_close(a, b):
    """Within 1 ulp of float32 (NaN equals NaN; infinities exactly)."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    ia, ib = f32_bits(a), f32_bits(b)
    if ia < 0:
        ia = -(ia & 0x7FFFFFFF)
    if ib < 0:
        ib = -(ib & 0x7FFFFFFF)
    return abs(ia - ib) <= 1


def norm_sparse(indices, values):
    """CNTK's Value -> scipy normalization: duplicate indices summed, sorted, zeros dropped.
    Returns (indices, values, magnitudes): a magnitude is the sum of the absolute values that
    were added up, which bounds the rounding error of a sum done in another order."""
    acc, mag = {}, {}
    for i, v in zip(indices, values):
        acc[i] = acc.get(i, 0.0) + float(v)
        mag[i] = mag.get(i, 0.0) + abs(float(v))
    keys = sorted(k for k, v in acc.items() if struct.unpack("<f", struct.pack("<f", v))[0] != 0.0)
    return keys, [struct.unpack("<f", struct.pack("<f", acc[k]))[0] for k in keys], [mag[k] for k in keys]


def canon_stream(r, sparse, idx, val):
    """A stream of one minibatch as (samples, sequences, sequences with sparse samples
    normalized); `idx`/`val` name the sparse sample's keys on that side."""
    seqs = [[norm_sparse(x[idx], x[val]) for x in q] if sparse else q for q in r["sequences"]]
    return r["num_samples"], r["num_sequences"], seqs


def canon_oracle(lines, streams):
    """Oracle lines -> (minibatches, end) with end in {"empty", "limit", "error: ...", "crash"}."""
    mbs = []
    end = "crash"
    for ln in lines:
        if ln.get("error") is not None:
            end = "error: " + ln["error"]
            if "'NoneType' object has no attribute" in ln["error"]:
                # CNTK returned a minibatch in which a stream has no data (the worker got
                # nothing this time, the epoch not over), which the oracle script cannot print:
                # the oracle's run ends there, as at an empty minibatch.
                end = "empty"
            break
        if ln.get("empty"):
            end = "empty"
            break
        st = {s["name"]: canon_stream(ln["streams"][s["name"]], s["sparse"], "idx", "val") for s in streams}
        eos = [ln["streams"][s["name"]]["end_of_sweep"] for s in streams]
        mbs.append({"position": ln["checkpoint"]["minibatchSourcePosition"], "end_of_sweep": eos, "streams": st})
    else:
        end = "limit"
    return mbs, end


def canon_dump(out, streams):
    mbs = []
    for m in out["minibatches"]:
        st = {s["name"]: canon_stream(m["streams"][s["name"]], s["sparse"], "indices", "values") for s in streams}
        mbs.append({"position": m["position"], "end_of_sweep": m["end_of_sweep"], "sweep": m["sweep"], "streams": st})
    end = "limit" if out["exit"] == 0 else "error: " + out["stderr"].strip().splitlines()[-1] if out["stderr"].strip() else "error"
    return mbs, end


def seqs_equal(a, b, sparse):
    if len(a) != len(b):
        return False
    for qa, qb in zip(a, b):
        if len(qa) != len(qb):
            return False
        for sa, sb in zip(qa, qb):
            if sparse:
                if sa[0] != sb[0] or len(sa[1]) != len(sb[1]):
                    return False
                for x, y, mx, my in zip(sa[1], sb[1], sa[2], sb[2]):
                    # Summed duplicates: CNTK adds in float32 in its own order.
                    if not (f32_close(x, y) or abs(float(x) - float(y)) <= 4e-7 * max(mx, my)):
                        return False
            else:
                if len(sa) != len(sb) or not all(f32_close(x, y) for x, y in zip(sa, sb)):
                    return False
    return True


def all_streams(case):
    return [s for src in case["sources"] for s in src["streams"]]


def compare(case, ocl, dmp, upto=None):
    """First difference between the canonical oracle and dump runs, or None."""
    streams = all_streams(case)
    omb, oend = ocl
    dmb, dend = dmp
    # CNTK returns an empty minibatch (and the oracle stops) when this worker has no data at a
    # point; dump prints an empty minibatch and goes on. Compare up to the first empty one.
    cut = None
    for i, m in enumerate(dmb):
        if all(m["streams"][s["name"]][1] == 0 for s in streams):
            cut = i
            break
    if cut is not None:
        dmb = dmb[:cut]
        dend = "empty"
    if upto is not None:
        omb, dmb = omb[:upto], dmb[:upto]
    n = min(len(omb), len(dmb))
    for i in range(n):
        o, d = omb[i], dmb[i]
        if o["position"] != d["position"]:
            return "mb %d: position %d (CNTK) vs %d" % (i, o["position"], d["position"])
        if any(e != d["end_of_sweep"] for e in o["end_of_sweep"]):
            return "mb %d: end_of_sweep %s (CNTK) vs %s" % (i, o["end_of_sweep"], d["end_of_sweep"])
        for s in streams:
            on, oq, ov = o["streams"][s["name"]]
            dn, dq, dv = d["streams"][s["name"]]
            if (on, oq) != (dn, dq):
                return "mb %d stream %s: samples/sequences %d/%d (CNTK) vs %d/%d" % (i, s["name"], on, oq, dn, dq)
            if not seqs_equal(ov, dv, s["sparse"]):
                for qi, (qa, qb) in enumerate(zip(ov, dv)):
                    if not seqs_equal([qa], [qb], s["sparse"]):
                        return "mb %d stream %s sequence %d: %s (CNTK) vs %s" % (
                            i, s["name"], qi, json.dumps(qa)[:150], json.dumps(qb)[:150])
                return "mb %d stream %s: values differ" % (i, s["name"])
    if upto is not None:
        return None if len(omb) == len(dmb) or min(len(omb), len(dmb)) >= upto else \
            "minibatch count %d (CNTK) vs %d within the compared prefix" % (len(omb), len(dmb))
    if oend.startswith("error") and dend.startswith("error") and len(dmb) >= len(omb):
        # CNTK loads chunks ahead of the minibatch that needs them (its prefetch and the
        # randomization window), so a fatal data error surfaces there earlier; minibatchd raises
        # it at the first minibatch that needs the chunk (docs/differences.md).
        return None
    if len(omb) != len(dmb):
        return "minibatch count %d (CNTK, end: %s) vs %d (end: %s)" % (len(omb), oend[:120], len(dmb), dend[:120])
    if oend.startswith("error") != dend.startswith("error"):
        return "end: %s (CNTK) vs %s" % (oend[:200], dend[:200])
    return None


def first_misjoin(case, mbs):
    """Index of the first minibatch (canonical oracle output) in which CNTK joined sources by the
    wrong key: every line of every source starts with its sequence's key (the first value of the
    source's first stream), so all samples of one sequence must carry the same key."""
    if len(case["sources"]) < 2:
        return None
    firsts = [src["streams"][0] for src in case["sources"]]
    if any(st["sparse"] for st in firsts):
        return None
    for i, m in enumerate(mbs):
        for qi in range(m["streams"][firsts[0]["name"]][1]):
            tags = set()
            for st in firsts:
                seqs = m["streams"][st["name"]][2]
                if qi < len(seqs):
                    tags.update(math.floor(float(sample[0])) for sample in seqs[qi])
            if len(tags) > 1:
                return i
    return None


def plus_zero(x):
    """`x` with every -0.0 made 0.0 (CNTK prints either, depending on how it packed the
    minibatch)."""
    if isinstance(x, (list, tuple)):
        return [plus_zero(v) for v in x]
    if isinstance(x, float):
        return x + 0.0
    return x


def first_sample_key(streams, mb_streams, qi):
    s = streams[0]
    q = mb_streams[s["name"]][2][qi]
    if not q:
        return None
    return json.dumps(plus_zero(q[0]))


def seek_points(case):
    """Minibatch indices before which CNTK repositions its reader (`SetConfiguration` after a
    change of minibatch size, `restore_from_checkpoint`), with the position it seeks to (None:
    the position the previous minibatch reported)."""
    points = []
    sizes = case["minibatch_sizes"]
    if case["restore_at_start"] is not None:
        points.append((0, case["restore_at_start"]))
    restores = dict((i, p) for i, p in case["restore_before"])
    for i in range(1, case["num_minibatches"]):
        if i in restores:
            points.append((i, restores[i]))
        elif sizes[i % len(sizes)] != sizes[(i - 1) % len(sizes)]:
            points.append((i, None))
    return points


def reference_config(case, sweeps, workers, rank, size):
    """An oracle run that shows CNTK's own order without any seek: the minibatch size never
    changes and nothing is restored, so CNTK never repositions its reader."""
    c = dict(case)
    c["workers"], c["rank"] = workers, rank
    c["restore_at_start"], c["restore_before"] = None, []
    c["limit"] = ["sweeps", sweeps]
    c["minibatch_sizes"] = [size]
    c["num_minibatches"] = 100000
    return c


def seek_free_reference(cases, d, oracle, sweep_size, sweeps):
    """Per rank, the sequences CNTK itself delivers to that rank without seeks, as a list of
    (first-sample key, global start position); None if a run failed."""
    streams = all_streams(cases[0])
    base = cases[0]
    glines = oracle.run(oracle_config(reference_config(base, sweeps, 1, 0, sweep_size), d))
    if glines is None:
        return None
    gmbs, gend = canon_oracle(glines, streams)
    if gend not in ("empty", "limit"):
        return None
    timeline = []
    at = 0
    for m in gmbs:
        keys = [first_sample_key(streams, m["streams"], qi) for qi in range(m["streams"][streams[0]["name"]][1])]
        for k, n in zip(keys, nominal_lengths(base, m)):
            timeline.append((k, at, n))
            at += n
    workers = base["workers"]
    if workers == 1:
        return [timeline], timeline
    per_rank = []
    for r in range(workers):
        # One local sample per minibatch: each minibatch holds one sequence of this rank, which
        # places it on the timeline even where a key recurs every sweep.
        lines = oracle.run(oracle_config(reference_config(base, sweeps, workers, r, workers), d))
        if lines is None:
            return None
        mbs, end = canon_oracle(lines, streams)
        if end not in ("empty", "limit"):
            return None
        block = base["randomize"] and base["window"] != ["chunks", 0]
        mine = []
        g = 0
        start = 0
        for m in mbs:
            for qi in range(m["streams"][streams[0]["name"]][1]):
                key = first_sample_key(streams, m["streams"], qi)
                # The same key recurs every sweep: the sequential reader stops right after its
                # local sequence, so it ends where the minibatch does; the block randomizer's is
                # the first one at or after where the minibatch started.
                while g < len(timeline) and (timeline[g][0] != key or timeline[g][1] < start or (
                        not block and timeline[g][1] + timeline[g][2] != m["position"])):
                    g += 1
                if g == len(timeline):
                    return None
                mine.append(timeline[g])
                g += 1
            start = m["position"]
        per_rank.append(mine)
    return per_rank, timeline


def epoch_end(case, sweep_size):
    lim = case["limit"]
    if lim[0] == "sweeps":
        return lim[1] * sweep_size
    if lim[0] == "samples":
        return lim[1]
    if lim[0] == "full":
        return sweep_size
    return float("inf")


def epoch_stop(case, sweep_size, timeline):
    """Where the block randomizer's walk stops at the epoch end: the start of the first sequence
    that starts at or after it (every worker walks the same global timeline)."""
    end = epoch_end(case, sweep_size)
    return next((p for _, p, _ in timeline if p >= end), None)


def first_inconsistency(case, mbs, mine, sweep_size, ended, timeline):
    """Index of the first minibatch of `mbs` (one rank's canonical oracle output) that does not
    hold exactly this rank's sequences of CNTK's own seek-free order between the position where
    it starts (the previous minibatch's, or the one a seek went to) and the position it reports;
    None if every minibatch does."""
    streams = all_streams(case)
    block = case["randomize"] and case["window"] != ["chunks", 0]
    seeks = dict(seek_points(case))
    ptr = 0
    prev = 0
    for i, m in enumerate(mbs):
        if i in seeks:
            a = seeks[i] if seeks[i] is not None else prev
            ptr = 0
            while ptr < len(mine) and mine[ptr][1] < a:
                ptr += 1
        expected = []
        while ptr < len(mine) and mine[ptr][1] < m["position"]:
            expected.append(mine[ptr][0])
            ptr += 1
        got = [first_sample_key(streams, m["streams"], qi) for qi in range(m["streams"][streams[0]["name"]][1])]
        # A fill ends where this rank's next sequence starts (it did not fit), right after its
        # last sequence (the sequential reader stops once the local size is reached), at a sweep
        # end (the block randomizer), or at the epoch end.
        ends = {mine[ptr][1]} if ptr < len(mine) else set()
        if ptr > 0 and not block:
            ends.add(mine[ptr - 1][1] + mine[ptr - 1][2])
        # The block randomizer also stops at a sweep end once the local size is reached there.
        at_sweep_end = block and m["position"] % sweep_size == 0
        if block:
            stop = epoch_stop(case, sweep_size, timeline)
            at_epoch_end = m["position"] == stop or stop is None and m["position"] >= epoch_end(case, sweep_size)
        else:
            at_epoch_end = m["position"] >= epoch_end(case, sweep_size)
        stop_ok = m["position"] in ends or at_sweep_end or at_epoch_end or ptr == len(mine)
        if block and stop_ok and not (at_sweep_end or at_epoch_end) and ptr < len(mine) \
                and m["position"] == mine[ptr][1] and not case["frame_mode"]:
            # It stopped at this rank's next sequence of the seek-free order: that sequence must
            # not have fitted in the local limit (CNTK's fill takes every one that does). If it
            # would have, CNTK's next sequence was another one: its order went astray.
            sizes = case["minibatch_sizes"]
            size, workers = sizes[i % len(sizes)], case["workers"]
            limit = max(1, size // workers + (1 if size % workers > case["rank"] else 0))
            local = sum(nominal_lengths(case, m))
            if 0 < local and local + mine[ptr][2] <= limit:
                stop_ok = False
        if got != expected or not stop_ok:
            # The seek that preceded this minibatch is where CNTK's order went astray; the
            # minibatches since then were filled from it too (a fill stops at the first
            # sequence that does not fit, which may already be a wrong one).
            return max([j for j in seeks if j <= i], default=i)
        prev = m["position"]
    if len(mbs) in seeks:
        # A seek before the call that found the epoch over (a restore past its end).
        a = seeks[len(mbs)] if seeks[len(mbs)] is not None else prev
        ptr = 0
        while ptr < len(mine) and mine[ptr][1] < a:
            ptr += 1
    if ended and ptr < len(mine) and mine[ptr][1] < epoch_end(case, sweep_size):
        # CNTK ended the epoch with sequences of this rank still to come.
        return max([j for j in seeks if j <= len(mbs)], default=len(mbs))
    return None


def nominal_lengths(case, mb):
    """Per sequence of a canonical minibatch: its nominal length (clean data: the largest
    per-stream sample count, or the defines_mb_size stream's)."""
    streams = all_streams(case)
    main = [s for s in streams if s.get("defines_mb_size")]
    use = main or streams
    n = mb["streams"][streams[0]["name"]][1]
    return [max(len(mb["streams"][s["name"]][2][qi]) for s in use) for qi in range(n)]


def garbage_shape(end):
    """Whether CNTK's run ended on a sample shape of (size_t)-2: uninitialised memory."""
    return "18446744073709551614" in end


def whole_sweeps(case):
    lim = case["limit"]
    if case["restore_at_start"] is not None or case["restore_before"]:
        return None
    if lim[0] == "sweeps":
        return lim[1]
    if lim[0] == "full":
        return 1
    return None


def exactly_once(case_runs, sweeps):
    """Over all ranks of a group: does each first sample appear exactly `sweeps` times?"""
    counts = Counter()
    for case, mbs in case_runs:
        streams = all_streams(case)
        for m in mbs:
            for qi in range(m["streams"][streams[0]["name"]][1]):
                counts[first_sample_key(streams, m["streams"], qi)] += 1
    bad = {k: v for k, v in counts.items() if v != sweeps}
    return not bad, counts


def sweep_prefix(mbs, sweep_size, restore):
    """Number of leading minibatches that start within the first sweep."""
    start = restore or 0
    for i, m in enumerate(mbs):
        if start >= sweep_size:
            return i
        start = m["position"]
    return len(mbs)


# ---------------------------------------------------------------- driver

def run_group(cases, oracle, binary, keep_dir=None):
    """Runs one group (all ranks); returns a list of (case, status, detail, oracle lines, upto):
    `upto` is the number of leading minibatches that are compared when CNTK is not consistent
    over the whole run (None: everything, the end included)."""
    d = tempfile.mkdtemp(prefix="cntk-diff-")
    try:
        write_case_files(cases[0], d)
        results = []
        ocls, dmps = [], []
        for case in cases:
            lines = oracle.run(oracle_config(case, d))
            dump = run_dump(binary, case, d)
            ocls.append(lines)
            dmps.append(dump)
        sweeps = whole_sweeps(cases[0])
        if any(len(dm["minibatches"]) >= cases[0]["num_minibatches"] for dm in dmps):
            # Cut by --num-minibatches before the sweeps end (both sides stop there): no sweep
            # count to check.
            sweeps = None
        broken = False
        streams = all_streams(cases[0])
        if any(lines is None for lines in ocls):
            return [(c, "cntk_crash", "", None, None) for c in cases]
        canon_o = [canon_oracle(lines, streams) for lines in ocls]
        canon_d = [canon_dump(dm, streams) for dm in dmps]
        o_ok = all(end in ("empty", "limit") for _, end in canon_o)
        # A rank where CNTK reads uninitialised memory says nothing about the others' seeks.
        o_sane = all(end in ("empty", "limit") or garbage_shape(end) for _, end in canon_o)
        if sweeps and cases[0]["unique_first_samples"] and o_ok and all(e == "empty" for _, e in canon_o):
            ok, _ = exactly_once([(c, o[0]) for c, o in zip(cases, canon_o)], sweeps)
            broken = not ok
        # Our own promise, checked whatever CNTK does.
        ours_once = None
        if sweeps and cases[0]["unique_first_samples"] and all(dm["exit"] == 0 for dm in dmps):
            ok, _ = exactly_once([(c, dd[0]) for c, dd in zip(cases, canon_d)], sweeps)
            ours_once = ok
        sweep_size = None
        ref = None
        if seek_points(cases[0]) and cases[0]["unique_first_samples"] and o_sane:
            sweep_size = dataset_sweep_size(cases[0], d, binary)
            top = max([m["position"] for co in canon_o for m in co[0]] + [p for _, p in seek_points(cases[0]) if p is not None] + [0])
            if sweep_size:
                ref = seek_free_reference(cases, d, oracle, sweep_size, top // sweep_size + 2)
        for case, co, cd, lines in zip(cases, canon_o, canon_d, ocls):
            if ours_once is False:
                results.append((case, "mismatch", "minibatchd is not exactly-once over %d sweeps" % sweeps, lines, None))
                continue
            # Malformed tokens are only on later lines, so every first sample carries its key.
            misjoin = first_misjoin(case, co[0])
            if misjoin is not None:
                diff = compare(case, co, cd, upto=misjoin)
                results.append((case, "mismatch" if diff else "cntk_misjoin", diff or "CNTK joins by a wrong key at mb %d" % misjoin, lines, misjoin))
                continue
            if garbage_shape(co[1]):
                # CNTK reports a sample shape of (size_t)-2: uninitialised memory. Before it,
                # CNTK may already have sought (differences 4): compare up to the earlier of both.
                cut = first_inconsistency(case, co[0], ref[0][case["rank"]], sweep_size, False, ref[1]) if ref is not None else None
                if cut is not None and cut < len(co[0]):
                    diff = compare(case, co, cd, upto=cut)
                    results.append((case, "mismatch" if diff else "cntk_reseeks", diff or "agrees up to CNTK's seek at mb %d" % cut, lines, cut))
                    continue
                diff = compare(case, co, cd, upto=len(co[0]))
                results.append((case, "mismatch" if diff else "cntk_garbage", diff or "agrees until CNTK's garbage shape", lines, len(co[0])))
                continue
            if (co[1].startswith("error: Reached the maximum number of allowed errors") and cd[1] == "limit"
                    and len(cd[0]) >= len(co[0])):
                # CNTK charges a malformed place again each time its chunk is parsed again
                # (docs/differences.md, CNTK #3); minibatchd charges it once.
                diff = compare(case, co, cd, upto=len(co[0]))
                results.append((case, "mismatch" if diff else "cntk_recounts", diff or "agrees until CNTK's re-counted errors", lines, len(co[0])))
                continue
            cut = first_inconsistency(case, co[0], ref[0][case["rank"]], sweep_size, co[1] == "empty", ref[1]) if ref is not None else None
            if cut is not None:
                diff = compare(case, co, cd, upto=cut)
                results.append((case, "mismatch" if diff else "cntk_reseeks", diff or "agrees up to CNTK's seek at mb %d" % cut, lines, cut))
                continue
            if broken:
                if sweep_size is None:
                    sweep_size = dataset_sweep_size(cases[0], d, binary)
                upto = sweep_prefix(co[0], sweep_size, case["restore_at_start"])
                diff = compare(case, co, cd, upto=upto)
                results.append((case, "mismatch" if diff else "cntk_broken", diff or "first sweep agrees", lines, upto))
            else:
                diff = compare(case, co, cd)
                results.append((case, "mismatch" if diff else "match", diff or "", lines, None))
        if keep_dir and any(r[1] == "mismatch" for r in results):
            dst = os.path.join(keep_dir, cases[0]["name"].rsplit("-r", 1)[0])
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(d, dst)
            with open(os.path.join(dst, "cases.json"), "w") as f:
                json.dump([{"case": r[0], "status": r[1], "detail": r[2], "oracle": r[3]} for r in results], f)
        return results
    finally:
        shutil.rmtree(d, ignore_errors=True)


def dataset_sweep_size(case, d, binary):
    """Samples per sweep, from one sequential minibatch as large as the data (minibatchd's index
    pass; the conformance tests check it against CNTK's)."""
    c = dict(case)
    c["randomize"] = False
    c["workers"], c["rank"] = 1, 0
    c["limit"] = ["full"]
    c["restore_at_start"], c["restore_before"] = None, []
    c["minibatch_sizes"] = [1 << 20]
    c["num_minibatches"] = 1
    out = run_dump(binary, c, d)
    return out["minibatches"][0]["position"] if out["minibatches"] else 0


def record_case(directory, case, status, lines, upto, max_bytes):
    """Writes one case as a fixture for tests/parity.rs: the data, the minibatchd config and
    `dump` arguments, and CNTK's answer in canonical form (what `compare` checks)."""
    if upto == 0:
        return  # CNTK is inconsistent from its first minibatch: nothing to compare
    streams = all_streams(case)
    mbs, end = canon_oracle(lines, streams)
    expected = []
    for m in mbs:
        eos = m["end_of_sweep"]
        expected.append({
            "position": m["position"],
            "end_of_sweep": eos[0] if all(e == eos[0] for e in eos) else None,
            "streams": {name: {"num_samples": v[0], "num_sequences": v[1], "sequences": v[2]}
                        for name, v in m["streams"].items()},
        })
    fixture = {
        "name": case["name"], "status": status, "kinds": kind_of(case),
        "files": case["files"], "config": minibatchd_config(case), "dataset": DATASET,
        "args": dump_args(case), "sparse": [s["name"] for s in streams if s["sparse"]],
        "compare": upto, "end": "error" if end.startswith("error") else end,
        "expected": expected,
    }
    text = json.dumps(fixture, separators=(",", ":"))
    if len(text) > max_bytes:
        return
    with open(os.path.join(directory, case["name"] + ".json"), "w") as f:
        f.write(text)


def kind_of(case):
    k = []
    if case["randomize"] and case["window"] != ["chunks", 0]:
        w = case["window"]
        k.append("window-" + (w[0] if w else "default"))
    else:
        k.append("sequential")  # randomize = false, or a window of 0 chunks (V2: no randomization)
    if case["workers"] > 1:
        k.append("workers")
    if case["limit"][0] in ("sweeps",) and case["limit"][1] > 1 or case["limit"][0] == "samples":
        k.append("multi-sweep")
    if case["restore_at_start"] is not None:
        k.append("restore-start")
    if case["restore_before"]:
        k.append("restore-mid")
    if len(case["sources"]) > 1:
        k.append("several-sources")
    if case["frame_mode"]:
        k.append("frame")
    if case["max_errors"]:
        k.append("errors")
    if case["randomize"] and case["window"] != ["chunks", 0] and case["seed"] % (1 << 32) == 0:
        k.append("randomized-seed-0")
    if not seek_points(case):
        k.append("no-seek")  # one minibatch size, no restore: CNTK never repositions
    if any(s.get("defines_mb_size") for s in all_streams(case)):
        k.append("defines_mb_size")
    return k


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100, help="number of cases (ranks count separately)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="copy each mismatching group (data, config, oracle answer) here")
    ap.add_argument("--record", help="write each clean case here as a fixture for tests/parity.rs")
    ap.add_argument("--record-max-bytes", type=int, default=24000, help="largest fixture recorded")
    ap.add_argument("--only", help="run only this group id (as printed)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    binary = os.environ.get("MINIBATCHD", os.path.join(ROOT, "target", "release", "minibatchd"))
    if not os.path.exists(binary):
        sys.exit("%s not found: cargo build --release" % binary)
    oracle = Oracle()
    rng = random.Random(args.seed)
    status = Counter()
    by_kind = defaultdict(Counter)
    mismatches = []
    n = 0
    gi = 0
    t0 = time.time()
    if args.record:
        os.makedirs(args.record, exist_ok=True)
    while n < args.cases:
        cases = gen_group(rng, "%d.%d" % (args.seed, gi))
        gi += 1
        if args.only and cases[0]["name"].rsplit("-r", 1)[0] != "g" + args.only:
            if gi > 100_000:
                sys.exit("no group %s within 100000 groups of seed %d" % (args.only, args.seed))
            continue
        for case, st, detail, lines, upto in run_group(cases, oracle, binary, args.keep):
            n += 1
            status[st] += 1
            for k in kind_of(case):
                by_kind[k][st] += 1
            if st == "mismatch":
                mismatches.append((case["name"], kind_of(case), detail))
                if args.verbose:
                    print("MISMATCH %s %s: %s" % (case["name"], ",".join(kind_of(case)), detail), flush=True)
            if args.record and st not in ("mismatch", "cntk_crash") and lines is not None:
                record_case(args.record, case, st, lines, upto, args.record_max_bytes)
        if args.only:
            break  # the one group asked for, whatever --cases says
    oracle.close()
    print("cases: %d in %.0f s (seed %d)" % (n, time.time() - t0, args.seed))
    for k in sorted(status):
        print("  %-12s %d" % (k, status[k]))
    print("by kind (a case counts under each of its kinds):")
    for k in sorted(by_kind):
        print("  %-18s %s" % (k, ", ".join("%s %d" % kv for kv in sorted(by_kind[k].items()))))
    if mismatches:
        print("mismatches (first 40):")
        for name, kinds, detail in mismatches[:40]:
            print("  %s [%s] %s" % (name, ",".join(kinds), detail))
    sys.exit(1 if mismatches else 0)



def show(kept, binary, n=12):
    """Prints a kept group side by side: per rank, each minibatch's position, counts and the first
    value of every sequence of the first stream, CNTK then minibatchd."""
    with open(os.path.join(kept, "cases.json")) as f:
        runs = json.load(f)
    c0 = runs[0]["case"]
    print({k: v for k, v in c0.items() if k not in ("files", "rank", "name")})
    for r in runs:
        case = r["case"]
        streams = all_streams(case)
        s0 = streams[0]["name"]
        print("rank %d: %s %s" % (case["rank"], r["status"], r["detail"]))
        ocl = canon_oracle(r["oracle"] or [], streams)
        dmp = canon_dump(run_dump(binary, case, kept), streams)

        def fmt(m):
            seqs = m["streams"][s0][2]
            first = [(q[0][0] if not streams[0]["sparse"] else q[0][1][:1]) if q else None for q in seqs]
            return "%5d %s %s" % (m["position"], "E" if m["end_of_sweep"] in (True, [True] * len(streams)) else " ", first)
        for i in range(min(n, max(len(ocl[0]), len(dmp[0])))):
            a = fmt(ocl[0][i]) if i < len(ocl[0]) else "-"
            b = fmt(dmp[0][i]) if i < len(dmp[0]) else "-"
            print("  %3d  %-45s | %s" % (i, a, b))
        print("  end: %s | %s" % (ocl[1][:80], dmp[1][:80]))


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "--show":
    show(sys.argv[2], os.environ.get("MINIBATCHD", os.path.join(ROOT, "target", "release", "minibatchd")))
    sys.exit(0)


if __name__ == "__main__":
    main()
