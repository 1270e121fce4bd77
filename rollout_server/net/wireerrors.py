"""How far a failed exchange of :mod:`rollout_server.net.wire` got: its exception types.

Only :class:`NotSent` (:class:`ConnectFailed`, :class:`ConnectTimeout`) means no byte of the
request was written, so sending it again cannot make the server act twice.
"""

from __future__ import annotations

from typing import Final

import trio

__all__ = [
    "DROPPED",
    "ConnectFailed",
    "ConnectTimeout",
    "ConnectionLost",
    "NotSent",
    "ReadFailed",
    "ReadTimeout",
    "WireError",
    "WriteFailed",
    "detail",
]

DROPPED: Final = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
"""What a socket raises when the connection under it fails."""


class WireError(Exception):
    """An exchange failed; ``before_answer`` when no byte of the answer had arrived."""

    def __init__(self, message: str, *, before_answer: bool) -> None:
        super().__init__(message)
        self.before_answer = before_answer


class NotSent(WireError):
    """Connecting failed: not one byte of the request was written."""


class ConnectFailed(NotSent):
    """The connection (or its TLS handshake) could not be set up."""


class ConnectTimeout(NotSent):
    """The connection (or its TLS handshake) was not up within the connect timeout."""


class ReadTimeout(WireError):
    """A read or a write made no progress within its timeout."""


class ConnectionLost(WireError):
    """An open connection failed: reset or closed, or the answer was not valid HTTP/1.1."""


class WriteFailed(ConnectionLost):
    """Writing the request failed (part of it may have left)."""


class ReadFailed(ConnectionLost):
    """Reading the answer failed at the socket (reset, broken pipe)."""


def detail(exc: BaseException) -> str:
    """The message of ``exc``, or its type's name when it has none."""
    return str(exc) or type(exc).__name__
