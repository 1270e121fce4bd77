"""The project's lean HTTP/1.1 client on trio streams, with a keep-alive pool.

httpx and httpcore cost more CPU per call than the servers they talk to (request and response
models, header merging, the pool's locks and bookkeeping, a watcher task per call). Two hot
paths go through this client instead: the bridge's non-streaming calls to a provider
(``bridge.upstreams.direct``, through :meth:`WirePool.request`) and the rollout client's
admissions and long-polls (:class:`~rollout_server.net.h1client.H1Pool`, which reads answers
whole and raises httpx's exception types). It does one request with a complete body, an answer
read whole or piece by piece (:class:`~rollout_server.net.wireanswer.WireResponse`), and reuses
connections per origin (the most recently used first, so a lone caller keeps one connection
and, over HTTPS, one TLS session). The common exchange (a request with ordinary headers, an
``HTTP/1.1`` answer with a ``content-length``) is written and read without h11
(:mod:`~rollout_server.net.wirefast`); any other is h11's, from the request or from the first
unusual byte of the answer, so what a caller sees is what h11 makes of the same bytes.

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
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Sequence
from math import inf
from typing import Final
from urllib.parse import urlsplit

import h11
import trio

from .wireanswer import _READING, _WRITING, WireResponse
from .wireerrors import (
    DROPPED,
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
from .wirefast import CheckedHeaders, Unusual, encode_request, parse_head

__all__ = [
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
    """One connection of a :class:`WirePool`, owned by one exchange at a time."""

    __slots__ = ("buffer", "h11", "idle_since", "key", "socket", "stream")

    def __init__(self, stream: trio.abc.Stream, key: str) -> None:
        self.stream = stream
        self.key = key
        self.h11: h11.Connection | None = None
        """h11's state while an exchange is h11's to read; ``None`` between exchanges."""
        self.buffer = b""
        """Bytes received and not yet parsed while h11 is not reading (as h11 would keep)."""
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
        try:
            if data is None:
                protocol = connection.h11 = h11.Connection(h11.CLIENT)
                data = _h11_request(protocol, method, target, origin, headers, body, sized)
            await self._write(connection, data, bound)
            response._step = _READING
            if connection.h11 is None:
                buffer, closed = connection.buffer, False
                while True:
                    try:
                        head = parse_head(buffer, method) if buffer else None
                    except Unusual:
                        break
                    if head is not None:
                        status, fields, length, end = head
                        response._remaining = response._length = length
                        connection.buffer = buffer[end:]
                        response._begin(status, fields)
                        return
                    received = await response._receive(connection, bound)
                    if not received:
                        closed = True
                        break
                    buffer = buffer + received if buffer else received
                # h11 reads this answer from its first byte; it takes the request as written.
                protocol = connection.h11 = h11.Connection(h11.CLIENT)
                _h11_request(protocol, method, target, origin, headers, body, sized)
                connection.buffer = b""
                protocol.receive_data(buffer)
                if closed:
                    protocol.receive_data(b"")
            await self._h11_head(response, connection, bound)
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

    async def _h11_head(
        self, response: WireResponse, connection: Connection, bound: trio.CancelScope | None
    ) -> None:
        protocol = connection.h11
        assert protocol is not None
        if connection.buffer:
            protocol.receive_data(connection.buffer)
            connection.buffer = b""
        # The answer's head, read here rather than in a coroutine of the response's own.
        while True:
            try:
                event = protocol.next_event()
            except h11.RemoteProtocolError as exc:
                raise response._lost(ConnectionLost, exc) from exc
            if event is h11.NEED_DATA:
                protocol.receive_data(await response._receive(connection, bound))
            elif type(event) is h11.Response:
                response._begin(event.status_code, event.headers)
                return
            elif type(event) is h11.ConnectionClosed:
                raise ConnectionLost(
                    "Server disconnected without sending a response", before_answer=True
                )
            elif not isinstance(event, h11.InformationalResponse):
                raise ConnectionLost(f"unexpected {type(event).__name__}", before_answer=True)

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
    protocol: h11.Connection,
    method: bytes,
    target: bytes,
    origin: Origin,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    sized: bool,
) -> bytes:
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
