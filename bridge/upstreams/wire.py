"""A lean HTTP/1.1 client for the direct path: h11 on trio streams, with a keep-alive pool.

httpx and httpcore cost the bridge about half of its CPU per call (request and response
models, header merging, the pool's locks and bookkeeping, a watcher task per call); this
client does what the direct path needs and nothing else: one request with a complete body,
an answer read whole or piece by piece, connections reused per origin (the most recently
used first, so a lone caller keeps one connection and one TLS session).

What it keeps from httpx: the TLS context (the process's one, ``shared_tls()``: httpx's, so
the same CA bundle and ``SSL_CERT_FILE``/``SSL_CERT_DIR``), the timeouts (connect, then per read and per
write), the stale-connection check before reuse, and gzip/deflate answers. Proxy variables are
not read, as they were not before: httpx ignores them when given its own transport, which the
bridge's client always was. Reading an answer can resume after a cancellation (trio's
``receive_some`` consumes nothing when cancelled), which lets the caller finish reading an
answer that is already paid for without a watcher task.
"""

from __future__ import annotations

import ssl
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

from rollout_server.net.httpclient import shared_tls

__all__ = [
    "ConnectTimeout",
    "ConnectionLost",
    "Origin",
    "ReadTimeout",
    "WireError",
    "WirePool",
    "WireResponse",
]

_RECEIVE = 65536


class WireError(Exception):
    """An exchange failed; ``before_answer`` when no byte of the answer had arrived."""

    def __init__(self, message: str, *, before_answer: bool) -> None:
        super().__init__(message)
        self.before_answer = before_answer


class ConnectTimeout(WireError):
    """The connection (or its TLS handshake) was not up within the connect timeout."""


class ReadTimeout(WireError):
    """A read or a write made no progress within its timeout."""


class ConnectionLost(WireError):
    """The connection failed, was reset or closed, or the answer was not valid HTTP/1.1."""


@dataclass(frozen=True)
class Origin:
    """Where a URL's requests go, parsed once."""

    scheme: str
    host: str
    port: int
    target: bytes
    """The request target: path and query."""
    host_header: bytes

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        shown = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        host_header = shown if port == default else f"{shown}:{port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, port, target.encode(), host_header.encode("idna"))


class _Connection:
    def __init__(self, stream: trio.abc.Stream, key: tuple[str, str, int]) -> None:
        self.stream = stream
        self.key = key
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def socket(self) -> trio.socket.SocketType:
        stream = self.stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        assert isinstance(stream, trio.SocketStream)
        return stream.socket


class WirePool:
    """Keep-alive connections per origin; each request takes one, its answer gives it back."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        timeout: float,
        keepalive_expiry: float = 60.0,
        max_idle: int = 256,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.keepalive_expiry = keepalive_expiry
        self.max_idle = max_idle
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._idle_count = 0

    async def request(
        self, origin: Origin, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> WireResponse:
        """POST ``body`` to ``origin`` and return once the answer's head has arrived."""
        connection = await self._checkout(origin)
        head = [(b"host", origin.host_header), *headers, (b"content-length", b"%d" % len(body))]
        try:
            wire = connection.h11.send(
                h11.Request(method=b"POST", target=origin.target, headers=head)
            )
            data = (wire or b"") + (connection.h11.send(h11.Data(data=body)) or b"")
            data += connection.h11.send(h11.EndOfMessage()) or b""
            with trio.move_on_after(self.timeout) as write:
                try:
                    await connection.stream.send_all(data)
                except (OSError, trio.BrokenResourceError) as exc:
                    detail = str(exc) or type(exc).__name__
                    raise ConnectionLost(detail, before_answer=True) from exc
            if write.cancelled_caught:
                raise ReadTimeout("timed out writing the request", before_answer=True)
            response = WireResponse(self, connection)
            await response._head()
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise
        return response

    async def _checkout(self, origin: Origin) -> _Connection:
        key = (origin.scheme, origin.host, origin.port)
        idle = self._idle.get(key)
        now = trio.current_time()
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            # A connection the server closed (or wrote to) while it was idle is readable.
            if now - connection.idle_since < self.keepalive_expiry and not (
                connection.socket().is_readable()
            ):
                await trio.lowlevel.checkpoint()
                return connection
            await trio.aclose_forcefully(connection.stream)
        return await self._connect(origin, key)

    async def _connect(self, origin: Origin, key: tuple[str, str, int]) -> _Connection:
        with trio.move_on_after(self.connect_timeout) as deadline:
            try:
                stream: trio.abc.Stream = await trio.open_tcp_stream(origin.host, origin.port)
                if origin.scheme == "https":
                    tls = trio.SSLStream(
                        stream, shared_tls(), server_hostname=origin.host, https_compatible=True
                    )
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(stream)
                        raise
                    stream = tls
            except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
                raise ConnectionLost(str(exc) or type(exc).__name__, before_answer=True) from exc
            return _Connection(stream, key)
        assert deadline.cancelled_caught
        raise ConnectTimeout("timed out connecting", before_answer=True)

    def _checkin(self, connection: _Connection) -> None:
        if self._idle_count >= self.max_idle:
            connection.socket().close()
            return
        connection.idle_since = trio.current_time()
        self._idle.setdefault(connection.key, []).append(connection)
        self._idle_count += 1

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle, self._idle_count = self._idle, {}, 0
        for connections in idle.values():
            for connection in connections:
                await trio.aclose_forcefully(connection.stream)


