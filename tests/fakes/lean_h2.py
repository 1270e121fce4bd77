"""The lean upstream's HTTP/2 side: h2c with prior knowledge, on the ``h2`` package.

:mod:`tests.fakes.lean_upstream` hands a connection here when its first bytes are the HTTP/2
connection preface. One task reads the connection and feeds ``h2``; each request, once its
stream has ended, is answered by a task of its own through the same routing as HTTP/1.1
(``answer``), so one connection carries as many held calls as the server advertises in
``SETTINGS_MAX_CONCURRENT_STREAMS``. Written on ``h2`` directly rather than served by
hypercorn: hypercorn closes a connection after 1,000 requests (``keep_alive_max_requests``)
and costs about ten times the CPU per call that the benchmarks' fake may take.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import trio

__all__ = ["PREFACE", "H2Answer", "serve_h2"]

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MAX_RECV: Final = 2**16
_DROPPED: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class _Gone(Exception):
    """The stream or the connection went away while answering."""


class H2Answer:
    """Writes one stream's answer (the interface of the HTTP/1.1 writers: ``whole`` and
    ``stream_events``)."""

    __slots__ = ("_conn", "_sid")

    def __init__(self, conn: _Connection, stream_id: int) -> None:
        self._conn = conn
        self._sid = stream_id

    async def whole(self, status: int, body: bytes) -> None:
        headers = [
            (b":status", b"%d" % status),
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
        ]
        await self._conn.send_headers(self._sid, headers, end=not body)
        if body:
            await self._conn.send_data(self._sid, body, end=True)

    async def stream_events(self, events: list[bytes]) -> None:
        headers = [
            (b":status", b"200"),
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
        ]
        await self._conn.send_headers(self._sid, headers, end=not events)
        last = len(events) - 1
        for i, event in enumerate(events):
            await self._conn.send_data(self._sid, event, end=i == last)


Answer = Callable[[bytes, bytes, bytes, H2Answer], Awaitable[None]]
"""``answer(method, target, body, out)``: the lean upstream's routing."""


class _Connection:
    def __init__(self, stream: trio.abc.Stream, max_streams: int) -> None:
        self.stream = stream
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams},
        )
        self._send_lock = trio.Lock()
        self._window = trio.Event()
        self.requests: dict[int, tuple[bytes, bytes, bytearray]] = {}
        self.answering: dict[int, trio.CancelScope] = {}

    async def flush(self) -> None:
        # Taken under the lock: header blocks must leave in the order HPACK encoded them.
        async with self._send_lock:
            data = self.h2.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except _DROPPED:
                    raise _Gone from None

    def window_changed(self) -> None:
        self._window.set()
        self._window = trio.Event()

    async def send_headers(self, sid: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        try:
            self.h2.send_headers(sid, headers, end_stream=end)
        except h2.exceptions.ProtocolError:
            raise _Gone from None
        await self.flush()

    async def send_data(self, sid: int, data: bytes, end: bool) -> None:
        view = memoryview(data)
        while True:
            try:
                room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
                if room <= 0:
                    await self._window.wait()
                    continue
                piece, view = view[:room], view[room:]
                self.h2.send_data(sid, bytes(piece), end_stream=end and not view)
            except h2.exceptions.ProtocolError:
                raise _Gone from None
            await self.flush()
            if not view:
                return


async def _respond(conn: _Connection, answer: Answer, sid: int) -> None:
    method, path, body = conn.requests.pop(sid)
    with trio.CancelScope() as scope:
        conn.answering[sid] = scope
        try:
            await answer(method, path, bytes(body), H2Answer(conn, sid))
        except _Gone:
            pass
        finally:
            del conn.answering[sid]


async def _poll(conn: _Connection) -> bytes | None:
    """After a GOAWAY: what the client sent next (b"" when nothing came for a moment), or
    None once every request kept has been answered (or the client went away)."""
    while conn.answering or conn.requests:
        with trio.move_on_after(0.05):
            try:
                data = await conn.stream.receive_some(_MAX_RECV)
            except _DROPPED:
                return None
            return bytes(data) or None
    return None


def _request_head(headers: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    method = path = b""
    for name, value in headers:
        if name == b":method":
            method = value
        elif name == b":path":
            path = value
    return method, path


async def _goaway(conn: _Connection, last: int) -> None:
    # Written by hand: h2 closes its own state when it sends one, and could then not answer
    # the streams it keeps (as a server closing gracefully does).
    frame = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + last.to_bytes(4, "big") + bytes(4)
    await conn.flush()
    async with conn._send_lock:
        try:
            await conn.stream.send_all(frame)
        except _DROPPED:
            raise _Gone from None


async def _linger(stream: trio.abc.Stream) -> None:
    """Close gracefully as nginx's lingering close does: no more bytes from us (FIN), then
    read what the client still sends until it closes or a second passed. Closing with the
    client's bytes unread (its WINDOW_UPDATEs, a stream it opened before it read the GOAWAY)
    would make the kernel answer with a reset that drops the last answer's unsent tail."""
    try:
        if isinstance(stream, trio.SocketStream):
            await stream.send_eof()
        with trio.move_on_after(1.0):
            while await stream.receive_some(_MAX_RECV):
                pass
    except _DROPPED:
        pass


async def serve_h2(
    stream: trio.abc.Stream,
    received: bytes,
    answer: Answer,
    *,
    max_streams: int,
    goaway_after: int = 0,
) -> None:
    """Serve one h2c connection whose first bytes, ``received``, began with :data:`PREFACE`,
    until the client closes it. ``goaway_after``: close it gracefully after that many requests,
    as hypercorn and nginx do after 1,000 (a GOAWAY naming the last request kept; the requests
    after it are left unanswered, the others answered, then the connection closed)."""
    conn = _Connection(stream, max_streams)
    conn.h2.initiate_connection()
    requests = 0
    last: int | None = None
    async with trio.open_nursery() as nursery:
        try:
            data: bytes | None = received
            while data is not None:
                for event in conn.h2.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        sid = event.stream_id
                        if last is not None and sid > last:
                            continue
                        requests += 1
                        if requests == goaway_after:
                            last = sid
                            await _goaway(conn, sid)
                        conn.requests[sid] = (*_request_head(event.headers), bytearray())
                    elif isinstance(event, h2.events.DataReceived):
                        if event.stream_id in conn.requests:
                            conn.requests[event.stream_id][2].extend(event.data)
                        conn.h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded):
                        if event.stream_id in conn.requests:
                            nursery.start_soon(_respond, conn, answer, event.stream_id)
                    elif isinstance(event, h2.events.StreamReset):
                        conn.requests.pop(event.stream_id, None)
                        scope = conn.answering.get(event.stream_id)
                        if scope is not None:
                            scope.cancel()
                    elif isinstance(
                        event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged
                    ):
                        conn.window_changed()
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return
                await conn.flush()
                if last is not None:
                    # Gracefully closing: done once the requests kept are answered.
                    data = await _poll(conn)
                    if data is None:
                        await _linger(stream)
                    continue
                try:
                    data = bytes(await stream.receive_some(_MAX_RECV)) or None
                except _DROPPED:
                    return
        except (h2.exceptions.ProtocolError, _Gone):
            return
        finally:
            nursery.cancel_scope.cancel()
