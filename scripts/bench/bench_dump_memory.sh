#!/usr/bin/env bash
# Issue #3 benchmark: peak memory of `minibatchd dump` over a large randomized CTF file with a
# small window, next to the window's parsed size; and the time of a full randomized sweep versus
# a sequential one (the sampling overhead next to the parse cost).
#
#   scripts/bench/bench_dump_memory.sh [SIZE_BYTES=1073741824] [WINDOW_CHUNKS=4] [CHUNK_BYTES=33554432]
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE=${1:-1073741824}; WINDOW=${2:-4}; CHUNK=${3:-33554432}
cargo build --release --locked -q --workspace --bins
DIR=${BENCH_DIR:-target/bench}; mkdir -p "$DIR"
DATA="$DIR/dense_$SIZE.ctf"
[ -f "$DATA" ] || target/release/minibatchd-gen ctf-dense "$DATA" "$SIZE"
cat > "$DIR/mem.toml" <<TOML
[daemon]
state_dir = "state"
[datasets.d]
format = "ctf"
files = ["$(basename "$DATA")"]
chunk_size_bytes = $CHUNK
[datasets.d.streams.features]
dim = 128
format = "dense"
[datasets.d.streams.labels]
dim = 10
format = "sparse"
TOML
target/release/minibatchd index --config "$DIR/mem.toml" --dataset d
run() {
  local label=$1; shift
  /usr/bin/time -f "$label: %e s wall, %M KiB max RSS" target/release/minibatchd dump --config "$DIR/mem.toml" \
    --dataset d --minibatch-size 256 --full-sweep "$@" > /dev/null
}
echo "file: $(du -h "$DATA" | cut -f1), chunk $CHUNK bytes, window $WINDOW chunks"
echo "parsed window ~ $WINDOW x $CHUNK bytes of text, x ~0.5 parsed (128 f32 = 512 B per ~1.1 KB line)"
run "sequential (NoRandomizer)" --randomize false
run "randomized, window $WINDOW chunks" --randomize true --window-chunks "$WINDOW"
