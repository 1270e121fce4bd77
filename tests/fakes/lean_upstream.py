"""A cheap fake OpenAI-compatible upstream in a process of its own, for benchmarks.

:mod:`tests.fakes.upstream` runs inside the test's process on hypercorn's trio worker and
costs about a millisecond of CPU per chat call: in a benchmark on a 2-core machine that CPU is
taken from the processes being measured, where a real provider costs this machine nothing.
This server answers the chat calls those benchmarks make exactly as that fake does (the reply
``"echo: " + <last user message text>``, whitespace-separated words counted as tokens, one SSE
chunk per word and a final usage chunk when ``stream_options.include_usage`` is set; the rules
are in :mod:`tests.fakes.echo_reply`) at a tenth of the CPU (scripts/bench/bench_upstreams.py
measures both), and runs in its own process so what it does cost can be told apart.

Run it as ``python -m tests.fakes.lean_upstream`` from the repository root: it listens on
127.0.0.1, port 0, with a listen backlog of 4096, prints the port it got as one line on
stdout, and serves until it is killed (or, with ``--until-stdin-closes``, until its standard
input reaches its end, so that it cannot outlive a parent that dies without stopping it).

Routes: ``POST .../chat/completions``, ``GET .../models``, and the control route
``/_control``: ``GET`` answers ``{"completed", "in_flight", "in_flight_peak", "connections",
"h2_connections", "h2_refused", "delay"}``
(chat calls answered, chat calls being answered, connections accepted, the delay) and
``POST`` with ``{"delay": <seconds>}`` sets the delay every chat call waits (a trio sleep)
before its answer. Anything else is a 404. There is no fault injection: tests that need it
use :mod:`tests.fakes.upstream`.

HTTP/2 (h2c with prior knowledge, :mod:`tests.fakes.lean_h2`): a connection that opens with
the HTTP/2 preface is served by ``h2``, many held calls at once, up to ``--h2-max-streams``
(100 by default, about what real providers advertise) per connection; ``--no-h2`` refuses it
as an HTTP/1.1-only server does (a 400). ``connections`` counts both kinds, ``h2_connections``
the HTTP/2 ones, ``h2_refused`` those that opened with the preface under ``--no-h2``.

Each HTTP/1.1 connection is one task that reads a request, answers it and reads the next. Plain
requests are read by :func:`tests.fakes.plainparse.parse_request` and answered with
hand-written bytes (one ``send_all`` per answer, or per SSE chunk); a request it declines goes,
with the bytes read so far, to h11 for that request. Each process runs one server.

:func:`run_lean_upstream` starts the process from a trio program and hands back a
:class:`LeanUpstream` (its URLs, ``set_delay`` and ``counters``); the process is killed when
that task is cancelled.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from functools import partial
from math import inf
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import h11
import msgspec
import trio

from tests.fakes.echo_reply import completion, encode, error, events, reply_text, usage
from tests.fakes.lean_h2 import PREFACE, serve_h2
from tests.fakes.plainparse import NEED_DATA, Request, parse_request

if TYPE_CHECKING:
    from rollout_server.net.h1client import H1Pool

__all__ = ["LeanUpstream", "run_lean_upstream", "serve"]

REPO: Final = Path(__file__).resolve().parents[2]
BACKLOG: Final = 4096
MAX_RECV: Final = 2**16
HEAD_LIMIT: Final = 2**16
"""The longest request head read (h11's ``max_incomplete_event_size``)."""
MAX_BODY: Final = 2**26
JSON: Final = b"application/json"
_DROPPED: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

_decode = msgspec.json.Decoder().decode


class _Gone(Exception):
    """The client went away, or the connection cannot carry another request."""


class State:
    """What the control route reads and sets."""

    __slots__ = (
        "completed",
        "connections",
        "delay",
        "h2_connections",
        "h2_goaway_after",
        "h2_refused",
        "h2_streams",
        "in_flight",
        "in_flight_peak",
    )

    def __init__(self, h2_streams: int = 100, h2_goaway_after: int = 0) -> None:
        self.delay = 0.0
        self.completed = 0
        self.in_flight = 0
        self.in_flight_peak = 0
        self.connections = 0
        self.h2_connections = 0
        self.h2_refused = 0
        """Connections that opened with the HTTP/2 preface while HTTP/2 is refused."""
        self.h2_streams = h2_streams
        self.h2_goaway_after = h2_goaway_after
        """Requests per HTTP/2 connection before a graceful close (GOAWAY); 0: never."""
        """Streams advertised per HTTP/2 connection; 0 refuses HTTP/2."""

    def counters(self) -> dict[str, float]:
        return {
            "completed": self.completed,
            "in_flight": self.in_flight,
            "in_flight_peak": self.in_flight_peak,
            "connections": self.connections,
            "h2_connections": self.h2_connections,
            "h2_refused": self.h2_refused,
            "delay": self.delay,
        }


# --- writing answers ------------------------------------------------------------------------


class _Writer:
    """Writes the answer to a request the fast path read."""

    __slots__ = ("close", "stream")

    def __init__(self, stream: trio.SocketStream, keep_alive: bool) -> None:
        self.stream = stream
        self.close = b"" if keep_alive else b"connection: close\r\n"

    async def _send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except _DROPPED:
            raise _Gone from None

    async def whole(self, status: int, body: bytes) -> None:
        head = b"HTTP/1.1 %d \r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
        await self._send(head % (status, len(body), self.close) + body)

    async def stream_events(self, events: list[bytes]) -> None:
        """A chunked ``text/event-stream`` answer, one write per event (as a provider streams)."""
        head = (
            b"HTTP/1.1 200 \r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n%s\r\n" % self.close
        )
        last = len(events) - 1
        for i, event in enumerate(events):
            piece = b"%x\r\n%s\r\n" % (len(event), event)
            if i == 0:
                piece = head + piece
            if i == last:
                piece += b"0\r\n\r\n"
            await self._send(piece)


class _H11Writer(_Writer):
    """Writes the answer to a request h11 read, through that h11 connection."""

    __slots__ = ("conn",)

    def __init__(self, stream: trio.SocketStream, conn: h11.Connection) -> None:
        super().__init__(stream, True)
        self.conn = conn

    async def whole(self, status: int, body: bytes) -> None:
        conn = self.conn
        headers = [(b"content-type", JSON), (b"content-length", b"%d" % len(body))]
        data = conn.send(h11.Response(status_code=status, headers=headers)) or b""
        data += conn.send(h11.Data(data=body)) or b""
        await self._send(data + (conn.send(h11.EndOfMessage()) or b""))

    async def stream_events(self, events: list[bytes]) -> None:
        conn = self.conn
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await self._send(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        for event in events:
            await self._send(conn.send(h11.Data(data=event)) or b"")
        await self._send(conn.send(h11.EndOfMessage()) or b"")


# --- routing --------------------------------------------------------------------------------


async def _answer(state: State, method: bytes, target: bytes, body: bytes, out: _Writer) -> None:
    path = target.partition(b"?")[0]
    if path == b"/_control":
        await _control(state, method, body, out)
    elif method == b"POST" and path.endswith(b"/chat/completions"):
        await _chat(state, body, out)
    elif method == b"GET" and path.endswith(b"/models"):
        models = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
        await out.whole(200, encode(models))
    else:
        await out.whole(404, error("not found"))


def _json(body: bytes) -> Any:
    try:
        return _decode(body) if body else None
    except msgspec.DecodeError:
        return None


async def _control(state: State, method: bytes, body: bytes, out: _Writer) -> None:
    if method == b"POST":
        update = _json(body)
        delay = update.get("delay") if isinstance(update, dict) else None
        if not isinstance(delay, int | float) or isinstance(delay, bool) or not 0 <= delay < inf:
            await out.whole(400, error('send {"delay": <seconds, >= 0>}'))
            return
        state.delay = float(delay)
    elif method != b"GET":
        await out.whole(405, error("GET or POST"))
        return
    await out.whole(200, encode(state.counters()))


async def _chat(state: State, body: bytes, out: _Writer) -> None:
    request = _json(body)
    if not isinstance(request, dict):
        await out.whole(400, error("body must be a JSON object"))
        return
    state.in_flight += 1
    state.in_flight_peak = max(state.in_flight_peak, state.in_flight)
    try:
        if state.delay:
            await trio.sleep(state.delay)
        text = reply_text(request)
        model = str(request.get("model", "fake-model"))
        counted = usage(request, text)
        # Counted before the answer goes out: a client that holds its answer must find it
        # counted (counting after the send raced the client's next /_control read).
        state.completed += 1
        if request.get("stream"):
            await out.stream_events(events(request, model, text, counted))
        else:
            await out.whole(200, completion(model, text, counted))
    finally:
        state.in_flight -= 1


# --- connections ----------------------------------------------------------------------------


async def _receive(stream: trio.SocketStream) -> bytes:
    try:
        return await stream.receive_some(MAX_RECV)
    except _DROPPED:
        return b""


async def _connection(state: State, stream: trio.SocketStream) -> None:
    state.connections += 1
    buffer = bytearray()
    try:
        while True:
            parsed = parse_request(buffer, HEAD_LIMIT) if buffer else NEED_DATA
            while parsed == NEED_DATA:
                data = await _receive(stream)
                if not data:
                    return
                buffer += data
                parsed = parse_request(buffer, HEAD_LIMIT)
            if buffer.startswith(PREFACE):
                if state.h2_streams:
                    await _h2_connection(state, stream, buffer)
                    return
                state.h2_refused += 1
            if type(parsed) is not Request:
                buffer = await _h11_request(state, stream, buffer)
                continue
            length = parsed.length
            if length > MAX_BODY:
                await _Writer(stream, False).whole(413, error("body too large"))
                return
            while len(buffer) < length:
                data = await _receive(stream)
                if not data:
                    return
                buffer += data
            body = bytes(buffer[:length])
            del buffer[:length]
            writer = _Writer(stream, parsed.keep_alive)
            await _answer(state, parsed.method, parsed.target, body, writer)
            if not parsed.keep_alive:
                return
    except (_Gone, h11.ProtocolError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def _h2_connection(state: State, stream: trio.SocketStream, buffer: bytearray) -> None:
    state.h2_connections += 1
    await serve_h2(
        stream,
        bytes(buffer),
        partial(_answer, state),
        max_streams=state.h2_streams,
        goaway_after=state.h2_goaway_after,
    )


async def _h11_request(state: State, stream: trio.SocketStream, buffer: bytearray) -> bytearray:
    """Read and answer one request with h11; what it left unread. :class:`_Gone` when the
    connection cannot go on."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
    conn.receive_data(bytes(buffer))
    request: h11.Request | None = None
    body = bytearray()
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:
                    go_on = h11.InformationalResponse(status_code=100, headers=[])
                    await _Writer(stream, True)._send(conn.send(go_on) or b"")
                conn.receive_data(await _receive(stream))
            elif type(event) is h11.Request:
                request = event
            elif type(event) is h11.Data:
                body += event.data
                if len(body) > MAX_BODY:
                    raise _Gone
            elif type(event) is h11.EndOfMessage:
                break
            else:
                raise _Gone  # the client closed the connection
    except h11.RemoteProtocolError as error:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            refusal = h11.Response(
                status_code=error.error_status_hint,
                headers=[(b"content-length", b"0"), (b"connection", b"close")],
            )
            data = (conn.send(refusal) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            await _Writer(stream, False)._send(data)
        raise _Gone from None
    assert request is not None
    await _answer(state, request.method, request.target, bytes(body), _H11Writer(stream, conn))
    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
        raise _Gone
    conn.start_next_cycle()
    return bytearray(conn.trailing_data[0])


async def serve(
    state: State, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve on 127.0.0.1, port 0, until cancelled; reports the port."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=BACKLOG)
    port: int = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, partial(_connection, state), listeners)
        task_status.started(port)


async def _until_stdin_closes() -> None:
    async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        while await stdin.receive_some():
            pass


async def _main(until_stdin_closes: bool, h2_streams: int, h2_goaway_after: int) -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, State(h2_streams, h2_goaway_after))
        sys.stdout.write(f"{port}\n")
        sys.stdout.flush()
        if until_stdin_closes:
            await _until_stdin_closes()
            nursery.cancel_scope.cancel()


# --- the handle a trio program starts it with ------------------------------------------------


class LeanUpstream:
    """A running lean upstream process: its URLs, its delay and its counters."""

    def __init__(self, port: int, pid: int, pool: H1Pool) -> None:
        self.port = port
        self.pid = pid
        self.base_url = f"http://127.0.0.1:{port}"
        self._pool = pool

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return self.base_url + "/v1"

    async def _control(self, method: bytes, body: bytes = b"") -> dict[str, float]:
        headers = [(b"content-type", JSON)]
        reply = await self._pool.request(method, b"/_control", headers, body, total_sec=10)
        if reply.status != 200:
            raise RuntimeError(f"lean upstream control: {reply.status} {reply.body!r}")
        counters: dict[str, float] = _decode(reply.body)
        return counters

    async def set_delay(self, seconds: float) -> None:
        """Make every chat call wait ``seconds`` before its answer (from the next call on)."""
        await self._control(b"POST", encode({"delay": seconds}))

    async def counters(self) -> dict[str, float]:
        """``completed``, ``in_flight``, ``connections`` (accepted so far) and ``delay``."""
        return await self._control(b"GET")


async def run_lean_upstream(
    *,
    h2_streams: int = 100,
    h2_goaway_after: int = 0,
    task_status: trio.TaskStatus[LeanUpstream] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start a lean upstream process and report its :class:`LeanUpstream` (for
    ``nursery.start``); kill the process when cancelled. Raises if the process ends first.
    ``h2_streams``: streams per HTTP/2 connection it advertises, 0 to refuse HTTP/2;
    ``h2_goaway_after``: requests per HTTP/2 connection before it closes it gracefully."""
    # The client side only: the server process never imports httpx.
    from rollout_server.net.h1client import H1Pool

    argv = [sys.executable, "-m", "tests.fakes.lean_upstream", "--until-stdin-closes"]
    argv += ["--no-h2"] if h2_streams <= 0 else ["--h2-max-streams", str(h2_streams)]
    argv += ["--h2-goaway-after", str(h2_goaway_after)] if h2_goaway_after else []
    process = await trio.lowlevel.open_process(
        argv, cwd=str(REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(60):
            while not line.endswith(b"\n"):
                data = await process.stdout.receive_some()
                if not data:
                    raise RuntimeError("the lean upstream exited before reporting its port")
                line += data
        pool = H1Pool("127.0.0.1", int(line))
        try:
            task_status.started(LeanUpstream(int(line), process.pid, pool))
            await process.wait()
            raise RuntimeError(f"the lean upstream exited with status {process.returncode}")
        finally:
            with trio.CancelScope(shield=True):
                await pool.aclose()
    finally:
        with trio.CancelScope(shield=True):
            process.kill()
            await process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    await pipe.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--until-stdin-closes",
        action="store_true",
        help="stop when standard input reaches its end (the parent's pipe closed)",
    )
    parser.add_argument(
        "--h2-max-streams",
        type=int,
        default=100,
        help="concurrent streams advertised per HTTP/2 connection (default 100)",
    )
    parser.add_argument(
        "--h2-goaway-after",
        type=int,
        default=0,
        help="close each HTTP/2 connection gracefully (GOAWAY) after that many requests",
    )
    parser.add_argument(
        "--no-h2", action="store_true", help="refuse HTTP/2, as an HTTP/1.1-only server does"
    )
    options = parser.parse_args()
    try:
        streams = 0 if options.no_h2 else options.h2_max_streams
        trio.run(_main, options.until_stdin_closes, streams, options.h2_goaway_after)
    except KeyboardInterrupt:
        sys.exit(130)
