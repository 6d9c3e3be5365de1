#!/usr/bin/env python3
"""Records CNTK 2.7's answers to hand-written end-of-file cases as parity fixtures.

The random cases of `scripts/oracle/cntk_diff.py` rarely end a file inside a sample; these do, one rule
each: the last line of the file without a newline, ending in an empty or bare sample (sparse and
dense), a name, a comment, an unknown input, a bad value, an over-long dense sample, or bare
digits (no id), in line mode, id mode and with `skip_sequence_ids`, with one stream or several,
and `max_errors` on both sides of the errors CNTK counts (docs/parity.md, "The corpus").

Each case is run through the CNTK 2.7 oracle and `minibatchd dump` and compared with the harness's
own functions (scripts/oracle/cntk_diff.py), strictly: no case here re-parses a chunk, so CNTK's
"maximum number of allowed errors" is never taken for a re-count (a failed chunk load is retried
5 times and counts its errors again, which only changes which of its two errors CNTK reports in
the end). A matching case is recorded with the harness's `record_case` into
tests/parity/cases/eof.*.json, which tests/parity.rs replays without CNTK. It needs the oracle:

    cargo build --release && tests/parity/eof_cases.py            # record, print each status
    MINIBATCHD=target/debug/minibatchd tests/parity/eof_cases.py --check   # compare only

Exit status 1 when a case is a mismatch (nothing is recorded for it).
"""
import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "oracle"))
import cntk_diff  # noqa: E402  (scripts/oracle/ is not a package)

S3 = [{"name": "a", "alias": "a", "dim": 3, "sparse": True}]
D3 = [{"name": "a", "alias": "a", "dim": 3, "sparse": False}]
D1 = [{"name": "a", "alias": "a", "dim": 1, "sparse": False}]
SS = [{"name": "a", "alias": "a", "dim": 3, "sparse": True}, {"name": "b", "alias": "b", "dim": 3, "sparse": True}]
DS = [{"name": "a", "alias": "a", "dim": 3, "sparse": False}, {"name": "b", "alias": "b", "dim": 3, "sparse": True}]
DS1 = [{"name": "a", "alias": "a", "dim": 1, "sparse": False}, {"name": "b", "alias": "b", "dim": 3, "sparse": True}]
MAIN = [{"name": "a", "alias": "a", "dim": 1, "sparse": False, "defines_mb_size": True},
        {"name": "b", "alias": "b", "dim": 3, "sparse": True}]

