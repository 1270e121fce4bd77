"""The lean HTTP/1.1 server connection: httptools parses, the app runs in the connection's task.

Hypercorn serves every request through several layers: a stream object, an event object per
step, a memory channel and a new task for the app, a lock and a shielded cancel scope around
every write. For servers whose requests are small and answered whole (the rollout server, the
bridge, the daemon's API) those layers cost more CPU than the answer. :func:`serve_h1` drops
them: one loop per connection reads a request, calls the app directly, and writes each answer
in one ``send_all``.

One parser per connection: an ``httptools.HttpRequestParser`` (llhttp, strict) is fed what
the socket gives and turns it into a queue of events (a request head, body pieces, the end of
a message); the loop and the app's ``receive`` take from that queue. Malformed framing (bad
chunk sizes, both ``Content-Length`` and ``Transfer-Encoding``, bare LF, obs-fold, NUL and
other control bytes, a missing or repeated ``Host``) is answered 400 and the connection closed.
Answers are written by :mod:`~rollout_server.net.wirebytes`, which writes what h11 would.

The floor's limits (:mod:`~rollout_server.net.limits`) are applied here: head size and header
count (431), a timeout for the head and for each body read (408), backpressure past the
current request (at most ``max_pending`` bytes are read ahead while the app works), and an
answer that begins while the request body is unread closes the connection instead of draining
it, so a refused body is never read.

What changes for an app: it runs in the task that reads the connection. An app that calls
``receive()`` after the request body gets ``http.disconnect`` when the client goes away (the
loop reads then, up to the backpressure bound); one that never does notices a vanished client
only when its answer cannot be written (the write error is swallowed, as hypercorn does, and
the connection closed). Protocol switches (``Upgrade`` with ``Connection: upgrade``, and
``CONNECT``) are refused 400: the rollout protocol has none.

Idle keep-alive connections close after ``keep_alive_timeout`` and at once when the server
shuts down (the caller's idle timer, :class:`~rollout_server.net.leanserve.IdleWatch`).

Why one module of this size: the connection (socket, parser, event queue, limits) and the
exchange (the app's ``receive`` and ``send``) are one object's two faces; split over two
modules they became an import circle with private state crossing it (issue 23), as
hypercorn's and httpcore's HTTP/1.1 connections are one module each.
"""

from __future__ import annotations

import socket as _socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from math import inf
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote
from wsgiref.handlers import format_date_time

import httptools
import trio

from .limits import MAX_RECV, Limits
from .wirebytes import Body, LocalProtocolError, response_head

if TYPE_CHECKING:
    # Types only: hypercorn.typing imports h2 (and hypercorn.utils imports hypercorn.typing).
    from hypercorn.config import Config
    from hypercorn.typing import AppWrapper, HTTPScope

__all__ = ["CLOSE", "DATE", "serve_h1"]

_DROPPED: Final = (trio.BrokenResourceError, trio.ClosedResourceError)
_DISCONNECT: Final = {"type": "http.disconnect"}
_ASGI: Final = {"spec_version": "2.1", "version": "3.0"}
CLOSE: Final = (b"connection", b"close")
_END: Final = object()
_SLICE: Final = 64 * 1024
"""The largest piece written at once (each must be taken within the send timeout)."""
"""Queue marker: the end of a message."""


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


class _Broken(Exception):
    """The client went away: stop serving this connection."""


class _TimedOut(_Broken):
    """The client stalled past a read's deadline."""


class _Refused(Exception):
    """A head broke a limit while it was parsed (raised through the parser's callback)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Request:
    """A parsed request head: what the ASGI scope and the answer's framing need."""

    __slots__ = ("head", "headers", "http10", "index", "keep_alive", "method", "target")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        http10: bool,
        keep_alive: bool,
        index: int,
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.http10 = http10
        self.keep_alive = keep_alive
        self.head = method == b"HEAD"
        self.index = index
        """This request's number on the connection (its body is read once that many
        messages are complete)."""


