"""The lean pool of the rollout client and of ``chat()``: :mod:`rollout_server.net.wire` for one
plain-HTTP origin, answers read whole as :class:`~rollout_server.net.reply.Reply`.

The rollout client makes two small calls per rollout (an admission and a long-poll). Through
``httpx.AsyncClient`` each one costs more CPU in the client than in the server: URL and header
objects, the auth and redirect flow, cookies, the response wrapper, httpcore's pool.
:class:`H1Pool` sends them through the project's lean client instead (one keep-alive connection
per call in flight, idle ones reused last-in first-out, an idle connection the server has
closed dropped before reuse as httpcore does; no retries here) and bounds each call as a
whole, connecting aside.

Failures are the :mod:`~rollout_server.net.wireerrors` types, as :class:`~.wire.WirePool`
raises them (:class:`~.wireerrors.NotSent` only when connecting failed, which the rollout
client relies on to send an admission again), plus :class:`~.wireerrors.ReadTimeout` when the
whole call ran out of time and :class:`~.wireerrors.LocalFailure` for a request HTTP/1.1
cannot carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf

import h11
import trio

from .reply import Reply
from .wire import Origin, WirePool
from .wireerrors import LocalFailure, ReadTimeout

__all__ = ["H1Pool"]


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
    ) -> Reply:
        """Send one request and read the whole answer, within ``total_sec`` seconds in all
        (connecting, when no idle connection can be reused, within ``connect_sec`` before)."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        wire, origin = self._wire, self._origin
        connection = wire.idle(origin)
        if connection is None:
            connection = await wire.connect(origin, connect_sec)
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
        except h11.LocalProtocolError as exc:
            # wire has h11 write the rare request its own writer declines.
            raise LocalFailure(str(exc), before_answer=True) from exc
        if bound.cancelled_caught:
            raise ReadTimeout("timed out waiting for the answer", before_answer=False)
        return Reply(response.status, response.raw_headers, content)
