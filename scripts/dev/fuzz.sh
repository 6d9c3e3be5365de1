#!/usr/bin/env bash
# Fuzzes the targets of fuzz/ one after the other (docs/fuzzing.md), each for MINUTES, on the
# stable toolchain without a sanitizer (release, debug assertions and overflow checks on), one
# libFuzzer process at a time. The working corpus fuzz/corpus/TARGET is seeded from the committed
# one (tests/fuzz_corpus/TARGET) first; libFuzzer's log goes to fuzz/logs/TARGET.log and its last
# status line is printed. Crashes land in fuzz/artifacts/TARGET/.
#
#   scripts/dev/fuzz.sh MINUTES [TARGET...]     (default: every target of `cargo fuzz list`)
#   FUZZ_SANITIZER=address scripts/dev/fuzz.sh 5 protocol   # AddressSanitizer (RUSTC_BOOTSTRAP=1)
set -euo pipefail
cd "$(dirname "$0")/../../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
minutes=${1:?usage: scripts/dev/fuzz.sh MINUTES [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
sanitizer=${FUZZ_SANITIZER:-none}
if [ "$sanitizer" = none ]; then
  build=(cargo fuzz run --sanitizer none -O -a)
else
  build=(env RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer "$sanitizer")
fi
mkdir -p logs
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  cp -n "../tests/fuzz_corpus/$t/"* "corpus/$t/" 2>/dev/null || true
  echo "== $t: $minutes min, sanitizer $sanitizer, started $(date -u +%FT%TZ)"
  "${build[@]}" "$t" "corpus/$t" -- -max_total_time=$((minutes * 60)) -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 >"logs/$t.log" 2>&1 || echo "   libFuzzer exited with $? (see fuzz/logs/$t.log, fuzz/artifacts/$t/)"
  grep -E '^#[0-9]+' "logs/$t.log" | tail -1 || true
  grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "logs/$t.log" || true
done