class _Connection:
    """One server connection: the socket, its parser, the parsed events not yet taken."""

    __slots__ = (
        "broken",
        "completed",
        "config",
        "eof",
        "events",
        "failed",
        "head_bytes",
        "headers",
        "hosts",
        "in_body",
        "limits",
        "max_requests",
        "on_busy",
        "on_idle",
        "overflow",
        "parser",
        "read_timeout",
        "requests",
        "size",
        "started",
        "stream",
        "timed_out",
        "url",
        "writing_since",
    )

    def __init__(
        self,
        config: Config,
        stream: trio.abc.Stream,
        on_idle: Callable[[], Awaitable[None]],
        on_busy: Callable[[], Awaitable[None]],
    ) -> None:
        self.config = config
        self.stream = stream
        self.limits: Limits = getattr(config, "limits", None) or Limits()
        self.on_idle = on_idle
        self.on_busy = on_busy
        self.read_timeout = config.read_timeout or inf
        self.max_requests = config.keep_alive_max_requests
        self.requests = 0
        self.broken = False
        self.timed_out = False
        self.eof = False
        # The status to refuse with once the parsed events run out (0: none): the parser
        # stops at the first malformed byte.
        self.failed = 0
        self.events: deque[Any] = deque()
        self.started = 0
        self.completed = 0
        self.in_body = False
        self.head_bytes = 0
        self.overflow = 0
        self.url: list[bytes] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.hosts = 0
        self.size = 0
        self.parser = httptools.HttpRequestParser(self)
        self.writing_since = inf
        """When the write in progress began (trio clock); ``inf`` when none is."""

    # -- the parser's callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = []
        self.headers = []
        self.hosts = 0
        self.size = 0

    def on_url(self, url: bytes) -> None:
        self.url.append(url)
        self.size += len(url)
        if self.size > self.limits.max_head:
            raise _Refused(414)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if value and value[-1] in (32, 9):
            value = value.rstrip(
                b" \t"
            )  # trailing whitespace is not the value's (RFC 9112, section 5)
        self.headers.append((name, value))
        self.size += len(name) + len(value) + 4
        if len(self.headers) > self.limits.max_headers or self.size > self.limits.max_head:
            raise _Refused(431)
        if name == b"host":
            self.hosts += 1

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise _Refused(505)  # RFC 9112, section 2.3: HTTP/2.0 (or 0.9) is not this major
        http10 = version == "1.0"
        if self.hosts > 1 or (not http10 and not self.hosts):
            raise _Refused(400)  # RFC 9112, section 3.2: one Host (and one in an HTTP/1.1 request)
        keep_alive = not http10
        for name, value in self.headers:
            if name == b"connection" and b"close" in [
                item.strip() for item in value.lower().split(b",")
            ]:
                keep_alive = False
            elif name == b"transfer-encoding":
                if http10:
                    # RFC 9112, section 6.1: Transfer-Encoding in an HTTP/1.0 message means
                    # faulty framing (a 1.0 hop may have left the chunks as they were): 400.
                    raise _Refused(400)
                if b"," in value:
                    # llhttp takes any list of codings that ends in chunked, and would hand the
                    # app a body still in the others (gzip, ...): RFC 9112, section 6.1's 501.
                    # (One that does not end in chunked is llhttp's 400, as that section says.)
                    codings = [coding.strip() for coding in value.lower().split(b",")]
                    if codings[-1] == b"chunked" and any(codings[:-1]):
                        raise _Refused(501)
        self.started += 1
        self.in_body = True
        self.head_bytes = 0
        target = b"".join(self.url)
        self.events.append(
            Request(parser.get_method(), target, self.headers, http10, keep_alive, self.started)
        )

    def on_body(self, body: bytes) -> None:
        self.events.append(body)

    def on_message_complete(self) -> None:
        self.completed += 1
        self.in_body = False
        self.events.append(_END)

    # -- reading ----------------------------------------------------------------------------

    def _feed(self, data: bytes | bytearray) -> None:
        if not self.in_body:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A protocol switch (an Upgrade with Connection: upgrade, or CONNECT) is not
            # served: refused 400 like malformed framing.
            if self.events and self.events[-1] is _END:
                self.events.pop()
            self.failed = 400
            self._drop_unread_head()
            return
        except httptools.HttpParserCallbackError as error:
            cause = error.__context__
            self.failed = cause.status if isinstance(cause, _Refused) else 400
            self._drop_unread_head()
            return
        except httptools.HttpParserError:
            self.failed = 400
            self._drop_unread_head()
            return
        if not self.in_body and self.head_bytes > self.limits.max_head:
            self.failed = 431

    def _drop_unread_head(self) -> None:
        """A head whose framing the parser refused right after it is refused whole."""
        if self.events and type(self.events[-1]) is Request:
            self.events.pop()

    async def read(self, deadline: float = inf) -> bool:
        """Read and parse the next bytes; False at end of stream. :class:`_Broken` when the
        client is gone, :class:`_TimedOut` past ``deadline`` (trio clock) or ``read_timeout``."""
        if self.read_timeout != inf:
            deadline = min(deadline, trio.current_time() + self.read_timeout)
        try:
            if deadline == inf:
                data = await self.stream.receive_some(MAX_RECV)
            else:
                with trio.fail_at(deadline):
                    data = await self.stream.receive_some(MAX_RECV)
        except _DROPPED:
            raise _Broken from None
        except trio.TooSlowError:
            self.timed_out = True
            raise _TimedOut from None
        if not data:
            self.eof = True
            return False
        self.overflow += len(data)
        if not self.failed:
            self._feed(data)
        return True

    async def next_request(self) -> Request | None:
        """The next request head, or ``None`` when the connection is over (after a 400, 408,
        414 or 431 where one is due). Waiting for the first byte is the idle watch's
        business; from then on the head must be whole within the head timeout."""
        deadline = inf
        events = self.events
        while True:
            if events:
                event = events.popleft()
                if type(event) is Request:
                    return event
                continue  # the tail of a body the app did not read (the request was answered)
            if self.failed:
                await self.refuse(self.failed)
                return None
            if self.eof:
                if self.head_bytes:
                    await self.refuse(400)  # the client ended in the middle of a head
                return None
            if self.head_bytes and deadline == inf:
                deadline = trio.current_time() + self.limits.head_timeout
            try:
                await self.read(deadline)
            except _TimedOut:
                await self.refuse(408)
                return None

    async def body_piece(self) -> bytes | None:
        """The next piece of the current request's body (``b""``: its end), or ``None`` when
        it cannot end (client gone, stalled, malformed). Each read has the body timeout."""
        events = self.events
        while True:
            if events:
                event = events[0]
                if event is _END:
                    events.popleft()
                    return b""
                if type(event) is bytes:
                    events.popleft()
                    return event
                return None  # a next request before this body's end: cannot happen
            if self.failed or self.eof:
                return None
            try:
                await self.read(trio.current_time() + self.limits.body_read_timeout)
            except _Broken:
                return None

    async def wait_disconnect(self) -> None:
        """Return when the client goes away; bytes of a next request are read meanwhile only
        up to ``max_pending`` (then the connection is not read until the answer is over)."""
        try:
            while self.overflow < self.limits.max_pending:
                if self.eof or not await self.read():
                    return
        except _Broken:
            return
        await trio.sleep_forever()

    async def write(self, data: bytes) -> None:
        if self.broken:
            # Still a checkpoint: an app that keeps sending to a connection that is gone
            # (without reading receive()) must not hold the loop.
            await trio.lowlevel.checkpoint()
            return
        # When the write began, for the connection's watch (leanserve.IdleWatch), which closes
        # a connection whose write the client has not taken within the send timeout (the
        # write then fails as dropped, and the app's receive() says the client is gone). Not a
        # cancel scope per write: entering one cost 7 us of the loop's 22 per request, moving
        # one connection-wide scope's deadline 4.5 (scripts/bench/bench_h1fast.py).
        # The bound is on progress, as nginx's send_timeout: a large answer goes in slices,
        # each of which must be taken in time (a slow reader of a big one is not cut off).
        try:
            if len(data) <= _SLICE:
                self.writing_since = trio.current_time()
                await self.stream.send_all(data)
            else:
                view = memoryview(data)
                for start in range(0, len(data), _SLICE):
                    self.writing_since = trio.current_time()
                    await self.stream.send_all(view[start : start + _SLICE])
        except _DROPPED:
            self.broken = True
        finally:
            self.writing_since = inf

    async def refuse(self, status: int) -> None:
        """Answer ``status`` with an empty body and ``Connection: close`` (the caller closes)."""
        head, _, _ = response_head(status, [(b"content-length", b"0"), CLOSE, DATE.header()], True)
        await self.write(head)

    # -- serving ----------------------------------------------------------------------------

    async def serve(self, app: AppWrapper, client: Any, server: Any, state: Any) -> None:
        idle = True
        while True:
            if idle and not self.events:
                await self.on_idle()
            try:
                request = await self.next_request()
            except _Broken:
                return
            if request is None:
                return
            if idle:
                await self.on_busy()
                idle = False
            self.requests += 1
            self.overflow = 0
            exchange = Exchange(self, request)
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
            if exchange.body is None:
                await exchange.send_error(self._error_status())
                return
            if self.broken or not (exchange.body.done and exchange.stays):
                return
            if self.completed < request.index:
                return  # cannot happen: an answer begun before the body's end closes
            if not exchange.body_done:
                # The app answered without reading to the end of the request (a GET's empty
                # body, a refused body that had fully arrived): drop the rest, up to its end,
                # so the connection is seen idle (and closed at shutdown or after the
                # keep-alive timeout).
                events = self.events
                while events and events.popleft() is not _END:
                    pass
            idle = True

    def _error_status(self) -> int:
        """The status for a request the app did not answer."""
        if self.timed_out:
            return 408
        if self.failed:
            return self.failed
        # A body cut short by the client's close is the client's error (h11's 400 too).
        return 400 if self.eof else 500


