"""The floor's limits (rollout_server.net.limits) as a client meets them on the lean loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from math import inf
from typing import Any

import pytest
import trio

from rollout_server.net import h1
from rollout_server.net.leanserve import IdleWatch, LeanConfig, serve_lean
from rollout_server.net.limits import (
    BODY_READ_TIMEOUT,
    HEAD_TIMEOUT,
    MAX_HEAD,
    MAX_HEADERS,
    MAX_PENDING,
    SEND_TIMEOUT,
    Limits,
)
from tests.wire_attacks import read_to_eof, rss

MIB = 1024 * 1024
answered: list[int] = []
entered_wait = trio.Event()
release = trio.Event()


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope["path"]
    if path == "/refuse":
        # Answers from the head alone, as the doors do.
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": b"no"})
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if path == "/wait":
        # Watches for a disconnect while it works, as the bridge's long calls do.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            entered_wait.set()
            await release.wait()
            nursery.cancel_scope.cancel()
    answered.append(len(body))
    answer = b"%d" % len(body)
    headers = [(b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
async def port(nursery: trio.Nursery) -> AsyncIterator[int]:
    global entered_wait, release
    entered_wait, release = trio.Event(), trio.Event()
    answered.clear()
    config = LeanConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.keep_alive_timeout = 3600.0
    binds = await nursery.start(partial(serve_lean, _app, config))
    yield int(binds[0].rsplit(":", 1)[1])


async def _exchange(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        return await read_to_eof(stream)


async def test_a_stalled_body_gets_408_and_a_close(port: int, autojump_clock: Any) -> None:
    with trio.fail_after(BODY_READ_TIMEOUT * 2):
        answer = await _exchange(
            port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n12"
        )
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answered == []


async def test_a_stalled_chunked_body_gets_408(port: int, autojump_clock: Any) -> None:
    head = b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab"
    with trio.fail_after(BODY_READ_TIMEOUT * 2):
        answer = await _exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 408 ")


async def test_a_slowloris_head_gets_408(port: int, autojump_clock: Any) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        with trio.fail_after(HEAD_TIMEOUT * 2):
            # A byte well within each read's patience, but the head never ends.
            start = trio.current_time()
            try:
                for byte in b"GET / HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 100:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(1)
            except trio.BrokenResourceError:
                pass  # closed by the server, which answered first
            answer = await read_to_eof(stream)
            assert trio.current_time() - start < 100  # closed before the head could end
    assert answer.startswith(b"HTTP/1.1 408 ")


async def test_an_oversize_head_gets_431(port: int) -> None:
    with trio.fail_after(10):
        head = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * MAX_HEAD + b"\r\n\r\n"
        assert (await _exchange(port, head)).startswith(b"HTTP/1.1 431 ")


async def test_too_many_headers_get_431(port: int) -> None:
    lines = b"".join(b"x-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1))
    with trio.fail_after(10):
        answer = await _exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    lines = b"".join(b"x-%d: 1\r\n" % i for i in range(MAX_HEADERS - 1))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        with trio.fail_after(10):
            await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n")
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200 ")


async def test_an_answer_before_the_body_closes_without_reading_it(port: int) -> None:
    head = b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 60000000\r\n\r\n"
    with trio.fail_after(10):
        answer = await _exchange(port, head + b"x" * 1000)
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"connection: close" in answer.lower()


async def test_bytes_sent_after_a_body_wait_in_the_kernel(port: int) -> None:
    """64 MiB sent after a request's body, while the app works, are not read into memory."""
    flood = b"y" * MIB
    sent = 0
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        with trio.fail_after(30):
            await stream.send_all(b"POST /wait HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok")
            await entered_wait.wait()
            before = rss()

            async def send_flood() -> None:
                nonlocal sent
                for _ in range(64):
                    await stream.send_all(flood)
                    sent += len(flood)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_flood)
                # Long enough for an unbounded reader to take it all; the assertion is on
                # memory, not on time.
                await trio.sleep(2)
                grown = rss() - before
                nursery.cancel_scope.cancel()
            release.set()
            answer = await stream.receive_some(65536)
    assert grown < 10 * MIB
    assert sent < 64 * MIB  # the sender was held back by the kernel's buffers
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert MAX_PENDING < MIB


