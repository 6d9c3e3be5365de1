"""JAX: epochs of minibatches as ``jax.Array``s, with the same order, split and resume story as
the PyTorch adapter.

Each pass over a ``MinibatchIterator`` is one epoch, and epoch ``k`` is sweep ``k`` of the CNTK
timeline (``set_epoch(k)`` picks it; later passes continue). With several JAX processes
(``jax.process_count()`` > 1, or ``process_count=``), process ``p`` reads CNTK worker ``p``'s
share, every process gets the same number of minibatches per epoch (``equal_steps``, on by
default then), and over all processes each sweep comes exactly once (less the dropped ragged
tail). Each item is ``{stream: {"values": jax.Array, "sequence_offsets": jax.Array, ...},
"meta": {"epoch", "sweep", "end_of_sweep", "position", "index", "worker", "workers"}}``: the
arrays are copied to the default device, and the shared-memory slot goes back once the copies
are complete (a transfer still reading the slot when the daemon refills it would be other data).

JAX keeps 32-bit types unless ``jax_enable_x64`` is on: then the offsets are int32 (they always
fit), but 64-bit values — a ``precision = "float64"`` dataset's values, deepx's uint64 feature
ids — would be narrowed, which changes them; the iterator raises ``MinibatchdError``
(``client_jax_x64``) rather than deliver them, saying to enable x64.

``state_dict()`` after a minibatch, and ``load_state_dict()`` before the next pass, resume
mid-epoch exactly (save it with the model, e.g. with orbax or pickle).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import jax
import jax.numpy as jnp

from ._adapter import user_options
from ._client import MinibatchdError, connect

META = "meta"


def _fits_32(key: str, arr: Any) -> bool:
    """Whether a 64-bit array of a minibatch keeps its values in JAX's 32-bit types: offsets
    (counts within one slot) do; values and feature ids are not narrowed at all."""
    if not key.endswith("offsets") or arr.dtype.kind not in "iu":
        return False
    return arr.size == 0 or int(arr.max()) < 2**31


class MinibatchIterator:
    """Minibatches of ``dataset`` from the daemon at ``socket`` as ``jax.Array``s, one sweep per
    pass. ``options`` are session options (``minibatch_size`` required); the epoch limit and the
    split over processes are the iterator's own."""

    def __init__(self, dataset: str, socket: Optional[str] = None, *, process_index: Optional[int] = None,
                 process_count: Optional[int] = None, equal_steps: Optional[bool] = None, **options: Any):
        options = user_options(options, "MinibatchIterator", "over processes: process_index=/process_count=")
        self.dataset = dataset
        self.socket = socket
        self.process_index = jax.process_index() if process_index is None else process_index
        self.process_count = jax.process_count() if process_count is None else process_count
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process {self.process_index} is out of range for {self.process_count} process(es)")
        self.equal_steps = self.process_count > 1 if equal_steps is None else equal_steps
        self._resume: Optional[dict] = options.pop("resume", None)
        self.options = options
        self._epoch = 0
        self._current: Optional[int] = None
        self._source = None
        # A state loaded after a complete pass: (its epoch, the state). `set_epoch` of that very
        # epoch makes the next pass its rest, empty, as the PyTorch adapter does.
        self._finished: Optional[tuple] = None
        # That empty pass, pending: the state it stands at.
        self._empty_pass: Optional[dict] = None

    def set_epoch(self, epoch: int) -> None:
        """The next pass delivers sweep ``epoch``; the passes after it continue from there. After
        ``load_state_dict``, ``set_epoch`` of the saved epoch keeps the resume; of another epoch,
        drops it (as the PyTorch adapter's ``set_epoch``)."""
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        finished, self._finished = self._finished, None
        self._empty_pass = None
        if finished is not None and finished[0] == epoch:
            # A loop that counts from the saved epoch, saved once its pass was complete (found by
            # a probe: the epoch came again whole, where the PyTorch adapter gives its rest, none).
            self._resume, self._empty_pass, self._epoch = None, finished[1], epoch + 1
            return
        # Found by a probe: a pending resume overrode the epoch set after it, so a loop resumed
        # "from the next epoch" got the rest of the saved one (none, or the wrong epoch's data
        # labelled as it) and never the epoch it asked for.
        if self._resume is not None and int(self._resume.get("epoch", 0)) != epoch:
            self._resume = None
        self._epoch = epoch

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._empty_pass is not None:
            # The rest of an epoch saved complete: nothing; the next pass is the epoch after.
            self._empty_pass = None
            return
        resume, self._resume = self._resume, None
        if resume is not None:
            # A mixture's state is the same on every process after the same step: any process's
            # resumes any process, at any process count (docs/mixtures.md).
            mixture = isinstance(resume.get("source"), dict) and "mixture" in resume["source"]
            if not mixture and (resume.get("worker"), resume.get("workers")) != (self.process_index, self.process_count):
                raise ValueError(f"this state belongs to process {resume.get('worker')} of {resume.get('workers')}")
            self._epoch = int(resume["epoch"])
        epoch = self._epoch
        options = dict(self.options, sweep=epoch, num_workers=self.process_count, rank=self.process_index)
        if self.equal_steps:
            options["equal_steps"] = True
        else:
            options.pop("tail", None)  # tail only shapes equal steps: one script serves 1 and N processes
        if resume is not None and resume.get("source") is not None:
            options["resume"] = resume["source"]
        try:
            source = connect(self.socket).open(self.dataset, **options)
        except BaseException:
            # No pass began (the daemon not running, a Ctrl-C during the open): the next is this
            # one again, and state_dict() still says so. Found by a probe: the epoch counted as
            # begun, and a checkpoint saved in the handler named it finished.
            self._resume = resume
            raise
        self._source, self._current = source, epoch
        self._epoch = epoch + 1
        try:
            while True:
                # An exception while an item is made takes its minibatch back (Source._next_made).
                item = source._next_made(lambda mb: self._item(mb, epoch))
                if item is None:
                    return
                yield item
        finally:
            source.close()

    def _item(self, mb: Any, epoch: int) -> Dict[str, Any]:
        """The item of minibatch ``mb`` in ``epoch``: its arrays on the device, its metadata."""
        item: Dict[str, Any] = {}
        x64 = bool(jax.config.jax_enable_x64)
        for name, stream in mb.streams.items():
            if name == META:
                raise ValueError(f"a stream is named {META!r}, which the JAX adapter uses for metadata")
            arrays = {}
            for key, arr in stream.arrays():
                if not x64 and arr.dtype.itemsize == 8 and not _fits_32(key, arr):
                    mb.release()
                    # Found by a probe: jnp.asarray narrowed uint64 feature ids (2^40 + 125 became
                    # 125) and float64 values to 32 bits without a word.
                    raise MinibatchdError(
                        "client_jax_x64", f"stream {name!r} holds {arr.dtype} {key}, which JAX would narrow to 32 bits "
                        "(changing them) while jax_enable_x64 is off: enable it before iterating "
                        "(jax.config.update('jax_enable_x64', True), or JAX_ENABLE_X64=1)")
                arrays[key] = jnp.asarray(arr)
            item[name] = arrays
        # The copies may still be in flight (an accelerator's transfer from the slot): the slot
        # goes back only once they are done.
        jax.block_until_ready(item)
        meta = {"epoch": epoch, "sweep": mb.sweep, "end_of_sweep": mb.end_of_sweep, "position": mb.position,
                "fingerprint": mb.fingerprint,
                "index": mb.index, "worker": self.process_index, "workers": self.process_count}
        if mb.sources is not None:
            meta["sources"], meta["sweeps_ended"] = mb.sources.tolist(), mb.sweeps_ended
        mb.release()
        item[META] = meta
        return item

    def state_dict(self) -> Dict[str, Any]:
        """The position after the last minibatch yielded: the epoch and the session state (a
        fresh epoch when no minibatch of it was taken yet); after ``load_state_dict`` and before
        the restored pass's first minibatch, the state loaded."""
        if self._resume is not None:
            # Restored, no pass begun from it yet (found by a probe: the state said epoch 0, and a
            # resume from it repeated every epoch since).
            return dict(self._resume)
        if self._empty_pass is not None:
            return dict(self._empty_pass)
        if self._finished is not None:
            # A state of a complete pass, restored (found by a probe: saved again before the next
            # pass, it lost `finished`, and a loop counting from the saved epoch read it again).
            return dict(self._finished[1])
        source = None if self._source is None else self._source.state()
        epoch = self._current if self._current is not None else self._epoch
        state = {"epoch": epoch, "source": source, "worker": self.process_index, "workers": self.process_count}
        if self._source is not None and getattr(self._source, "_ended", False):
            # The pass is complete: the next one starts fresh, and `finished` names the epoch done.
            state.update(epoch=epoch + 1, source=None, finished=epoch)
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next pass continues from ``state``: the rest of its epoch, then the next ones."""
        if state.get("source") is None:
            self.set_epoch(int(state.get("epoch", 0)))
            if state.get("finished") is not None:
                self._finished = (int(state["finished"]), dict(state))
        else:
            self._finished = self._empty_pass = None
            self._resume = dict(state)
