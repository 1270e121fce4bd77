"""The lean HTTP/2 client of the bridge's non-streamed provider calls, on the ``h2`` package.

Why not httpx's HTTP/2 (which :mod:`bridge.upstreams.h2pool` uses for streamed calls): measured
in the bridge process, ``bench_inflight.py --rows 3000 --in-flight 3000 --latency 5``, the
bridge's CPU per call was 2.46 ms over httpx's HTTP/2 against 1.08-1.10 ms over the lean
HTTP/1.1 pool (:mod:`rollout_server.net.wire`), and at 10,000 in flight that CPU, spent when
the 10,000 answers arrive together, made the run 1.6x its ideal. httpcore also hands the
answers of one connection's streams from task to task through one read lock (a stream whose
answer arrived waits for the tasks queued before it, one of which may be blocked reading).
Here one reader task per connection feeds ``h2`` and wakes the stream an event is for.

Shape: :class:`H2Wire` holds connections per origin, each carrying as many calls at once as
the server's ``SETTINGS_MAX_CONCURRENT_STREAMS`` (first fit, a new connection when all are
full); its readers run in the nursery :meth:`H2Wire.serve` opens. :meth:`H2Wire.request` sends
one request and returns once the answer's head arrived, as ``WirePool.request`` does, raising
the same :mod:`rollout_server.net.wireerrors` types, so the direct path maps them to the same
statuses and retries. Calls the server refused unprocessed (streams above a GOAWAY's last
stream id, ``REFUSED_STREAM``) go out again on another connection. ``https://`` offers ``h2``
and ``http/1.1`` by ALPN; an origin that picks HTTP/1.1 is remembered and :meth:`request`
answers None for it, the caller then using the HTTP/1.1 pool.

``http://`` has no negotiation (HTTP/2 with prior knowledge, h2c). An origin that has never
sent us its SETTINGS and, on a connection of ours, answers the preface with an HTTP/1.1 status
line or drops the connection before its SETTINGS does not speak h2c (an HTTP/1.1-only server:
uvicorn, most local model servers): it is remembered as HTTP/1.1 for the rest of the bridge's
life, logged once, and :meth:`request` answers None for it as for ALPN's choice. That is safe
for the call that found it: no stream goes out on a connection before the server's SETTINGS
arrived, so the server never saw an HTTP/2 request.

Why one module of this size: one protocol client whose parts share their state (the
connection's ``h2`` state machine, its send lock and flow-control window, its streams): the
pool that picks connections, the connection's reader, and the exchange; split, each would
reach into the others' private fields.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from typing import Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from rollout_server.net.wire import Origin
from rollout_server.net.wireerrors import (
    DROPPED,
    ConnectFailed,
    ConnectTimeout,
    ReadFailed,
    ReadTimeout,
    WireError,
    WriteFailed,
    detail,
)

__all__ = ["H2Response", "H2Wire"]

#: Streams assumed per connection until the server's SETTINGS say (what providers advertise).
_ASSUMED_STREAMS: Final = 100
_MAX_RECV: Final = 2**16
_ATTEMPTS: Final = 10
"""Sends of one call the server refused unprocessed (GOAWAY, REFUSED_STREAM) before failing:
such a call did nothing, so sending it again is free; the bound only stops a server that
refuses everything. (A burst onto connections each closed after a few requests halves the
refused calls per round.)"""


_GOAWAY: Final = 0x7


def _take_goaways(buffer: bytearray) -> tuple[bytes, list[bytes]]:
    """The whole frames at the start of ``buffer`` (taken out of it), without their GOAWAY
    frames, and the payloads of those.

    ``h2`` turns a received GOAWAY into a closed connection and refuses every frame after it,
    so the answers still coming on the streams the server kept (those up to its last stream
    id: a graceful close, e.g. a server that closes a connection every 1,000 requests) would
    be lost. The reader handles GOAWAY itself instead.
    """
    pos, end, start = 0, len(buffer), 0
    kept: list[bytes] = []
    goaways: list[bytes] = []
    while end - pos >= 9:
        total = 9 + int.from_bytes(buffer[pos : pos + 3], "big")
        if end - pos < total:
            break
        if buffer[pos + 3] == _GOAWAY:
            kept.append(bytes(buffer[start:pos]))
            goaways.append(bytes(buffer[pos + 9 : pos + total]))
            start = pos + total
        pos += total
    kept.append(bytes(buffer[start:pos]))
    del buffer[:pos]
    return b"".join(kept), goaways


#: Header checks off: ours are lower-case bytes built by the direct path, and the answers' are
#: read for the status, content-type and retry-after only; the checks were a fifth of this
#: client's CPU per call.
_CONFIG: Final = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    split_outbound_cookies=False,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
)


class _GivenUp(ConnectFailed):
    """The call opening a connection went away before it was up: its waiters open another."""


class _NoH2c(ReadFailed):
    """The server answered the HTTP/2 preface as an HTTP/1.1 server does."""


class _Unprocessed(Exception):
    """The server did not process the stream: the call may go out again as it is."""


class _Stream:
    __slots__ = ("body", "changed", "ended", "error", "headers", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] | None = None
        self.body = bytearray()
        self.ended = False
        self.error: BaseException | None = None
        self.changed = trio.Event()

    def wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def until(self, done: Callable[[], bool], idle_s: float, *, before_answer: bool) -> None:
        """Wait until ``done()``: the stream's error if it fails first, :class:`ReadTimeout`
        when nothing changed for ``idle_s`` seconds."""
        while not done():
            if self.error is not None:
                raise self.error
            with trio.move_on_after(idle_s):
                await self.changed.wait()
                continue
            raise ReadTimeout("timed out reading the answer", before_answer=before_answer)


class _Conn:
    __slots__ = (
        "capacity",
        "closing",
        "connected",
        "error",
        "h2",
        "idle_since",
        "ready",
        "reserved",
        "send_lock",
        "socket",
        "streams",
        "window",
    )

    def __init__(self) -> None:
        self.h2 = h2.connection.H2Connection(_CONFIG)
        self.h2.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.ENABLE_PUSH: 0}
        )
        self.socket: trio.abc.Stream | None = None
        self.connected = trio.Event()
        self.ready = trio.Event()  # the server's first SETTINGS arrived
        self.error: WireError | None = None
        self.capacity = _ASSUMED_STREAMS
        self.reserved = 0
        self.streams: dict[int, _Stream] = {}
        self.closing = False
        self.send_lock = trio.Lock()
        self.window = trio.Event()
        self.idle_since = trio.current_time()

    def free(self) -> int:
        if self.closing or self.error is not None:
            return 0
        return self.capacity - self.reserved - len(self.streams)

    async def flush(self) -> None:
        # Taken under the lock: header blocks must leave in the order HPACK encoded them.
        async with self.send_lock:
            data = self.h2.data_to_send()
            if data and self.socket is not None:
                try:
                    await self.socket.send_all(data)
                except DROPPED as exc:
                    raise WriteFailed(detail(exc), before_answer=True) from exc

    def window_changed(self) -> None:
        self.window.set()
        self.window = trio.Event()

    def fail(self, error: WireError) -> None:
        """The connection is gone: every stream on it fails with ``error`` (before or after
        its answer began, as each stood)."""
        self.closing = True
        for stream in self.streams.values():
            began = stream.headers is not None
            stream.error = type(error)(str(error), before_answer=not began)
            stream.wake()
        self.streams.clear()
        self.ready.set()
        self.window_changed()


class H2Response:
    """One answer: ``status`` and ``headers`` at once, the body with :meth:`read`."""

    __slots__ = ("_conn", "_sid", "_stream", "_timeout", "headers", "status")

    def __init__(self, conn: _Conn, sid: int, stream: _Stream, timeout: float) -> None:
        self._conn, self._sid, self._stream, self._timeout = conn, sid, stream, timeout
        self.status = stream.status
        self.headers: dict[str, str] = stream.headers or {}

    async def read(self) -> bytes:
        """The whole body (raises :class:`ReadTimeout` when no byte came within the timeout)."""
        stream = self._stream
        await stream.until(lambda: stream.ended, self._timeout, before_answer=False)
        return bytes(stream.body)

    async def aclose(self) -> None:
        """Give the stream up if its answer is not all in (a reset tells the server)."""
        if not self._stream.ended and self._stream.error is None:
            await _reset(self._conn, self._sid)


async def _reset(conn: _Conn, sid: int) -> None:
    conn.streams.pop(sid, None)
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        try:
            conn.h2.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            await conn.flush()
        except (h2.exceptions.ProtocolError, WireError):
            pass


class H2Wire:
    """HTTP/2 connections to providers (see the module's docstring). Run :meth:`serve` (with
    ``nursery.start``) before the first :meth:`request`."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        timeout: float,
        keepalive_expiry: float,
        log: Callable[[str, str], None] | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.keepalive_expiry = keepalive_expiry
        self.log = log
        """``(level, message)`` sink: told once per ``http://`` origin found not to speak h2c."""
        self._conns: dict[str, list[_Conn]] = {}
        self._http1: set[str] = set()
        self._answered: set[str] = set()
        self._asking: dict[str, trio.Lock] = {}
        self._nursery: trio.Nursery | None = None
        self._tls: ssl.SSLContext | None = None

    def answered(self, origin: Origin) -> bool:
        """Whether ``origin`` has spoken HTTP/2 (sent its SETTINGS) on a connection of ours."""
        return origin.key in self._answered

    async def speaks_http2(self, origin: Origin) -> bool:
        """Whether ``origin`` speaks HTTP/2 (its SETTINGS came on a connection of ours), opening
        a connection to it to find out the first time; False when it speaks only HTTP/1.1.
        Raises :mod:`~rollout_server.net.wireerrors` types when it cannot be reached."""
        if origin.key in self._answered:
            return True
        # One connection asks (first fit would open one per hundred callers at once).
        async with self._asking.setdefault(origin.key, trio.Lock()):
            if origin.key in self._answered:
                return True
            if origin.key in self._http1:
                return False
            conn = await self._reserve(origin)
            if conn is None:
                return False
            conn.reserved -= 1
            return True

    @property
    def connections(self) -> int:
        """The connections open or opening."""
        return sum(len(conns) for conns in self._conns.values())

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the connections' readers until cancelled; then close every connection."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self.aclose()

    async def aclose(self) -> None:
        """Close every connection."""
        conns = [conn for group in self._conns.values() for conn in group]
        self._conns.clear()
        for conn in conns:
            conn.fail(ReadFailed("the bridge is stopping", before_answer=True))
            if conn.socket is not None:
                await trio.aclose_forcefully(conn.socket)

    async def request(
        self, origin: Origin, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> H2Response | None:
        """POST ``body`` to ``origin``: the answer once its head arrived, or None when the
        origin speaks only HTTP/1.1 (ALPN chose it). Raises :mod:`~rollout_server.net.wireerrors`
        types as the HTTP/1.1 pool does."""
        for attempt in range(_ATTEMPTS):
            if origin.key in self._http1:
                return None
            conn = await self._reserve(origin)
            try:
                if conn is None:
                    return None
                return await self._exchange(conn, origin, headers, body)
            except _Unprocessed:
                if attempt == _ATTEMPTS - 1:
                    raise ReadFailed(
                        "the provider refused the call unprocessed (GOAWAY or REFUSED_STREAM) "
                        f"{_ATTEMPTS} times",
                        before_answer=True,
                    ) from None
        raise AssertionError("unreachable")

    async def _reserve(self, origin: Origin) -> _Conn | None:
        """A connection with a stream reserved for one call; None when HTTP/1.1 only."""
        while True:
            conns = self._conns.setdefault(origin.key, [])
            await self._drop_idle(conns)
            conn = next((c for c in conns if c.free() > 0), None)
            if conn is None:
                conn = _Conn()
                conns.append(conn)
                conn.reserved += 1
                await self._connect(conn, origin)
            else:
                conn.reserved += 1
            if not conn.ready.is_set():  # opening: wait for the server's SETTINGS
                try:
                    with trio.move_on_after(self.connect_timeout) as waited:
                        await conn.connected.wait()
                        await conn.ready.wait()
                    if waited.cancelled_caught:
                        raise ConnectTimeout("timed out connecting", before_answer=True)
                except BaseException:
                    conn.reserved -= 1
                    raise
            if conn.error is not None:
                conn.reserved -= 1
                if origin.key in self._http1:
                    return None
                if isinstance(conn.error, _GivenUp):
                    continue
                raise conn.error
            if conn.closing or conn.reserved + len(conn.streams) > conn.capacity:
                # The server allows fewer streams than assumed, or is going away: choose again.
                conn.reserved -= 1
                await trio.lowlevel.checkpoint()
                continue
            self._answered.add(origin.key)  # its SETTINGS came: it speaks HTTP/2
            return conn

    async def _drop_idle(self, conns: list[_Conn]) -> None:
        now = trio.current_time()
        for conn in list(conns):
            if conn.streams or conn.reserved or not conn.connected.is_set():
                continue
            gone = conn.closing or conn.error is not None
            if gone or now - conn.idle_since > self.keepalive_expiry:
                conns.remove(conn)
                conn.closing = True
                if conn.socket is not None:  # its reader then ends
                    await trio.aclose_forcefully(conn.socket)

    async def _connect(self, conn: _Conn, origin: Origin) -> None:
        """Open ``conn`` (its waiters wake on ``connected``), start its reader."""
        try:
            with trio.move_on_after(self.connect_timeout) as deadline:
                try:
                    tcp = await trio.open_tcp_stream(origin.host, origin.port)
                    if origin.scheme == "https":
                        stream: trio.abc.Stream = await self._handshake(tcp, origin)
                    else:
                        stream = tcp
                except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
                    raise ConnectFailed(detail(exc), before_answer=True) from exc
                conn.socket = stream
                if isinstance(stream, trio.SSLStream) and stream.selected_alpn_protocol() != "h2":
                    self._http1.add(origin.key)
                    await trio.aclose_forcefully(stream)
                    conn.socket = None
                    raise ConnectFailed("the provider chose HTTP/1.1", before_answer=True)
                conn.h2.initiate_connection()
                try:
                    await conn.flush()
                except WireError as exc:
                    self._check_h2c(conn, origin, exc)
                    raise
            if deadline.cancelled_caught:
                raise ConnectTimeout("timed out connecting", before_answer=True)
        except BaseException as exc:
            # Its other waiters wake to the failure (a cancelled opener's too).
            error = exc if isinstance(exc, WireError) else None
            conn.error = error or _GivenUp("connecting was given up", before_answer=True)
            conn.closing = True
            conn.connected.set()
            conn.ready.set()
            if error is None:
                raise
            return
        assert self._nursery is not None, "H2Wire.serve is not running"
        self._nursery.start_soon(self._read, conn, origin)
        conn.connected.set()

    async def _handshake(
        self, tcp: trio.SocketStream, origin: Origin
    ) -> trio.SSLStream[trio.SocketStream]:
        if self._tls is None:
            import httpx

            # httpx's verifying context, as the HTTP/1.1 pool's, offering h2 by ALPN.
            self._tls = httpx.create_ssl_context()
            self._tls.set_alpn_protocols(["h2", "http/1.1"])
        tls = trio.SSLStream(tcp, self._tls, server_hostname=origin.host, https_compatible=True)
        try:
            await tls.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(tcp)
            raise
        return tls

    async def _exchange(
        self, conn: _Conn, origin: Origin, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> H2Response:
        head = [
            (b":method", b"POST"),
            (b":scheme", origin.scheme.encode()),
            (b":authority", origin.host_header),
            (b":path", origin.target),
            *headers,
        ]
        stream = _Stream()
        conn.reserved -= 1
        try:
            sid = conn.h2.get_next_available_stream_id()
            conn.h2.send_headers(sid, head, end_stream=not body)
        except (h2.exceptions.ProtocolError, h2.exceptions.NoAvailableStreamIDError) as exc:
            # Stream ids used up, or the server lowered its stream limit: another connection.
            conn.closing = conn.closing or isinstance(exc, h2.exceptions.NoAvailableStreamIDError)
            raise _Unprocessed from exc
        conn.streams[sid] = stream
        try:
            await conn.flush()
            await self._send_body(conn, sid, stream, body)
            await stream.until(lambda: stream.headers is not None, self.timeout, before_answer=True)
        except BaseException:
            if not stream.ended:
                await _reset(conn, sid)
            raise
        return H2Response(conn, sid, stream, self.timeout)

    async def _send_body(self, conn: _Conn, sid: int, stream: _Stream, body: bytes) -> None:
        view = memoryview(body)
        while view:
            if stream.error is not None:
                raise stream.error
            try:
                room = min(conn.h2.local_flow_control_window(sid), conn.h2.max_outbound_frame_size)
                if room <= 0:
                    with trio.move_on_after(self.timeout):
                        await conn.window.wait()
                        continue
                    raise ReadTimeout("timed out writing the request", before_answer=True)
                piece, view = view[:room], view[room:]
                conn.h2.send_data(sid, bytes(piece), end_stream=not view)
            except h2.exceptions.StreamClosedError:
                raise stream.error or ReadFailed("stream closed", before_answer=True) from None
            await conn.flush()

    async def _read(self, conn: _Conn, origin: Origin) -> None:
        """The reader of ``conn``: feeds ``h2`` and wakes the stream each event is for."""
        socket = conn.socket
        assert socket is not None
        buffer = bytearray()
        try:
            while True:
                try:
                    data = await socket.receive_some(_MAX_RECV)
                except DROPPED as exc:
                    raise ReadFailed(detail(exc), before_answer=True) from exc
                if not data:
                    raise ReadFailed("the provider closed the connection", before_answer=True)
                buffer += data
                if not conn.ready.is_set() and buffer.startswith(b"HTTP/"):
                    line = bytes(buffer.split(b"\r\n", 1)[0][:80]).decode("latin-1")
                    raise _NoH2c(f"the provider answered HTTP/2 with {line!r}", before_answer=True)
                frames, goaways = _take_goaways(buffer)
                try:
                    events = conn.h2.receive_data(frames)
                except h2.exceptions.ProtocolError as exc:
                    raise ReadFailed(
                        f"HTTP/2 protocol error: {detail(exc)}", before_answer=True
                    ) from exc
                for event in events:
                    self._on_event(conn, event)
                for payload in goaways:
                    self._goaway(conn, payload)
                await conn.flush()
                if conn.closing and not conn.streams:
                    return
        except WireError as exc:
            self._check_h2c(conn, origin, exc)
            conn.error = conn.error or exc
            conn.fail(exc)
        finally:
            conn.closing = True
            conns = self._conns.get(origin.key)
            if conns is not None and conn in conns:
                conns.remove(conn)
            await trio.aclose_forcefully(socket)

    def _on_event(self, conn: _Conn, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            stream = conn.streams.get(event.stream_id)
            if stream is not None and stream.headers is None and event.headers is not None:
                fields: dict[str, str] = {}
                for name, value in event.headers:
                    key = bytes(name).decode("latin-1")
                    if key == ":status":
                        stream.status = int(value)
                    else:
                        fields[key] = bytes(value).decode("latin-1")
                stream.headers = fields
                stream.wake()
        elif isinstance(event, h2.events.DataReceived):
            stream = conn.streams.get(event.stream_id)
            if event.flow_controlled_length:
                conn.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if stream is not None and event.data:
                stream.body += event.data
                stream.wake()
        elif isinstance(event, h2.events.StreamEnded):
            stream = conn.streams.pop(event.stream_id, None)
            if stream is not None:
                stream.ended = True
                stream.wake()
            self._stream_closed(conn)
        elif isinstance(event, h2.events.StreamReset):
            stream = conn.streams.pop(event.stream_id, None)
            if stream is not None:
                refused = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
                if refused and stream.headers is None:
                    stream.error = _Unprocessed()
                else:
                    code = getattr(event.error_code, "name", event.error_code)
                    stream.error = ReadFailed(
                        f"the provider reset the stream ({code})",
                        before_answer=stream.headers is None,
                    )
                stream.wake()
            self._stream_closed(conn)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            streams = conn.h2.remote_settings.max_concurrent_streams
            conn.capacity = max(1, min(streams, 2**16))
            conn.ready.set()
            conn.window_changed()
        elif isinstance(event, h2.events.WindowUpdated):
            conn.window_changed()

    def _check_h2c(self, conn: _Conn, origin: Origin, error: WireError) -> None:
        """Remember ``origin`` as HTTP/1.1 only when ``conn``, open, failed before the server's
        SETTINGS and the origin never sent us any (see the module's docstring); log it once."""
        if conn.ready.is_set() or conn.closing or origin.scheme != "http":
            return
        if origin.key in self._answered or origin.key in self._http1:
            return
        self._http1.add(origin.key)
        if self.log is not None:
            self.log(
                "warning",
                f"{origin.key} does not speak HTTP/2 without TLS (h2c: {error}); calling it over "
                "HTTP/1.1 from now on, one connection per call ([bridge] upstream_http2)",
            )

    @staticmethod
    def _goaway(conn: _Conn, payload: bytes) -> None:
        """The server is closing ``conn``: no new stream on it; the streams above its last
        stream id were not processed and go out again elsewhere; the others finish."""
        conn.closing = True
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        for sid in [sid for sid in conn.streams if sid > last]:
            stream = conn.streams.pop(sid)
            stream.error = _Unprocessed()
            stream.wake()

    @staticmethod
    def _stream_closed(conn: _Conn) -> None:
        if not conn.streams:
            conn.idle_since = trio.current_time()
