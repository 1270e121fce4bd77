"""The project's lean HTTP/1.1 client: h11 on trio streams, with a keep-alive pool.

httpx and httpcore cost more CPU per call than the servers they talk to (request and response
models, header merging, the pool's locks and bookkeeping, a watcher task per call). Two hot
paths go through this client instead: the bridge's non-streaming calls to a provider
(``bridge.upstreams.direct``, through :meth:`WirePool.request`) and the rollout client's
admissions and long-polls (:class:`~rollout_server.net.h1client.H1Pool`, which reads answers
whole and raises httpx's exception types). It does one request with a complete body, an answer
read whole or piece by piece, and reuses connections per origin (the most recently used first,
so a lone caller keeps one connection and, over HTTPS, one TLS session).

What it keeps from httpx: the TLS context (the process's one,
:func:`~rollout_server.net.httpclient.shared_tls`: httpx's, so the same CA bundle and
``SSL_CERT_FILE``/``SSL_CERT_DIR``), timeouts (connect, then per read and per write), the
stale-connection check before reuse (an idle connection whose socket reads as ready was closed
by the server, or holds junk, and is dropped), and gzip/deflate answers. Proxy variables are
not read. Reading an answer can resume after a cancellation (trio's ``receive_some`` consumes
nothing when cancelled), which lets a caller finish reading an answer that is already paid for
without a watcher task.

Failures are :class:`WireError` subclasses that say how far the exchange got. Only
:class:`NotSent` (:class:`ConnectFailed`, :class:`ConnectTimeout`) means no byte of the request
was written, so sending it again cannot make the server act twice; it is raised only while
connecting, never once a connection is up. ``before_answer`` is true when no byte of the answer
had arrived.
"""

from __future__ import annotations

import ssl
import zlib
from collections.abc import AsyncIterator, Sequence
from math import inf
from typing import Final
from urllib.parse import urlsplit

import h11
import trio

