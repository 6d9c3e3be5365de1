"""The Python client against a real daemon."""

import gc
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import minibatchd
from conftest import Daemon, daemon_section


def test_connect_reads_the_socket_from_the_environment(daemon, monkeypatch):
    monkeypatch.setenv("MINIBATCHD_SOCKET", daemon.socket)
    client = minibatchd.connect()
    assert len(client.daemon_id) == 16


@pytest.mark.parametrize(
    "options,args",
    [
        (dict(minibatch_size=7, max_sweeps=2, seed=5), ["--minibatch-size", "7", "--max-sweeps", "2", "--seed", "5"]),
        (dict(minibatch_size=4, full_sweep=True, randomize=False), ["--minibatch-size", "4", "--full-sweep", "--randomize", "false"]),
        (dict(minibatch_size=9, max_samples=150, window_samples=30, num_workers=2, rank=1), ["--minibatch-size", "9", "--max-samples", "150", "--window-samples", "30", "--workers", "2", "--rank", "1"]),
    ],
)
def test_to_dump_equals_the_dump_command(daemon, options, args):
    source = minibatchd.connect(daemon.socket).open("train", **options)
    got = [mb.to_dump() for mb in source]
    assert got == daemon.dump(*args)
    assert len(got) > 1


def test_protocol_1_fallback_reads_the_same_minibatches(daemon, monkeypatch):
    """A daemon that refuses the client's newest version (here: a version from the future) gets
    a second hello with version 1: JSON ready/release, the same data as version 2's binary ones."""
    from minibatchd import _client

    args = dict(minibatch_size=5, max_sweeps=2, seed=3, prefetch=3)
    binary = minibatchd.connect(daemon.socket).open("train", **args)
    assert binary._binary
    expected = [mb.to_dump() for mb in binary]
    monkeypatch.setattr(_client, "PROTOCOL_VERSION", 99)
    monkeypatch.setattr(_client._hello, "__defaults__", (99,))
    source = minibatchd.connect(daemon.socket).open("train", **args)
    assert not source._binary
    got = [mb.to_dump() for mb in source]
    assert got == expected == daemon.dump("--minibatch-size", "5", "--max-sweeps", "2", "--seed", "3")


def test_arrays_are_zero_copy_views_with_the_slot_layout(daemon):
    source = minibatchd.connect(daemon.socket).open("train", minibatch_size=8, full_sweep=True)
    mb = next(source)
    f, l = mb["features"], mb["labels"]
    assert f.values.dtype == np.float32 and f.values.shape == (f.num_samples, 3)
    assert not f.values.flags.owndata and not f.values.flags.writeable
    assert f.values.ctypes.data % 64 == 0 and l.indices.ctypes.data % 64 == 0
    assert f.sequence_offsets.dtype == np.int64 and f.sequence_offsets[0] == 0
    assert l.indices.dtype == np.int32 and l.sample_offsets.dtype == np.int64
    assert l.sample_offsets[-1] == len(l.values) == len(l.indices)
    # The first value of a sequence's first sample is its id: the sequence offsets line up.
    ids = f.values[f.sequence_offsets[:-1], 0]
    assert len(set(ids.tolist())) == f.num_sequences
    # arrays(): the same views as the named arrays, those the stream has, in STREAM_ARRAYS order.
    for stream in (f, l):
        named = [(k, getattr(stream, k)) for k in minibatchd._client.STREAM_ARRAYS if getattr(stream, k) is not None]
        listed = stream.arrays()
        assert [k for k, _ in listed] == [k for k, _ in named]
        for (_, a), (_, b) in zip(listed, named):
            assert a.dtype == b.dtype and a.shape == b.shape and a.ctypes.data == b.ctypes.data
    assert [k for k, _ in l.arrays()] == ["sequence_offsets", "sample_offsets", "indices", "values"]
    source.close()


def test_a_slot_is_released_when_the_last_view_dies(daemon):
    source = minibatchd.connect(daemon.socket).open("train", minibatch_size=4, full_sweep=True, prefetch=2)
    mb = next(source)
    values = mb["features"].values
    key = next(iter(source._live))
    del mb
    gc.collect()
    assert key in source._live, "a live view keeps the lease"
    del values
    gc.collect()
    # The dead reference is queued by the weakref machinery itself; the source turns it into a
    # release in its own next call (here, at once).
    assert len(source._releaser.dead) == 1
    source._releaser.drain()
    assert key not in source._live, "the last view gone releases the slot"
    # With 2 slots, holding 2 minibatches would block forever: the client says so instead.
    a, b = next(source), next(source)
    with pytest.raises(minibatchd.MinibatchdError) as e:
        next(source)
    assert e.value.code == "client_all_slots_held"
    a.release()
    c = next(source)
    assert c.index == b.index + 1
    del b, c
    assert sum(1 for _ in source) > 0