class Exchange:
    """One request and its answer: what the app's ``receive`` and ``send`` act on."""

    __slots__ = (
        "body",
        "body_done",
        "connection",
        "continued",
        "head",
        "request",
        "stays",
        "suppress",
    )

    def __init__(self, connection: _Connection, request: Request) -> None:
        self.connection = connection
        self.request = request
        self.head: tuple[bytes, int, bool] | None = None
        self.body: Body | None = None
        self.stays = False
        self.body_done = False
        self.continued = False
        # The app's body bytes are dropped for answers without a body by rule (to HEAD, 204,
        # 304), as hypercorn drops them.
        self.suppress = request.head

    def scope(self, client: Any, server: Any, state: Any) -> HTTPScope:
        request = self.request
        raw_path, _, query = request.target.partition(b"?")
        text = raw_path.decode("latin-1")
        return {
            "type": "http",
            "http_version": "1.0" if request.http10 else "1.1",
            "asgi": _ASGI,  # type: ignore[typeddict-item]
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": unquote(text) if "%" in text else text,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": self.connection.config.root_path,
            "headers": list(request.headers),
            "client": client,
            "server": server,
            "state": state.copy(),
            "extensions": {},
        }

    async def receive(self) -> Any:
        connection = self.connection
        if self.body_done:
            await connection.wait_disconnect()
            return _DISCONNECT
        if not self.continued and self.body is None and self.head is None:
            self.continued = True
            if self._waiting_for_continue():
                await connection.write(b"HTTP/1.1 100 \r\n%s: %s\r\n\r\n" % DATE.header())
        piece = await connection.body_piece()
        if piece:
            return {"type": "http.request", "body": piece, "more_body": True}
        self.body_done = True
        connection.overflow = 0
        if piece is None:
            return _DISCONNECT
        return {"type": "http.request", "body": b"", "more_body": False}

    def _waiting_for_continue(self) -> bool:
        request = self.request
        if request.http10 or self.connection.completed >= request.index:
            return False
        if self.connection.events:
            return False  # body bytes came without waiting
        return any(n == b"expect" and v.lower() == b"100-continue" for n, v in request.headers)

    def _body_pending(self) -> bool:
        """Part of the request body has not arrived (answering now means closing)."""
        return self.connection.completed < self.request.index

    async def send(self, message: Any) -> None:
        kind = message["type"]
        connection = self.connection
        if kind == "http.response.start":
            if self.head is not None or self.body is not None:
                raise RuntimeError("http.response.start sent twice")
            status = int(message["status"])
            headers = [*message.get("headers", ()), DATE.header()]
            if (
                connection.requests >= connection.max_requests
                or (not self.body_done and self._body_pending())
            ) and not any(n.lower() == b"connection" and v.lower() == b"close" for n, v in headers):
                # An unread body is never drained: the answer closes the connection instead.
                headers.append(CLOSE)
            request = self.request
            self.suppress = request.head or status in (204, 304)
            try:
                self.head = response_head(
                    status, headers, request.keep_alive, head=request.head, http10=request.http10
                )
            except (LocalProtocolError, TypeError):
                connection.broken = True
                raise
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        parts: list[bytes] = []
        if self.head is not None:
            data, length, self.stays = self.head
            parts.append(data)
            self.head = None
            self.body = Body(length)
        elif self.body is None:
            raise RuntimeError("http.response.body before http.response.start")
        body = self.body
        try:
            data = message.get("body", b"")
            if data and not self.suppress:
                parts.append(body.data(data))
            if not message.get("more_body", False):
                parts.append(body.end())
        except LocalProtocolError:
            connection.broken = True
            raise
        if parts:  # an empty piece of a streamed body writes nothing
            await connection.write(b"".join(parts) if len(parts) > 1 else parts[0])

    async def send_error(self, status: int) -> None:
        """Answer ``status`` and close, unless an answer has begun."""
        if self.body is None:
            await self.connection.refuse(status)


