#!/usr/bin/env python3
"""System time of writing one large array into a new file, by the size of each `write`.

    .venv/bin/python scripts/bench/write_sizes.py [--mib 460] [--path FILE] KIB [KIB ...]

Allocates and fills MIB MiB once, then for each KIB in turn removes the file, waits 3 s and
writes the array to it KIB KiB per `write` (unbuffered), printing the wall and system time. On a
VM whose memory balloon reports free memory to its host, large writes make the kernel build large
page-cache folios from memory the host must back again (docs/benchmarks.md, "The persister's
writes, 1 MiB at a time"); `16384 1024 256` shows it.
"""

import argparse
import os
import resource
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=460)
    ap.add_argument("--path", default="write_sizes.bin")
    ap.add_argument("kib", type=int, nargs="+")
    a = ap.parse_args()
    n = a.mib << 20
    data = memoryview(np.ones(n // 4, dtype=np.float32)).cast("B")
    system = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_stime  # noqa: E731
    try:
        for kib in a.kib:
            if os.path.exists(a.path):
                os.remove(a.path)
            time.sleep(3)
            step = kib << 10
            s0, t0 = system(), time.perf_counter()
            with open(a.path, "wb", buffering=0) as f:
                for i in range(0, n, step):
                    f.write(data[i : i + step])
            print(f"writes of {kib} KiB: wall {time.perf_counter() - t0:.2f} s, system {system() - s0:.2f} s", flush=True)
    finally:
        if os.path.exists(a.path):
            os.remove(a.path)


if __name__ == "__main__":
    main()
