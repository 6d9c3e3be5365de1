"""Client for the minibatchd daemon (protocol version 2, falls back to 1 for older daemons).

``connect()`` → ``Client``; ``client.open(dataset, **options)`` → ``Source`` (iterable of
``Minibatch``); ``mb[stream]`` → ``Stream`` with zero-copy NumPy views on the shared-memory slot.
``minibatchd.torch`` adapts sessions to PyTorch. Linux only: the ring is a memfd passed over a
Unix socket (``SCM_RIGHTS``). See this package's README.md; the protocol and the slot layout are
in the daemon repository's docs/daemon.md.
"""

from ._client import (
    DEFAULT_SOCKET,
    PROTOCOL_VERSION,
    Client,
    DaemonNotRunning,
    Minibatch,
    MinibatchdError,
    MinibatchdWarning,
    Source,
    Stream,
    connect,
    torchrun_env,
)

__all__ = [
    "DEFAULT_SOCKET",
    "PROTOCOL_VERSION",
    "Client",
    "DaemonNotRunning",
    "Minibatch",
    "MinibatchdError",
    "MinibatchdWarning",
    "Source",
    "Stream",
    "connect",
    "torchrun_env",
]
__version__ = "0.1.0"
