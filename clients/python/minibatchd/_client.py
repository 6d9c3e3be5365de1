"""Implementation of the minibatchd client: framing, sessions, leases and slot decoding."""

from __future__ import annotations

import collections
import fcntl
import gc
import json
import logging
import mmap
import os
import socket
import struct
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

# Version 2: `ready` arrives, and `release` goes, as fixed binary frames (protocol.rs); the
# client falls back to version 1 (JSON only) for a daemon that does not speak 2.
PROTOCOL_VERSION = 2
LAYOUT_VERSION = 1
DEFAULT_SOCKET = "/run/minibatchd/minibatchd.sock"
MAX_MESSAGE_BYTES = 64 * 1024
# hello.features: the daemon accepts ``wait_ns`` (consumer wait, for the input-bound metric).
FEATURE_CONSUMER_WAIT = "consumer_wait"
# hello.features: an ``open`` on a dataset still being indexed is held by the daemon until the
# dataset is ready (a quarter of a second at most) before ``dataset_indexing``: ask again at once.
FEATURE_OPEN_WAITS_FOR_INDEX = "open_waits_for_index"
# How long to wait for the daemon's ``closed`` when reporting the final position at its shutdown.
FINAL_REPORT_TIMEOUT = 10.0
# Errors with which the daemon ends a session that was going well (it is stopping; a reload
# removed the dataset): the client then reports what it took (``close``), so that a resume by the
# session's name continues exactly after it.
_ENDED_BY_DAEMON = ("shutting_down", "unknown_dataset")
# Errors that say the session's producer stopped, sent when it stops: the session still answers
# `state` and `close`, so a reply awaited behind one comes after it (found by a probe: a state()
# called after such an error had arrived raised it, and the next next() then met the `state`
# reply and died with client_protocol).
_PRODUCER_STOPPED = ("minibatch_too_large", "data_error")

# How many of the latest minibatches a source can give back untaken (``Source._untake_last``):
# more than a DataLoader step of any sensible ``batch_size`` takes.
UNTAKE_DEPTH = 1024

_LEN = struct.Struct("<I")
# Binary hot messages (version 2), little-endian, after the length prefix:
# ready: tag 0x01, flags (bit 0: end_of_sweep), 2 zero bytes, slot u32, generation, index, sweep, position.
_READY = struct.Struct("<BBxxIQQQQ")
_READY_TAG = 0x01
# A whole binary ready frame: its length prefix and tag, then the fields.
_READY_HEAD = _LEN.pack(_READY.size) + bytes([_READY_TAG])
_READY_FRAME = 4 + _READY.size
# release: tag 0x02, flags (bit 0: wait_ns present), 2 zero bytes, slot u32, generation, taken, wait_ns.
_RELEASE = struct.Struct("<IBBxxIQQQ")  # with its length prefix (32)
_RELEASE_TAG = 0x02
# Ring header (layout.rs RingHeader): magic, layout_version, byte_order, daemon_id, session_id,
# slot_count, slot_size, slots_offset, total_bytes — native byte order.
_RING = struct.Struct("=8sIIQQQQQQ")
# Slot header: magic, num_tensors, generation, minibatch, used_bytes.
_SLOT = struct.Struct("=4sIQQQQ")  # magic, tensors, generation, index, used bytes, fingerprint
_ENTRY = "IIII4QQQ"  # name_offset, name_len, dtype, ndim, shape[4], offset, nbytes
_DTYPES = {
    1: np.dtype("=f4"),
    2: np.dtype("=f8"),
    3: np.dtype("=i4"),
    4: np.dtype("=i8"),
    5: np.dtype("=u8"),
    6: np.dtype("u1"),
}
_TABLES: Dict[int, struct.Struct] = {}
_ENTRY_SIZE = struct.calcsize("=" + _ENTRY)


def _tensor_specs(raw: bytes, n: int) -> List[Tuple[tuple, np.dtype, int]]:
    """``(shape, dtype, offset)`` of each entry of a slot's tensor table."""
    table = _TABLES.get(n)
    if table is None:
        table = _TABLES[n] = struct.Struct("=" + _ENTRY * n)
    f = table.unpack_from(raw, 0)
    out = []
    for i in range(0, 10 * n, 10):
        # name_offset, name_len, dtype, ndim, shape[4], offset, nbytes
        dtype = _DTYPES.get(f[i + 2])
        if dtype is None:
            raise MinibatchdError("client_layout", f"unknown dtype code {f[i + 2]} in a slot's tensor table")
        out.append((tuple(f[i + 4 : i + 4 + f[i + 3]]), dtype, f[i + 8]))
    return out


class MinibatchdWarning(UserWarning):
    """What the daemon says at ``open`` that a trainer should know (``Source.warnings``): e.g. that
    this worker gets no data because the dataset has fewer chunks than workers."""