def test_state_and_resume_continue_exactly(daemon):
    options = dict(minibatch_size=5, max_sweeps=2, seed=3)
    want = daemon.dump("--minibatch-size", "5", "--max-sweeps", "2", "--seed", "3")
    client = minibatchd.connect(daemon.socket)
    for cut in (0, 1, 17):
        source = client.open("train", **options)
        got = []
        while len(got) < cut:
            got.append(next(source).to_dump())
        state = source.state()
        assert state["minibatches"] == cut
        assert state["position"] == (got[-1]["position"] if got else 0)
        del source  # no close: prefetched minibatches are dropped, not counted
        source = client.open("train", resume=state, **options)
        got.extend(mb.to_dump() for mb in source)
        assert got == want, f"cut after {cut}"
        assert source.state()["position"] == want[-1]["position"]


def test_an_interrupt_while_a_minibatch_is_received_loses_no_slot_and_no_minibatch(daemon):
    """Found by a probe: a KeyboardInterrupt after a ``ready`` was read but before its slot was
    tracked lost that slot for good; after a ring's worth of such interrupts next() waited forever.
    The minibatch is now taken back: next() says so (``client_interrupted``), and the state resumes
    with exactly that minibatch."""
    options = dict(minibatch_size=4, max_sweeps=1, prefetch=2)
    want = daemon.dump("--minibatch-size", "4", "--max-sweeps", "1")
    client = minibatchd.connect(daemon.socket)
    for interrupted in (0, 3):
        source = client.open("train", **options)
        got = [next(source).to_dump() for _ in range(interrupted)]
        releaser = source._releaser

        class Interrupting:
            def track(self, owner, key):
                raise KeyboardInterrupt  # as if Ctrl-C came just before the slot was tracked

            def drain(self):
                releaser.drain()

        source._releaser = Interrupting()
        with pytest.raises(KeyboardInterrupt):
            next(source)
        source._releaser = releaser
        with pytest.raises(minibatchd.MinibatchdError) as e:
            next(source)
        assert e.value.code == "client_interrupted"
        state = source.state()
        assert state["minibatches"] == interrupted
        source.close()
        source = client.open("train", resume=state, **options)
        got.extend(mb.to_dump() for mb in source)
        assert got == want, f"interrupted after {interrupted}"


SWEEP = dict(minibatch_size=4, max_sweeps=1, prefetch=2)


def _sweep_so_far(daemon, taken):
    """A session of one sweep of minibatches of 4: the client, the source, its first ``taken``
    minibatches (as dump objects) and dump's whole sweep."""
    client = minibatchd.connect(daemon.socket)
    source = client.open("train", **SWEEP)
    got = [next(source).to_dump() for _ in range(taken)]
    return client, source, got, daemon.dump("--minibatch-size", "4", "--max-sweeps", "1")


def _rest_resumed_from(client, state, got, want):
    """Reads the rest of the sweep resumed from ``state`` after ``got``: the whole equals dump's."""
    source = client.open("train", resume=state, **SWEEP)
    got.extend(mb.to_dump() for mb in source)
    assert got == want


def test_a_minibatch_lost_inside_next_is_never_skipped_by_iterating_on(daemon):
    """Found by a probe: an exception raised after a ``ready`` was taken off the socket but before
    its minibatch was made (here from the socket read itself) was caught by the caller, who went
    on iterating: that minibatch was skipped without a word, and the state counted past it. The
    next call now says the session was interrupted, and the state resumes with that minibatch."""
    client, source, got, want = _sweep_so_far(daemon, 3)
    conn = source._conn
    real = conn.recv

    def recv_then_interrupt(*args, **kwargs):
        real(*args, **kwargs)
        conn.recv = real
        raise KeyboardInterrupt  # the ready is off the socket: a careless caller goes on
    conn.buf.clear()  # every ready arrives through recv from here
    conn.recv = recv_then_interrupt
    try:
        next(source)
    except KeyboardInterrupt:
        pass
    with pytest.raises(minibatchd.MinibatchdError) as e:
        next(source)
    assert e.value.code == "client_interrupted"
    state = source.close()
    assert state["minibatches"] == 3
    _rest_resumed_from(client, state, got, want)


def test_a_minibatch_taken_but_not_returned_is_taken_back(daemon):
    """An exception after next() made a minibatch (the state counts it) but before the caller got
    it: the state and close() report the position before it, and a resume delivers it."""
    client, source, got, want = _sweep_so_far(daemon, 2)
    made = source._minibatch

    def made_then_interrupted(*args, **kwargs):
        made(*args, **kwargs)
        raise KeyboardInterrupt  # as if Ctrl-C came as the minibatch was handed back
    source._minibatch = made_then_interrupted
    with pytest.raises(KeyboardInterrupt):
        next(source)
    del source._minibatch
    assert source.state()["minibatches"] == 2
    state = source.close()
    assert state["minibatches"] == 2
    _rest_resumed_from(client, state, got, want)


