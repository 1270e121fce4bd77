"""One request and its answer on the lean HTTP/1.1 loop (:mod:`rollout_server.net.h1`).

An :class:`Exchange` is what the app's ``receive`` and ``send`` act on. A request the fast
path read (:mod:`~rollout_server.net.fastparse`) has its body cut from the connection's buffer
as h11 would cut it, and its answer written by
:func:`~rollout_server.net.fastparse.response_head` when that answer is plain too; an unusual
answer to it is written by a throwaway h11 connection shown the same request head, so its
bytes and errors are h11's. A request h11 read is read and answered by that h11 connection.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote
from wsgiref.handlers import format_date_time

import h11
import trio

from .fastparse import Body, Request, response_head

if TYPE_CHECKING:
    from hypercorn.typing import HTTPScope

    from .h1 import _Connection

__all__ = ["CLOSE", "DATE", "Broken", "Exchange", "TimedOut"]

_DISCONNECT: Final = {"type": "http.disconnect"}
_ASGI: Final = {"spec_version": "2.1", "version": "3.0"}
CLOSE: Final = (b"connection", b"close")
# A plain request's body: being read, read to its end, cut short by the client.
_BODY: Final = "body"
_DONE: Final = "done"
_FAILED: Final = "failed"


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


DATE: Final = _Date()


class Broken(Exception):
    """The client went away: stop serving this connection."""


class TimedOut(Broken):
    """The client stalled past a read's deadline (:mod:`~rollout_server.net.limits`)."""


