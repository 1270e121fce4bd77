"""A lean keep-alive HTTP/1.1 client for one plain-HTTP origin, for calls answered whole.

The rollout client makes two small calls per rollout (an admission and a long-poll). Through
``httpx.AsyncClient`` each one costs more CPU in the client than in the server: URL and header
objects, the auth and redirect flow, cookies, the response wrapper, httpcore's pool. :class:`H1Pool`
keeps only what such calls need: h11 for the protocol, one keep-alive connection per call in
flight (idle ones reused last-in first-out), and the whole answer read into memory.

Failures are raised as the httpx exceptions the same failure raises through httpx
(``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``WriteError``, ``ReadError``,
``RemoteProtocolError``), so a caller handles both clients alike. There are no retries here: an
idle connection the server has closed is recognised before reuse (its socket reads as ready) and
dropped, as httpcore does.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf
from typing import Final

import h11
import httpx
import trio

__all__ = ["H1Pool", "H1Reply"]

_MAX_RECV: Final = 2**16
_DROPPED: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


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


class _Connection:
    __slots__ = ("protocol", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.protocol = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.stream.socket.close()


class H1Pool:
    """Keep-alive connections to ``host:port``; each :meth:`request` uses one of its own."""

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._host_header = (host if ":" not in host else f"[{host}]").encode("idna")
        if port != 80:
            self._host_header += b":%d" % port
        self._idle: list[_Connection] = []
        self._closed = False

    async def aclose(self) -> None:
        """Close every idle connection; calls still in flight close theirs when they end."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
        await trio.lowlevel.checkpoint()

    def _reusable(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            # Readable while idle means the server closed it (or sent junk): not reusable.
            if connection.stream.socket.is_readable():
                connection.close()
                continue
            return connection
        return None

    async def _connect(self, limit_sec: float) -> _Connection:
        try:
            with trio.fail_after(limit_sec):
                stream = await trio.open_tcp_stream(self._host, self._port)
        except trio.TooSlowError:
            raise httpx.ConnectTimeout("timed out connecting") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(stream)

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
        (connecting, when no idle connection can be reused, within ``connect_sec``)."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        connection = self._reusable() or await self._connect(connect_sec)
        done = False
        try:
            with trio.fail_after(total_sec):
                reply = await self._exchange(connection, method, target, headers, body)
            done = True
        except trio.TooSlowError:
            raise httpx.ReadTimeout("timed out waiting for the answer") from None
        except h11.ProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc
        finally:
            protocol = connection.protocol
            if (
                done
                and not self._closed
                and protocol.our_state is h11.DONE
                and protocol.their_state is h11.DONE
            ):
                protocol.start_next_cycle()
                self._idle.append(connection)
            else:
                connection.close()
        return reply

    async def _exchange(
        self,
        connection: _Connection,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> H1Reply:
        protocol = connection.protocol
        head = [(b"host", self._host_header), *headers]
        if body or method in (b"POST", b"PUT", b"PATCH"):
            head.append((b"content-length", b"%d" % len(body)))
        data = protocol.send(h11.Request(method=method, target=target, headers=head)) or b""
        if body:
            data += protocol.send(h11.Data(data=body)) or b""
        data += protocol.send(h11.EndOfMessage()) or b""
        try:
            await connection.stream.send_all(data)
        except _DROPPED as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        response: h11.Response | None = None
        chunks: list[bytes] = []
        while True:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                try:
                    received = await connection.stream.receive_some(_MAX_RECV)
                except _DROPPED as exc:
                    raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
                protocol.receive_data(bytes(received))
                continue
            kind = type(event)
            if kind is h11.Response:
                response = event  # type: ignore[assignment]
            elif kind is h11.Data:
                chunks.append(bytes(event.data))  # type: ignore[union-attr]
            elif kind is h11.EndOfMessage:
                assert response is not None
                content = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                return H1Reply(response.status_code, list(response.headers), content)
            elif kind is h11.ConnectionClosed:
                raise httpx.RemoteProtocolError("server disconnected without sending a response")
            # InformationalResponse (100 Continue): keep reading.
