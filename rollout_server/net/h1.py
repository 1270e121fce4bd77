"""A lean HTTP/1.1 connection loop: the app runs in the connection's task.

Hypercorn serves every request through several layers: a stream object, an event object per
step (request, response, body, end, closed), a memory channel and a new task for the app, a
lock and a shielded cancel scope around every write, and a ``fail_after`` around every read.
For a server whose requests are small and answered whole (the rollout server: an admission, a
long-poll, a health check) those layers cost more CPU than the answer. :func:`serve_h1` drops
them: one loop per connection reads a request, calls the app directly, and writes each answer
in one ``send_all``. Plain requests and answers (nearly all of them) are read and written by
:mod:`~rollout_server.net.fastparse`, with h11's results but without h11's per-request cost;
every request it declines (anything unusual or malformed: ``Expect: 100-continue``, chunked
bodies, HTTP/1.0, HEAD, a head too long, ...) goes, with the bytes buffered so far, to a fresh
h11 connection for that request's cycle, so h11 still decides parsing, framing, keep-alive and
errors wherever the fast path is not sure.

What changes for an app: it runs in the task that reads the connection, so the connection is
not read while the app works. An app that calls ``receive()`` after the request body still gets
``http.disconnect`` when the client goes away (the loop reads then); one that never does notices
a vanished client only when its answer cannot be written (the write error is swallowed, as
hypercorn does, and the connection closed). HTTP/1.1 clients do not send a new request before
the answer to the previous one, so nothing else is lost. TLS connections, HTTP/2 and
WebSocket upgrades are not served here: :class:`~rollout_server.net.httpserve.LeanConfig`
servers hand TLS connections to hypercorn as usual, and answer upgrade requests as plain
HTTP/1.1 (the rollout protocol has none).

Idle keep-alive connections close after ``keep_alive_timeout`` and at once when the server
shuts down (the caller's idle timer); a request in progress at shutdown gets to finish within
the graceful timeout, after which the caller cancels the connection's task. The callers are
hypercorn's trio worker (:mod:`~rollout_server.net.httpserve`) and
:func:`~rollout_server.net.leanserve.serve_lean`, which needs no hypercorn worker at all.
"""

from __future__ import annotations

import socket as _socket
from collections.abc import Awaitable, Callable
from math import inf
from typing import TYPE_CHECKING, Any, Final

import h11
import trio

from .fastparse import DECLINED, Request, parse_request, response_head
from .h1exchange import CLOSE, DATE, Broken, Exchange, TimedOut
from .limits import MAX_RECV, Limits

if TYPE_CHECKING:
    # Types only: hypercorn.typing imports h2 (and hypercorn.utils imports hypercorn.typing).
    from hypercorn.config import Config
    from hypercorn.typing import AppWrapper

__all__ = ["serve_h1"]

_DROPPED: Final = (trio.BrokenResourceError, trio.ClosedResourceError)