class WireResponse:
    """One answer: its status and headers at once, its body on demand."""

    status: int
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its values joined by ``", "``."""

    def __init__(self, pool: WirePool, connection: _Connection) -> None:
        self._pool = pool
        self._connection: _Connection | None = connection
        self._parts: list[bytes] = []
        self._done = False
        self._decoder: zlib._Decompress | None = None
        self._answering = False

    async def _next(self) -> h11.Event | type[h11.PAUSED]:
        connection = self._connection
        assert connection is not None
        while True:
            try:
                event = connection.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._lost(exc) from exc
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            with trio.move_on_after(self._pool.timeout) as read:
                try:
                    data = await connection.stream.receive_some(_RECEIVE)
                except (OSError, trio.BrokenResourceError) as exc:
                    raise self._lost(exc) from exc
            if read.cancelled_caught:
                raise ReadTimeout("timed out reading the answer", before_answer=not self._answering)
            self._answering = True
            connection.h11.receive_data(data if isinstance(data, bytes) else bytes(data))

    def _lost(self, exc: BaseException) -> ConnectionLost:
        detail = str(exc) or type(exc).__name__
        if not self._answering:
            detail = f"Server disconnected without sending a response ({detail})"
        return ConnectionLost(detail, before_answer=not self._answering)

    async def _head(self) -> None:
        while True:
            event = await self._next()
            if type(event) is h11.Response:
                break
            if not isinstance(event, h11.InformationalResponse):
                raise ConnectionLost(f"unexpected {type(event).__name__}", before_answer=True)
        self.status = event.status_code
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.headers = headers
        coding = headers.get("content-encoding", "").strip().lower()
        if coding == "gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._decoder = zlib.decompressobj()
        elif coding not in ("", "identity"):
            raise ConnectionLost(f"unsupported content-encoding {coding!r}", before_answer=False)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives (decoded)."""
        while not self._done:
            event = await self._next()
            if type(event) is h11.Data:
                data = bytes(event.data)
                if self._decoder is not None:
                    try:
                        data = self._decoder.decompress(data)
                    except zlib.error as exc:
                        raise ConnectionLost(
                            f"invalid compressed body: {exc}", before_answer=False
                        ) from exc
                if data:
                    yield data
            elif type(event) is h11.EndOfMessage:
                self._done = True
                self._release()
                if self._decoder is not None and (rest := self._decoder.flush()):
                    yield rest
            else:
                raise ConnectionLost(f"unexpected {type(event).__name__}", before_answer=False)

    async def read(self) -> bytes:
        """The whole body. If cancelled, calling it again resumes where it stopped."""
        async for part in self.chunks():
            self._parts.append(part)
        return b"".join(self._parts)

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        assert connection is not None
        state = connection.h11
        if state.our_state is h11.DONE and state.their_state is h11.DONE:
            state.start_next_cycle()
            self._pool._checkin(connection)
        else:
            connection.socket().close()

    async def aclose(self) -> None:
        """Give the connection back if the body was read whole; otherwise close it."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await trio.aclose_forcefully(connection.stream)
