#!/usr/bin/env bash
# Installs what building and testing minibatchd needs on a fresh Debian/Ubuntu machine:
# a Rust toolchain (rustup, or Debian's cargo as a fallback) and Python 3 with venv for the
# client tests. Idempotent: does nothing that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# apt-get, root or through sudo, waiting while another apt holds its locks (a machine's own
# first-boot apt, or a second setup): apt-get update does not wait for the lists lock itself,
# and a skipped install only shows later as a failing test.
apt_get() {
  local sudo="" out
  [ "$(id -u)" = 0 ] || sudo="sudo"
  for _ in $(seq 120); do
    if out=$($sudo env DEBIAN_FRONTEND=noninteractive apt-get "$@" 2>&1); then
      printf '%s' "$out"; return 0
    fi
    case "$out" in
      *"Could not get lock"*) sleep 5 ;;
      *) printf '%s\n' "$out" >&2; return 1 ;;
    esac
  done
  echo "setup.sh: apt's lock was still held after 10 minutes" >&2
  return 1
}

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v cc >/dev/null || need_apt+=(build-essential)
command -v curl >/dev/null || need_apt+=(curl ca-certificates)
[ -x /usr/bin/time ] || need_apt+=(time)   # benchmark scripts report max RSS with it
command -v systemd-analyze >/dev/null || need_apt+=(systemd)   # tests/ops.rs verifies the unit with it
if [ ${#need_apt[@]} -gt 0 ]; then
  apt_get update -qq
  apt_get install -y -qq "${need_apt[@]}"
fi
# tests/prometheus.rs: a real Prometheus scrapes the daemon and promtool runs the alerts' unit
# tests. Debian's package, without its recommends (node exporter & co.); its service is not used.
if ! { [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; }; then
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends prometheus
fi

if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  if curl -sSf https://sh.rustup.rs -o /tmp/rustup-init.sh; then
    sh /tmp/rustup-init.sh -y --profile minimal --component clippy,rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    apt_get install -y -qq cargo rustc rustfmt rust-clippy
  fi
fi
# The test command checks formatting and lints (scripts/test.sh).
if command -v rustup >/dev/null; then
  { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1 || rustup component add clippy rustfmt
fi

# Python environment for the client tests (NumPy), kept inside the project.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ -f clients/python/requirements-test.txt ]; then
  # torch from PyPI brings CUDA's libraries (about 5 GiB unpacked, more while its wheels unpack):
  # pip unpacks into a folder of the project's rather than /tmp, which may be a small tmpfs, and
  # on failure says how much disk there was.
  mkdir -p target/pip-tmp
  if ! TMPDIR="$PWD/target/pip-tmp" .venv/bin/python -m pip install -q --disable-pip-version-check \
      --no-cache-dir -r clients/python/requirements-test.txt; then
    echo "setup: installing the Python test packages failed; free disk here and in /tmp:" >&2
    df -h . /tmp >&2
    rm -rf target/pip-tmp
    exit 1
  fi
  rm -rf target/pip-tmp
fi