class _Connection:
    __slots__ = (
        "broken",
        "buffer",
        "config",
        "conn",
        "eof",
        "limit",
        "limits",
        "max_requests",
        "on_busy",
        "on_idle",
        "read_timeout",
        "requests",
        "stream",
        "timed_out",
    )

    def __init__(
        self,
        config: Config,
        stream: trio.SocketStream,
        on_idle: Callable[[], Awaitable[None]],
        on_busy: Callable[[], Awaitable[None]],
    ) -> None:
        self.config = config
        self.stream = stream
        # None while the fast path reads the connection (its bytes in ``buffer``, ``eof`` once
        # the client has half-closed); an h11 connection from the first request it declines
        # until that request's cycle is over.
        self.conn: h11.Connection | None = None
        self.buffer = bytearray()
        self.eof = False
        self.limits: Limits = getattr(config, "limits", None) or Limits()
        self.limit = self.limits.max_head
        self.on_idle = on_idle
        self.on_busy = on_busy
        self.read_timeout = config.read_timeout or inf
        self.max_requests = config.keep_alive_max_requests
        self.requests = 0
        self.broken = False
        self.timed_out = False

    async def read(self, deadline: float = inf) -> bool:
        """Buffer the next bytes (or feed them, ``b""`` at end of stream, to h11); False at end
        of stream. :class:`Broken` on errors, :class:`TimedOut` past ``deadline`` (a trio
        clock time) or after ``read_timeout``."""
        if self.read_timeout != inf:
            deadline = min(deadline, trio.current_time() + self.read_timeout)
        try:
            if deadline == inf:
                data = await self.stream.receive_some(MAX_RECV)
            else:
                with trio.fail_at(deadline):
                    data = await self.stream.receive_some(MAX_RECV)
        except _DROPPED:
            raise Broken from None
        except trio.TooSlowError:
            self.timed_out = True
            raise TimedOut from None
        if self.conn is not None:
            self.conn.receive_data(bytes(data))
        elif data:
            self.buffer += data
        else:
            self.eof = True
        return bool(data)

    def _to_h11(self) -> None:
        """Hand what the fast path has buffered (and the end of stream) to a fresh h11."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limit)
        conn.receive_data(bytes(self.buffer))
        if self.eof:
            conn.receive_data(b"")
        self.buffer = bytearray()
        self.conn = conn

    def _from_h11(self, conn: h11.Connection) -> None:
        """Back to the fast path for the next request, with what h11 has buffered."""
        data, self.eof = conn.trailing_data
        self.buffer = bytearray(data)
        self.conn = None

    async def write(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            await self.stream.send_all(data)
        except _DROPPED:
            self.broken = True

    async def next_event(self, conn: h11.Connection, deadline: float | None = None) -> Any:
        """The next h11 event, reading as needed; never ``NEED_DATA``. Each read waits until
        ``deadline``, or :attr:`Limits.body_read_timeout` when it is ``None``."""
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if deadline is None:
                await self.read(trio.current_time() + self.limits.body_read_timeout)
            else:
                await self.read(deadline)

    def pending(self) -> int:
        """Bytes buffered past what has been parsed."""
        if self.conn is None:
            return len(self.buffer)
        return len(self.conn.trailing_data[0])

    async def _next_request(self) -> h11.Request | Request | None:
        """The next request, or ``None`` when the connection is over (a 400, 408 or 431 sent).

        The head must be whole within :attr:`Limits.head_timeout` of its first byte (waiting
        for that byte is the idle watch's business)."""
        deadline = inf
        if self.conn is None:
            while True:
                if self.buffer:
                    if deadline == inf:
                        deadline = trio.current_time() + self.limits.head_timeout
                    parsed = parse_request(self.buffer, self.limit)
                    if type(parsed) is Request:
                        if (
                            len(parsed.headers) > self.limits.max_headers
                            or len(parsed.head) + 4 > self.limit
                        ):
                            await self.refuse(431)
                            return None
                        return parsed
                    if parsed == DECLINED or self.eof:
                        break
                elif self.eof:
                    return None  # h11's ConnectionClosed
                try:
                    await self.read(deadline)
                except TimedOut:
                    await self.refuse(408)
                    return None
            self._to_h11()
        conn = self.conn
        assert conn is not None
        if deadline == inf:
            deadline = trio.current_time() + self.limits.head_timeout
        try:
            event = await self.next_event(conn, deadline)
        except h11.RemoteProtocolError as error:
            if conn.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                await self.error(conn, error.error_status_hint)
            return None
        except TimedOut:
            if conn.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                await self.error(conn, 408)
            return None
        if type(event) is h11.Request and (
            len(event.headers) > self.limits.max_headers
            # h11 bounds an incomplete head only; this is the complete head's size, near enough.
            or len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers) > self.limit
        ):
            await self.error(conn, 431)
            return None
        # ConnectionClosed (or PAUSED after an answer that must close) ends the connection.
        return event if type(event) is h11.Request else None

    async def refuse(self, status: int) -> None:
        """Answer ``status`` with an empty body and ``Connection: close`` (the caller closes)."""
        head = response_head(status, [(b"content-length", b"0"), CLOSE, DATE.header()], True)
        assert head is not None
        await self.write(head[0])

    async def serve(self, app: AppWrapper, client: Any, server: Any, state: Any) -> None:
        idle = True
        while True:
            try:
                if idle and not (self.buffer if self.conn is None else self.conn.trailing_data[0]):
                    await self.on_idle()
                request = await self._next_request()
            except Broken:
                return
            if request is None:
                return
            if idle:
                await self.on_busy()
                idle = False
            self.requests += 1
            exchange = Exchange(self, request)
            try:
                await app(
                    exchange.scope(client, server, state),
                    exchange.receive,
                    exchange.send,
                    trio.to_thread.run_sync,
                    trio.from_thread.run,
                )
            except Broken:
                return
            except Exception:
                await self.config.log.exception("Error in ASGI Framework")
                if not exchange.started:
                    await exchange.send_error(408 if self.timed_out else 500)
                    return
            if not exchange.started:
                await exchange.send_error(408 if self.timed_out else 500)
                return
            if self.broken or not exchange.answered_keeping_open():
                return
            try:
                if not await exchange.finish_request():
                    return
            except (h11.RemoteProtocolError, Broken):
                return
            conn = self.conn
            if conn is not None:
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return
                self._from_h11(conn)
            idle = True

    async def error(self, conn: h11.Connection, status: int) -> None:
        try:
            data = conn.send(
                h11.Response(
                    status_code=status,
                    headers=[(b"content-length", b"0"), CLOSE, DATE.header()],
                )
            )
            data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            return
        await self.write(data)


async def serve_h1(
    app: AppWrapper,
    config: Config,
    stream: trio.SocketStream,
    state: Any,
    *,
    on_idle: Callable[[], Awaitable[None]],
    on_busy: Callable[[], Awaitable[None]],
) -> None:
    """Serve HTTP/1.1 requests on ``stream`` until the client or the answer ends the connection.

    ``on_idle``/``on_busy`` are awaited when the connection starts and stops waiting for a
    request (the idle timer's ``restart``/``stop``). The caller closes ``stream``.
    """
    socket = stream.socket
    client = _socket_addr(socket.family, socket.getpeername())
    server = _socket_addr(socket.family, socket.getsockname())
    await _Connection(config, stream, on_idle, on_busy).serve(app, client, server, state)


def _socket_addr(family: int, address: Any) -> tuple[str, int] | None:
    """An ASGI ``client``/``server`` value: (host, port) for IP sockets, else ``None``."""
    if family in (_socket.AF_INET, _socket.AF_INET6):
        return (address[0], address[1])
    return None
