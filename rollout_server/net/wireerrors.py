"""How far a failed exchange got: the exception types of the project's HTTP clients.

:mod:`rollout_server.net.wire` raises them, and so do the rollout client's calls on either of
its paths (the lean pool, or httpx, whose failures
:func:`~rollout_server.net.httpclient.send_whole` translates), so a caller decides on one
vocabulary whether to send again:

- :class:`NotSent` (:class:`ConnectFailed`, :class:`ConnectTimeout`): no byte of the request
  was written, so sending it again cannot make the server act twice;
- :class:`ReadTimeout`: the server was too slow;
- :class:`ConnectionLost` (:class:`WriteFailed`, :class:`ReadFailed`, :class:`BadAnswer`): an
  open connection failed, and the server may have acted on the request;
- :class:`LocalFailure`: the request could not be made at all on this side; sending it again
  fails the same way.
"""

from __future__ import annotations

from typing import Final

import trio

__all__ = [
    "DROPPED",
    "BadAnswer",
    "ConnectFailed",
    "ConnectTimeout",
    "ConnectionLost",
    "LocalFailure",
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
    """An open connection failed: reset or closed, or the answer was not valid HTTP/1.1
    (:class:`BadAnswer`)."""


class WriteFailed(ConnectionLost):
    """Writing the request failed (part of it may have left)."""


class ReadFailed(ConnectionLost):
    """Reading the answer failed at the socket (reset, broken pipe)."""


class BadAnswer(ConnectionLost):
    """No whole, valid HTTP/1.1 answer came: a malformed one, or the server closed the
    connection before its end (or before it began)."""


class LocalFailure(WireError):
    """The request could not be made on this side (a header HTTP/1.1 cannot carry, a URL
    scheme or proxy the client cannot use): the server played no part."""


def detail(exc: BaseException) -> str:
    """The message of ``exc``, or its type's name when it has none."""
    return str(exc) or type(exc).__name__