# (name, data, streams, max_errors values, options). Where CNTK counts k errors, k - 1 and k are
# both recorded; where it refuses the file, 0 and a large budget.
CASES = [
    # Issue #36: an empty sparse sample ends a file without a newline.
    ("issue", "|a 1:1\n|a 2:2\n|a ", S3, [0, 1, 10], {}),
    ("issue-newline", "|a 1:1\n|a 2:2\n|a \n", S3, [0], {}),
    ("issue-ids", "0 |a 1:1\n1 |a 2:2\n2 |a ", S3, [0, 10], {}),
    ("issue-skip-ids", "0 |a 1:1\n1 |a 2:2\n2 |a ", S3, [10], {"skip_ids": True}),
    ("issue-chunk1", "|a 1:1\n|a 2:2\n|a ", S3, [0, 10], {"chunk": 1}),
    ("sparse-name", "|a 1:1\n|a", S3, [0, 10], {}),
    ("sparse-name-newline", "|a 1:1\n|a\n", S3, [0], {}),
    ("sparse-tab", "|a 1:1\n|a\t", S3, [0, 10], {}),
    ("sparse-blanks", "|a 1:1\n|a   \t ", S3, [10], {}),
    ("sparse-cr", "|a 1:1\r\n|a \r", S3, [0], {}),
    ("sparse-entry", "|a 1:1\n|a 2:2 ", S3, [0], {}),
    ("sparse-bar", "|a 1:1\n|", S3, [10], {}),
    ("sparse-only-line", "|a ", S3, [0, 10], {}),
    # In a multi-line last sequence, an earlier entry of the stream makes the empty sample valid.
    ("ids-sparse-had-entry", "0 |a 1:1\n1 |a 2:2\n1 |a ", S3, [0], {}),
    ("ids-sparse-no-entry", "0 |a 1:1\n1 |a \n1 |a ", S3, [1, 2], {}),
    ("ids-sparse-name", "0 |a 1:1\n1 |a 2:2\n1 |a", S3, [1, 2], {}),
    ("ids-sparse-single", "0 |a 1:1\n1 |a ", S3, [0, 10], {}),
    ("line-sparse-duplicate", "|a 1:1\n|a 1:1 |a ", S3, [0, 1], {}),
    # Dense: an empty sample or a name costs 1; more than dim values are kept, cut to dim.
    ("dense-empty", "|a 1 2 3\n|a ", D3, [0, 10], {}),
    ("dense-name", "|a 1 2 3\n|a", D3, [10], {}),
    ("dense-empty-newline", "|a 1 2 3\n|a \n", D3, [0], {}),
    ("dense-empty-cr", "|a 1 2 3\n|a \r", D3, [0], {}),
    ("dense-exact", "|a 1 2 3\n|a 4 5 6  ", D3, [0], {}),
    ("dense-long", "|a 1 2 3\n|a 1 2 3 4", D3, [0], {}),
    ("dense-long-cr", "|a 1 2 3\n|a 1 2 3 4\r", D3, [0, 10], {}),
    ("ids-dense-empty", "0 |a 1 2 3\n1 |a 4 5 6\n1 |a ", D3, [1, 2], {}),
    ("ids-dense-name", "0 |a 1 2 3\n1 |a 4 5 6\n1 |a", D3, [1, 2], {}),
    ("ids-dense-long", "0 |a 1\n1 |a 2\n1 |a 3 4", D1, [0], {}),
    # Several streams.
    ("two-sparse", "|a 1:1 |b 1:1\n|a 2:2 |b ", SS, [0, 10], {}),
    ("two-sparse-first-cut", "|a 1:1 |b 2:2\n|b |a ", SS, [10], {}),
    ("ids-two-sparse-had-entry", "0 |a 1:1 |b 1:1\n0 |a 2:2 |b ", SS, [0], {}),
    ("dense-sparse", "|a 1 2 3 |b 1:1\n|a 4 5 6 |b ", DS, [0, 10], {}),
    ("sparse-dense", "|b 1:1 |a 1 2 3\n|b 2:2 |a ", DS, [10], {}),
    ("main-had-entry", "0 |a 1 |b 1:1\n0 |a 2 |b ", MAIN, [0], {}),
    ("main-line", "|a 1 |b 1:1\n|a 2 |b ", MAIN, [10], {}),
    # The last row costs nothing even without a sample: only its sample's error and the length.
    ("ids-bad-value", "0 |a 1\n0 |a x", D1, [1, 2], {}),
    ("ids-bad-value-newline", "0 |a 1\n0 |a x\n", D1, [2, 3], {}),
    ("ids-comment", "0 |a 1\n0 |#c", D1, [0, 1], {}),
    ("ids-comment-newline", "0 |a 1\n0 |#c\n", D1, [1, 2], {}),
    ("ids-unknown", "0 |a 1\n0 |zz 1", D1, [0, 1], {}),
    ("ids-unknown-name", "0 |a 1\n1 |a 2\n1 |z", D3, [1, 2], {}),
    ("ids-id-and-blank", "0 |a 1\n0 ", D1, [0, 1], {}),
    ("ids-dangling-unknown", "0 |a 1 |b 1:1\n0 |a 2 |b 2:2 |c", DS1, [0, 1], {}),
    ("ids-exponent-cut", "0 |a 1\n0 |a 1 2e", D3, [1, 2], {}),
    ("ids-index-cut", "0 |a 1:1\n0 |a 2:2 3", S3, [1, 2], {}),
    # Bare digits at the end of the file are no id: they join the last sequence, uncounted.
    ("ids-digits", "0 |a 1\n1", D1, [0], {}),
    ("ids-digits-same", "0 |a 1\n0", D1, [0], {}),
    ("ids-digits-after-two", "0 |a 1\n1 |a 2\n12", D1, [0], {}),
    ("ids-digits-space", "0 |a 1\n1 ", D1, [10], {}),
    ("ids-digits-only-line", "5", D1, [0], {}),
]


def make_case(name, data, streams, max_errors, options):
    return {
        "name": "eof.%s.me%d-r0" % (name, max_errors),
        "files": {"data.ctf": data},
        "sources": [{"file": "data.ctf", "skip_sequence_ids": options.get("skip_ids", False),
                     "streams": [dict(s) for s in streams]}],
        "chunk_size_bytes": options.get("chunk", 1 << 25), "max_errors": max_errors,
        "randomize": False, "window": None, "seed": 0, "limit": ["full"],
        "minibatch_sizes": [100], "num_minibatches": 600, "workers": 1, "rank": 0,
        "restore_at_start": None, "restore_before": [], "frame_mode": False,
        "unique_first_samples": False,
    }


def run(case, oracle, binary):
    """CNTK's output lines (None: it crashed) and minibatchd's dump of `case`."""
    d = tempfile.mkdtemp(prefix="eof-case-")
    try:
        cntk_diff.write_case_files(case, d)
        return oracle.run(cntk_diff.oracle_config(case, d)), cntk_diff.run_dump(binary, case, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare only, record nothing")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "parity", "cases"))
    args = ap.parse_args()
    binary = os.environ.get("MINIBATCHD", os.path.join(ROOT, "target", "release", "minibatchd"))
    if not os.path.exists(binary):
        sys.exit("%s not found: cargo build --release" % binary)
    oracle = cntk_diff.Oracle()
    bad = 0
    try:
        for name, data, streams, budgets, options in CASES:
            for max_errors in budgets:
                case = make_case(name, data, streams, max_errors, options)
                lines, dump = run(case, oracle, binary)
                if lines is None:
                    print("%-45s CNTK crashed" % case["name"], flush=True)
                    bad += 1
                    continue
                streams = cntk_diff.all_streams(case)
                ocl, dmp = cntk_diff.canon_oracle(lines, streams), cntk_diff.canon_dump(dump, streams)
                diff = cntk_diff.compare(case, ocl, dmp)
                print("%-45s %-9s CNTK: %d minibatches, %s; minibatchd: %d, %s" % (
                    case["name"], "mismatch" if diff else "match", len(ocl[0]), ocl[1][:70], len(dmp[0]),
                    dmp[1][:150]), flush=True)
                if diff:
                    print("    " + diff)
                    bad += 1
                elif not args.check:
                    cntk_diff.record_case(args.out, case, "match", lines, None, 24000)
    finally:
        oracle.close()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
