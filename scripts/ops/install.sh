#!/usr/bin/env bash
# Installs minibatchd as a systemd service: the binary, the unit, the sysusers/tmpfiles snippets,
# a config (only if none is there) and the docs; then creates the user and directories and
# reloads systemd. Run as root from the repository root after `cargo build --release`.
#
#   scripts/ops/install.sh [--bin PATH] [--no-systemctl]
#
# DESTDIR=/some/root stages everything below that root instead (packaging, tests) and implies
# --no-systemctl. PREFIX (default /usr/local) is where the binary goes; the unit's ExecStart is
# rewritten to match.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=target/release/minibatchd
run_systemctl=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --no-systemctl) run_systemctl=0; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
DESTDIR="${DESTDIR:-}"
PREFIX="${PREFIX:-/usr/local}"
[ -n "$DESTDIR" ] && run_systemctl=0
if [ ! -x "$bin" ]; then
  echo "install.sh: $bin not found; build it first (cargo build --release) or pass --bin PATH" >&2
  exit 1
fi

install -D -m 0755 "$bin" "$DESTDIR$PREFIX/bin/minibatchd"
install -d -m 0755 "$DESTDIR/etc/systemd/system"
sed "s#/usr/local/bin/minibatchd#$PREFIX/bin/minibatchd#g" systemd/minibatchd.service > "$DESTDIR/etc/systemd/system/minibatchd.service"
chmod 0644 "$DESTDIR/etc/systemd/system/minibatchd.service"
install -D -m 0644 systemd/minibatchd.sysusers.conf "$DESTDIR/usr/lib/sysusers.d/minibatchd.conf"
install -D -m 0644 systemd/minibatchd.tmpfiles.conf "$DESTDIR/usr/lib/tmpfiles.d/minibatchd.conf"
install -D -m 0644 docs/daemon.md "$DESTDIR/usr/share/doc/minibatchd/daemon.md"
install -D -m 0644 conf/grafana/minibatchd.json "$DESTDIR/usr/share/doc/minibatchd/grafana/minibatchd.json"
install -D -m 0644 conf/grafana/alerts.yml "$DESTDIR/usr/share/doc/minibatchd/grafana/alerts.yml"
if [ -e "$DESTDIR/etc/minibatchd/minibatchd.toml" ]; then
  echo "keeping the existing $DESTDIR/etc/minibatchd/minibatchd.toml"
else
  install -D -m 0640 conf/minibatchd.toml "$DESTDIR/etc/minibatchd/minibatchd.toml"
  echo "installed $DESTDIR/etc/minibatchd/minibatchd.toml: edit its [datasets] before starting"
fi

if [ "$run_systemctl" -eq 1 ]; then
  systemd-sysusers /usr/lib/sysusers.d/minibatchd.conf
  systemd-tmpfiles --create /usr/lib/tmpfiles.d/minibatchd.conf
  chgrp minibatchd /etc/minibatchd/minibatchd.toml
  systemctl daemon-reload
  echo "installed; start with: systemctl enable --now minibatchd"
  echo "trainers need the minibatchd group to reach /run/minibatchd/minibatchd.sock"
fi