class MinibatchdError(Exception):
    """An ``error`` reply from the daemon (``code`` is the protocol's error code) or a client-side
    failure (``code`` starts with ``client_``).

    ``detail``, for a data error (``data_error``, or ``unknown_dataset`` for a dataset that failed
    to open): a dict with ``kind`` and, when the error is about one place, ``file``, ``line``
    (1-based) and ``offset`` (bytes from the start of the file) — what the daemon's log says.
    ``None`` otherwise, and from daemons that do not send it."""

    def __init__(self, code: str, message: str, detail: Optional[dict] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail

    @classmethod
    def from_reply(cls, msg: dict) -> "MinibatchdError":
        """The exception for an ``error`` reply."""
        detail = msg.get("detail")
        return cls(msg.get("code", "unknown"), msg.get("message", ""), detail if isinstance(detail, dict) else None)


def torchrun_env() -> Tuple[int, int]:
    """``(rank, world_size)`` from torchrun's environment (``RANK``, ``WORLD_SIZE``); ``(0, 1)``
    when they are not set."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class DaemonNotRunning(MinibatchdError, ConnectionError):
    """Nothing listens on the socket: the daemon is not running, or the client looks in the wrong
    place. (A ``ConnectionError`` too, for code that catches those.)"""


class _Conn:
    """A framed connection: 4-byte little-endian length + JSON."""

    def __init__(self, path: str, timeout: Optional[float]):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as e:
            self.sock.close()
            raise DaemonNotRunning(
                "client_no_daemon",
                f"no minibatchd daemon listens on {path} ({e.strerror}). Start one with "
                "`minibatchd run --config FILE` (or `systemctl start minibatchd`), or point the client at "
                "its socket: connect(path) or MINIBATCHD_SOCKET (the [daemon] socket key of its config)",
            ) from None
        self.buf = bytearray()
        self.fds: List[int] = []

    def send(self, frames: List[dict]) -> None:
        out = bytearray()
        for obj in frames:
            try:
                body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
            except ValueError as e:
                # Python writes NaN and infinities as `NaN`/`Infinity`, which are not JSON (found by
                # a probe: `weights=[nan, 1]` reached the daemon as an unreadable message).
                raise MinibatchdError("invalid_options", f"a {obj.get('type')!r} message holds NaN or an infinity "
                                      f"({e}): every number of the protocol is finite") from None
            if len(body) > MAX_MESSAGE_BYTES:
                # Said here, with what to do, rather than by the daemon closing the connection.
                job = ((obj.get("options") or {}).get("resume_job") if isinstance(obj, dict) else None) or []
                hint = ""
                if job:
                    fit = MAX_MESSAGE_BYTES * len(job) // len(body)
                    hint = (f": its resume_job holds {len(job)} states, about {fit} fit; continue the job at the "
                            f"same worker count by each worker's own state instead")
                raise MinibatchdError("message_too_large",
                                      f"a {obj.get('type')!r} message of {len(body)} bytes is over the protocol's "
                                      f"{MAX_MESSAGE_BYTES} bytes{hint}")
            out += _LEN.pack(len(body))
            out += body
        self.sendall(out)

    def sendall(self, data: bytes) -> None:
        """Sends ``data``. When the daemon has closed the connection, raises the reason it gave
        before closing (``shutting_down`` after the grace period, ``unknown_dataset`` after a
        reload removed the dataset) instead of a bare ``BrokenPipeError``."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise self._why_closed(e) from None

    def _why_closed(self, cause: OSError) -> "MinibatchdError":
        # What the daemon sent before it closed is still readable: find its error, if any.
        try:
            while True:
                msg = self.recv()
                if isinstance(msg, dict) and msg.get("type") == "error":
                    return MinibatchdError.from_reply(msg)
        except (MinibatchdError, OSError, ValueError):
            pass
        return MinibatchdError("client_disconnected", f"the daemon closed the connection ({cause.strerror})")

    def _fill(self, with_fds: bool) -> None:
        try:
            if with_fds:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 4)
                self.fds.extend(fds)
            else:
                data = self.sock.recv(1 << 16)
        except socket.timeout as e:
            raise MinibatchdError("client_timeout", f"no answer from the daemon within the connection's timeout ({e})") from e
        except (ConnectionResetError, BrokenPipeError) as e:
            # The daemon went (killed): the same error as a connection it closed.
            raise MinibatchdError("client_disconnected", f"the daemon closed the connection ({e.strerror})") from e
        if not data:
            raise MinibatchdError("client_disconnected", "the daemon closed the connection")
        self.buf += data

    def has_frame(self) -> bool:
        buf = self.buf
        return len(buf) >= 4 and len(buf) >= 4 + _LEN.unpack_from(buf, 0)[0]

    def recv(self, with_fds: bool = False) -> Any:
        """The next message: a dict (JSON) or, for a binary ``ready``, a tuple."""
        while True:
            if len(self.buf) >= 4:
                (n,) = _LEN.unpack_from(self.buf, 0)
                if n > MAX_MESSAGE_BYTES:
                    raise MinibatchdError("client_protocol", f"frame of {n} bytes from the daemon")
                if len(self.buf) >= 4 + n:
                    if n == _READY.size and self.buf[4] == _READY_TAG:
                        # A binary ready: a tuple (tag, flags, slot, generation, index, sweep, position).
                        msg = _READY.unpack_from(self.buf, 4)
                        del self.buf[: 4 + n]
                        return msg
                    body = bytes(self.buf[4 : 4 + n])
                    del self.buf[: 4 + n]
                    return json.loads(body)
            self._fill(with_fds)

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()
        try:
            self.sock.close()
        except OSError:
            pass


def _type(msg: Any) -> Optional[str]:
    """A message's type: binary messages (tuples) are ``ready``."""
    return "ready" if type(msg) is tuple else msg.get("type")


def _check(msg: dict, expected: str) -> dict:
    t = _type(msg)
    if t == "error":
        raise MinibatchdError.from_reply(msg)
    if t != expected:
        raise MinibatchdError("client_protocol", f"expected {expected!r}, got {t!r}")
    return msg


def _hello(conn: _Conn, version: int = PROTOCOL_VERSION) -> dict:
    conn.send([{"type": "hello", "version": version, "client": "minibatchd-python/0.1"}])
    return _check(conn.recv(), "hello")


def _handshake(path: str, timeout: Optional[float]) -> Tuple[_Conn, dict]:
    """Connects and says hello with the newest version, then with version 1 on a new connection
    if the daemon refuses it (a daemon older than binary ready/release)."""
    conn = _Conn(path, timeout)
    try:
        return conn, _hello(conn)
    except MinibatchdError as e:
        conn.close()
        if e.code != "version_mismatch":
            raise
    except BaseException:
        conn.close()
        raise
    conn = _Conn(path, timeout)
    try:
        return conn, _hello(conn, 1)
    except BaseException:
        conn.close()
        raise


def connect(path: Optional[str] = None, timeout: Optional[float] = None) -> "Client":
    """Connects to the daemon at ``path`` (default: ``$MINIBATCHD_SOCKET``, else
    ``/run/minibatchd/minibatchd.sock``) and checks the protocol version."""
    path = path or os.environ.get("MINIBATCHD_SOCKET") or DEFAULT_SOCKET
    return Client(path, timeout)


class Client:
    """A daemon endpoint. Each ``open`` makes its own connection (one session per connection)."""

    def __init__(self, path: str, timeout: Optional[float] = None):
        self.path = path
        self.timeout = timeout
        conn, info = _handshake(path, timeout)
        conn.close()
        self.daemon_id: str = info["daemon_id"]
        self.server: str = info.get("server", "")

    def open(
        self,
        dataset: str,
        *,
        use_torchrun_env: bool = False,
        wait_indexing: Optional[float] = None,
        **options: Any,
    ) -> "Source":
        """Opens a session on ``dataset``. Options (docs/daemon.md, "Session options"): ``minibatch_size`` (required),
        ``max_samples`` | ``max_sweeps`` | ``full_sweep``, ``randomize``, ``window_chunks`` |
        ``window_samples``, ``seed``, ``frame_mode``, ``num_workers``, ``rank``, ``resume`` (a
        ``state()``), ``prefetch`` (ring slots), ``slot_size_bytes``, ``session`` (a name). A
        mixture of datasets (docs/mixtures.md) is opened by its name, with ``weights`` or
        ``weight_schedule`` and ``sweep`` besides; one not configured is given as
        ``mixture={"datasets": [...], "epoch": ..., "streams": {...}}`` with ``weights``.
        ``use_torchrun_env=True`` takes ``rank``/``num_workers`` from ``RANK``/``WORLD_SIZE`` and,
        when there is more than one worker, turns ``equal_steps`` on unless it is given (as the
        PyTorch and JAX adapters do: DistributedDataParallel hangs when ranks run different
        numbers of steps).

        While the daemon is still indexing the dataset (just started, or a reload added it) it
        answers ``dataset_indexing``; ``open`` then waits and asks again, up to ``wait_indexing``
        seconds (``None``: as long as it takes; ``0``: raise at once), logging the progress to
        the ``minibatchd`` logger every ``INDEXING_LOG_EVERY`` seconds (at WARNING once the wait
        is that long, so that it shows without any logging set up)."""
        if use_torchrun_env:
            rank, world = torchrun_env()
            options.setdefault("rank", rank)
            options.setdefault("num_workers", world)
            if (options.get("num_workers") or 1) > 1 and options.get("resume_job") is None:
                options.setdefault("equal_steps", True)
            if not options.get("equal_steps"):
                # tail only shapes equal steps: one script serves 1 and N ranks (as the adapters).
                options.pop("tail", None)
        options = {k: v for k, v in options.items() if v is not None}
        source = _open_when_indexed(lambda: Source(self.path, self.timeout, dataset, options), dataset, wait_indexing)
        source._warn(stacklevel=2)
        return source


