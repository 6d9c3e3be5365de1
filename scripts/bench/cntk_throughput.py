"""CNTK 2.7's MinibatchSource over a dense CTF file, timed: the peer figure of
scripts/bench/bench_peers.py. Runs under the CNTK oracle's Python 3.6 (../shared/tools/cntk-oracle,
set up by its setup.sh; ORACLE_HOME, default /tmp/cntk-oracle):

    LD_LIBRARY_PATH=$ORACLE_HOME/mpishim $ORACLE_HOME/venv36/bin/python scripts/bench/cntk_throughput.py \
        FILE.ctf DIM CLASSES MINIBATCH SWEEPS [WINDOW_CHUNKS]

The file is minibatchd-gen's ctf-dense (`|features` DIM floats, `|labels` a one-hot of CLASSES).
Randomized with CNTK's default window, like the daemon benchmark, or a window of WINDOW_CHUNKS
chunks. `build_s` is the time its `MinibatchSource` constructor took (it indexes the file): the
clock a user sees starts before it. Each minibatch's dense
features are materialized as a NumPy array (what a trainer feeding another framework does; the
sparse labels stay CNTK Values). Prints one JSON line: samples and seconds per sweep.
"""
import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")
import cntk  # noqa: E402
from cntk.io import CTFDeserializer, MinibatchSource, StreamDef, StreamDefs  # noqa: E402


def main():
    path, dim, classes, mb_size, sweeps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    window = {"randomization_window_in_chunks": int(sys.argv[6])} if len(sys.argv) > 6 else {}
    streams = StreamDefs(
        features=StreamDef(field="features", shape=dim, is_sparse=False),
        labels=StreamDef(field="labels", shape=classes, is_sparse=True),
    )
    built = time.perf_counter()
    source = MinibatchSource(CTFDeserializer(path, streams), randomize=True, max_sweeps=sweeps, **window)
    build_s = time.perf_counter() - built
    fs, ls = source.streams.features, source.streams.labels
    per_sweep = []
    samples = 0
    t0 = time.perf_counter()
    at = t0
    first = None
    while True:
        mb = source.next_minibatch(mb_size)
        if not mb:
            break
        if first is None:
            first = time.perf_counter() - t0
        x = mb[fs].asarray()
        labels = mb[ls].data
        samples += mb[fs].num_samples
        sweep_end = mb[fs].sweep_end
        # Nothing of this minibatch may outlive it: CNTK's prefetch resizes the buffers behind
        # it during the next call, and throws "Cannot resize the matrix because it is a view"
        # (seen once in three runs) when a view of them is still held.
        del x, labels, mb
        if sweep_end:
            now = time.perf_counter()
            per_sweep.append([now - at, samples - sum(n for _, n in per_sweep)])
            at = now
    print(json.dumps({"cntk": cntk.__version__, "per_sweep": per_sweep, "samples": samples, "first_minibatch_s": first,
                      "build_s": build_s}))


if __name__ == "__main__":
    main()
