"""The exec relay (rollout_server/harbor/agent_path/rollbridge_relay.py) without podman.

The inside end runs as a plain local subprocess (``python -u -c <inside_source()> 0``, the same
source a sandbox runs), and the host end both as the CLI trio callers use and as the asyncio
``start_host_relay`` the harness uses. Targets are real servers on 127.0.0.1 port 0: a raw ASGI
app on hypercorn's trio worker and a plain TCP echo server. The helpers here are reused by
tests/harbor/test_relay.py (the same checks through a real ``--network none`` container).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import httpx
import psutil
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

REPO = Path(__file__).resolve().parents[2]
RELAY_FILE = REPO / "rollout_server" / "harbor" / "agent_path" / "rollbridge_relay.py"


def _load_relay() -> ModuleType:
    # agent_path is put on Harbor's PYTHONPATH, not imported as a subpackage: load it the same way.
    spec = importlib.util.spec_from_file_location("rollbridge_relay", RELAY_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


relay = _load_relay()


# --- targets ------------------------------------------------------------------------------------


@dataclass
class HttpTarget:
    """A raw ASGI app: ``POST /echo`` answers the body; ``GET /stream`` sends gated chunks."""

    port: int = 0
    chunks: int = 4
    #: ``gates[i]`` lets the server write chunk i + 1; ``written[i]``: chunk i was handed over.
    gates: list[trio.Event] = field(default_factory=list)
    written: list[trio.Event] = field(default_factory=list)
    shutdown: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        self.gates = [trio.Event() for _ in range(self.chunks)]
        self.written = [trio.Event() for _ in range(self.chunks)]

    @staticmethod
    def chunk(index: int) -> bytes:
        return f"data: chunk-{index}\n\n".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/echo":
            headers = [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": bytes(body)})
            return
        if scope["path"] == "/stream":
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for index in range(self.chunks):
                if index:
                    await self.gates[index - 1].wait()
                await send(
                    {"type": "http.response.body", "body": self.chunk(index), "more_body": True}
                )
                self.written[index].set()
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def run_http_target(
    target: HttpTarget, *, task_status: trio.TaskStatus[HttpTarget] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``target`` on 127.0.0.1:0 until ``target.shutdown`` is set or cancellation."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                cast(Any, target),
                config,
                shutdown_trigger=target.shutdown.wait,
                task_status=task_status,
            )
        )
        target.port = int(binds[0].rsplit(":", 1)[1])
        task_status.started(target)


async def _echo(stream: trio.SocketStream) -> None:
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()
    except trio.BrokenResourceError:
        pass


async def receive_all(stream: trio.abc.ReceiveStream) -> bytes:
    """Everything until EOF (a reset counts as the end)."""
    got = bytearray()
    try:
        while data := await stream.receive_some(65536):
            got += data
    except trio.BrokenResourceError:
        pass
    return bytes(got)


async def echo_round_trip(port: int, payload: bytes) -> bytes:
    """Send ``payload`` on a new connection, half-close, return all that came back."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream, trio.open_nursery() as nursery:

        async def send() -> None:
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(payload)
                await stream.send_eof()

        nursery.start_soon(send)
        return await receive_all(stream)


# --- the host end as the CLI --------------------------------------------------------------------


def local_exec_argv() -> list[str]:
    """The inside end as a local subprocess, on a port the OS picks."""
    return [sys.executable, "-u", "-c", relay.inside_source(), "0"]


@dataclass
class RelayCli:
    process: trio.Process
    port: int
    stderr: list[str]

    @property
    def pids(self) -> list[int]:
        """The CLI and every process below it."""
        parent = psutil.Process(self.process.pid)
        return [self.process.pid, *(p.pid for p in parent.children(recursive=True))]


async def _collect_lines(stream: trio.abc.ReceiveStream, into: list[str]) -> None:
    buffer = b""
    while data := await stream.receive_some(4096):
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        into.extend(line.decode() for line in lines)


