"""The project's lean HTTP/1.1 client on trio streams, with a keep-alive pool.

httpx and httpcore cost more CPU per call than the servers they talk to (request and response
models, header merging, the pool's locks and bookkeeping, a watcher task per call). Two hot
paths go through this client instead: the bridge's non-streaming calls to a provider
(``bridge.upstreams.direct``, through :meth:`WirePool.request`) and the rollout client's
admissions and long-polls (:class:`~rollout_server.net.h1client.H1Pool`). It does one request
with a complete body, an answer read whole or piece by piece (:class:`WireResponse`), and
reuses connections per origin (the most recently used first, so a lone caller keeps one
connection and, over HTTPS, one TLS session).

One parser per connection: an ``httptools.HttpResponseParser`` (llhttp) reads every answer on
it, head and body (content-length, chunked, or to the close), skipping ``1xx`` heads. Requests
are written by :func:`~rollout_server.net.wirefast.encode_request` (h11's bytes for the common
request); the rare one it declines is written by h11, which here only writes bytes. A
connection goes back to the pool only when its answer ended cleanly, both sides allow
keep-alive and nothing followed the answer.

What it keeps from httpx: the TLS context (the process's one,
:func:`~rollout_server.net.httpclient.shared_tls`: httpx's, so the same CA bundle and
``SSL_CERT_FILE``/``SSL_CERT_DIR``), timeouts (connect, then per read and per write), the
stale-connection check before reuse (an idle connection whose socket reads as ready was closed
by the server, or holds junk, and is dropped), and gzip/deflate answers. Proxy variables are
not read. Reading an answer can resume after a cancellation (trio's ``receive_some`` consumes
nothing when cancelled), which lets a caller finish reading an answer that is already paid for
without a watcher task.

Failures are :class:`WireError` subclasses (:mod:`~rollout_server.net.wireerrors`) that say how
far the exchange got. Only
:class:`NotSent` (:class:`ConnectFailed`, :class:`ConnectTimeout`) means no byte of the request
was written, so sending it again cannot make the server act twice; it is raised only while
connecting, never once a connection is up. ``before_answer`` is true when no byte of the answer
had arrived.

Why one module of this size: a connection, its parser and the answer being read from it share
state at every step (httpcore keeps its HTTP/1.1 connection and response stream in one module
for the same reason); split in two they were an import circle with private names crossing it.
"""

from __future__ import annotations

import re
import socket
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from math import inf
from typing import Any, Final
from urllib.parse import urlsplit

import h11
import httptools
import trio

from .wireerrors import (
    DROPPED,
    BadAnswer,
    ConnectFailed,
    ConnectionLost,
    ConnectTimeout,
    NotSent,
    ReadFailed,
    ReadTimeout,
    WireError,
    WriteFailed,
    detail,
)
from .wirefast import CheckedHeaders, encode_request

__all__ = [
    "BadAnswer",
    "CheckedHeaders",
    "ConnectFailed",
    "ConnectTimeout",
    "Connection",
    "ConnectionLost",
    "NotSent",
    "Origin",
    "ReadFailed",
    "ReadTimeout",
    "WireError",
    "WirePool",
    "WireResponse",
    "WriteFailed",
]

_BODY_METHODS: Final = (b"POST", b"PUT", b"PATCH")
_RECEIVE: Final = 65536
_WRITING: Final = 0
_READING: Final = 1
_END: Final = object()
"""Queue marker: the end of an answer."""
_BAD_REASON: Final = re.compile(rb"[\x00-\x08\x0a-\x1f]")


def _literal_address(host: str, port: int) -> tuple[int, tuple[str, int]] | None:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family, (host, port)
    return None


async def _connect_literal(family: int, sockaddr: tuple[str, int]) -> trio.SocketStream:
    """A TCP connection to one numeric address: what ``trio.open_tcp_stream`` does for it,
    without its nursery and attempt tasks (about 0.2 ms of CPU less per connection, which a
    run with a thousand rollouts in flight pays on every hop: measured in
    scripts/bench/bench_wire_connect.py)."""
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect(sockaddr)
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