def _reopen_by_name(daemon, opts):
    """Opens ``train`` with ``opts`` (a session name) once the daemon has let the closed or
    dropped session of that name go (``session_busy`` until then)."""
    for _ in range(100):
        try:
            return minibatchd.connect(daemon.socket).open("train", **opts)
        except minibatchd.MinibatchdError as e:
            assert e.code == "session_busy", e
            time.sleep(0.05)
    raise AssertionError("the session stayed busy")


def test_minibatches_given_back_after_their_slots_were_released_resume_by_name_exactly(daemon):
    """A step that holds more minibatches than half the ring (an adapter's DataLoader batch) lets
    the later ones' slots go while it still may give them back; it gives all of them back. Before,
    the daemon counted a released minibatch taken whatever the client said: a resume by the
    session's name skipped the ones given back, and said it was exact."""
    name = "step-given-back"
    opts = dict(SWEEP, session=name, prefetch=4)
    want = daemon.dump("--minibatch-size", "4", "--max-sweeps", "1")
    source = minibatchd.connect(daemon.socket).open("train", **opts)
    got = [next(source).to_dump() for _ in range(2)]
    source._hold_taken, source._hold_overflowed = source._taken, False  # as an adapter's step does
    for _ in range(5):
        next(source)  # each minibatch dies at once: its slot may be released (past half the ring)
    assert source._hold_overflowed
    for _ in range(5):
        assert source._untake_last()
    source._hold_taken = None
    assert source.close()["minibatches"] == 2
    again = _reopen_by_name(daemon, opts)
    assert again.resumed["exact"] is True, again.resumed
    got.extend(mb.to_dump() for mb in again)
    assert got == want


def test_next_from_two_threads_at_once_is_refused(daemon):
    """Found by a probe: two threads iterating one source got correct data, but at the end one of
    them waited for ever. A source is not thread-safe: a second thread inside next() is told."""
    source = minibatchd.connect(daemon.socket).open("train", minibatch_size=4, full_sweep=True)
    source._in_next = (source._taken, threading.get_ident() + 1)  # another thread is inside next()
    with pytest.raises(minibatchd.MinibatchdError) as e:
        next(source)
    assert e.value.code == "client_concurrent_use"
    source._in_next = None
    assert next(source).index == 0, "the source goes on for the thread that owns it"
    source.close()


def test_next_on_a_closed_source_says_so(daemon):
    """Found by a probe: next() after close() stopped iteration, so a loop over a closed source
    looked like an empty epoch. Closed before its end, it now says so; after its end it stops."""
    client = minibatchd.connect(daemon.socket)
    source = client.open("train", minibatch_size=4, full_sweep=True)
    next(source)
    source.close()
    with pytest.raises(minibatchd.MinibatchdError) as e:
        next(source)
    assert e.value.code == "client_closed"
    source = client.open("train", minibatch_size=1000, full_sweep=True)
    assert len(list(source)) > 0
    source.close()
    assert list(source) == [], "an ended epoch stops iteration, closed or not"


def test_resume_against_other_options_is_refused(daemon):
    client = minibatchd.connect(daemon.socket)
    source = client.open("train", minibatch_size=5, seed=3)
    next(source)
    state = source.close()
    with pytest.raises(minibatchd.MinibatchdError) as e:
        client.open("train", minibatch_size=5, seed=4, resume=state)
    assert e.value.code == "resume_mismatch"


def test_errors_carry_codes(daemon):
    client = minibatchd.connect(daemon.socket)
    with pytest.raises(minibatchd.MinibatchdError) as e:
        client.open("nope", minibatch_size=1)
    assert e.value.code == "unknown_dataset"
    with pytest.raises(minibatchd.MinibatchdError) as e:
        client.open("train", minibatch_size=1, rank=3, num_workers=2)
    assert e.value.code == "invalid_options"


def test_padded_and_dense(daemon):
    source = minibatchd.connect(daemon.socket).open("train", minibatch_size=12, full_sweep=True, randomize=False)
    mb = next(source)
    f, l = mb["features"], mb["labels"]
    data, mask = f.padded(pad_value=-1.0)
    lens = np.diff(f.sequence_offsets)
    assert data.shape == (f.num_sequences, lens.max(), 3)
    assert mask.sum() == f.num_samples
    for q in range(f.num_sequences):
        a, b = f.sequence_offsets[q], f.sequence_offsets[q + 1]
        np.testing.assert_array_equal(data[q, : b - a], f.values[a:b])
        assert (data[q, b - a :] == -1.0).all()
    dense = l.dense()
    assert dense.shape == (l.num_samples, 6)
    row = l.sample_offsets
    for j in range(l.num_samples):
        for k in range(row[j], row[j + 1]):
            assert dense[j, l.indices[k]] == l.values[k]