@asynccontextmanager
async def relay_cli(target_port: int, exec_argv: list[str]) -> AsyncIterator[RelayCli]:
    """The relay CLI forwarding to 127.0.0.1:``target_port``; closed (stdin EOF) on exit."""
    argv = [sys.executable, str(RELAY_FILE), "host", "--target", f"127.0.0.1:{target_port}"]
    argv += ["--print-port", "--", *exec_argv]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    stderr: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_collect_lines, process.stderr, stderr)
            line = b""
            while not line.endswith(b"\n"):
                data = await process.stdout.receive_some(1)
                assert data, f"relay CLI ended before READY: {stderr}"
                line += data
            word, port = line.decode().split()
            assert word == "READY", line
            yield RelayCli(process, int(port), stderr)
            await process.stdin.aclose()
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def gone(pids: list[int]) -> list[int]:
    """The subset of ``pids`` still running (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


async def stream_chunks(url: str, target: HttpTarget) -> list[str]:
    """GET ``url`` (the /stream path) and return the order of events seen.

    Each chunk must arrive while the server is still held before the next one (the server
    writes chunk i + 1 only after the client has seen chunk i and opened the gate), so a relay
    that buffers the response never delivers and the caller's ``fail_after`` fires.
    """
    order: list[str] = []
    async with (
        httpx.AsyncClient(timeout=30, trust_env=False) as client,
        client.stream("GET", url) as response,
    ):
        assert response.status_code == 200
        seen = b""
        index = 0
        async for data in response.aiter_raw():
            seen += data
            while index < target.chunks and target.chunk(index) in seen:
                if index < target.chunks - 1:
                    last_written = target.written[-1].is_set()
                    order.append(f"got {index} (last written: {last_written})")
                else:
                    order.append(f"got {index}")
                target.gates[index].set()
                index += 1
    assert index == target.chunks, seen
    return order


def expected_order(chunks: int) -> list[str]:
    """Every chunk but the last arrived before the server wrote the last one."""
    return [f"got {i} (last written: False)" for i in range(chunks - 1)] + [f"got {chunks - 1}"]


# --- tests: the CLI with real targets -----------------------------------------------------------


async def test_http_round_trips_and_keep_alive(nursery: trio.Nursery) -> None:
    with trio.fail_after(60):
        target = await nursery.start(run_http_target, HttpTarget())
        async with (
            relay_cli(target.port, local_exec_argv()) as cli,
            httpx.AsyncClient(timeout=30, trust_env=False) as client,
        ):
            for index in range(3):
                body = f'{{"call": {index}}}'.encode()
                response = await client.post(f"http://127.0.0.1:{cli.port}/echo", content=body)
                assert (response.status_code, response.content) == (200, body)
            assert cli.stderr == []
        assert cli.process.returncode == 0


async def test_twenty_concurrent_connections_stay_separate(nursery: trio.Nursery) -> None:
    with trio.fail_after(90):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, _echo, listeners)
        target_port = listeners[0].socket.getsockname()[1]
        payloads = [random.Random(i).randbytes(50_000 + 7919 * i) for i in range(20)]
        results: dict[int, bytes] = {}
        async with relay_cli(target_port, local_exec_argv()) as cli:

            async def one(index: int) -> None:
                results[index] = await echo_round_trip(cli.port, payloads[index])

            async with trio.open_nursery() as clients:
                for index in range(20):
                    clients.start_soon(one, index)
        assert [results[i] == payloads[i] for i in range(20)] == [True] * 20


async def test_a_streamed_response_arrives_chunk_by_chunk(nursery: trio.Nursery) -> None:
    with trio.fail_after(60):
        target = await nursery.start(run_http_target, HttpTarget(chunks=4))
        async with relay_cli(target.port, local_exec_argv()) as cli:
            order = await stream_chunks(f"http://127.0.0.1:{cli.port}/stream", target)
        assert order == expected_order(4)


async def test_five_megabytes_each_way(nursery: trio.Nursery) -> None:
    with trio.fail_after(120):
        target = await nursery.start(run_http_target, HttpTarget())
        body = random.Random(5).randbytes(5 * 1024 * 1024)
        async with (
            relay_cli(target.port, local_exec_argv()) as cli,
            httpx.AsyncClient(timeout=60, trust_env=False) as client,
        ):
            response = await client.post(f"http://127.0.0.1:{cli.port}/echo", content=body)
        assert response.status_code == 200
        assert len(response.content) == len(body) and response.content == body


async def test_a_refused_target_closes_that_connection_only(nursery: trio.Nursery) -> None:
    with trio.fail_after(60):
        # Bound but not listening: connections are refused until listen() below.
        sock = trio.socket.socket()
        await sock.bind(("127.0.0.1", 0))
        target_port = sock.getsockname()[1]
        async with relay_cli(target_port, local_exec_argv()) as cli:
            assert await echo_round_trip(cli.port, b"nobody there") == b""
            sock.listen(16)
            nursery.start_soon(trio.serve_listeners, _echo, [trio.SocketListener(sock)])
            assert await echo_round_trip(cli.port, b"now served") == b"now served"
            assert cli.process.returncode is None
        refused = [line for line in cli.stderr if "cannot reach" in line]
        assert len(refused) == 1, cli.stderr
        assert f"127.0.0.1:{target_port}" in refused[0]


async def test_stdin_eof_ends_the_relay_and_its_exec(nursery: trio.Nursery) -> None:
    with trio.fail_after(60):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, _echo, listeners)
        async with relay_cli(listeners[0].socket.getsockname()[1], local_exec_argv()) as cli:
            pids = cli.pids
            assert len(pids) == 2, pids  # the CLI and the inside end
            open_client = await trio.open_tcp_stream("127.0.0.1", cli.port)
            await open_client.send_all(b"ping")
            assert await open_client.receive_some(4) == b"ping"
        assert cli.process.returncode == 0
        assert gone(pids) == []
        # The connection that was open is closed, not left hanging.
        assert await receive_all(open_client) == b""
        await open_client.aclose()


async def test_sigterm_stops_the_relay_and_its_exec(nursery: trio.Nursery) -> None:
    with trio.fail_after(60):
        target = await nursery.start(run_http_target, HttpTarget())
        async with relay_cli(target.port, local_exec_argv()) as cli:
            pids = cli.pids
            cli.process.send_signal(signal.SIGTERM)
            assert await cli.process.wait() == 0
        assert gone(pids) == []


async def test_an_exec_that_fails_is_one_line_and_exit_1() -> None:
    with trio.fail_after(60):
        argv = [sys.executable, str(RELAY_FILE), "host", "--target", "127.0.0.1:9", "--"]
        argv += [sys.executable, "-c", "import sys; sys.exit('no python3 in there')"]
        # stdin stays open (EOF on the CLI's stdin means "stop", which is not what we test).
        keep_open, stdin = os.pipe()
        try:
            result = await trio.run_process(
                argv, stdin=keep_open, capture_stdout=True, capture_stderr=True, check=False
            )
        finally:
            os.close(keep_open)
            os.close(stdin)
        assert result.returncode == 1
        assert result.stdout == b""
        lines = result.stderr.decode().splitlines()
        assert lines[-1].startswith("rollbridge-relay: the relay's exec ended before it was ready")
        assert "no python3 in there" in lines[-1]


async def test_bad_arguments_are_one_line_and_exit_2() -> None:
    with trio.fail_after(30):
        for args in (["host", "--target", "nowhere", "--", "true"], ["host", "--", "true"], []):
            result = await trio.run_process(
                [sys.executable, str(RELAY_FILE), *args], capture_stderr=True, check=False
            )
            assert result.returncode == 2, args
            assert len(result.stderr.decode().strip().splitlines()) == 1, result.stderr


# --- tests: the frames of the inside end --------------------------------------------------------


class Frames:
    """The host's side of the pipe, spoken by hand."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.buffer = b""

    async def _exactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            data = await self.stdout.receive_some(65536)
            assert data, "the inside end closed its stdout"
            self.buffer += data
        out, self.buffer = self.buffer[:count], self.buffer[count:]
        return out

    async def next(self) -> tuple[int, int, bytes]:
        sid, ftype, length = relay.HEADER.unpack(await self._exactly(relay.HEADER.size))
        return sid, ftype, await self._exactly(length)

    async def send(self, ftype: int, sid: int, payload: bytes = b"") -> None:
        await self.stdin.send_all(relay.HEADER.pack(sid, ftype, len(payload)) + payload)


