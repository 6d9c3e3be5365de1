"""PyTorch helpers: an ``IterableDataset`` over a minibatchd session.

Each item is one minibatch as ``{stream: {"values": tensor, "sequence_offsets": tensor, ...}}``
(see ``Stream.torch``). Use it with ``DataLoader(ds, batch_size=None)``: the daemon already
batches. By default the tensors are copied out of shared memory (``copy=True``) so the slot goes
back at once; ``copy=False`` yields zero-copy tensors that hold the slot while they live.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch
from torch.utils.data import IterableDataset

from ._client import connect


class MinibatchIterableDataset(IterableDataset):
    """Streams minibatches of ``dataset`` from the daemon at ``socket``.

    ``use_torchrun_env`` (default True) takes ``rank``/``num_workers`` from ``RANK``/``WORLD_SIZE``.
    ``state()`` gives the state after the last minibatch yielded (for checkpoints);
    ``resume=`` in the options continues from one."""

    def __init__(self, dataset: str, socket: Optional[str] = None, *, copy: bool = True, use_torchrun_env: bool = True, **options: Any):
        super().__init__()
        self.dataset = dataset
        self.socket = socket
        self.copy = copy
        self.use_torchrun_env = use_torchrun_env
        self.options = options
        self._source = None

    def __iter__(self) -> Iterator[Dict[str, Dict[str, torch.Tensor]]]:
        client = connect(self.socket)
        self._source = client.open(self.dataset, use_torchrun_env=self.use_torchrun_env, **self.options)
        try:
            for mb in self._source:
                item = mb.to_torch()
                if self.copy:
                    item = {s: {k: t.clone() for k, t in d.items()} for s, d in item.items()}
                    mb.release()
                yield item
        finally:
            self._source.close()

    def state(self) -> Optional[dict]:
        return None if self._source is None else self._source.state()