class Origin:
    """Where requests go: scheme, host and port (parsed once), and a default request target."""

    __slots__ = ("address", "host", "host_header", "key", "port", "scheme", "target")

    def __init__(self, scheme: str, host: str, port: int, target: bytes = b"/") -> None:
        if scheme not in ("http", "https") or not host:
            raise ValueError(f"not an http(s) origin: {scheme}://{host}")
        self.scheme = scheme
        self.host = host
        self.port = port
        self.target = target
        """The request target of :meth:`WirePool.request`: path and query."""
        shown = f"[{host}]" if ":" in host else host
        default = 443 if scheme == "https" else 80
        self.host_header = (shown if port == default else f"{shown}:{port}").encode("idna")
        # A string caches its hash: the pool looks idle connections up by it on every call.
        self.key = f"{scheme}://{shown}:{port}"
        self.address = _literal_address(host, port)
        """``(family, sockaddr)`` when ``host`` is an IP literal (a loopback bridge, a local
        server): :meth:`WirePool.connect` then skips the resolver and happy eyeballs."""

    @classmethod
    def parse(cls, url: str) -> Origin:
        """The origin of an ``http(s)`` URL, its path and query as the target."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, port, target.encode())


class Connection:
    """One connection of a :class:`WirePool`, owned by one exchange at a time, with the one
    response parser that reads every answer on it."""

    __slots__ = (
        "answered",
        "error",
        "events",
        "fields",
        "idle_since",
        "keep_alive",
        "key",
        "parser",
        "socket",
        "started",
        "stream",
    )

    def __init__(self, stream: trio.abc.Stream, key: str) -> None:
        self.stream = stream
        self.key = key
        self.idle_since = 0.0
        self.events: deque[Any] = deque()
        """Parsed and not yet taken: ``(status, headers)`` heads, body bytes, :data:`_END`."""
        self.fields: list[tuple[bytes, bytes]] = []
        self.error: str | None = None
        """Why the parser stopped (the answer is malformed), once it has."""
        self.keep_alive = False
        """The last complete answer allows the connection to be used again."""
        self.started = False
        """A message has begun and not ended: after an answer, bytes nobody asked for."""
        self.answered = False
        """The answer to the last request has ended: any message after it (even a whole
        ``1xx``, which is skipped) was not asked for, and the connection is not fit to use."""
        self.parser = httptools.HttpResponseParser(self)
        transport = stream
        while isinstance(transport, trio.SSLStream):
            transport = transport.transport_stream
        assert isinstance(transport, trio.SocketStream)
        self.socket = transport.socket

    # The parser's callbacks.
    def on_message_begin(self) -> None:
        self.fields = []
        self.started = True
        if self.answered:
            self.error = "unexpected data after the answer"

    def on_status(self, reason: bytes) -> None:
        # llhttp takes any byte but CR and LF in a reason phrase; h11 (RFC 9112, section 4) refuses
        # control bytes other than tab.
        if _BAD_REASON.search(reason) is not None:
            raise ValueError(f"illegal status line reason {reason!r}")

    def on_header(self, name: bytes, value: bytes) -> None:
        if value and value[-1] in (32, 9):
            value = value.rstrip(b" \t")
        self.fields.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status >= 200:  # 1xx heads are skipped, as h11 reports them apart
            self.events.append((status, self.fields))

    def on_body(self, body: bytes) -> None:
        self.events.append(body)

    def on_message_complete(self) -> None:
        self.started = False
        if self.parser.get_status_code() >= 200:
            self.answered = True
            # h11's rule, stricter than llhttp's: an HTTP/1.0 answer, or one whose
            # Connection header says close anywhere, ends the connection.
            self.keep_alive = self.parser.get_http_version() == "1.1" and not any(
                name == b"connection" and b"close" in value.lower() for name, value in self.fields
            )
            self.events.append(_END)

    def feed(self, data: bytes) -> None:
        """Parse ``data``; a malformed answer leaves :attr:`error` set and the rest unparsed."""
        if self.error is not None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.error = "the server switched protocols"
        except httptools.HttpParserCallbackError as exc:
            self.error = str(exc.__context__ or exc)
        except httptools.HttpParserError as exc:
            self.error = str(exc) or type(exc).__name__


class WirePool:
    """Keep-alive connections per origin; each exchange takes one, its answer gives it back.

    ``timeout`` bounds each write and each read (``inf``: no bound, and no cancel scope per
    read). ``decompress=False`` leaves ``content-encoding`` alone: bodies arrive as sent.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = inf,
        timeout: float = inf,
        keepalive_expiry: float = 60.0,
        max_idle: float = 256,
        decompress: bool = True,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.keepalive_expiry = keepalive_expiry
        self.max_idle = max_idle
        self.decompress = decompress
        self._idle: dict[str, list[Connection]] = {}
        self._idle_count = 0
        self._closed = False

    async def request(
        self, origin: Origin, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> WireResponse:
        """POST ``body`` to ``origin``'s target; return once the answer's head has arrived."""
        connection = self.idle(origin) or await self.connect(origin, self.connect_timeout)
        return await self.send(connection, origin, b"POST", origin.target, headers, body)

    def idle(self, origin: Origin) -> Connection | None:
        """An idle connection to ``origin`` that can be reused, or ``None``."""
        idle = self._idle.get(origin.key)
        if not idle:
            return None
        expiry = self.keepalive_expiry
        now = trio.current_time() if expiry != inf else 0.0
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            # A connection the server closed (or wrote to) while it was idle is readable.
            if now - connection.idle_since < expiry and not connection.socket.is_readable():
                return connection
            connection.socket.close()
        return None

    async def connect(self, origin: Origin, connect_timeout: float) -> Connection:
        """A new connection to ``origin``; raises :class:`NotSent` subclasses only."""
        with trio.move_on_after(connect_timeout) as deadline:
            try:
                address = origin.address
                if address is not None:
                    tcp = await _connect_literal(*address)
                else:
                    tcp = await trio.open_tcp_stream(origin.host, origin.port)
                stream = tcp if origin.scheme == "http" else await _tls(tcp, origin.host)
            except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
                raise ConnectFailed(detail(exc), before_answer=True) from exc
            return Connection(stream, origin.key)
        assert deadline.cancelled_caught
        raise ConnectTimeout("timed out connecting", before_answer=True)

    async def send(
        self,
        connection: Connection,
        origin: Origin,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> WireResponse:
        """Write one request on ``connection`` and return once the answer's head has arrived.

        The common exchange skips h11 (:mod:`~rollout_server.net.wirefast`); any other is
        h11's, from the request or from the answer's first unusual byte. On any failure (or
        cancellation) the connection is closed.
        """
        response = WireResponse(self, connection)
        if self.timeout == inf:
            await self._send(response, connection, origin, method, target, headers, body, None)
            return response
        # One scope bounds the write and each read of the head, its deadline moved before
        # each of them (a scope entered per step was most of what the bound cost).
        with trio.CancelScope() as bound:
            await self._send(response, connection, origin, method, target, headers, body, bound)
            return response
        # The connection is closed already (by _send, as the cancellation passed).
        if response._step == _WRITING:
            raise ReadTimeout("timed out writing the request", before_answer=True)
        raise ReadTimeout("timed out reading the answer", before_answer=not response._answering)

    async def _send(
        self,
        response: WireResponse,
        connection: Connection,
        origin: Origin,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        bound: trio.CancelScope | None,
    ) -> None:
        sized = bool(body) or method in _BODY_METHODS
        data = encode_request(method, target, origin.host_header, headers, body, sized)
        if data is None:
            data = _h11_request(method, target, origin, headers, body, sized)
            # (encode_request declines every request with a Connection header.)
            response._close = any(
                name.lower() == b"connection" and b"close" in value.lower()
                for name, value in headers
            )
        response._head_only = method == b"HEAD"
        try:
            await self._write(connection, data, bound)
            response._step = _READING
            connection.answered = False  # what comes now answers this request
            events = connection.events
            while True:
                if events:
                    event = events.popleft()
                    if type(event) is tuple:
                        response._begin(*event)
                        return
                    # Bytes that followed the last answer: the connection is not fit to use.
                    raise BadAnswer("unexpected data before the answer", before_answer=True)
                if connection.error is not None:
                    raise BadAnswer(connection.error, before_answer=not response._answering)
                first = not response._answering
                received = await response._receive(connection, bound)
                if not received:
                    raise BadAnswer(
                        "Server disconnected without sending a response",
                        before_answer=first,
                    )
                if first and received[0] in (13, 10):
                    # llhttp skips empty lines before a status line; h11 (and we) refuse them.
                    raise BadAnswer("no response line received", before_answer=False)
                connection.feed(received)
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise

    async def _write(
        self, connection: Connection, data: bytes, bound: trio.CancelScope | None
    ) -> None:
        try:
            if bound is None:
                await connection.stream.send_all(data)
            else:
                bound.deadline = trio.current_time() + self.timeout
                await connection.stream.send_all(data)
        except DROPPED as exc:
            raise WriteFailed(detail(exc), before_answer=True) from exc

    def _checkin(self, connection: Connection) -> None:
        if self._closed or self._idle_count >= self.max_idle:
            connection.socket.close()
            return
        if self.keepalive_expiry != inf:
            connection.idle_since = trio.current_time()
        idle = self._idle.get(connection.key)
        if idle is None:
            idle = self._idle[connection.key] = []
        idle.append(connection)
        self._idle_count += 1

    async def aclose(self) -> None:
        """Close every idle connection; those in use are closed when their answer ends."""
        self._closed = True
        idle, self._idle, self._idle_count = self._idle, {}, 0
        for connections in idle.values():
            for connection in connections:
                # Closed at once, as a stale one is in idle(): nothing waits on an idle
                # connection, and trio.aclose_forcefully's cancelled scope costs ~0.1 ms per
                # connection (a pool of a thousand took 0.16 s to close).
                connection.socket.close()
        await trio.lowlevel.checkpoint()


def _h11_request(
    method: bytes,
    target: bytes,
    origin: Origin,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    sized: bool,
) -> bytes:
    """The bytes of a request :func:`encode_request` declined, written by h11 (which raises
    ``h11.LocalProtocolError`` for one HTTP/1.1 cannot carry). h11 only writes here."""
    protocol = h11.Connection(h11.CLIENT)
    head = [(b"host", origin.host_header), *headers]
    if sized:
        head.append((b"content-length", b"%d" % len(body)))
    data = protocol.send(h11.Request(method=method, target=target, headers=head)) or b""
    if body:
        data += protocol.send(h11.Data(data=body)) or b""
    return data + (protocol.send(h11.EndOfMessage()) or b"")


async def _tls(stream: trio.SocketStream, host: str) -> trio.SSLStream[trio.SocketStream]:
    # Imported here: httpclient brings httpx, which a plain-HTTP caller need not load.
    from .httpclient import shared_tls

    tls = trio.SSLStream(stream, shared_tls(), server_hostname=host, https_compatible=True)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls


class WireResponse:
    """One answer: its status and headers at once, its body on demand."""

    __slots__ = (
        "_answering",
        "_close",
        "_connection",
        "_decoder",
        "_done",
        "_head_only",
        "_headers",
        "_length",
        "_parts",
        "_pool",
        "_remaining",
        "_step",
        "raw_headers",
        "status",
    )

    status: int
    raw_headers: Sequence[tuple[bytes, bytes]]
    """As received: names in lower case, in order."""

    def __init__(self, pool: WirePool, connection: Connection) -> None:
        self._pool = pool
        self._connection: Connection | None = connection
        self._parts: list[bytes] = []
        self._done = False
        self._decoder: zlib._Decompress | None = None
        self._answering = False
        self._headers: dict[str, str] | None = None
        self._step = _WRITING
        self._head_only = False
        self._close = False
        """The request asked to close the connection after this answer."""

    @property
    def headers(self) -> dict[str, str]:
        """Lower-case names; a repeated header keeps its values joined by ``", "``."""
        if self._headers is None:
            headers: dict[str, str] = {}
            for name, value in self.raw_headers:
                key, text = name.decode("latin-1"), value.decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            self._headers = headers
        return self._headers

    async def _receive(
        self, connection: Connection, bound: trio.CancelScope | None = None
    ) -> bytes:
        """The next bytes from the socket; ``b""`` at its end.

        The pool's timeout bounds the read: ``bound`` (the caller's scope, which reports the
        timeout) gets its deadline moved, or the read gets a scope of its own.
        """
        timeout = self._pool.timeout
        try:
            if timeout == inf:
                data = await connection.stream.receive_some(_RECEIVE)
            elif bound is not None:
                bound.deadline = trio.current_time() + timeout
                data = await connection.stream.receive_some(_RECEIVE)
            else:
                with trio.CancelScope(deadline=trio.current_time() + timeout) as read:
                    data = await connection.stream.receive_some(_RECEIVE)
                if read.cancelled_caught:
                    raise ReadTimeout(
                        "timed out reading the answer", before_answer=not self._answering
                    )
        except DROPPED as exc:
            raise self._lost(ReadFailed, exc) from exc
        if data:
            self._answering = True
        return bytes(data)

    def _lost(self, kind: type[ConnectionLost], exc: BaseException) -> ConnectionLost:
        if self._answering:
            return kind(detail(exc), before_answer=False)
        shown = f"Server disconnected without sending a response ({detail(exc)})"
        return kind(shown, before_answer=True)

    def _begin(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.raw_headers = headers
        if not self._pool.decompress:
            return
        coding = b""
        for name, value in headers:
            if name == b"content-encoding":
                coding = coding + b", " + value if coding else value
        coding = coding.strip().lower()
        if coding == b"gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == b"deflate":
            self._decoder = zlib.decompressobj()
        elif coding not in (b"", b"identity"):
            shown = coding.decode("latin-1")
            raise BadAnswer(f"unsupported content-encoding {shown!r}", before_answer=False)

    def _decode(self, data: bytes) -> bytes:
        if self._decoder is None:
            return data
        try:
            return self._decoder.decompress(data)
        except zlib.error as exc:
            raise BadAnswer(f"invalid compressed body: {exc}", before_answer=False) from exc

    def _end(self) -> bytes:
        self._done = True
        self._release()
        return self._decoder.flush() if self._decoder is not None else b""

    async def _next(self) -> bytes:
        """The next piece of the body (decoded, maybe empty); gives the connection back at
        its end. Cancelled while waiting for bytes, it has consumed none."""
        connection = self._connection
        assert connection is not None
        if self._head_only:
            # llhttp cannot be told an answer is to HEAD (it would wait for the body its
            # length announces): the answer ends at its head and the connection is closed.
            self._done = True
            self.discard()
            return b""
        events = connection.events
        if events:
            event = events.popleft()
            if type(event) is bytes:
                return self._decode(event)
            if event is _END:
                return self._end()
            raise BadAnswer("unexpected second answer", before_answer=False)
        if connection.error is not None:
            raise BadAnswer(connection.error, before_answer=False)
        received = await self._receive(connection)
        if received:
            connection.feed(received)
            return b""
        if self._to_close():
            return self._end()  # an answer framed by the close ends with it
        exc = BadAnswer(
            "peer closed connection without sending complete message body",
            before_answer=False,
        )
        raise exc

    def _to_close(self) -> bool:
        """The answer has neither a length nor chunks: its body runs to the close."""
        for name, value in self.raw_headers:
            if name == b"content-length" or (
                name == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                return False
        return self.status not in (204, 304)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives (decoded)."""
        while not self._done:
            if data := await self._next():
                yield data

    async def read(self) -> bytes:
        """The whole body. If cancelled, calling it again resumes where it stopped."""
        parts = self._parts
        while not self._done:
            if data := await self._next():
                parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        assert connection is not None
        if (
            self._close
            or connection.events
            or connection.error is not None
            or connection.started
            or not connection.keep_alive
            or self._to_close()
        ):
            connection.socket.close()
        else:
            self._pool._checkin(connection)

    def discard(self) -> None:
        """Close the connection unless the body was read whole (then it is back in the pool)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.socket.close()

    async def aclose(self) -> None:
        """Give the connection back if the body was read whole; otherwise close it."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await trio.aclose_forcefully(connection.stream)