# fcntl's memfd seal commands (Linux; the fcntl module names them from Python 3.9 on).
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)


def _check_ring_fd(fd: int, size: int) -> None:
    """The ring must be a memfd sealed against shrinking (``F_SEAL_SHRINK``) and at least ``size``
    bytes long: a descriptor that its sender (or anyone holding it) could truncate would make
    reading a mapped slot kill this process with SIGBUS. The Rust client checks the same."""
    try:
        seals = fcntl.fcntl(fd, F_GET_SEALS)
    except OSError as e:
        raise MinibatchdError("client_protocol", f"the ring's descriptor is not a sealed memfd ({e})") from None
    if not seals & F_SEAL_SHRINK:
        raise MinibatchdError("client_protocol", "the ring's memfd is not sealed against shrinking (F_SEAL_SHRINK)")
    if os.fstat(fd).st_size < size:
        raise MinibatchdError("client_protocol", f"the ring's memfd is smaller than the {size} bytes announced")


# While the dataset is being indexed, ``open`` asks again after INDEXING_FIRST_POLL seconds, then
# twice as long each time up to INDEXING_POLL: a daemon that has just started reads a dataset's
# index cache in tens of milliseconds, and a trainer started with it opens its session then.
INDEXING_FIRST_POLL = 0.002
INDEXING_POLL = 0.25
INDEXING_LOG_EVERY = 10.0


def _open_when_indexed(open_source: Any, dataset: str, wait: Optional[float]) -> "Source":
    """``open_source()``, asked again while the daemon answers ``dataset_indexing``."""
    log = logging.getLogger("minibatchd")
    start = time.monotonic()
    logged = start - INDEXING_LOG_EVERY
    poll = INDEXING_FIRST_POLL
    while True:
        try:
            return open_source()
        except MinibatchdError as e:
            now = time.monotonic()
            if e.code != "dataset_indexing" or (wait is not None and now - start >= wait):
                raise
            if now - logged >= INDEXING_LOG_EVERY:
                # At once at INFO (a short index pass is routine); from INDEXING_LOG_EVERY on at
                # WARNING, which Python shows without any logging set up: a trainer waiting on a
                # large file's index pass says why instead of looking hung.
                level = logging.WARNING if now - start >= INDEXING_LOG_EVERY else logging.INFO
                log.log(level, "minibatchd: waiting for dataset %r: %s", dataset, e.message)
                logged = now
            if not getattr(e, "daemon_waited", False):
                time.sleep(poll)
                poll = min(poll * 2, INDEXING_POLL)


class _Releaser:
    """Queues a slot's release when its owner array dies or on demand; the source sends the
    queued releases with its next request.

    A dying owner's weak reference is appended to ``dead`` by the weakref machinery calling
    ``deque.append`` itself: a call into C, which no signal handler can interrupt halfway. (A
    Python callback could be: found by a probe, a ``KeyboardInterrupt`` raised inside it was
    swallowed by the interpreter, the slot was neither live nor queued, and ``next()`` later
    waited for ever.) ``drain`` turns dead references into releases in the source's own calls,
    in an order that an interruption anywhere leaves to be completed by the next call (a slot
    queued twice is released once: the daemon ignores the second, stale release)."""

    __slots__ = ("pending", "live", "refs", "dead")

    def __init__(self) -> None:
        self.pending: collections.deque = collections.deque()
        self.live: set = set()
        self.refs: Dict[int, Tuple[Any, Tuple[int, int]]] = {}
        self.dead: collections.deque = collections.deque()

    def track(self, owner: np.ndarray, key: Tuple[int, int]) -> Any:
        ref = weakref.ref(owner, self.dead.append)
        self.refs[id(ref)] = (ref, key)
        self.live.add(key)
        return ref

    def __call__(self, ref: Any) -> None:
        """Releases the slot of ``ref`` now (``Minibatch.release``)."""
        self.dead.append(ref)

    def drain(self) -> None:
        dead, refs = self.dead, self.refs
        while dead:
            ref = dead[0]
            # The reference is held by ``dead`` until here, so its id names no other one.
            entry = refs.get(id(ref))
            if entry is not None and entry[0] is ref:
                self.pending.append(entry[1])
                self.live.discard(entry[1])
                del refs[id(ref)]
            dead.popleft()