async def test_a_connection_idle_after_a_get_closes_after_the_keep_alive_timeout(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """An answered GET (whose empty body the app never read) leaves the connection idle: the
    keep-alive timeout closes it."""
    config = LeanConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.keep_alive_timeout = 5.0
    binds = await nursery.start(partial(serve_lean, _app, config))
    port = int(binds[0].rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        with trio.fail_after(60):
            await stream.send_all(b"GET /refuse HTTP/1.1\r\nhost: x\r\n\r\n")
            answer = await read_to_eof(stream)
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"connection: close" not in answer.lower()  # closed later, by the idle timer


stream_gone = trio.Event()


async def _endless(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/endless``: a streamed answer that never ends, which notes when its call ends (the
    client gone, or the call cancelled)."""
    if scope["path"] != "/endless":
        await _app(scope, receive, send)
        return
    await receive()  # the (empty) request body
    start = {"type": "http.response.start", "status": 200, "headers": []}
    await send(start)
    try:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await receive()  # returns when the client is gone
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            while True:
                piece = {"type": "http.response.body", "body": b"x" * 65536, "more_body": True}
                await send(piece)
    finally:
        stream_gone.set()


async def _serve(nursery: trio.Nursery, app: Any, limits: Limits | None = None) -> int:
    config = LeanConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.keep_alive_timeout = 3600.0
    if limits is not None:
        config.limits = limits
    binds = await nursery.start(partial(serve_lean, app, config))
    return int(binds[0].rsplit(":", 1)[1])


async def test_a_client_that_stops_reading_is_closed_after_the_send_timeout(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """The answer's writes wait for the client at most SEND_TIMEOUT: then the app's call is
    cancelled (the bridge's provider call with it) and the connection closed."""
    global stream_gone
    stream_gone = trio.Event()
    port = await _serve(nursery, _endless)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /endless HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(SEND_TIMEOUT * 3):
            await stream_gone.wait()  # never read: the kernel's buffers fill, the write waits
            assert await read_to_eof(stream)  # what the kernel held, then the close


async def _answered(stream: trio.SocketStream) -> bytes:
    await stream.send_all(b"GET /refuse HTTP/1.1\r\nhost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"no"):
        piece = await stream.receive_some(65536)
        if not piece:
            return answer
        answer += piece
    return answer


async def test_past_the_connection_cap_the_longest_idle_connection_makes_room(
    nursery: trio.Nursery,
) -> None:
    port = await _serve(nursery, _app, Limits(max_connections=3))
    with trio.fail_after(20):
        streams = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
        for stream in streams:  # answered one after another: the first is idle longest
            assert (await _answered(stream)).startswith(b"HTTP/1.1 401 ")
        late = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await _answered(late)).startswith(b"HTTP/1.1 401 ")
        assert await read_to_eof(streams[0]) == b""  # closed to make room
        for stream in (*streams[1:], late):  # the others are still served
            assert (await _answered(stream)).startswith(b"HTTP/1.1 401 ")
    for stream in (*streams, late):
        await stream.aclose()


async def test_past_the_connection_cap_with_none_idle_a_new_one_is_refused(
    nursery: trio.Nursery,
) -> None:
    global entered_wait, release
    entered_wait, release = trio.Event(), trio.Event()
    port = await _serve(nursery, _app, Limits(max_connections=1))
    busy = await trio.open_tcp_stream("127.0.0.1", port)
    async with busy:
        with trio.fail_after(20):
            await busy.send_all(b"POST /wait HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok")
            await entered_wait.wait()
            refused = await trio.open_tcp_stream("127.0.0.1", port)
            async with refused:
                # Closed unread: the connection that works is not disturbed.
                assert await read_to_eof(refused) == b""
            release.set()
            assert (await busy.receive_some(65536)).startswith(b"HTTP/1.1 200 ")


async def test_codings_other_than_chunked_get_501(port: int) -> None:
    """llhttp takes `gzip, chunked` as chunked; the body would reach the app still gzipped."""
    head = b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    with trio.fail_after(10):
        answer = await _exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 501 ")
    assert answered == []
    plain = b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(plain)
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200 ")


async def test_transfer_encoding_in_http_1_0_is_faulty_framing(port: int) -> None:
    """RFC 9112, section 6.1: refused (400) and closed, not de-chunked."""
    head = b"POST / HTTP/1.0\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    with trio.fail_after(10):
        answer = await _exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert answered == []
    plain = b"POST / HTTP/1.0\r\nhost: x\r\ncontent-length: 2\r\n\r\nok"
    with trio.fail_after(10):
        assert (await _exchange(port, plain)).startswith(b"HTTP/1.1 200 ")


async def test_a_version_other_than_1_0_and_1_1_gets_505(port: int) -> None:
    with trio.fail_after(10):
        answer = await _exchange(port, b"GET / HTTP/2.0\r\nhost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 505 ")
    assert answered == []


async def test_the_send_timeout_bounds_progress_not_the_whole_answer(autojump_clock: Any) -> None:
    """A large answer is written in slices (h1._SLICE), each of which must be taken within
    SEND_TIMEOUT: a slow reader that keeps taking slices is never cut off; one that stops is,
    within twice the timeout. (The watch alone, on the trio clock: with real sockets the mock
    clock may jump before the kernel says a socket is writable again.)"""
    closed = trio.Event()

    async def close() -> None:
        closed.set()

    began = [trio.current_time()]
    watch = IdleWatch(trio.Event(), 3600.0, close, SEND_TIMEOUT)
    watch.watch_writes(lambda: began[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.watch)
        for _ in range(30):  # twenty minutes of slices, each taken after 40 s
            await trio.sleep(40)
            assert not closed.is_set()
            began[0] = trio.current_time()
        stalled = trio.current_time()
        with trio.fail_after(SEND_TIMEOUT * 2 + 1):
            await closed.wait()
        assert trio.current_time() - stalled >= SEND_TIMEOUT


async def test_a_large_answer_is_written_in_slices() -> None:
    class Recording(trio.abc.Stream):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            await trio.lowlevel.checkpoint()
            self.sizes.append(len(data))

        async def wait_send_all_might_not_block(self) -> None:
            await trio.lowlevel.checkpoint()

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            await trio.sleep_forever()
            raise AssertionError

        async def aclose(self) -> None:
            await trio.lowlevel.checkpoint()

    stream = Recording()
    connection = h1._Connection(LeanConfig(), stream, _nothing, _nothing)
    with trio.fail_after(10):
        await connection.write(b"z" * (h1._SLICE * 3 + 5))
        await connection.write(b"small")
    assert stream.sizes == [h1._SLICE] * 3 + [5, 5]
    assert connection.writing_since == inf


async def _nothing() -> None:
    await trio.lowlevel.checkpoint()
