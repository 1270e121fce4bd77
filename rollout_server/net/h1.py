"""A lean HTTP/1.1 connection loop: the app runs in the connection's task.

Hypercorn serves every request through several layers: a stream object, an event object per
step (request, response, body, end, closed), a memory channel and a new task for the app, a
lock and a shielded cancel scope around every write, and a ``fail_after`` around every read.
For a server whose requests are small and answered whole (the rollout server: an admission, a
long-poll, a health check) those layers cost more CPU than the answer. :func:`serve_h1` keeps
h11 for the protocol itself (parsing, framing, keep-alive, ``Expect: 100-continue``, errors) and
drops the rest: one loop per connection reads a request, calls the app directly, and writes each
answer in one ``send_all``.

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
import time
from collections.abc import Awaitable, Callable
from math import inf
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote
from wsgiref.handlers import format_date_time

import h11
import trio

if TYPE_CHECKING:
    # Types only: hypercorn.typing imports h2 (and hypercorn.utils imports hypercorn.typing).
    from hypercorn.config import Config
    from hypercorn.typing import AppWrapper, HTTPScope

__all__ = ["serve_h1"]

MAX_RECV: Final = 2**16
_DISCONNECT: Final = {"type": "http.disconnect"}
_ASGI: Final = {"spec_version": "2.1", "version": "3.0"}
_CLOSE: Final = (b"connection", b"close")
_DROPPED: Final = (trio.BrokenResourceError, trio.ClosedResourceError)


class _Date:
    """The ``date`` header value, formatted once per second instead of once per answer."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def header(self) -> tuple[bytes, bytes]:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = format_date_time(second).encode("ascii")
        return (b"date", self._value)


_DATE: Final = _Date()


class _Broken(Exception):
    """The client went away: stop serving this connection."""


class _Connection:
    __slots__ = (
        "broken",
        "config",
        "conn",
        "max_requests",
        "on_busy",
        "on_idle",
        "read_timeout",
        "requests",
        "stream",
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
        self.conn = h11.Connection(
            h11.SERVER, max_incomplete_event_size=config.h11_max_incomplete_size
        )
        self.on_idle = on_idle
        self.on_busy = on_busy
        self.read_timeout = config.read_timeout or inf
        self.max_requests = config.keep_alive_max_requests
        self.requests = 0
        self.broken = False

    async def _read(self) -> bool:
        """Feed the next bytes (``b""`` at end of stream) to h11; False at end of stream.
        :class:`_Broken` on errors."""
        try:
            if self.read_timeout == inf:
                data = await self.stream.receive_some(MAX_RECV)
            else:
                with trio.fail_after(self.read_timeout):
                    data = await self.stream.receive_some(MAX_RECV)
        except (*_DROPPED, trio.TooSlowError):
            raise _Broken from None
        self.conn.receive_data(bytes(data))
        return bool(data)

    async def _write(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            await self.stream.send_all(data)
        except _DROPPED:
            self.broken = True

    async def _next_event(self) -> Any:
        """The next h11 event, reading as needed; never ``NEED_DATA``."""
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            await self._read()

    async def serve(self, app: AppWrapper, client: Any, server: Any, state: Any) -> None:
        conn = self.conn
        idle = True
        while True:
            try:
                if idle and not conn.trailing_data[0]:
                    await self.on_idle()
                event = await self._next_event()
            except h11.RemoteProtocolError as error:
                if conn.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                    await self._error(error.error_status_hint)
                return
            except _Broken:
                return
            if type(event) is not h11.Request:
                return  # ConnectionClosed (or PAUSED after an answer that must close)
            if idle:
                await self.on_busy()
                idle = False
            self.requests += 1
            exchange = _Exchange(self, event)
            try:
                await app(
                    exchange.scope(client, server, state),
                    exchange.receive,
                    exchange.send,
                    trio.to_thread.run_sync,
                    trio.from_thread.run,
                )
            except _Broken:
                return
            except Exception:
                await self.config.log.exception("Error in ASGI Framework")
                if not exchange.started:
                    await exchange.send_error(500)
                    return
            if not exchange.started:
                await exchange.send_error(500)
                return
            if self.broken or conn.our_state is not h11.DONE:
                return
            try:
                while conn.their_state is h11.SEND_BODY:
                    await self._next_event()  # the app left part of the body unread
            except (h11.RemoteProtocolError, _Broken):
                return
            if conn.their_state is not h11.DONE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return
            idle = True

    async def _error(self, status: int) -> None:
        try:
            data = self.conn.send(
                h11.Response(
                    status_code=status,
                    headers=[(b"content-length", b"0"), _CLOSE, _DATE.header()],
                )
            )
            data = (data or b"") + (self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            return
        await self._write(data)


class _Exchange:
    """One request and its answer."""

    __slots__ = ("body_done", "connection", "head", "method", "request", "started", "suppress")

    def __init__(self, connection: _Connection, request: h11.Request) -> None:
        self.connection = connection
        self.request = request
        self.method = request.method.decode("ascii").upper()
        self.started = False
        self.head: h11.Response | None = None
        self.suppress = self.method == "HEAD"
        self.body_done = False

    def scope(self, client: Any, server: Any, state: Any) -> HTTPScope:
        target = self.request.target
        raw_path, _, query = target.partition(b"?")
        text = raw_path.decode("ascii")
        return {
            "type": "http",
            "http_version": self.request.http_version.decode(),
            "asgi": _ASGI,  # type: ignore[typeddict-item]
            "method": self.method,
            "scheme": "http",
            "path": unquote(text) if "%" in text else text,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": self.connection.config.root_path,
            "headers": list(self.request.headers),
            "client": client,
            "server": server,
            "state": state.copy(),
            "extensions": {},
        }

    async def receive(self) -> Any:
        connection = self.connection
        conn = connection.conn
        if self.body_done:
            # Nothing more to read for this request: wait for the client to go away (bytes of
            # a next request stay buffered in h11 meanwhile).
            try:
                while await connection._read():
                    pass
            except _Broken:
                pass
            return _DISCONNECT
        if conn.they_are_waiting_for_100_continue:
            data = conn.send(h11.InformationalResponse(status_code=100, headers=[_DATE.header()]))
            await connection._write(data or b"")
        try:
            event = await connection._next_event()
        except (h11.RemoteProtocolError, _Broken):
            self.body_done = True
            return _DISCONNECT
        if type(event) is h11.Data:
            return {"type": "http.request", "body": bytes(event.data), "more_body": True}
        self.body_done = True
        if type(event) is h11.EndOfMessage:
            return {"type": "http.request", "body": b"", "more_body": False}
        return _DISCONNECT

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started or self.head is not None:
                raise RuntimeError("http.response.start sent twice")
            status = int(message["status"])
            headers = [*message.get("headers", ()), _DATE.header()]
            connection = self.connection
            if connection.requests >= connection.max_requests:
                headers.append(_CLOSE)
            self.suppress = self.suppress or 100 <= status < 200 or status in (204, 304)
            self.head = h11.Response(status_code=status, headers=headers)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        conn = self.connection.conn
        parts: list[bytes] = []
        try:
            if self.head is not None:
                parts.append(conn.send(self.head) or b"")
                self.head = None
                self.started = True
            elif not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            body = message.get("body", b"")
            if body and not self.suppress:
                parts.append(conn.send(h11.Data(data=body)) or b"")
            if not message.get("more_body", False):
                parts.append(conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            self.connection.broken = True
            raise
        await self.connection._write(b"".join(parts) if len(parts) > 1 else parts[0])

    async def send_error(self, status: int) -> None:
        if self.connection.conn.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
            await self.connection._error(status)


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
