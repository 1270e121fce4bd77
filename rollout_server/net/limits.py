"""Every bound the lean HTTP/1.1 floor puts on a client, named once.

A server that reads requests from the internet (the bridge behind a tunnel) must not let a
client decide how much memory it holds or how long it waits. These are hypercorn's kinds of
limit, applied by :mod:`rollout_server.net.h1` to every connection:

- a request head (request line and headers) longer than :data:`MAX_HEAD` bytes, or with more
  than :data:`MAX_HEADERS` header lines, is answered 431 and the connection closed;
- a head must arrive whole within :data:`HEAD_TIMEOUT` seconds of its first byte, and each
  read of a body must bring bytes within :data:`BODY_READ_TIMEOUT` seconds: a slowloris head
  or a stalled body is answered 408 (when no answer has begun) and the connection closed,
  which frees what was buffered for it;
- a connection idle between requests closes after :data:`KEEP_ALIVE_TIMEOUT` seconds;
- each write of an answer must be taken by the client within :data:`SEND_TIMEOUT` seconds
  (nginx's ``send_timeout``; the connection's watch looks at least that often, so within
  twice that): a client that stops reading (a streamed answer, or pipelined requests whose
  answers it never reads) is closed, and the app's ``receive()`` says it is gone;
- a server holds at most ``max_connections`` connections at once (by default its process's
  open-file limit less a reserve, :func:`default_max_connections`): a connection past it
  closes the one idle longest (it waits for a request, or for the rest of a head; its client
  reconnects as after a keep-alive timeout), or is closed at once when none is idle. A flood
  of idle connections then costs the server neither its accept loop (no EMFILE there, which
  trio logs ten times a second) nor the callers that are working;
- nothing past the current request is read from the socket once :data:`MAX_PENDING` bytes of
  it are buffered, until the app has answered: bytes a client pipelines (or floods) after a
  request's body wait in the kernel's buffers, not in ours;
- a request whose body the app has not read when it answers is never drained: the answer says
  ``Connection: close`` and the connection is closed, so a refused body is never read.

Per-route body caps belong to the apps (they know their routes): the rollout server's and the
bridge's are checked from ``Content-Length`` before a byte of the body is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "BODY_READ_TIMEOUT",
    "HEAD_TIMEOUT",
    "KEEP_ALIVE_TIMEOUT",
    "MAX_HEAD",
    "MAX_HEADERS",
    "MAX_PENDING",
    "MAX_RECV",
    "SEND_TIMEOUT",
    "Limits",
    "default_max_connections",
]

MAX_HEAD: Final = 16 * 1024
"""Bytes of a request head (request line, headers, blank line) before it is refused 431."""
MAX_HEADERS: Final = 100
"""Header lines in a request head before it is refused 431."""
MAX_RECV: Final = 64 * 1024
"""Bytes asked of the socket per read."""
MAX_PENDING: Final = MAX_HEAD + MAX_RECV
"""Bytes past the current request buffered before the connection stops reading."""
HEAD_TIMEOUT: Final = 30.0
"""Seconds from a request's first byte to the end of its head."""
BODY_READ_TIMEOUT: Final = 60.0
"""Seconds one read of a request body may wait for bytes."""
KEEP_ALIVE_TIMEOUT: Final = 75.0
"""Seconds an idle keep-alive connection stays open (servers may set their own)."""
SEND_TIMEOUT: Final = 60.0
"""Seconds one write of an answer may wait for the client to take its bytes."""


def default_max_connections() -> int:
    """The connections one server holds at once when its :class:`Limits` names no number:
    the process's soft open-file limit less the reserve the supervisor's budget keeps free
    for what does not grow with the rollouts in flight (a quarter of the limit, at most 256:
    launcher.fdbudget.RESERVE). The rollouts in flight are fitted below that, so the calls
    of working rollouts always fit under the cap; at least 64."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, soft - min(256, soft // 4))


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits one server applies (the module's constants unless a test or server says
    otherwise). The keep-alive timeout is the server config's ``keep_alive_timeout``."""

    max_head: int = MAX_HEAD
    max_headers: int = MAX_HEADERS
    head_timeout: float = HEAD_TIMEOUT
    body_read_timeout: float = BODY_READ_TIMEOUT
    send_timeout: float = SEND_TIMEOUT
    max_connections: int | None = None
    """None: :func:`default_max_connections`, read when the server takes its first one."""
    max_pending: int = MAX_PENDING