__all__ = [
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

_RECEIVE: Final = 65536
_DROPPED: Final = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
_BODY_METHODS: Final = (b"POST", b"PUT", b"PATCH")


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


def _detail(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Origin:
    """Where requests go: scheme, host and port (parsed once), and a default request target."""

    __slots__ = ("host", "host_header", "key", "port", "scheme", "target")

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
    """One connection of a :class:`WirePool`, owned by one exchange at a time."""

    __slots__ = ("h11", "idle_since", "key", "socket", "stream")

    def __init__(self, stream: trio.abc.Stream, key: str) -> None:
        self.stream = stream
        self.key = key
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        transport = stream
        while isinstance(transport, trio.SSLStream):
            transport = transport.transport_stream
        assert isinstance(transport, trio.SocketStream)
        self.socket = transport.socket


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
                tcp = await trio.open_tcp_stream(origin.host, origin.port)
                stream = tcp if origin.scheme == "http" else await _tls(tcp, origin.host)
            except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
                raise ConnectFailed(_detail(exc), before_answer=True) from exc
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

        On any failure (or cancellation) the connection is closed.
        """
        protocol = connection.h11
        head = [(b"host", origin.host_header), *headers]
        if body or method in _BODY_METHODS:
            head.append((b"content-length", b"%d" % len(body)))
        try:
            data = protocol.send(h11.Request(method=method, target=target, headers=head)) or b""
            if body:
                data += protocol.send(h11.Data(data=body)) or b""
            data += protocol.send(h11.EndOfMessage()) or b""
            timeout = self.timeout
            try:
                if timeout == inf:
                    await connection.stream.send_all(data)
                else:
                    with trio.move_on_after(timeout) as write:
                        await connection.stream.send_all(data)
                    if write.cancelled_caught:
                        raise ReadTimeout("timed out writing the request", before_answer=True)
            except _DROPPED as exc:
                raise WriteFailed(_detail(exc), before_answer=True) from exc
            # The answer's head, read here rather than in a coroutine of the response's own.
            response = WireResponse(self, connection)
            while True:
                try:
                    event = protocol.next_event()
                except h11.RemoteProtocolError as exc:
                    raise response._lost(ConnectionLost, exc) from exc
                if event is h11.NEED_DATA:
                    await response._receive(connection)
                elif type(event) is h11.Response:
                    break
                elif type(event) is h11.ConnectionClosed:
                    raise ConnectionLost(
                        "Server disconnected without sending a response", before_answer=True
                    )
                elif not isinstance(event, h11.InformationalResponse):
                    raise ConnectionLost(f"unexpected {type(event).__name__}", before_answer=True)
            response._begin(event)
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise
        return response

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
                await trio.aclose_forcefully(connection.stream)
        await trio.lowlevel.checkpoint()


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
        "_connection",
        "_decoder",
        "_done",
        "_headers",
        "_parts",
        "_pool",
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

    async def _receive(self, connection: Connection) -> None:
        timeout = self._pool.timeout
        try:
            if timeout == inf:
                data = await connection.stream.receive_some(_RECEIVE)
            else:
                with trio.move_on_after(timeout) as read:
                    data = await connection.stream.receive_some(_RECEIVE)
                if read.cancelled_caught:
                    raise ReadTimeout(
                        "timed out reading the answer", before_answer=not self._answering
                    )
        except _DROPPED as exc:
            raise self._lost(ReadFailed, exc) from exc
        if data:
            self._answering = True
        connection.h11.receive_data(bytes(data))

    def _lost(self, kind: type[ConnectionLost], exc: BaseException) -> ConnectionLost:
        if self._answering:
            return kind(_detail(exc), before_answer=False)
        detail = f"Server disconnected without sending a response ({_detail(exc)})"
        return kind(detail, before_answer=True)

    def _begin(self, answer: h11.Response) -> None:
        self.status = answer.status_code
        self.raw_headers = answer.headers
        if not self._pool.decompress:
            return
        coding = b""
        for name, value in answer.headers:
            if name == b"content-encoding":
                coding = coding + b", " + value if coding else value
        coding = coding.strip().lower()
        if coding == b"gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == b"deflate":
            self._decoder = zlib.decompressobj()
        elif coding not in (b"", b"identity"):
            shown = coding.decode("latin-1")
            raise ConnectionLost(f"unsupported content-encoding {shown!r}", before_answer=False)

    def _piece(self, event: h11.Event | type[h11.NEED_DATA | h11.PAUSED]) -> bytes:
        """The body bytes an event carries (decoded); gives the connection back at the end."""
        if type(event) is h11.Data:
            data = bytes(event.data)
            if self._decoder is None:
                return data
            try:
                return self._decoder.decompress(data)
            except zlib.error as exc:
                raise ConnectionLost(
                    f"invalid compressed body: {exc}", before_answer=False
                ) from exc
        if type(event) is h11.EndOfMessage:
            self._done = True
            self._release()
            return self._decoder.flush() if self._decoder is not None else b""
        raise ConnectionLost(f"unexpected {type(event).__name__}", before_answer=False)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives (decoded)."""
        while not self._done:
            connection = self._connection
            assert connection is not None
            try:
                event = connection.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._lost(ConnectionLost, exc) from exc
            if event is h11.NEED_DATA:
                await self._receive(connection)
            elif data := self._piece(event):
                yield data

    async def read(self) -> bytes:
        """The whole body. If cancelled, calling it again resumes where it stopped."""
        parts = self._parts
        while not self._done:
            connection = self._connection
            assert connection is not None
            try:
                event = connection.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._lost(ConnectionLost, exc) from exc
            if event is h11.NEED_DATA:
                await self._receive(connection)
            elif data := self._piece(event):
                parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        assert connection is not None
        state = connection.h11
        if state.our_state is h11.DONE and state.their_state is h11.DONE:
            state.start_next_cycle()
            self._pool._checkin(connection)
        else:
            connection.socket.close()

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