class Exchange:
    """One request and its answer.

    A request the fast path read (``plain``) is answered by :func:`response_head` and
    :class:`Body` when the answer is plain too, else by a throwaway h11 connection shown the
    same request head (``writer``); a request h11 read is answered by that h11 connection.
    """

    __slots__ = (
        "body",
        "body_done",
        "connection",
        "fast_head",
        "head",
        "method",
        "plain",
        "remaining",
        "request",
        "request_state",
        "started",
        "stays",
        "suppress",
        "writer",
    )

    def __init__(self, connection: _Connection, request: h11.Request | Request) -> None:
        self.connection = connection
        self.request = request
        self.plain = request if type(request) is Request else None
        self.writer = connection.conn if self.plain is None else None
        self.remaining = self.plain.length if self.plain is not None else 0
        self.request_state = _BODY
        self.method = request.method.decode("ascii").upper()
        self.started = False
        self.head: h11.Response | None = None
        self.fast_head: tuple[bytes, int, bool] | None = None
        self.body: Body | None = None
        self.stays = False
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

    async def _piece(self) -> bytes:
        """The next piece of a plain request's body as h11 cuts it (``b""``: its end)."""
        connection = self.connection
        while True:
            remaining = self.remaining
            if not remaining:
                self.request_state = _DONE
                return b""
            buffer = connection.buffer
            if buffer:
                if len(buffer) <= remaining:
                    piece = bytes(buffer)
                    buffer.clear()
                else:
                    piece = bytes(buffer[:remaining])
                    del buffer[:remaining]
                self.remaining = remaining - len(piece)
                return piece
            if connection.eof:
                self.request_state = _FAILED
                raise h11.RemoteProtocolError("peer closed connection amid the request body")
            try:
                await connection.read(trio.current_time() + connection.limits.body_read_timeout)
            except Broken:
                self.request_state = _FAILED
                raise

    async def receive(self) -> Any:
        connection = self.connection
        if self.body_done:
            # Nothing more to read for this request: wait for the client to go away. Bytes of
            # a next request stay buffered meanwhile, up to a bound; past it the connection is
            # not read until the answer is over (backpressure: the rest waits in the kernel).
            try:
                while connection.pending() < connection.limits.max_pending:
                    if not await connection.read():
                        return _DISCONNECT
            except Broken:
                return _DISCONNECT
            await trio.sleep_forever()
        conn = self.writer
        if self.plain is None and conn is not None and conn.they_are_waiting_for_100_continue:
            data = conn.send(h11.InformationalResponse(status_code=100, headers=[DATE.header()]))
            await connection.write(data or b"")
        try:
            if self.plain is not None:
                piece = await self._piece()
                if piece:
                    return {"type": "http.request", "body": piece, "more_body": True}
                self.body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            assert conn is not None
            event = await connection.next_event(conn)
        except (h11.RemoteProtocolError, Broken):
            self.body_done = True
            return _DISCONNECT
        if type(event) is h11.Data:
            return {"type": "http.request", "body": bytes(event.data), "more_body": True}
        self.body_done = True
        if type(event) is h11.EndOfMessage:
            return {"type": "http.request", "body": b"", "more_body": False}
        return _DISCONNECT

    async def finish_request(self) -> bool:
        """Read what the app left of the request body; True when the request ended cleanly."""
        if self.plain is not None:
            while self.request_state is _BODY:
                await self._piece()
            return self.request_state is _DONE
        conn = self.writer
        assert conn is not None
        while conn.their_state is h11.SEND_BODY:
            await self.connection.next_event(conn)
        return conn.their_state is h11.DONE

    def _body_pending(self) -> bool:
        """Part of the request body is still unread (answering now means closing)."""
        if self.plain is not None:
            return self.request_state is _BODY and self.remaining > 0
        conn = self.writer
        if conn is None or conn.their_state is not h11.SEND_BODY:
            return False
        for name, value in self.request.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                return True
        return False

    def answered_keeping_open(self) -> bool:
        """The answer is complete and the connection may serve another request."""
        if self.writer is not None:
            return self.writer.our_state is h11.DONE
        return self.body is not None and self.body.done and self.stays

    def _h11_writer(self) -> h11.Connection:
        """An h11 connection that has read this plain request, to write an unusual answer."""
        assert self.plain is not None
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(self.plain.head + b"\r\n\r\n")
        conn.next_event()
        self.writer = conn
        return conn

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started or self.head is not None or self.fast_head is not None:
                raise RuntimeError("http.response.start sent twice")
            status = int(message["status"])
            headers = [*message.get("headers", ()), DATE.header()]
            connection = self.connection
            if connection.requests >= connection.max_requests or self._body_pending():
                # An unread body is never drained: the answer closes the connection instead.
                headers.append(CLOSE)
            self.suppress = self.suppress or 100 <= status < 200 or status in (204, 304)
            if self.plain is not None and self.writer is None:
                self.fast_head = response_head(status, headers, self.plain.keep_alive)
                if self.fast_head is not None:
                    return
            self.head = h11.Response(status_code=status, headers=headers)
            if self.writer is None:
                self._h11_writer()
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if self.writer is None:
            await self._send_plain(message)
            return
        conn = self.writer
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
        if parts:  # an empty piece of a streamed body writes nothing
            await self.connection.write(b"".join(parts) if len(parts) > 1 else parts[0])

    async def _send_plain(self, message: Any) -> None:
        """A body message of an answer :func:`response_head` wrote the head of."""
        parts: list[bytes] = []
        if self.fast_head is not None:
            data, length, self.stays = self.fast_head
            parts.append(data)
            self.fast_head = None
            self.body = Body(length)
            self.started = True
        elif self.body is None:
            raise RuntimeError("http.response.body before http.response.start")
        body = self.body
        try:
            data = message.get("body", b"")
            if data:
                parts.append(body.data(data))
            if not message.get("more_body", False):
                parts.append(body.end())
        except h11.LocalProtocolError:
            self.connection.broken = True
            raise
        if parts:  # an empty piece of a streamed body writes nothing
            await self.connection.write(b"".join(parts) if len(parts) > 1 else parts[0])

    async def send_error(self, status: int) -> None:
        connection = self.connection
        if self.writer is not None:
            if self.writer.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                await connection.error(self.writer, status)
            return
        assert self.plain is not None
        if self.body is not None:
            return  # the answer has begun
        headers = [(b"content-length", b"0"), CLOSE, DATE.header()]
        head = response_head(status, headers, self.plain.keep_alive)
        if head is None:
            await connection.error(self._h11_writer(), status)
        else:
            await connection.write(head[0])