def test_rank_and_world_size_from_torchrun_env(daemon, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert minibatchd.torchrun_env() == (1, 3)
    source = minibatchd.connect(daemon.socket).open("train", minibatch_size=6, full_sweep=True, use_torchrun_env=True)
    got = [mb.to_dump() for mb in source]
    # Under torchrun every rank gets the same number of steps by default (a DDP job whose ranks
    # run different step counts hangs).
    assert got == daemon.dump("--minibatch-size", "6", "--full-sweep", "--workers", "3", "--rank", "1", "--equal-steps")
    steps = [sum(1 for _ in minibatchd.connect(daemon.socket).open("train", minibatch_size=6, full_sweep=True, rank=r,
                                                                   num_workers=3, equal_steps=True)) for r in range(3)]
    assert steps[0] == steps[1] == steps[2] == len(got), steps
    source = minibatchd.connect(daemon.socket).open("train", minibatch_size=6, full_sweep=True, use_torchrun_env=True,
                                                    equal_steps=False)
    assert [mb.to_dump() for mb in source] == daemon.dump("--minibatch-size", "6", "--full-sweep", "--workers", "3",
                                                          "--rank", "1")
    # One rank: no equal steps, and `tail` (which only shapes them) is dropped, so that one script
    # serves 1 and N ranks (found by a probe: refused with invalid_options).
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    source = minibatchd.connect(daemon.socket).open("train", minibatch_size=6, full_sweep=True, use_torchrun_env=True,
                                                    tail="pad")
    assert [mb.to_dump() for mb in source] == daemon.dump("--minibatch-size", "6", "--full-sweep")


def test_no_daemon_names_the_socket_and_how_to_start_one(tmp_path):
    missing = str(tmp_path / "nothing.sock")
    with pytest.raises(minibatchd.DaemonNotRunning) as e:
        minibatchd.connect(missing)
    assert missing in str(e.value) and "minibatchd run --config" in str(e.value) and "MINIBATCHD_SOCKET" in str(e.value)
    assert isinstance(e.value, ConnectionError) and e.value.code == "client_no_daemon"


def test_a_data_error_reaches_the_client_with_its_file_line_offset_and_kind(tmp_path):
    """A malformed value with max_errors = 0: the session fails with `data_error`, and the reply
    names the file, the 1-based line, the byte offset and the kind, as the daemon's log does."""
    from conftest import Daemon, daemon_section

    data = tmp_path / "bad.ctf"
    good = "0 |F 1 2 3\n1 |F 4 5 6\n"
    data.write_text(good + "2 |F 7 x8 9\n3 |F 1 1 1\n")
    d = Daemon.__new__(Daemon)
    d.tmp, d.socket, d.config = tmp_path, str(tmp_path / "mbd.sock"), tmp_path / "minibatchd.toml"
    d.config.write_text(daemon_section(tmp_path, d.socket) + f"""
[datasets.bad]
format = "ctf"
files = ["{data}"]
max_errors = 0

[datasets.bad.streams.features]
alias = "F"
dim = 3
format = "dense"

[datasets.bad.sampling]
randomize = false
""")
    d._start()
    try:
        session = minibatchd.connect(d.socket).open("bad", minibatch_size=4, full_sweep=True)
        with pytest.raises(minibatchd.MinibatchdError) as e:
            for _ in session:
                pass
        assert e.value.code == "data_error", e.value
        detail = e.value.detail
        assert detail is not None, e.value
        assert detail["file"] == str(data.resolve()) or detail["file"] == str(data), detail
        assert detail["line"] == 3, detail
        assert detail["offset"] == len(good) + len("2 |F 7 "), detail
        assert detail["kind"] == "bad_number", detail
    finally:
        d.stop()


def test_a_step_longer_than_the_shutdown_grace_gets_shutting_down_not_a_broken_pipe(tmp_path):
    """The daemon stops (SIGTERM) while the trainer is busy for longer than shutdown_grace_secs
    (1 s here): its next call raises MinibatchdError('shutting_down'), the reason the daemon gave
    before closing, not a bare BrokenPipeError."""
    import time

    from conftest import Daemon

    d = Daemon(tmp_path)
    try:
        session = minibatchd.connect(d.socket).open("train", minibatch_size=4)
        it = iter(session)
        next(it)
        d.proc.send_signal(__import__("signal").SIGTERM)
        time.sleep(3)  # a long training step: the grace period is over, the socket closed
        with pytest.raises(minibatchd.MinibatchdError) as e:
            for _ in range(1000):
                next(it)
        assert e.value.code == "shutting_down", e.value
    finally:
        d.stop()


@pytest.mark.parametrize("step_past_the_grace", [False, True])
def test_state_after_the_daemon_stopped_answers_locally(tmp_path, step_past_the_grace):
    """SIGTERM while the trainer is inside a step (longer than the 1 s grace, or not): its next
    Source.state(), before any next(), returns the position after the last minibatch the
    iterator returned — known locally — instead of raising (it raised client_disconnected once
    the daemon had closed the socket). The short step is a race check: the daemon may still
    answer, and the answer must be the same."""
    import signal

    from conftest import Daemon

    d = Daemon(tmp_path)
    try:
        session = minibatchd.connect(d.socket).open("train", minibatch_size=4)
        it = iter(session)
        for _ in range(3):
            mb = next(it)
        position = mb.position
        d.proc.send_signal(signal.SIGTERM)
        if step_past_the_grace:
            d.proc.wait(timeout=30)  # the grace is over and the daemon gone: the socket is closed
        state = session.state()
        assert (state["minibatches"], state["position"]) == (3, position), state
        with pytest.raises(minibatchd.MinibatchdError) as e:
            for _ in range(1000):
                next(it)
        assert e.value.code == "shutting_down", e.value
        assert session.state()["minibatches"] >= 3
    finally:
        d.stop()


def test_a_dataset_removed_by_a_reload_raises_the_daemons_reason_not_a_broken_pipe(tmp_path):
    """A SIGHUP drops the session's dataset from the configuration while the trainer reads: its
    next call raises MinibatchdError('unknown_dataset') with the daemon's message, not a bare
    BrokenPipeError or ConnectionResetError. The client reports what it took before the
    connection ends, so once the dataset is back the session resumes by name exactly after the
    last minibatch the iterator returned."""
    import signal
    import time

    from conftest import Daemon

    d = Daemon(tmp_path)
    try:
        session = minibatchd.connect(d.socket).open("train", minibatch_size=4, session="removed-job")
        it = iter(session)
        last = next(it).index
        d.config.write_text(d.config.read_text().replace("[datasets.train", "[datasets.renamed"))
        d.proc.send_signal(signal.SIGHUP)
        with pytest.raises(minibatchd.MinibatchdError) as e:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                last = next(it).index
                time.sleep(0.01)
        assert e.value.code == "unknown_dataset", e.value
        assert "removed by a configuration reload" in str(e.value), e.value
        d.config.write_text(d.config.read_text().replace("[datasets.renamed", "[datasets.train"))
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while True:
            try:
                again = minibatchd.connect(d.socket).open("train", minibatch_size=4, session="removed-job")
                break
            except minibatchd.MinibatchdError as refused:
                if refused.code != "unknown_dataset" or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        assert again.resumed is not None
        assert again.resumed["from"] == "lingering" and again.resumed["exact"] is True, again.resumed
        assert next(iter(again)).index == last + 1
    finally:
        d.stop()


def test_a_session_resumed_by_name_after_a_crash_says_so(tmp_path):
    """After kill -9 the session opened by name comes back from the checkpoint written when it
    opened: Session.resumed says that minibatches come again (exact is False)."""
    from conftest import Daemon

    d = Daemon(tmp_path)
    try:
        first = minibatchd.connect(d.socket).open("train", minibatch_size=4, session="crash-job")
        assert first.resumed is None
        it = iter(first)
        for _ in range(3):
            next(it)
        d.proc.kill()
        d.proc.wait()
        d._start()
        # Found by a probe: said only in `resumed`, which a trainer that does not look saw nothing of.
        with pytest.warns(minibatchd.MinibatchdWarning, match="exact: false"):
            again = minibatchd.connect(d.socket).open("train", minibatch_size=4, session="crash-job", wait_indexing=30)
        assert again.resumed is not None
        assert again.resumed["from"] == "checkpoint" and again.resumed["exact"] is False, again.resumed
    finally:
        d.stop()


def _fake_daemon(path, memfd_seals):
    """A socket at `path` that answers like a daemon up to `opened`, passing a 8 KiB memfd with
    `memfd_seals` added; returns the serving thread."""
    import json
    import socket
    import struct
    import threading

    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)

    def frame(msg):
        body = json.dumps(msg).encode()
        return struct.pack("<I", len(body)) + body

    def read_frame(c):
        head = c.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        (n,) = struct.unpack("<I", head)
        return json.loads(c.recv(n, socket.MSG_WAITALL))

    def serve():
        with srv:
            for _ in range(2):  # connect()'s probe handshake, then the session's connection
                c, _ = srv.accept()
                with c:
                    read_frame(c)
                    c.sendall(frame({"type": "hello", "version": 2, "daemon_id": "0" * 16, "features": []}))
                    if read_frame(c) is None:
                        continue
                    fd = os.memfd_create("ring", os.MFD_ALLOW_SEALING)
                    os.ftruncate(fd, 8192)
                    if memfd_seals:
                        import fcntl

                        fcntl.fcntl(fd, 1033, memfd_seals)  # F_ADD_SEALS
                    ring = {"size_bytes": 8192, "slot_count": 1, "slot_size": 4096}
                    opened = {"type": "opened", "session": "s", "ring": ring, "streams": [], "sweep_size": 0}
                    socket.send_fds(c, [frame(opened)], [fd])
                    os.close(fd)
                    c.recv(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_a_ring_memfd_not_sealed_against_shrinking_is_refused(tmp_path):
    """#15: the Python client mapped the ring without checking its seals (the Rust client did): a
    ring its sender could truncate would kill the trainer with SIGBUS on a read."""
    path = str(tmp_path / "unsealed.sock")
    t = _fake_daemon(path, 0)
    with pytest.raises(minibatchd.MinibatchdError) as e:
        minibatchd.connect(path).open("x", minibatch_size=1)
    assert e.value.code == "client_protocol" and "F_SEAL_SHRINK" in e.value.message, e.value
    t.join(10)
    # Sealed, it passes the check (and fails later on this fake ring's empty header instead).
    path = str(tmp_path / "sealed.sock")
    t = _fake_daemon(path, 0x0002 | 0x0004)  # F_SEAL_SHRINK | F_SEAL_GROW
    with pytest.raises(Exception) as e:
        minibatchd.connect(path).open("x", minibatch_size=1)
    assert "F_SEAL_SHRINK" not in str(e.value), e.value
    t.join(10)


def test_open_waits_while_the_daemon_indexes_the_dataset(tmp_path):
    """#15 acceptance 2: the socket opens before the datasets are indexed; an open meanwhile gets
    `dataset_indexing` (with wait_indexing=0) or waits (the default) until the dataset is ready."""
    from conftest import Daemon, daemon_section

    big = tmp_path / "big.txt"
    big.write_text("1 1:1 2:0.5 3:0.25\n" * 4_000_000)
    small = tmp_path / "small.txt"
    small.write_text("1 1:1\n0 2:1\n" * 10)
    d = Daemon.__new__(Daemon)
    d.tmp, d.socket, d.config = tmp_path, str(tmp_path / "mbd.sock"), tmp_path / "minibatchd.toml"
    # Opened in name order: `small` waits for `a_big`'s index pass — seconds in a debug build
    # where the memory limit lets the pass parse too (under the tests' 256 MiB it only counts,
    # which a fast machine did within the quarter of a second the daemon holds an open).
    section = daemon_section(tmp_path, d.socket).replace("memory_limit_bytes = 268435456", "memory_limit_bytes = 4294967296")
    d.config.write_text(section + f"""
[datasets.a_big]
format = "libsvm"
files = ["{big}"]
cache_index = false

[datasets.small]
format = "libsvm"
files = ["{small}"]
""")
    d._start()
    try:
        client = minibatchd.connect(d.socket)
        with pytest.raises(minibatchd.MinibatchdError) as e:
            client.open("small", minibatch_size=4, wait_indexing=0)
        assert e.value.code == "dataset_indexing", e.value
        assert "'small' is still being indexed" in e.value.message, e.value
        src = client.open("small", minibatch_size=4)
        mb = next(iter(src))
        assert mb.index == 0
        src.close()
    finally:
        d.stop()


def test_a_worker_that_gets_no_data_is_warned_at_open(daemon):
    """Randomized, a chunk goes whole to one worker: with more workers than chunks the last ones
    get nothing, and with equal steps so does every worker. The daemon says so at `open`, and the
    client shows it as a warning (and in `Source.warnings`); a worker that gets data is not warned."""
    import warnings as w

    client = minibatchd.connect(daemon.socket)
    with w.catch_warnings():
        w.simplefilter("error")
        fine = client.open("train", minibatch_size=4, full_sweep=True, num_workers=2, rank=1)
    assert fine.warnings == []
    assert sum(mb["features"].num_samples for mb in fine) > 0
    import subprocess

    from conftest import BIN

    out = subprocess.run([BIN, "index", "--config", str(daemon.config), "--dataset", "train"], capture_output=True,
                         text=True, check=True).stdout
    chunks = int(out.strip().split(", ")[-1].split()[0])  # "train: S sequences, N samples, C chunks"
    assert 1 < chunks < 120, out
    w = chunks + 1
    with pytest.warns(minibatchd.MinibatchdWarning, match=f"worker {chunks} of {w} gets no data") as caught:
        empty = client.open("train", minibatch_size=4, full_sweep=True, num_workers=w, rank=chunks)
    assert "chunk_size_bytes" in str(caught[0].message)
    assert len(empty.warnings) == 1 and list(empty) == []
    # Randomized, the chunks bound the workers that get data before the sequences do.
    with pytest.warns(minibatchd.MinibatchdWarning, match=f"use at most {chunks} workers"):
        assert list(client.open("train", minibatch_size=4, full_sweep=True, num_workers=1000, rank=999)) == []
    with pytest.warns(minibatchd.MinibatchdWarning, match="equal steps give every worker 0 minibatches"):
        equal = client.open("train", minibatch_size=4, full_sweep=True, num_workers=w, rank=0, equal_steps=True)
    assert list(equal) == []


def test_a_long_wait_for_the_index_pass_is_logged_where_python_shows_it(monkeypatch, caplog):
    """While the daemon answers dataset_indexing, open logs its progress: at once at INFO (a short
    index pass is routine), and once the wait is INDEXING_LOG_EVERY long at WARNING, which Python
    prints without any logging set up — a trainer waiting on a large file does not look hung."""
    import logging

    from minibatchd import _client

    monkeypatch.setattr(_client, "INDEXING_LOG_EVERY", 0.02)
    clock = {"calls": 0}

    def open_source():
        clock["calls"] += 1
        if clock["calls"] < 8:  # 2 + 4 + ... + 128 ms of polling: past the 20 ms mark
            raise minibatchd.MinibatchdError("dataset_indexing", f"indexing 'train': {clock['calls']} of 8 files")
        return "opened"

    with caplog.at_level(logging.INFO, logger="minibatchd"):
        assert _client._open_when_indexed(open_source, "train", None) == "opened"
    levels = [r.levelno for r in caplog.records if "waiting for dataset 'train'" in r.getMessage()]
    assert levels[0] == logging.INFO and logging.WARNING in levels[1:], levels


def test_exactly_once_counts_a_minibatch_across_sweep_ends_under_each_sweep(daemon):
    """Found by a probe: `exactly_once` counted a minibatch's next-sweep sequences under the sweep
    it started in, reporting duplicates in one sweep and a gap in the next where the data was
    right. The ledger says where each later sweep begins (`next_sweeps_at`)."""
    from minibatchd import ledger
    from conftest import BIN
    runs = [ledger.expected(str(daemon.config), "train", binary=BIN, minibatch_size=10, max_sweeps=3, workers=2,
                            rank=r) for r in range(2)]
    assert any(e.get("next_sweeps_at") for r in runs for e in r), "some minibatch crosses a sweep end"
    once = ledger.exactly_once(runs)
    assert sorted(once) == [0, 1, 2]
    assert all(set(c.values()) == {1} for c in once.values()), once
    assert once[0].keys() == once[1].keys() == once[2].keys()


def test_a_resume_job_too_large_for_one_message_is_refused_before_sending(daemon):
    """Found by a probe: 400 workers' states make an ``open`` of 78 KB, over the protocol's 64 KiB;
    the daemon closed the connection with ``message_too_large``. The client now says so before
    sending, with how many states fit, and the connection goes on."""
    client = minibatchd.connect(daemon.socket)
    source = client.open("train", minibatch_size=4, full_sweep=True, num_workers=2, rank=0, equal_steps=False)
    next(iter(source))
    state = source.state()
    source.close()
    with pytest.raises(minibatchd.MinibatchdError) as e:
        client.open("train", minibatch_size=4, full_sweep=True, resume_job=[state] * 400)
    assert e.value.code == "message_too_large", e.value
    assert "holds 400 states" in str(e.value) and "fit" in str(e.value), e.value
    assert sum(mb["features"].num_samples for mb in client.open("train", minibatch_size=4, full_sweep=True)) > 0


def test_reconnect_continues_a_session_that_resumed_a_job(daemon):
    """Found by a probe: ``reconnect()`` of a session opened with ``resume_job`` sent both
    ``resume_job`` and ``resume`` and was refused (``invalid_options``): every rank of a job resumed
    at another world size could not continue after a daemon restart. Its state carries the job."""
    client = minibatchd.connect(daemon.socket)
    states = []
    for rank in range(2):
        worker = client.open("train", minibatch_size=4, full_sweep=True, num_workers=2, rank=rank)
        it = iter(worker)
        next(it), next(it)
        states.append(worker.state())
        worker.close()

    def key(mb):
        return mb.position, mb["features"].values.tobytes()

    whole = [key(mb) for mb in client.open("train", minibatch_size=4, full_sweep=True, resume_job=states)]
    assert len(whole) > 4
    source = client.open("train", minibatch_size=4, full_sweep=True, resume_job=states)
    it = iter(source)
    first = [key(next(it)) for _ in range(3)]
    again = source.reconnect(timeout=10)
    assert first + [key(mb) for mb in again] == whole


def test_a_session_read_to_its_end_and_dropped_resumes_by_name_exactly(daemon):
    """Found by a probe: a trainer that read to the end and exited without ``close()`` left its
    session a minibatch short (the daemon had not heard that the last one was taken): a resume by
    name was not exact and gave that minibatch again. The client reports it at the end."""
    name = "read-to-the-end"
    opts = dict(minibatch_size=64, full_sweep=True, session=name, prefetch=16)
    source = minibatchd.connect(daemon.socket).open("train", **opts)
    # Every minibatch and the end arrive before the first is read: the client has no reason to
    # send its releases on the way (it reports when it would wait, or when half the ring waits).
    time.sleep(0.5)
    assert 1 < sum(1 for _ in source) < 8
    source._conn.close()  # the process goes: no close()
    del source
    again = _reopen_by_name(daemon, opts)
    assert again.resumed["from"] == "lingering" and again.resumed["exact"] is True, again.resumed
    assert list(again) == []


class HeavySparseDaemon(Daemon):
    """A daemon serving `train`: 60 one-line sequences whose sparse stream has from 0 to 1,180
    entries a sample, under 4 KiB slots — past what the daemon can bound at open (one entry a
    sample)."""

    def __init__(self, tmp: Path):
        lines = []
        for i in range(60):
            entries = " ".join(f"{(k * 7 + i) % 5000}:{k % 9}" for k in range((i * 37) % 60 * 20))
            lines.append(f"{i} |F {i} |W {entries}".rstrip())
        (tmp / "heavy.ctf").write_text("\n".join(lines) + "\n")
        self.tmp = tmp
        self.socket = str(tmp / "mbd.sock")
        self.config = tmp / "minibatchd.toml"
        self.config.write_text(
            daemon_section(tmp, self.socket).replace("slot_size_bytes = 65536", "slot_size_bytes = 4096")
            + f"""
[datasets.train]
format = "ctf"
files = ["{tmp}/heavy.ctf"]
chunk_size_bytes = 4096

[datasets.train.streams.id]
alias = "F"
dim = 1
format = "dense"

[datasets.train.streams.words]
alias = "W"
dim = 5000
format = "sparse"
"""
        )
        self._start()


def test_a_minibatch_too_large_for_the_slots_reopens_the_session_with_larger_ones(tmp_path, caplog):
    """Samples with more sparse entries than the daemon can bound at open: the daemon answers
    ``minibatch_too_large`` with the bytes needed (nothing taken), and the client reopens the
    session where it stands with slots that hold them — the sweep equals ``dump``, nothing lost
    or repeated, a minibatch held from before stays intact, ``state()`` between minibatches
    answers (found by a probe: one asked after the error had arrived raised it and killed the
    session), what the first open said (``resumed``) stays, no warning is raised again, and the
    state resumes exactly."""
    import warnings

    d = HeavySparseDaemon(tmp_path)
    try:
        args = ["--minibatch-size", "3", "--max-sweeps", "2", "--seed", "2"]
        want = d.dump(*args)
        options = dict(minibatch_size=3, max_sweeps=2, seed=2, session="heavy")
        first = minibatchd.connect(d.socket).open("train", **options)
        got = [next(first).to_dump()]
        first.close()
        # Opened again by its name: the daemon says where it continues, and that stays.
        source = minibatchd.connect(d.socket).open("train", **options)
        resumed = source.resumed
        assert resumed is not None and resumed["exact"] is True, resumed
        held = next(source)
        held_dump = held.to_dump()
        got.append(held_dump)
        with warnings.catch_warnings(record=True) as raised:
            warnings.simplefilter("always")
            for _ in range(10):
                got.append(next(source).to_dump())
                state = source.state()
        assert not [w for w in raised if issubclass(w.category, minibatchd.MinibatchdWarning)], raised
        assert source.slot_regrowths >= 1, "the data needs larger slots than open raised"
        assert source.resumed == resumed
        assert held.to_dump() == held_dump, "a minibatch held across the reopen is unchanged"
        assert "reopened with slots of" in caplog.text
        got.extend(mb.to_dump() for mb in source)
        assert got == want
        # The state taken after the reopen resumes exactly, in another session.
        resumed_source = minibatchd.connect(d.socket).open("train", minibatch_size=3, max_sweeps=2, seed=2,
                                                           resume=state)
        assert [mb.to_dump() for mb in resumed_source] == want[12:]
    finally:
        d.stop()