async def serve_h1(
    app: AppWrapper,
    config: Config,
    stream: trio.abc.Stream,
    state: Any,
    *,
    on_idle: Callable[[], Awaitable[None]],
    on_busy: Callable[[], Awaitable[None]],
    sock: trio.socket.SocketType,
    writes: Callable[[Callable[[], float]], None] | None = None,
) -> None:
    """Serve HTTP/1.1 requests on ``stream`` until the client or the answer ends the connection.

    ``on_idle``/``on_busy`` are awaited when the connection starts and stops waiting for a
    request (the idle timer's ``restart``/``stop``). ``writes`` is given a function that
    says when the write in progress began (``inf``: none), for the caller's watch to bound
    it. ``sock`` is the TCP socket under ``stream`` (``stream`` may be TLS over it). The
    caller closes ``stream``.
    """
    client = _socket_addr(sock.family, sock.getpeername())
    server = _socket_addr(sock.family, sock.getsockname())
    connection = _Connection(config, stream, on_idle, on_busy)
    if writes is not None:
        writes(lambda: connection.writing_since)
    await connection.serve(app, client, server, state)


def _socket_addr(family: int, address: Any) -> tuple[str, int] | None:
    """An ASGI ``client``/``server`` value: (host, port) for IP sockets, else ``None``."""
    if family in (_socket.AF_INET, _socket.AF_INET6):
        return (address[0], address[1])
    return None
