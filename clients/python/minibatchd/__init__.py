"""Client for the minibatchd daemon (protocol version 1).

``connect()`` → ``Client``; ``client.open(dataset, **options)`` → ``Source`` (iterable of
``Minibatch``); ``mb[stream]`` → ``Stream`` with zero-copy NumPy views on the shared-memory slot.
See README.md and the daemon's DESIGN (§5 protocol and slot layout, §6 sessions, §8 client).
"""

from ._client import (
    DEFAULT_SOCKET,
    PROTOCOL_VERSION,
    Client,
    Minibatch,
    MinibatchdError,
    Source,
    Stream,
    connect,
    torchrun_env,
)

__all__ = [
    "DEFAULT_SOCKET",
    "PROTOCOL_VERSION",
    "Client",
    "Minibatch",
    "MinibatchdError",
    "Source",
    "Stream",
    "connect",
    "torchrun_env",
]
__version__ = "0.1.0"