async def test_inside_end_frames_window_and_half_close() -> None:
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            local_exec_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            frames = Frames(process)
            sid, ftype, payload = await frames.next()
            assert (sid, ftype) == (0, relay.READY)
            port = int(payload)
            client = await trio.open_tcp_stream("127.0.0.1", port)
            first, ftype, _ = await frames.next()
            assert ftype == relay.OPEN
            blob = random.Random(1).randbytes(1024 * 1024)
            async with trio.open_nursery() as nursery:

                async def send() -> None:
                    await client.send_all(blob)
                    await client.send_eof()

                nursery.start_soon(send)
                got = bytearray()
                while len(got) < relay.WINDOW_BYTES:
                    sid, ftype, payload = await frames.next()
                    assert (sid, ftype) == (first, relay.DATA)
                    assert len(payload) <= relay.CHUNK
                    got += payload
                assert len(got) == relay.WINDOW_BYTES
                # No credit, no more data: the next frame is the second connection's OPEN.
                second_client = await trio.open_tcp_stream("127.0.0.1", port)
                second, ftype, _ = await frames.next()
                assert ftype == relay.OPEN and second != first
                await frames.send(relay.WINDOW, first, relay.COUNT.pack(len(blob)))
                while True:
                    sid, ftype, payload = await frames.next()
                    assert sid == first
                    if ftype == relay.EOF:
                        break
                    assert ftype == relay.DATA
                    got += payload
            assert got == blob
            # Host to client: written, credit returned per ACK_BYTES written, then half-closed.
            await frames.send(relay.DATA, first, b"hello")
            assert await client.receive_some(5) == b"hello"
            sent = b"hello"
            piece = random.Random(2).randbytes(relay.ACK_BYTES // 4)
            async with trio.open_nursery() as nursery:
                received = bytearray()

                async def read_back() -> None:
                    while len(received) < relay.ACK_BYTES:
                        received.extend(await client.receive_some(65536))

                nursery.start_soon(read_back)
                for _ in range(4):
                    await frames.send(relay.DATA, first, piece)
                    sent += piece
                credit = relay.COUNT.pack(5 + relay.ACK_BYTES)
                assert await frames.next() == (first, relay.WINDOW, credit)
            await frames.send(relay.EOF, first)
            assert b"hello" + bytes(received) + await receive_all(client) == sent
            # CLOSE resets the second connection.
            await frames.send(relay.CLOSE, second, b"test")
            assert await receive_all(second_client) == b""
            # stdin EOF: the inside end exits cleanly.
            await process.stdin.aclose()  # type: ignore[union-attr]
            assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_inside_end_that_cannot_listen_says_why() -> None:
    with trio.fail_after(30), socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        argv = [sys.executable, "-u", "-c", relay.inside_source(), str(taken.getsockname()[1])]
        result = await trio.run_process(
            argv, stdin=b"", capture_stdout=True, capture_stderr=True, check=False
        )
        assert result.returncode == 1
        assert result.stdout == b""
        assert result.stderr.decode().startswith("rollbridge-relay (inside): cannot listen on")


def test_inside_source_is_python_3_8_syntax() -> None:
    """The sandbox may have an older python3 than the host: keep the inside end 3.8-clean."""
    import ast

    ast.parse(relay.inside_source(), feature_version=(3, 8))


# --- tests: start_host_relay (asyncio, as the harness calls it) ---------------------------------


def _in_asyncio_thread(coro: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``coro()`` on a fresh asyncio loop in a thread; return its result or raise."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = asyncio.run(coro())
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


async def test_start_host_relay_forwards_and_closes(nursery: trio.Nursery) -> None:
    with trio.fail_after(60):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, _echo, listeners)
        target = ("127.0.0.1", listeners[0].socket.getsockname()[1])
        logged: list[str] = []

        async def scenario() -> tuple[bytes, int | None, bool]:
            host = await relay.start_host_relay(local_exec_argv(), target, log=logged.append)
            async with host:
                reader, writer = await asyncio.open_connection("127.0.0.1", host.port)
                writer.write(b"through asyncio")
                writer.write_eof()
                echoed = await reader.read()
                writer.close()
                pid = host.pid
            return echoed, host.returncode, psutil.pid_exists(pid) and gone([pid]) != []

        thread, out = _in_asyncio_thread(scenario)
        await trio.to_thread.run_sync(thread.join)
        assert "error" not in out, out
        echoed, returncode, still_running = out["result"]
        assert echoed == b"through asyncio"
        assert returncode == 0
        assert not still_running
        assert logged == []


async def test_start_host_relay_reports_an_early_end() -> None:
    with trio.fail_after(60), socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        argv = [sys.executable, "-u", "-c", relay.inside_source(), str(taken.getsockname()[1])]

        async def scenario() -> None:
            await relay.start_host_relay(argv, ("127.0.0.1", 9), log=lambda line: None)

        thread, out = _in_asyncio_thread(scenario)
        await trio.to_thread.run_sync(thread.join)
        error = out.get("error")
        assert isinstance(error, relay.RelayError), out
        message = str(error)
        assert "\n" not in message
        assert "exit code 1" in message and "cannot listen on" in message


def test_this_module_runs_without_the_relay_on_pythonpath() -> None:
    """The relay is stdlib-only: it imports in a bare interpreter with no site-packages."""
    result = subprocess.run(
        [sys.executable, "-S", "-I", "-c", f"import runpy; runpy.run_path({str(RELAY_FILE)!r})"],
        capture_output=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
    )
    # run_path with __name__ != "__main__" only defines things: exit 0, no output.
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
