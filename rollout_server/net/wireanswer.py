"""One answer of :mod:`rollout_server.net.wire`: its head at once, its body on demand.

The body is read without h11 when :mod:`~rollout_server.net.wirefast` took the head (the
connection keeps the bytes that arrived beyond it), and by h11 when h11 read the head.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Sequence
from math import inf
from typing import TYPE_CHECKING, Final

import h11
import trio

from .wireerrors import DROPPED, ConnectionLost, ReadFailed, ReadTimeout, detail

if TYPE_CHECKING:
    from .wire import Connection, WirePool

__all__ = ["WireResponse"]

_RECEIVE: Final = 65536
_WRITING: Final = 0
_READING: Final = 1
"""Where :meth:`WirePool.send <rollout_server.net.wire.WirePool.send>` is, for its timeout's words."""


class WireResponse:
    """One answer: its status and headers at once, its body on demand."""

    __slots__ = (
        "_answering",
        "_connection",
        "_decoder",
        "_done",
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
        self._remaining = self._length = 0
        """Body bytes still to come (of ``_length``) while h11 is not reading the answer."""
        self._step = _WRITING

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
            raise ConnectionLost(f"unsupported content-encoding {shown!r}", before_answer=False)

    def _decode(self, data: bytes) -> bytes:
        if self._decoder is None:
            return data
        try:
            return self._decoder.decompress(data)
        except zlib.error as exc:
            raise ConnectionLost(f"invalid compressed body: {exc}", before_answer=False) from exc

    def _end(self) -> bytes:
        self._done = True
        self._release()
        return self._decoder.flush() if self._decoder is not None else b""

    async def _next(self) -> bytes:
        """The next piece of the body (decoded, maybe empty); gives the connection back at
        its end. Cancelled while waiting for bytes, it has consumed none."""
        connection = self._connection
        assert connection is not None
        protocol = connection.h11
        if protocol is None:
            buffer, remaining = connection.buffer, self._remaining
            if not buffer and remaining:
                buffer = await self._receive(connection)
                if not buffer:
                    # h11's words for it, so that either way of reading fails alike.
                    got = self._length - remaining
                    exc = h11.RemoteProtocolError(
                        "peer closed connection without sending complete message body "
                        f"(received {got} bytes, expected {self._length})"
                    )
                    raise self._lost(ConnectionLost, exc) from exc
            if len(buffer) < remaining:
                connection.buffer = b""
                self._remaining = remaining - len(buffer)
                return self._decode(buffer)
            connection.buffer = buffer[remaining:] if len(buffer) > remaining else b""
            self._remaining = 0
            data = self._decode(buffer[:remaining]) if remaining else b""
            return data + self._end()
        try:
            event = protocol.next_event()
        except h11.RemoteProtocolError as exc:
            raise self._lost(ConnectionLost, exc) from exc
        if event is h11.NEED_DATA:
            protocol.receive_data(await self._receive(connection))
            return b""
        if type(event) is h11.Data:
            return self._decode(bytes(event.data))
        if type(event) is h11.EndOfMessage:
            return self._end()
        raise ConnectionLost(f"unexpected {type(event).__name__}", before_answer=False)

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
        state = connection.h11
        if state is None:
            self._pool._checkin(connection)
        elif state.our_state is h11.DONE and state.their_state is h11.DONE:
            # A fresh h11 state is the one start_next_cycle() would leave; bytes h11 holds
            # beyond this answer are the next one's start, as they would be for h11.
            connection.buffer, connection.h11 = state.trailing_data[0], None
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
