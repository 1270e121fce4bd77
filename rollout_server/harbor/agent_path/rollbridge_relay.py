"""The exec relay: TCP connections made inside a sandbox, carried to the host over one exec pipe.

A sandbox with no network at all (``--network none`` leaves only ``lo``) can still reach this
run's bridge: the *inside end* listens on ``127.0.0.1:<port>`` in the container (the route's
``RELAY_PORT``, 13131) and multiplexes every accepted connection over its own stdin and stdout;
the *host end* runs it through ``podman exec -i <ctr> python3 -u -c <inside_source()> <port>``
and forwards each connection to a new TCP connection to the target (the loopback bridge).
Bytes are forwarded as they arrive, so a streamed (SSE) response streams, and a call costs a
pipe hop rather than a polling interval.

Frames, both directions: a 9-byte header ``>IBI`` (stream id, type, payload length) and the
payload. Stream 0 is the control stream.

``READY`` (inside to host, stream 0)
    The inside end listens; the payload is the bound port in ASCII (port 0 picks a free one).
``OPEN`` (inside to host)
    A new connection was accepted; its stream id is new (ids are never reused in one session).
``DATA``
    Bytes of the stream, at most 64 KiB per frame.
``EOF``
    The sender's side of the stream is done (TCP half close); the receiver shuts down writing.
``CLOSE``
    Abort the stream (payload: a short reason): the receiver resets its socket and forgets it.
``WINDOW``
    Credit (4-byte count): the receiver wrote that many more bytes of the stream to its socket
    (sent once at least 64 KiB were written since the last one).

Backpressure: each end may have at most 256 KiB of a stream's data unacknowledged by the peer;
a stream without credit stops reading its socket, so one fast stream cannot take unbounded
memory, and a receiver that got more than the window aborts that stream. Frames are written by
one event loop, each with a single ``write``, so they never interleave.

The inside end exits, closing every connection, when its stdin closes (the host end went away
or closed the relay). The host end is :func:`start_host_relay` (asyncio: it runs inside Harbor's
process, next to the harness agent) and, for trio callers, the CLI::

    python rollbridge_relay.py host --target 127.0.0.1:PORT [--print-port] -- <exec argv...>

which prints ``READY`` (``READY <port>`` with ``--print-port``) on stdout once the inside end
listens, and runs until its stdin closes or it gets SIGTERM/SIGINT, then closes the relay and
exits (0; 1 when the exec ended by itself or never got ready; 2 for bad arguments). The exec
child stays in the CLI's process group, so a group kill takes both. Errors are one line each on
stderr; a target that refuses a connection resets only that stream (the client in the sandbox
sees its connection closed) and the relay keeps serving the others.

Only the standard library is used, and the inside part runs on Python >= 3.8 (the host part
needs >= 3.11), because the inside end is this very file: :func:`inside_source` returns its
source, and run as ``-c <source> <port>`` its ``__main__`` block starts the inside end.

Why one module of this size: the inside end is shipped as this file's own source text, so the
framing, the stream pumps both ends share and both ends must live in one self-contained file.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["HostRelay", "RelayError", "exec_argv", "inside_source", "main", "start_host_relay"]

HEADER = struct.Struct(">IBI")
COUNT = struct.Struct(">I")
READY, OPEN, DATA, EOF, CLOSE, WINDOW = 1, 2, 3, 4, 5, 6
CHUNK = 64 * 1024
WINDOW_BYTES = 256 * 1024
#: Credit is returned once this much was written, so a small exchange sends no WINDOW frame.
ACK_BYTES = WINDOW_BYTES // 4
MAX_PAYLOAD = CHUNK
PREFIX = "rollbridge-relay: "
INSIDE_PREFIX = "rollbridge-relay (inside): "


class RelayError(Exception):
    """The relay could not start or broke; the message is one line for the user."""


def _stderr_line(line: str) -> None:
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()


class _Mux:
    """One end of the pipe: the frame writer and the table of live streams."""

    def __init__(self, out: Any) -> None:
        # ``out`` has ``write(bytes)`` and ``is_closing()``: a write-pipe transport inside, the
        # exec's stdin StreamWriter on the host.
        self.out = out
        self.streams: dict[int, _Stream] = {}

    def send(self, ftype: int, sid: int, payload: bytes = b"") -> None:
        if not self.out.is_closing():
            self.out.write(HEADER.pack(sid, ftype, len(payload)) + payload)

    async def read_frames(
        self, reader: asyncio.StreamReader, control: Callable[[int, int, bytes], None]
    ) -> None:
        """Dispatch frames until the pipe ends; raises RelayError on a malformed frame."""
        while True:
            try:
                head = await reader.readexactly(HEADER.size)
                sid, ftype, length = HEADER.unpack(head)
                if length > MAX_PAYLOAD:
                    raise RelayError(
                        f"a frame of {length} bytes (limit {MAX_PAYLOAD}): "
                        "the other end of the pipe is not a rollbridge relay"
                    )
                payload = await reader.readexactly(length) if length else b""
            except asyncio.IncompleteReadError:
                return
            stream = self.streams.get(sid)
            if ftype == DATA:
                if stream is not None:
                    stream.feed(payload)
            elif ftype == EOF:
                if stream is not None:
                    stream.feed(None)
            elif ftype == WINDOW:
                if stream is not None and len(payload) == COUNT.size:
                    stream.grant(COUNT.unpack(payload)[0])
            elif ftype == CLOSE:
                if stream is not None:
                    stream.abort(None)
            else:
                control(sid, ftype, payload)

    def abort_all(self) -> None:
        for stream in list(self.streams.values()):
            stream.abort(None)


class _Stream:
    """One relayed TCP connection: socket to frames and frames to socket, with a credit window."""

    def __init__(self, mux: _Mux, sid: int) -> None:
        self.mux = mux
        self.sid = sid
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.outstanding = 0  # received from the peer and not yet acknowledged
        self.unacked = 0  # of which already written to the socket
        self.credit = WINDOW_BYTES
        self.credit_changed = asyncio.Event()
        self.writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Future[None]] = []
        self.closed = False
        mux.streams[sid] = self

    def feed(self, data: bytes | None) -> None:
        """Queue the peer's bytes (``None``: its EOF) for the socket."""
        if data is not None:
            self.outstanding += len(data)
            if self.outstanding > WINDOW_BYTES:
                self.abort("the peer overran the stream's window")
                return
        self.inbound.put_nowait(data)

    def grant(self, count: int) -> None:
        self.credit += count
        self.credit_changed.set()

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pump both directions until both are done or the stream is aborted."""
        self.writer = writer
        if self.closed:
            writer.transport.abort()
            return
        self.tasks = [
            asyncio.ensure_future(self._outbound(reader)),
            asyncio.ensure_future(self._inbound(writer)),
        ]
        try:
            await asyncio.wait(self.tasks)
        finally:
            if not self.closed:
                self.closed = True
                self.mux.streams.pop(self.sid, None)
                writer.close()
            for task in self.tasks:
                task.cancel()

    async def _outbound(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                while self.credit <= 0:
                    self.credit_changed.clear()
                    await self.credit_changed.wait()
                data = await reader.read(min(CHUNK, self.credit))
                if not data:
                    break
                self.credit -= len(data)
                self.mux.send(DATA, self.sid, data)
        except OSError as exc:
            self.abort(f"read failed: {exc}")
            return
        self.mux.send(EOF, self.sid)

    async def _inbound(self, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await self.inbound.get()
                if data is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                self.unacked += len(data)
                if self.unacked >= ACK_BYTES:
                    self.mux.send(WINDOW, self.sid, COUNT.pack(self.unacked))
                    self.outstanding -= self.unacked
                    self.unacked = 0
        except OSError as exc:
            self.abort(f"write failed: {exc}")

    def abort(self, reason: str | None) -> None:
        """Reset the socket and forget the stream; tell the peer unless it told us."""
        if self.closed:
            return
        self.closed = True
        self.mux.streams.pop(self.sid, None)
        if reason is not None:
            self.mux.send(CLOSE, self.sid, reason.encode("utf-8", "replace")[:200])
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        if self.writer is not None:
            self.writer.transport.abort()


# --- the inside end (Python >= 3.8: runs in the sandbox) ---------------------------------------


async def _inside_main(port: int) -> int:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    lost: asyncio.Future[None] = loop.create_future()

    class _Stdout(asyncio.Protocol):
        def connection_lost(self, exc: Exception | None) -> None:
            if not lost.done():
                lost.set_result(None)

    out, _ = await loop.connect_write_pipe(_Stdout, sys.stdout)
    mux = _Mux(out)
    next_id = [0]

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        next_id[0] += 1
        stream = _Stream(mux, next_id[0])
        mux.send(OPEN, stream.sid)
        await stream.run(reader, writer)

    try:
        server = await asyncio.start_server(accept, "127.0.0.1", port)
    except OSError as exc:
        _stderr_line(f"{INSIDE_PREFIX}cannot listen on 127.0.0.1:{port}: {exc}")
        return 1
    mux.send(READY, 0, str(server.sockets[0].getsockname()[1]).encode())

    def control(sid: int, ftype: int, payload: bytes) -> None:
        return None  # the host sends no control frames the inside end acts on

    reading = asyncio.ensure_future(mux.read_frames(stdin, control))
    await asyncio.wait([reading, lost], return_when=asyncio.FIRST_COMPLETED)
    server.close()
    mux.abort_all()
    if reading.done() and reading.exception() is not None:
        _stderr_line(f"{INSIDE_PREFIX}{reading.exception()}")
        return 1
    reading.cancel()
    return 0


# --- the host end (Python >= 3.11: Harbor's process or the CLI) --------------------------------


class HostRelay:
    """A running relay: the exec child and the connections forwarded to ``target``.

    ``port`` is the port the inside end listens on (inside the sandbox). ``await close()``
    closes the exec's stdin (the inside end exits), then terminates and kills the exec if it
    lingers; it is safe to call twice. Use it as an async context manager to close on exit.
    """

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        target: tuple[str, int],
        log: Callable[[str], None],
    ) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._target = target
        self._log = log
        self._mux = _Mux(proc.stdin)
        self._ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._ended = asyncio.Event()
        self._last_stderr = ""
        self._dials: set[asyncio.Future[None]] = set()
        self._reader = asyncio.ensure_future(self._read(proc.stdout))
        self._stderr = asyncio.ensure_future(self._pump_stderr(proc.stderr))
        self.port = 0

    @property
    def returncode(self) -> int | None:
        """The exec's exit status once it ended."""
        return self._proc.returncode

    @property
    def pid(self) -> int:
        """The exec child's pid."""
        return self._proc.pid

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        try:
            await self._mux.read_frames(stdout, self._control)
        except RelayError as exc:
            self._log(f"{PREFIX}{exc}")
        finally:
            self._ended.set()
            self._mux.abort_all()
            for dial in list(self._dials):
                dial.cancel()
            if not self._ready.done():
                self._ready.set_exception(RelayError("the exec ended before it was ready"))

    async def _pump_stderr(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self._last_stderr = text
                self._log(text)

    def _control(self, sid: int, ftype: int, payload: bytes) -> None:
        if ftype == READY and not self._ready.done():
            self._ready.set_result(int(payload.decode() or "0"))
        elif ftype == OPEN and sid not in self._mux.streams:
            stream = _Stream(self._mux, sid)
            dial = asyncio.ensure_future(self._dial(stream))
            self._dials.add(dial)
            dial.add_done_callback(self._dials.discard)

    async def _dial(self, stream: _Stream) -> None:
        host, port = self._target
        try:
            async with asyncio.timeout(30):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
            self._log(f"{PREFIX}connection {stream.sid}: cannot reach {host}:{port}: {why}")
            stream.abort(f"target unreachable: {why}")
            return
        await stream.run(reader, writer)

    async def _wait_ready(self, within: float) -> None:
        try:
            async with asyncio.timeout(within):
                self.port = await self._ready
        except TimeoutError:
            raise RelayError(
                f"the relay's inside end did not report ready within {within:g} s"
            ) from None
        except RelayError:
            # The exec closed its stdout: wait (briefly) for its status and last stderr line.
            await asyncio.wait([self._stderr, asyncio.ensure_future(self._proc.wait())], timeout=5)
            code = self._proc.returncode
            detail = f": {self._last_stderr}" if self._last_stderr else ""
            raise RelayError(
                f"the relay's exec ended before it was ready (exit code {code}){detail}"
            ) from None

    async def wait_closed(self) -> None:
        """Return once the pipe has ended (the exec exited or the relay was closed)."""
        await self._ended.wait()

    async def close(self, grace: float = 5.0) -> None:
        """Stop the relay: EOF to the inside end, then SIGTERM, then SIGKILL to the exec."""
        proc = self._proc
        if proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()
            for stop in (proc.terminate, proc.kill):
                try:
                    async with asyncio.timeout(grace):
                        await proc.wait()
                    break
                except TimeoutError:
                    try:
                        stop()
                    except ProcessLookupError:
                        break
            await proc.wait()
        self._mux.abort_all()
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # retrieved: an early end is reported by _wait_ready
        for task in (self._reader, self._stderr, *self._dials):
            task.cancel()
        await asyncio.gather(self._reader, self._stderr, return_exceptions=True)

    async def __aenter__(self) -> HostRelay:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def start_host_relay(
    exec_argv: Sequence[str],
    target: tuple[str, int],
    *,
    ready_timeout: float = 60.0,
    log: Callable[[str], None] | None = None,
) -> HostRelay:
    """Start ``exec_argv`` (which runs the inside end) and forward its connections to ``target``.

    Returns once the inside end listens; raises :class:`RelayError` (one-line message) when the
    exec cannot start, ends first, or is not ready within ``ready_timeout`` seconds. ``log``
    gets one line per error and each stderr line of the exec (default: this process's stderr).
    """
    if not exec_argv:
        raise RelayError("no exec command to run the relay's inside end")
    try:
        proc = await asyncio.create_subprocess_exec(
            *exec_argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise RelayError(f"cannot start {exec_argv[0]}: {exc}") from None
    relay = HostRelay(proc, target, log or _stderr_line)
    try:
        await relay._wait_ready(ready_timeout)
    except BaseException:
        await relay.close(grace=1.0)
        raise
    return relay


_SOURCE: list[str] = []


def inside_source() -> str:
    """The Python source of the inside end, for ``python3 -u -c <source> <port>``."""
    if not _SOURCE:
        with open(__file__, encoding="utf-8") as handle:
            _SOURCE.append(handle.read())
    return _SOURCE[0]


def exec_argv(engine: str, container: str, port: int) -> list[str]:
    """``<engine> exec -i <container> python3 -u -c <inside source> <port>``: the inside end."""
    return [engine, "exec", "-i", container, "python3", "-u", "-c", inside_source(), str(port)]


def _parse_target(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--target must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    loop.call_soon_threadsafe(stop.set)


async def _host_cli(target: tuple[str, int], exec_argv: list[str], print_port: bool) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    threading.Thread(target=_watch_stdin, args=(loop, stop), daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    starting = asyncio.ensure_future(start_host_relay(exec_argv, target))
    await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        return 0
    try:
        relay = starting.result()
    except RelayError as exc:
        _stderr_line(f"{PREFIX}{exc}")
        return 1
    sys.stdout.write(f"READY {relay.port}\n" if print_port else "READY\n")
    sys.stdout.flush()
    ended = asyncio.ensure_future(relay.wait_closed())
    await asyncio.wait([stopped, ended], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if not stop.is_set():
        code = 1
        _stderr_line(f"{PREFIX}the exec ended (exit code {await relay._proc.wait()})")
    await relay.close()
    stopped.cancel()
    return code


USAGE = (
    "usage: rollbridge_relay.py host --target HOST:PORT [--print-port] -- EXEC_ARGV... "
    "| rollbridge_relay.py [inside] PORT"
)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``host ...`` runs the host end, ``[inside] PORT`` the inside end."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["host"]:
        if "--" not in args:
            _stderr_line(f"{PREFIX}missing '-- EXEC_ARGV'; {USAGE}")
            return 2
        split = args.index("--")
        options, exec_argv = args[1:split], args[split + 1 :]
        print_port = "--print-port" in options
        options = [o for o in options if o != "--print-port"]
        try:
            if len(options) != 2 or options[0] != "--target" or not exec_argv:
                raise ValueError(USAGE)
            target = _parse_target(options[1])
        except ValueError as exc:
            _stderr_line(f"{PREFIX}{exc}")
            return 2
        return asyncio.run(_host_cli(target, exec_argv, print_port))
    if args[:1] == ["inside"]:
        args = args[1:]
    if len(args) == 1 and args[0].isdigit() and int(args[0]) < 65536:
        return asyncio.run(_inside_main(int(args[0])))
    _stderr_line(f"{PREFIX}{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
