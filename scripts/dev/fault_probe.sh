#!/usr/bin/env bash
# Runs the daemon through random faults for a long time: the fault-injection tests of
# tests/fault_injection.rs (SIGTERM with trainers inside long steps, SIGKILL, reloads that remove
# and re-add the dataset, a full state directory; sessions resumed by name and by state checked
# minibatch by minibatch against dump and against each trainer's own record), over and over with
# fresh seeds and more faults per run than CI's. Stops at the first failure and prints the seed
# that replays it (MINIBATCHD_FAULT_SEED=N cargo test --test fault_injection).
#
#   scripts/dev/fault_probe.sh [MINUTES] [FAULTS_PER_RUN]      (default 30 minutes, 40 faults)
#
# Needs root (the full-disk fault mounts a small tmpfs), as the test suite does.
set -euo pipefail
cd "$(dirname "$0")/../.."
minutes=${1:-30}
faults=${2:-40}
export PATH="$HOME/.cargo/bin:$PATH"
cargo test --locked --test fault_injection --no-run -q
end=$((SECONDS + minutes * 60))
runs=0
while [ "$SECONDS" -lt "$end" ]; do
  seed=$(( (RANDOM << 15 | RANDOM) | 1 ))
  if ! MINIBATCHD_FAULT_SEED=$seed MINIBATCHD_FAULT_ROUNDS=$faults \
      cargo test --locked --test fault_injection -q -- --nocapture --test-threads 1 > target/fault_probe.log 2>&1; then
    echo "FAILED with MINIBATCHD_FAULT_SEED=$seed MINIBATCHD_FAULT_ROUNDS=$faults after $runs runs; log: target/fault_probe.log"
    grep -E "panicked|seed" target/fault_probe.log | head -20
    exit 1
  fi
  runs=$((runs + 1))
  grep -E "^seed" target/fault_probe.log | sed "s/^/run $runs: /"
done
echo "fault probe: $runs runs of up to $faults faults each, no failure"
