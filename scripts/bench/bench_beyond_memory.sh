#!/usr/bin/env bash
# A dataset larger than the memory the daemon may use, page cache included: runs
# scripts/bench/bench_daemon.py (dense CTF, 128 floats + a one-hot label per line, randomized, minibatch
# 256, a window of 4 chunks) inside a cgroup-v1 memory group of CGROUP_MIB, on a file of SIZE_GIB,
# so that neither the parsed chunks nor the text nor the persisted chunks stay in memory across a
# sweep: every sweep reads from disk. This stands in for "a dataset larger than RAM" on a machine
# whose disk cannot hold one (this VM: 23 GiB of RAM, ~25 GB free). Needs root (it creates the
# group under /sys/fs/cgroup/memory) and prints bench_daemon's report plus the group's peak.
#
#     scripts/bench/bench_beyond_memory.sh [SIZE_GIB=6] [CGROUP_MIB=2048] [MEMORY_LIMIT_MIB=1024] [SWEEPS=3]
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE_GIB=${1:-6}
CGROUP_MIB=${2:-2048}
LIMIT_MIB=${3:-1024}
SWEEPS=${4:-3}
G=/sys/fs/cgroup/memory/minibatchd-bench
[ -d /sys/fs/cgroup/memory ] || { echo "no cgroup-v1 memory controller here" >&2; exit 1; }
mkdir -p "$G"
trap 'rmdir "$G" 2>/dev/null || true' EXIT
echo $((CGROUP_MIB << 20)) > "$G/memory.limit_in_bytes"
echo 0 > "$G/memory.max_usage_in_bytes" 2>/dev/null || true
WORK=${BENCH_WORKDIR:-$PWD/target/bench-beyond}
# The file is made outside the group (its writing would otherwise be charged to it).
cargo build -q --release --workspace --bins
mkdir -p "$WORK"
SIZE=$((SIZE_GIB << 30))
if [ ! -f "$WORK/bench.ctf" ] || [ "$(stat -c %s "$WORK/bench.ctf")" -lt $((SIZE * 9 / 10)) ]; then
  target/release/minibatchd-gen ctf-dense "$WORK/bench.ctf" "$SIZE" 128 10
fi
# Nothing of the file in the page cache at the start.
sync && echo 1 > /proc/sys/vm/drop_caches
echo "cgroup $CGROUP_MIB MiB (page cache included), memory_limit_bytes $LIMIT_MIB MiB, file $(($(stat -c %s "$WORK/bench.ctf") >> 20)) MiB"
sh -c "echo \$\$ > $G/cgroup.procs && exec .venv/bin/python scripts/bench/bench_daemon.py --workdir '$WORK' --size-bytes $SIZE \
  --sweeps $SWEEPS --window-chunks 4 --memory-limit $((LIMIT_MIB << 20))"
echo "cgroup peak (RSS + page cache): $(($(cat "$G/memory.max_usage_in_bytes") >> 20)) MiB; failcnt $(cat "$G/memory.failcnt")"
