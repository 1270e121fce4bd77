"""The rollout client's lean pool: :mod:`rollout_server.net.wire` for one plain-HTTP origin,
answers read whole, failures raised as httpx's exceptions.

The rollout client makes two small calls per rollout (an admission and a long-poll). Through
``httpx.AsyncClient`` each one costs more CPU in the client than in the server: URL and header
objects, the auth and redirect flow, cookies, the response wrapper, httpcore's pool.
:class:`H1Pool` sends them through the project's lean client instead (one keep-alive connection
per call in flight, idle ones reused last-in first-out, an idle connection the server has
closed dropped before reuse as httpcore does; no retries here) and bounds each call as a
whole, connecting aside.

Failures are raised as the httpx exceptions the same failure raises through httpx, so a caller
handles both clients alike: ``ConnectError`` and ``ConnectTimeout`` only when connecting failed
(:class:`~rollout_server.net.wire.NotSent`: not one byte of the request was written, which the
rollout client relies on to send an admission again), ``WriteError`` and ``ReadError`` for a
connection that failed later, ``ReadTimeout`` when the answer did not arrive in time, and
``RemoteProtocolError`` for an answer that is not valid HTTP/1.1 or never came.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf
from typing import TYPE_CHECKING

import h11
import trio

from .wire import (
    ConnectFailed,
    ConnectTimeout,
    Origin,
    ReadFailed,
    ReadTimeout,
    WireError,
    WirePool,
    WriteFailed,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["H1Pool", "H1Reply"]


class H1Reply:
    """A whole answer: ``status_code``, ``headers`` (names in lower case) and ``content``."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], content: bytes):
        self.status_code = status_code
        self.headers = headers
        self.content = content

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), or ``None``."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


def _as_httpx(exc: WireError) -> httpx.TransportError:
    """The httpx exception for ``exc``; only a failure to connect becomes a connect error."""
    # Imported on failure only: the SDK's chat() reaches its loopback bridge through this pool
    # in a server that need not import httpx otherwise (about 30 ms of CPU at its start).
    import httpx

    cause = exc.__cause__
    detail = (str(cause) or type(cause).__name__) if cause is not None else str(exc)
    if isinstance(exc, ConnectTimeout):
        return httpx.ConnectTimeout("timed out connecting")
    if isinstance(exc, ConnectFailed):
        return httpx.ConnectError(detail)
    if isinstance(exc, WriteFailed):
        return httpx.WriteError(detail)
    if isinstance(exc, ReadFailed):
        return httpx.ReadError(detail)
    if isinstance(exc, ReadTimeout):
        return httpx.ReadTimeout(detail)
    return httpx.RemoteProtocolError(detail)


class H1Pool:
    """Keep-alive connections to ``host:port``; each :meth:`request` uses one of its own."""

    def __init__(self, host: str, port: int) -> None:
        self._origin = Origin("http", host, port)
        # Bounds are per call (``request``); idle connections are kept as long as they last.
        self._wire = WirePool(keepalive_expiry=inf, max_idle=inf, decompress=False)
        self._closed = False

    async def aclose(self) -> None:
        """Close every idle connection; calls still in flight close theirs when they end."""
        self._closed = True
        await self._wire.aclose()

    async def request(
        self,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]] = (),
        body: bytes = b"",
        *,
        total_sec: float = inf,
        connect_sec: float = inf,
    ) -> H1Reply:
        """Send one request and read the whole answer, within ``total_sec`` seconds in all
        (connecting, when no idle connection can be reused, within ``connect_sec`` before)."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        wire, origin = self._wire, self._origin
        connection = wire.idle(origin)
        if connection is None:
            try:
                connection = await wire.connect(origin, connect_sec)
            except WireError as exc:
                raise _as_httpx(exc) from exc
        try:
            # A cancel scope of our own rather than ``fail_after``: this is the hot path.
            with trio.CancelScope(deadline=trio.current_time() + total_sec) as bound:
                # ``send`` closes the connection when it fails; ``read`` leaves that to us.
                response = await wire.send(connection, origin, method, target, headers, body)
                try:
                    content = await response.read()
                except BaseException:
                    response.discard()
                    raise
        except WireError as exc:
            raise _as_httpx(exc) from exc
        except h11.ProtocolError as exc:
            import httpx

            raise httpx.RemoteProtocolError(str(exc)) from exc
        if bound.cancelled_caught:
            import httpx

            raise httpx.ReadTimeout("timed out waiting for the answer")
        fields = response.raw_headers
        return H1Reply(response.status, fields if type(fields) is list else list(fields), content)