class Source:
    """An open session: iterate for ``Minibatch`` objects; ``state()`` for a checkpoint."""

    def __init__(self, path: str, timeout: Optional[float], dataset: str, options: dict):
        self.dataset = dataset
        self._path = path
        self._timeout = timeout
        self._options = {k: v for k, v in options.items() if k != "resume"}
        # Time spent waiting for the daemon in __next__ (reported as wait_ns: the input-bound
        # fraction), and whether the daemon stopped (error shutting_down) after we reported.
        self._wait_ns = 0
        self._report_wait = False
        self._stopped = False
        self._releaser = _Releaser()
        self._pending = self._releaser.pending
        self._dead = self._releaser.dead
        # While a next() runs: the minibatches taken when it began and its thread; None between
        # calls. Still set when a call begins, the last one ended in an exception it did not
        # mean (a KeyboardInterrupt, say) somewhere a minibatch may have been lost — or another
        # thread is inside next() now.
        self._in_next: Optional[Tuple[int, int]] = None
        # The state before each of the latest minibatches next() returned, and its slot, latest
        # last (_untake_last: a DataLoader step of `batch_size` items gives back all of them);
        # the slots of minibatches given back untaken, whose release is never sent.
        self._befores: collections.deque = collections.deque(maxlen=UNTAKE_DEPTH)
        # Set by an adapter while a step of its consumer may still give minibatches back: the
        # releases and state requests report no more taken than this (``close`` reports all).
        self._hold_taken: Optional[int] = None
        # Whether the open step released some of its slots all the same (``_held_keys``), and
        # then whether one of its minibatches was given back: this client's own state is the
        # session's from then on (the daemon counts the minibatches whose slots it got back).
        self._hold_overflowed = False
        self._given_back = False
        self._unreported: set = set()
        self._live = self._releaser.live
        self._queued: collections.deque = collections.deque()
        self._ended = False
        # The state the daemon confirmed when this client reported the end (what close() returns
        # then, as it did when close() sent the report itself).
        self._closed_state: Optional[dict] = None
        self._failed: Optional[MinibatchdError] = None
        # How many times a minibatch too large for the slots reopened the session (_regrow).
        self.slot_regrowths: int = 0
        self._mm: Optional[mmap.mmap] = None
        self._conn, hello = _handshake(path, timeout)
        try:
            self._binary = hello.get("version", 1) >= 2
            self._report_wait = FEATURE_CONSUMER_WAIT in (hello.get("features") or [])
            self._conn.send([{"type": "open", "dataset": dataset, "options": options}])
            try:
                opened = _check(self._conn.recv(with_fds=True), "opened")
            except MinibatchdError as e:
                # Whether the daemon already waited for the index pass before answering.
                e.daemon_waited = FEATURE_OPEN_WAITS_FOR_INDEX in (hello.get("features") or [])
                raise
            if not self._conn.fds:
                raise MinibatchdError("client_protocol", "opened without a shared-memory descriptor")
            fd = self._conn.fds.pop(0)
            ring = opened["ring"]
            try:
                _check_ring_fd(fd, ring["size_bytes"])
                # Not populated: the ring's pages are made by the daemon as it fills slots, and a
                # read fault maps a slot's written pages in a few faults (fault-around) the first
                # time each slot is read. MAP_POPULATE would make every page of the ring first —
                # 64 MiB zeroed for the default ring, 58 ms inside `open` on a 2-core VM.
                self._mm = mmap.mmap(fd, ring["size_bytes"], mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
        except BaseException:
            self._conn.close()
            raise
        self.session: str = opened["session"]
        self._options.setdefault("session", self.session)
        self.streams: List[dict] = opened["streams"]
        # Per stream: its info, its first tensor in the slot's table and how many it has.
        self._where: Dict[str, Tuple[dict, int, int]] = {}
        k = 0
        for info in self.streams:
            count = {"sparse": 4, "strings": 3}.get(info["kind"], 2)
            self._where[info["name"]] = (info, k, count)
            k += count
        self.sweep_size: int = opened["sweep_size"]
        # A mixture's session: its sources, in source order ({"dataset", "sweep_size"} each);
        # None for a dataset's session.
        self.mixture_sources: Optional[List[dict]] = (opened.get("mixture") or {}).get("sources")
        # Where a mixture's own tensors start in a slot's table: after every stream's.
        self._mix_at: Optional[int] = k if self.mixture_sources is not None else None
        # Set when the session continued one the daemon kept by name: {"from": "lingering" |
        # "checkpoint", "checkpoint_unix_secs": ..., "exact": bool}. exact False: the trainer may
        # have taken minibatches past this position (an earlier connection ended without saying
        # what it took, or the daemon stopped uncleanly), and those come again.
        self.resumed: Optional[dict] = opened.get("resumed")
        # What the daemon says the trainer should know before it runs (e.g. that this worker
        # gets no data: fewer chunks than workers); raised as warnings by whoever made this
        # source (`Client.open`, `reconnect`), once it is whole.
        self.warnings: List[str] = list(opened.get("warnings") or [])
        # Found by a probe: a resume by name that may give minibatches again was said only in
        # `resumed`, which a trainer that does not look at it never saw.
        if self.resumed is not None and self.resumed.get("exact") is False:
            self.warnings.append(
                f"resumed by name (from its {self.resumed.get('from', 'record')} record) at minibatch "
                f"{opened['state'].get('minibatches')} with exact: false — the trainer may already have been given "
                "minibatches after this position (its client did not report them before it stopped), and those come "
                "again (from a daemon checkpoint it cannot vouch for, edited or without its checksum, minibatches may "
                "be skipped instead); resume from the trainer's own saved state() (resume=) to continue exactly")
        self._start_state: dict = opened["state"]
        self._taken: int = opened["state"]["minibatches"]
        self._last_state: dict = dict(opened["state"])
        self._check_ring(ring)
        self._slot_count = ring["slot_count"]
        self._slot_size = ring["slot_size"]
        self._slots_offset = ring["slots_offset"]
        self._specs: Dict[bytes, list] = {}
        # The table of the last minibatch and its specs: compared before the dict is hashed.
        self._last_table: bytes = b""
        self._last_specs: list = []

    def _warn(self, stacklevel: int) -> None:
        """Raises each of the daemon's `opened.warnings` as a `MinibatchdWarning` (at the caller
        `stacklevel` names)."""
        for w in self.warnings:
            warnings.warn(f"minibatchd session {self.session!r}: {w}", MinibatchdWarning, stacklevel=stacklevel + 1)

    def _check_ring(self, ring: dict) -> None:
        magic, version, order, _daemon, _sid, count, size, offset, total = _RING.unpack_from(self._mm, 0)
        if magic != b"MBDRING\0":
            raise MinibatchdError("client_layout", "the shared memory is not a minibatchd ring")
        if order != 1:
            raise MinibatchdError("client_layout", "ring written with another byte order")
        if version != LAYOUT_VERSION:
            raise MinibatchdError("client_layout", f"ring layout version {version}; this client reads {LAYOUT_VERSION}")
        if (count, size, offset) != (ring["slot_count"], ring["slot_size"], ring["slots_offset"]):
            raise MinibatchdError("client_layout", "ring header disagrees with the opened message")

    # -- messages ------------------------------------------------------------------------------

    def _report(self, msg: dict) -> dict:
        """Adds what every client report carries: ``taken`` and, if the daemon accepts it, the
        cumulative consumer wait."""
        msg["taken"] = self._taken if msg.get("type") == "close" else self._reported_taken()
        if self._report_wait:
            msg["wait_ns"] = self._wait_ns
        return msg

    def _reported_taken(self) -> int:
        """The minibatches taken that a report says: all of them, or, while an adapter's step
        is open, those before it (``_hold_taken``)."""
        hold = self._hold_taken
        return self._taken if hold is None else min(self._taken, hold)

    def _held_keys(self) -> set:
        """The slots of the minibatches an open adapter step may still give back
        (``_hold_taken``): their releases wait, as a release says its minibatch was taken."""
        hold = self._hold_taken
        keys: set = set()
        if hold is not None:
            for before in reversed(self._befores):
                # At most half the ring waits: a step of more minibatches than that (a large
                # `batch_size`) would otherwise leave the daemon no slot to fill, and wait for
                # ever. Those released early still report the count before the step, which the
                # daemon believes (an older daemon counted them taken: hence ``state()`` and
                # ``close()`` answer from this client once one of the step's is given back).
                if before[0] < hold:
                    break
                if 2 * len(keys) >= self._slot_count:
                    self._hold_overflowed = True
                    break
                keys.add(before[4])
        return keys

    def _flush(self, extra: Optional[List[dict]] = None) -> None:
        self._releaser.drain()
        frames = []
        pending = self._pending
        # Taken off the queue once sent: an interruption before that sends them again (stale
        # releases, which the daemon ignores), never loses one. Held ones stay queued.
        held = self._held_keys()
        send = [key for key in pending if key not in held] if held else pending
        sent = len(send)
        if self._binary and send:
            out = bytearray()
            pack, taken = _RELEASE.pack, self._reported_taken()
            flag, wait = (1, self._wait_ns) if self._report_wait else (0, 0)
            for slot, gen in send:
                if (slot, gen) not in self._unreported:
                    out += pack(_RELEASE.size - 4, _RELEASE_TAG, flag, slot, gen, taken, wait)
            self._conn.sendall(out)
            self._unqueue(send, sent, held)
            if not extra:
                return
            send, sent = (), 0
        for slot, gen in send:
            if (slot, gen) not in self._unreported:
                frames.append(self._report({"type": "release", "slot": slot, "generation": gen}))
        if extra:
            frames.extend(self._report(m) for m in extra)
        if frames:
            self._conn.send(frames)
        self._unqueue(send, sent, held)

    def _unqueue(self, sent: Any, count: int, held: set) -> None:
        """Takes the ``count`` releases ``sent`` off the queue: its first ones, unless some were
        held (then each by name)."""
        pending = self._pending
        if held:
            for key in list(sent):
                pending.remove(key)
        else:
            for _ in range(count):
                pending.popleft()

    def _next_message(self) -> dict:
        if self._queued:
            return self._queued.popleft()
        return self._conn.recv()

    def _await_reply(self, expected: str) -> dict:
        while True:
            msg = self._conn.recv()
            t = _type(msg)
            if t == expected:
                return msg
            if t == "error" and msg.get("code") not in _PRODUCER_STOPPED:
                raise MinibatchdError.from_reply(msg)
            self._queued.append(msg)

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator["Minibatch"]:
        return self

    def __next__(self) -> "Minibatch":
        if self._in_next is not None:
            self._interrupted()
        self._in_next = (self._taken, threading.get_ident())
        try:
            mb = self._next()
        except (StopIteration, MinibatchdError):
            self._in_next = None
            raise
        # No signal handler runs between these two steps (the interpreter checks for them at
        # calls and backward jumps): the caller has the minibatch once the flag is down.
        self._in_next = None
        return mb

    def _interrupted(self) -> None:
        """next() was entered while a call was still marked running: another thread's (refused:
        a source is not thread-safe), or a call that an exception ended where a minibatch may
        have been received and lost (found by a probe: one interrupted between taking a `ready`
        off the socket and making its minibatch, then iterated on, skipped that minibatch
        without a word). The session only closes from here, at the state before anything lost."""
        _taken, thread = self._in_next or (self._taken, 0)
        if thread != threading.get_ident():
            raise MinibatchdError("client_concurrent_use", "next() was called from two threads at once: a Source is "
                                  "not thread-safe; iterate it from one thread (or give each thread its own session)")
        self._settle()
        if self._failed is None:
            self._failed = MinibatchdError(
                "client_interrupted", "an exception interrupted next() while it received a minibatch, which may have been "
                "lost: close the session and resume it from its state(), which continues after the last minibatch "
                "next() returned")
        raise self._failed

    def _settle(self) -> None:
        """After a next() that an exception ended (``_in_next`` still set): a minibatch it took
        but never returned is taken back, so that ``state()`` and ``close()`` report the position
        after the last minibatch the caller got."""
        if self._in_next is None:
            return
        taken, thread = self._in_next
        if thread != threading.get_ident():
            return  # another thread's next() is running (unsupported): not this one's to settle
        self._in_next = None
        if self._taken != taken:
            self._untake_last()

    def _next(self) -> "Minibatch":
        # The common case first: a binary `ready` already received, nothing queued before it,
        # no releases due (the general path below does the same, in more steps).
        buf = self._conn.buf
        if (
            buf.startswith(_READY_HEAD)
            and len(buf) >= _READY_FRAME
            and not self._queued
            and self._failed is None
            # A released minibatch's reference may be queued twice (its release, then its
            # array's death): dead references count half.
            and len(self._pending) * 2 + len(self._dead) < self._slot_count
            and self._mm is not None
            and not self._ended
        ):
            _tag, flags, slot, gen, index, sweep, position = _READY.unpack_from(buf, 4)
            return self._minibatch(slot, gen, index, sweep, bool(flags & 1), position, _READY_FRAME)
        if self._ended:
            raise StopIteration
        if self._failed is not None:
            raise self._failed
        if self._mm is None:
            # Found by a probe: a loop over a closed source looked like an empty epoch.
            raise MinibatchdError("client_closed", "the session was closed before its epoch ended: open it again "
                                  "(resume=its state) to go on")
        ready = bool(self._queued) or self._conn.has_frame()
        self._releaser.drain()
        # Releases are batched: sent before this client would wait for the daemon, or once half
        # the ring waits to be given back — never one syscall per minibatch on a backlog.
        if not ready or len(self._pending) * 2 >= self._slot_count:
            try:
                self._flush()
            except OSError:
                # The daemon ended the session and closed the socket: its reason is still
                # readable, and more useful than a broken pipe.
                msg = self._next_message()
                if _type(msg) == "error":
                    self._failed = MinibatchdError.from_reply(msg)
                    raise self._failed
                raise
        if not ready and len(self._live) >= self._slot_count:
            gc.collect()
            self._flush()
            if len(self._live) >= self._slot_count:
                raise MinibatchdError(
                    "client_all_slots_held",
                    f"all {self._slot_count} ring slots are held by live minibatches; drop or release() some, "
                    "or open the session with a larger prefetch",
                )
        if ready:
            msg = self._next_message()
        else:
            waiting = time.perf_counter_ns()
            msg = self._next_message()
            self._wait_ns += time.perf_counter_ns() - waiting
        if type(msg) is tuple:
            return self._minibatch(msg[2], msg[3], msg[4], msg[5], bool(msg[1] & 1), msg[6])
        t = msg.get("type")
        if t == "ready":
            meta = msg["minibatch"]
            return self._minibatch(msg["slot"], msg["generation"], meta["index"], meta["sweep"], meta["end_of_sweep"], meta["position"])
        if t == "end":
            self._ended = True
            # Tell the daemon the last minibatch was taken (found by a probe: a trainer that read
            # to the end and exited without close() left its session one minibatch short, so a
            # resume by name was not exact and gave it again). state() stays the end's.
            before = self._last_state
            self._report_final()
            # Confirmed (a new state), or the report failed and close() returns the end's.
            self._closed_state = self._last_state if self._last_state is not before else None
            self._last_state = msg["state"]
            raise StopIteration
        if t == "error":
            error = MinibatchdError.from_reply(msg)
            if error.code == "minibatch_too_large" and self._regrow(error):
                return self._next()
            # The session cannot go on (its producer stopped): every later next() says so too;
            # state() and close() still work.
            self._failed = error
            if self._failed.code in _ENDED_BY_DAEMON:
                self._report_final()
            raise self._failed
        raise MinibatchdError("client_protocol", f"unexpected message {t!r}")

    def _regrow(self, error: MinibatchdError) -> bool:
        """The next minibatch does not fit the ring's slots (samples with more sparse entries or
        longer strings than the daemon can bound at ``open``, docs/daemon.md): the session is
        reopened where it stands — ``resume=`` the state after the last minibatch returned, the
        same session name — with slots that hold that minibatch and a quarter more. Nothing is
        lost or given twice (the order does not depend on the slot size); minibatches still held
        stay valid (they keep the old ring mapped). False, and the error stands, when the daemon
        did not say how many bytes (an older daemon) or the reopen failed (its error is chained
        to the original one)."""
        needed = (error.detail or {}).get("needed_bytes")
        if not isinstance(needed, int) or needed <= self._slot_size:
            return False
        slot = -(-(needed + needed // 4) // 4096) * 4096
        in_next, before = self._in_next, self._options
        self._options = dict(before, slot_size_bytes=slot)
        try:
            # Without the reopen's warnings: it continues exactly where this client stands, and
            # what the daemon would say of the name's history was said at the first open.
            fresh = self._reopen(None, 60.0)
        except (OSError, MinibatchdError) as e:
            self._options, self._in_next, self._failed = before, in_next, error
            raise error from e
        logging.getLogger("minibatchd").warning(
            "minibatchd session %r: minibatch %d needs %d bytes, a slot holds %d: reopened with slots of %d bytes",
            self.session, self._taken, needed, self._slot_size, slot)
        # This object becomes the new session; the other must not close the connection it hands on.
        # What the first open said stays (found by a probe: `resumed` became None).
        kept = {"slot_regrowths": self.slot_regrowths + 1, "resumed": self.resumed, "warnings": self.warnings,
                "_in_next": in_next}
        state = fresh.__dict__
        fresh.__dict__ = {}
        self.__dict__.clear()
        self.__dict__.update(state)
        self.__dict__.update(kept)
        return True

    def _minibatch(self, slot: int, gen: int, index: int, sweep: int, end_of_sweep: bool, position: int,
                   consume: int = 0) -> "Minibatch":
        """The minibatch of a ``ready`` (the binary one still in the buffer when ``consume`` is its
        length: taken out here). An exception before it is returned takes it back (``_lost``)."""
        taken = self._taken
        try:
            if consume:
                del self._conn.buf[:consume]
            return self._make_minibatch(slot, gen, index, sweep, end_of_sweep, position)
        except BaseException as e:
            self._lost(slot, gen, taken, e)
            raise

    def _make_minibatch(self, slot: int, gen: int, index: int, sweep: int, end_of_sweep: bool,
                        position: int) -> "Minibatch":
        base = self._slots_offset + slot * self._slot_size
        mm = self._mm
        magic, n, sgen, _index, _used, fingerprint = _SLOT.unpack_from(mm, base)
        if magic != b"MBSL" or sgen != gen:
            raise MinibatchdError("client_layout", f"slot {slot} does not hold generation {gen}")
        # The owner's base is the mapping (not an ndarray), so NumPy's base collapsing stops at the
        # owner: every view derived from it keeps it alive, and its finalizer runs only when the
        # last view is gone.
        owner = np.frombuffer(mm, np.uint8, self._slot_size, base)
        # The table's entries as (shape, dtype, offset), parsed once per distinct table: with a
        # fixed minibatch size most minibatches repeat the previous one's shapes exactly.
        raw = mm[base + 64 : base + 64 + _ENTRY_SIZE * n]
        if raw == self._last_table:
            specs = self._last_specs
        else:
            specs = self._specs.get(raw)
            if specs is None:
                specs = self._specs[raw] = _tensor_specs(raw, n)
                if len(self._specs) > 64:
                    self._specs.clear()
                    self._specs[raw] = specs
            self._last_table, self._last_specs = raw, specs
        ref = self._releaser.track(owner, (slot, gen))
        # The arrays themselves are made when their stream is first asked for.
        # Taken now: the state the client keeps (and a reconnect resumes from) is after it.
        mb = Minibatch(self, owner, ref, index, sweep, end_of_sweep, position, specs, fingerprint)
        mixture = None if self._mix_at is None else self._mixture(mb, owner, specs[self._mix_at:self._mix_at + 3])
        mb._mixture_state = mixture
        state = self._last_state
        self._befores.append((self._taken, state.get("position"), state.get("minibatches"), state.get("mixture"),
                              (slot, gen)))
        self._taken = index + 1
        state["position"] = position
        state["minibatches"] = index + 1
        if mixture is not None:
            state["mixture"] = mixture
        return mb

    def _lost(self, slot: int, gen: int, taken: int, error: BaseException) -> None:
        """A ``ready`` was read but an exception (a ``KeyboardInterrupt``, say) came before its
        minibatch reached the caller: the minibatch is taken back as ``_untake_last`` does — its
        slot is never reported, the state is the one before it and every later ``next()`` raises
        ``client_interrupted`` — rather than its slot being lost for good (after a ring's worth,
        ``next()`` waited forever on a daemon with no free slot)."""
        if self._taken != taken:
            self._untake_last()
            return
        self._unreported.add((slot, gen))
        if self._failed is None:
            self._failed = MinibatchdError(
                "client_interrupted", f"a minibatch was lost to {type(error).__name__} while it was received ({error}): "
                "close the session and resume it from its state(), which continues with that minibatch")

    def _next_made(self, make: Any) -> Any:
        """What ``make`` makes of the next minibatch (an adapter's item), or None at the end. An
        exception on the way (a ``KeyboardInterrupt`` while the item is copied, say) takes the
        minibatch back (``_untake_last``) before it propagates: the session then closes with the
        state before it, and a resume delivers it — a checkpoint saved in the handler skips
        nothing."""
        before = self._taken
        try:
            return make(next(self))
        except StopIteration:
            return None
        except BaseException:
            if self._taken != before:
                self._untake_last()
            raise

    def _untake_last(self) -> bool:
        """The minibatch ``next()`` returned last (and not given back yet) never reached its
        consumer: an exception (a ``KeyboardInterrupt``, say) ended the consumer's step while it
        was being made into an item. The state goes back to before it, its slot is never reported
        (a release says its minibatch was taken), and the session only closes from here:
        ``close()`` and ``state()`` give the state before it, so a resume delivers it again —
        nothing skipped. Called again, the one before it is given back too (up to
        ``UNTAKE_DEPTH``; False when none is left to give back). Used by the adapters, which close
        the session on any exception."""
        if not self._befores:
            return False
        before = self._befores.pop()
        self._given_back |= self._hold_overflowed
        taken, position, minibatches, mixture, key = before
        self._taken = taken
        state = self._last_state
        state["position"], state["minibatches"] = position, minibatches
        if mixture is not None:
            state["mixture"] = mixture
        self._unreported.add(key)
        if self._failed is None:
            self._failed = MinibatchdError(
                "client_interrupted", "a minibatch was lost to an exception in its consumer: close the session and "
                "resume it from its state(), which continues with that minibatch")
        return True

    @staticmethod
    def _mixture(mb: "Minibatch", owner: np.ndarray, specs: list) -> dict:
        """A mixture's minibatch: its slot's ``mixture/sources`` and ``mixture/sweeps_ended`` read
        into ``mb``; its ``mixture/state`` (the mixture's state after it, the same on every
        worker) returned."""
        if len(specs) != 3:
            raise MinibatchdError("client_layout", "a mixture's minibatch without its mixture tensors")
        (n_src,), _, at_src = specs[0]
        (n_end,), _, at_end = specs[1]
        (n_st,), _, at_st = specs[2]
        mb.sources = np.frombuffer(owner, np.int32, n_src, at_src).copy()
        mb.sweeps_ended = np.frombuffer(owner, np.int32, n_end, at_end).tolist()
        v = np.frombuffer(owner, np.int64, n_st, at_st).tolist()
        return {
            "step": v[0], "slots": v[1], "samples": v[2], "ended": bool(v[3]),
            "sources": [{"position": v[i], "taken": v[i + 1], "credit": v[i + 2], "weight": v[i + 3]}
                        for i in range(4, len(v), 4)],
        }

    def _report_final(self) -> None:
        """The daemon is stopping: tell it what was taken (``close``), so its checkpoint holds this
        session's exact position, and keep the state it confirms. Best effort."""
        self._stopped = True
        try:
            self._conn.sock.settimeout(FINAL_REPORT_TIMEOUT)
            self._flush([{"type": "close"}])
            self._last_state = self._await_reply("closed")["state"]
        except (MinibatchdError, OSError, ValueError):
            pass

    def reconnect(self, path: Optional[str] = None, timeout: float = 60.0) -> "Source":
        """Opens this session again — typically after the daemon restarted — with the same
        options and session name, continuing exactly after the last minibatch this iterator
        returned (``resume=`` its state, which the client keeps itself). Waits up to ``timeout``
        seconds for the daemon to accept it. This source is closed."""
        source = self._reopen(path, timeout)
        source._warn(stacklevel=2)
        return source

    def _reopen(self, path: Optional[str], timeout: float) -> "Source":
        """``reconnect`` without its warnings."""
        self._settle()
        state = dict(self._last_state)
        self.close()
        # The state carries the earlier run a ``resume_job`` continued; both together are refused.
        options = {k: v for k, v in self._options.items() if k != "resume_job"}
        options["resume"] = state
        deadline = time.monotonic() + timeout
        while True:
            try:
                return Source(path or self._path, self._timeout, self.dataset, options)
            except (OSError, MinibatchdError) as e:
                retry = isinstance(e, OSError) or e.code in (
                    "client_disconnected",
                    "shutting_down",
                    "session_busy",
                    "dataset_indexing",
                )
                if not retry or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    # -- state ---------------------------------------------------------------------------------

    def state(self) -> dict:
        """The session's state: the position after the last minibatch this iterator returned
        (prefetched ones never count). Pass it as ``resume=`` to continue exactly after it."""
        self._settle()
        if self._ended or self._stopped or self._mm is None or self._given_back:
            return dict(self._last_state)
        try:
            self._flush([{"type": "state"}])
            return self._await_reply("state")["state"]
        except MinibatchdError as e:
            # The daemon ended the session (or went) before answering: what this client knows
            # is exact — the position after the last minibatch it returned.
            if e.code not in _ENDED_BY_DAEMON and e.code != "client_disconnected":
                raise
            self._failed = e  # what next() raises from now on
            self._report_final()
            return dict(self._last_state)

    def close(self) -> dict:
        """Ends the session (it stays resumable by name for the daemon's linger time) and
        returns the final state."""
        self._settle()
        if self._mm is None or self._stopped:
            self._conn.close()
            self._mm = None
            if self._closed_state is not None and not self._given_back:
                self._last_state = self._closed_state
            return dict(self._last_state)
        try:
            self._flush([{"type": "close"}])
            final = self._await_reply("closed")["state"]
        except (MinibatchdError, OSError):
            final = dict(self._last_state)
        if self._given_back:
            final = dict(self._last_state)
        self._conn.close()
        self._mm = None  # arrays still alive keep the mapping itself alive
        self._last_state = final
        return final

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._mm is not None:
                self._conn.close()
        except Exception:
            pass


# A stream's arrays by their place among its tensors in a slot's table, per kind (any other kind
# reads as dense); the arrays a kind does not have are None.
_STREAM_ARRAYS = {
    "dense": {"sequence_offsets": 0, "values": 1},
    "sparse": {"sequence_offsets": 0, "sample_offsets": 1, "indices": 2, "values": 3},
    "strings": {"sequence_offsets": 0, "offsets": 1, "values": 2},
}


def _lazy_array(name: str, doc: str) -> Any:
    """A stream's array ``name``, made on first read and kept."""

    def get(self: "Stream") -> Any:
        array = self._made.get(name)
        if array is None:
            i = self._places.get(name)
            if i is None:
                return None
            shape, dtype, offset = self._specs[i]
            # Positional arguments: NumPy's keyword parsing costs as much as the array itself.
            array = self._made[name] = np.ndarray(shape, dtype, self._owner, offset)
        return array

    return property(get, doc=doc)


# The arrays of a stream, in the order `Stream.torch()` and the torch adapter give them.
STREAM_ARRAYS = ("sequence_offsets", "sample_offsets", "indices", "offsets", "values")
# Per kind, the arrays it has in that order, with their places among its tensors.
_ORDERED_ARRAYS = {kind: [(key, places[key]) for key in STREAM_ARRAYS if key in places]
                   for kind, places in _STREAM_ARRAYS.items()}


class Stream:
    """One stream of a minibatch. Arrays are read-only views on shared memory, each made when it
    is first read (a trainer often reads only the values; an array costs about 0.4 µs)."""

    __slots__ = ("name", "kind", "dim", "_owner", "_specs", "_places", "_made")

    def __init__(self, info: dict, owner: np.ndarray, specs: list):
        self.name: str = info["name"]
        self.kind: str = info["kind"]
        self.dim: int = info["dim"]
        self._owner = owner
        self._specs = specs
        self._places = _STREAM_ARRAYS.get(self.kind, _STREAM_ARRAYS["dense"])
        self._made: Dict[str, np.ndarray] = {}

    sequence_offsets = _lazy_array("sequence_offsets", "Sample offsets per sequence (``num_sequences + 1``).")
    sample_offsets = _lazy_array("sample_offsets", "Entry offsets per sample of a sparse stream; else None.")
    indices = _lazy_array("indices", "Entry indices of a sparse stream; else None.")
    offsets = _lazy_array("offsets", "Byte offsets per sample of a strings stream (bytes[offsets[j]:offsets[j + 1]], deepx uuids); else None.")
    values = _lazy_array("values", "The values (dense: ``[num_samples, dim]``; sparse: one per entry; strings: the bytes).")

    def arrays(self) -> List[Tuple[str, np.ndarray]]:
        """The stream's arrays, (name, view on shared memory), in ``STREAM_ARRAYS`` order: those
        its kind has, made anew without keeping them (the adapters' per-item path)."""
        specs, owner = self._specs, self._owner
        out = []
        for key, i in _ORDERED_ARRAYS.get(self.kind, _ORDERED_ARRAYS["dense"]):
            shape, dtype, offset = specs[i]
            out.append((key, np.ndarray(shape, dtype, owner, offset)))
        return out

    @property
    def num_sequences(self) -> int:
        return len(self.sequence_offsets) - 1

    @property
    def num_samples(self) -> int:
        return int(self.sequence_offsets[-1]) if len(self.sequence_offsets) else 0

    def csr_arrays(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(values, indices, indptr)`` of a sparse stream: one CSR row per sample, entries in
        file order (duplicates kept). Views on shared memory; deepx feature ids are uint64."""
        if self.kind != "sparse":
            raise TypeError(f"stream {self.name!r} is {self.kind}, not sparse")
        return self.values, self.indices, self.sample_offsets

    def csr(self, num_features: Optional[int] = None):
        """The stream as a ``scipy.sparse.csr_matrix`` ``[num_samples, num_features]`` (a copy:
        scipy sums duplicates lazily and wants signed indices). ``num_features`` defaults to the
        stream's ``dim``, or for deepx streams (dim 0: ids are unbounded) to the largest id + 1.
        Needs scipy, which the client does not require."""
        try:
            import scipy.sparse
        except ImportError as e:  # scipy is optional
            raise ImportError("Stream.csr() needs scipy; csr_arrays() gives the same data as NumPy arrays") from e
        values, indices, indptr = self.csr_arrays()
        largest = int(indices.max()) if len(indices) else -1
        if largest >= 2**63 - 1:
            raise ValueError(f"feature id {largest} does not fit scipy's int64 indices; hash the ids or use csr_arrays()")
        if num_features is None:
            num_features = self.dim or (int(indices.max()) + 1 if len(indices) else 0)
        return scipy.sparse.csr_matrix((np.array(values), indices.astype(np.int64), indptr.astype(np.int64)), shape=(self.num_samples, num_features))

    def strings(self) -> List[str]:
        """The samples of a `strings` stream, decoded as UTF-8 (invalid bytes replaced; for
        binary data — a TFRecord ``bytes`` feature — use ``byte_strings()``)."""
        return [b.decode("utf-8", errors="replace") for b in self.byte_strings()]

    def byte_strings(self) -> List[bytes]:
        """The samples of a `strings` stream as they were read, one ``bytes`` each (a copy)."""
        if self.kind != "strings":
            raise TypeError(f"stream {self.name!r} is {self.kind}, not strings")
        raw, offs = self.values.tobytes(), self.offsets.tolist()
        return [raw[offs[j] : offs[j + 1]] for j in range(len(offs) - 1)]

    def dense(self) -> np.ndarray:
        """``[num_samples, dim]`` values (a copy for sparse streams, the view for dense ones)."""
        if self.kind != "sparse":
            return self.values
        out = np.zeros((self.num_samples, self.dim), dtype=self.values.dtype)
        rows = np.repeat(np.arange(self.num_samples), np.diff(self.sample_offsets))
        np.add.at(out, (rows, self.indices), self.values)
        return out

    def padded(self, pad_value: float = 0.0) -> Tuple[np.ndarray, np.ndarray]:
        """``(data [num_sequences, max_len, dim], mask [num_sequences, max_len])``: sequences
        padded to the longest; ``mask`` is True on real samples. A copy."""
        lens = np.diff(self.sequence_offsets)
        n, longest = len(lens), int(lens.max()) if len(lens) else 0
        values = self.dense()
        data = np.full((n, longest, self.dim), pad_value, dtype=values.dtype)
        mask = np.arange(longest)[None, :] < lens[:, None]
        data[mask] = values
        return data, mask

    def _dump_values(self, v: np.ndarray) -> list:
        if v.dtype == np.float32:
            # The shortest decimal that round-trips float32 (as `dump` prints), read as a double.
            return [float(str(x)) for x in v]
        return v.tolist()

    def to_dump(self) -> dict:
        """This stream as in a ``minibatchd dump`` line."""
        seqs = []
        so = self.sequence_offsets.tolist()
        if self.kind == "strings":
            # As `dump` writes them: UTF-8 as a string, other bytes as {"hex": ...}.
            texts = []
            for b in self.byte_strings():
                try:
                    texts.append(b.decode("utf-8"))
                except UnicodeDecodeError:
                    texts.append({"hex": b.hex()})
            for q in range(len(so) - 1):
                seqs.append(texts[so[q] : so[q + 1]])
        elif self.kind == "sparse":
            offs = self.sample_offsets.tolist()
            idx = self.indices.tolist()
            vals = self._dump_values(self.values)
            for q in range(len(so) - 1):
                seqs.append([{"indices": idx[offs[j] : offs[j + 1]], "values": vals[offs[j] : offs[j + 1]]} for j in range(so[q], so[q + 1])])
        else:
            vals = self._dump_values(self.values.reshape(-1))
            d = self.dim
            for q in range(len(so) - 1):
                seqs.append([vals[j * d : (j + 1) * d] for j in range(so[q], so[q + 1])])
        return {"num_samples": self.num_samples, "num_sequences": self.num_sequences, "sequences": seqs}

    def torch(self) -> Dict[str, Any]:
        """The stream's arrays as torch tensors sharing memory with the slot (read-only data:
        do not write to them)."""
        import warnings

        import torch

        out = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
            for key in STREAM_ARRAYS:
                arr = getattr(self, key)
                if arr is not None:
                    out[key] = torch.from_numpy(arr)
        return out


class Minibatch:
    """One minibatch: ``mb[name]`` is a ``Stream``. Holds a lease on its slot until every view is
    gone or ``release()`` is called."""


    def __init__(self, source: Source, owner: np.ndarray, ref: Any, index: int, sweep: int, end_of_sweep: bool, position: int,
                 specs: list, fingerprint: int = 0):
        self._owner = owner
        self._release = (source._releaser, ref)
        self.index = index
        self.sweep = sweep
        self.end_of_sweep = end_of_sweep
        self.position = position
        # A mixture's minibatch: the source (index into ``Source.mixture_sources``) of each
        # sequence (an int32 array), and the sources that completed a sweep in it. None for a
        # dataset's.
        self.sources: Optional[np.ndarray] = None
        self.sweeps_ended: Optional[List[int]] = None
        # A mixture's minibatch: the mixture's state after it (its slot's ``mixture/state``).
        self._mixture_state: Optional[dict] = None
        self._fingerprint = fingerprint
        # The slot's tensor table as (shape, dtype, offset); None once released.
        self._specs: Optional[list] = specs
        self._layout = source._where
        self._streams: Dict[str, Stream] = {}

    def __getitem__(self, name: str) -> Stream:
        # Streams, and their arrays, are built when first asked for: a trainer often reads only
        # some of them.
        stream = self._streams.get(name)
        if stream is None:
            info, k, count = self._layout[name]
            if self._specs is None:
                raise KeyError(name)
            stream = self._streams[name] = Stream(info, self._owner, self._specs[k : k + count])
        return stream

    @property
    def streams(self) -> Dict[str, Stream]:
        """Every stream, by name (empty after ``release()``)."""
        if self._specs is not None:
            for name in self._layout:
                self[name]
        return self._streams

    def __contains__(self, name: str) -> bool:
        return name in self._layout and self._specs is not None

    def keys(self):
        return self.streams.keys()

    @property
    def num_samples(self) -> Dict[str, int]:
        return {n: s.num_samples for n, s in self.streams.items()}

    def release(self) -> None:
        """Gives the slot back now. Arrays obtained from this minibatch must not be used after."""
        releaser, ref = self._release
        releaser(ref)
        self._streams = {}
        self._specs = None
        self._owner = None

    @property
    def fingerprint(self) -> str:
        """The data-order ledger fingerprint: 16 hex digits that name which sequences this
        minibatch holds, in which order, from which sweep (``minibatchd dump`` prints the same;
        ``"0" * 16`` from a daemon that does not write it). Kept after ``release()``."""
        return f"{self._fingerprint:016x}"

    def ledger_entry(self) -> dict:
        """What a trainer records per step to check its data order later (``minibatchd.ledger``)."""
        return {"minibatch": self.index, "sweep": self.sweep, "position": self.position, "fingerprint": self.fingerprint}

    def to_dump(self) -> dict:
        """The same object ``json.loads`` gives for this minibatch's ``minibatchd dump`` line (a
        mixture's: the line of ``minibatchd dump --mixture``, ``docs/mixtures.md``)."""
        state = self._mixture_state
        if state is not None and self.sources is not None:
            return {
                "minibatch": self.index,
                "step": state["step"] - 1,
                "sweeps_ended": list(self.sweeps_ended or []),
                "fingerprint": self.fingerprint,
                "sources": self.sources.tolist(),
                "streams": {n: s.to_dump() for n, s in self.streams.items()},
                "state": dict(state, sources=[dict(source) for source in state["sources"]]),
            }
        return {
            "minibatch": self.index,
            "sweep": self.sweep,
            "end_of_sweep": self.end_of_sweep,
            "position": self.position,
            "fingerprint": self.fingerprint,
            "streams": {n: s.to_dump() for n, s in self.streams.items()},
        }

    def to_torch(self) -> Dict[str, Dict[str, Any]]:
        """Every stream's arrays as torch tensors (zero-copy; see ``Stream.torch``)."""
        return {n: s.torch() for n, s in self.streams.items()}
