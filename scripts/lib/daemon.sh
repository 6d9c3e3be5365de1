# Sourced by the shell scripts under scripts/ (from the repository root): the daemon binary,
# built when missing; the daemon started in the background with its stderr in a log; waiting
# for a line of that log; stopping it (SIGTERM: it checkpoints and exits).
#
#   . scripts/lib/daemon.sh
#   mbd_start "$W/m.toml" "$W/log"      # MBD_BIN, then MBD_PID
#   mbd_wait_log "$W/log" "datasets opened"
#   trap mbd_stop EXIT

# The daemon binary: $MINIBATCHD_BIN (another build, for A/B runs), else the release build.
MBD_BIN=${MINIBATCHD_BIN:-target/release/minibatchd}

mbd_build() {
    [ -x "$MBD_BIN" ] || cargo build -q --release --bin minibatchd
}

# mbd_start CONFIG LOG: `minibatchd run --config CONFIG` in the background, stderr to LOG; its
# pid in MBD_PID.
mbd_start() {
    mbd_build
    "$MBD_BIN" run --config "$1" 2>"$2" &
    MBD_PID=$!
}

# mbd_wait_log LOG TEXT: until LOG holds TEXT; fails (with the log's end) if the daemon exits first.
mbd_wait_log() {
    until grep -q "$2" "$1"; do
        if ! kill -0 "$MBD_PID" 2>/dev/null; then
            echo "the daemon exited before logging '$2':" >&2
            tail -5 "$1" >&2
            return 1
        fi
        sleep 0.1
    done
}

# mbd_stop: stops the daemon started by mbd_start, if it runs, and waits for it.
mbd_stop() {
    if [ -n "${MBD_PID:-}" ]; then
        kill "$MBD_PID" 2>/dev/null && wait "$MBD_PID" 2>/dev/null
    fi
    return 0
}
