#!/usr/bin/env python3
"""Runs many CNTK 2.7 oracle cases in one interpreter (CNTK's import and start-up cost ~0.5 s;
one case ~30 ms once it is loaded).

Runs under the oracle's own Python 3.6 (see ../shared/tools/cntk-oracle/README.md), started by
scripts/oracle/cntk_diff.py. Reads one JSON object per line on stdin, {"id": ..., "cfg": {...}} with
`cfg` in the oracle's config format, calls the oracle's `main()` on it with stdout captured, and
writes {"id": ..., "lines": [...], "restarts": [...]} per case to stdout. `restarts` lists the
minibatch indices during whose `next_minibatch` CNTK's SequenceRandomizer printed "Seek(): starting
over" (trace level >= 1): CNTK then re-shuffles the sweep's sequences with the bare sweep index
as seed instead of seed + sweep, which changes its order when the seed is not 0. A CNTK crash (SIGSEGV, seen with several
deserializers) ends the process: the driver sees the missing answer and restarts it.

Usage: cntk_oracle_batch.py ORACLE_DIR  (ORACLE_DIR holds ctf_oracle.py)
"""
import io
import json
import os
import sys
import tempfile


def main():
    sys.path.insert(0, sys.argv[1])
    import ctf_oracle  # noqa: E402  (the oracle's directory is only known at run time)
    import cntk.io  # noqa: E402

    # Mark each next_minibatch call on fd 2, so that CNTK's own trace lines can be assigned to
    # the minibatch during which they were printed.
    counter = [0]
    original_next = cntk.io.MinibatchSource.next_minibatch

    def marked_next(self, *args, **kwargs):
        os.write(2, ("\n@@MB %d\n" % counter[0]).encode())
        counter[0] += 1
        return original_next(self, *args, **kwargs)

    cntk.io.MinibatchSource.next_minibatch = marked_next

    out = sys.stdout
    saved_err = os.dup(2)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        buf = io.StringIO()
        sys.stdout = buf
        counter[0] = 0
        err = tempfile.TemporaryFile()
        os.dup2(err.fileno(), 2)
        try:
            sys.argv = ["ctf_oracle.py", json.dumps(req["cfg"])]
            ctf_oracle.main()
        except SystemExit:
            pass
        except Exception as e:  # a Python-level failure of the oracle script itself
            buf.write(json.dumps({"mb": -2, "error": "oracle script: %r" % (e,)}) + "\n")
        finally:
            sys.stdout = out
            sys.stderr.flush()
            os.dup2(saved_err, 2)
        err.seek(0)
        restarts = []
        mb = -1
        for text in err.read().decode("utf-8", "replace").splitlines():
            if text.startswith("@@MB "):
                mb = int(text[5:])
            elif "Seek(): starting over" in text:
                restarts.append(mb)
        err.close()
        lines = [json.loads(x) for x in buf.getvalue().splitlines() if x.strip()]
        out.write(json.dumps({"id": req["id"], "lines": lines, "restarts": restarts}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
