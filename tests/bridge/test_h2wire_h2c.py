"""bridge.upstreams.h2wire over plain TCP (h2c with prior knowledge): an ``http://`` origin that
answers the preface as an HTTP/1.1 server does, or closes before its SETTINGS, is answered None
from then on (the caller's HTTP/1.1 pool takes over), logged once; an origin that has spoken
HTTP/2 is never taken for an HTTP/1.1 one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio

from bridge.upstreams.h2wire import H2Wire
from rollout_server.net.wire import Origin
from rollout_server.net.wireerrors import WireError
from tests.fakes.lean_h2 import H2Answer, serve_h2

pytest.importorskip("h2", reason="HTTP/2 needs the h2 package")

FIELDS = [(b"content-type", b"application/json")]
Handler = Callable[[trio.SocketStream, int], Awaitable[None]]


async def _server(nursery: trio.Nursery, handler: Handler) -> tuple[Origin, list[int]]:
    """A server on port 0 running ``handler(stream, n)`` for its n-th connection (from 0)."""
    opened: list[int] = []

    async def accept(stream: trio.SocketStream) -> None:
        opened.append(len(opened))
        try:
            await handler(stream, opened[-1])
        except trio.BrokenResourceError:
            return
        finally:
            await trio.aclose_forcefully(stream)

    listeners = await nursery.start(partial(trio.serve_tcp, accept, 0, host="127.0.0.1"))
    port: int = listeners[0].socket.getsockname()[1]
    return Origin.parse(f"http://127.0.0.1:{port}/v1/chat/completions"), opened


async def _h2(stream: trio.SocketStream) -> None:
    async def answer(method: bytes, target: bytes, body: bytes, out: H2Answer) -> None:
        await out.whole(200, b'{"echo": "%s"}' % body)

    await serve_h2(stream, b"", answer, max_streams=100)


async def _wire(
    nursery: trio.Nursery, logs: list[tuple[str, str]], keepalive_expiry: float = 60
) -> H2Wire:
    wire = H2Wire(
        connect_timeout=10,
        timeout=10,
        keepalive_expiry=keepalive_expiry,
        log=lambda level, message: logs.append((level, message)),
    )
    await nursery.start(wire.serve)
    return wire


async def _status_line_kept_open(stream: trio.SocketStream, n: int) -> None:
    await stream.receive_some(1024)
    await stream.send_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
    await trio.sleep_forever()  # keeps the connection open: the status line alone must tell


async def _closed_at_once(stream: trio.SocketStream, n: int) -> None:
    await stream.receive_some(1024)


@pytest.mark.parametrize("handler", [_status_line_kept_open, _closed_at_once])
async def test_an_http1_only_origin_is_left_to_the_http1_pool(
    nursery: trio.Nursery, handler: Handler
) -> None:
    origin, opened = await _server(nursery, handler)
    logs: list[tuple[str, str]] = []
    wire = await _wire(nursery, logs)
    with trio.fail_after(20):
        async with trio.open_nursery() as calls:  # calls at once share the finding
            for _ in range(3):
                calls.start_soon(wire.request, origin, FIELDS, b"{}")
        assert await wire.request(origin, FIELDS, b"{}") is None
        assert not await wire.speaks_http2(origin)
    assert opened == [0]  # remembered: asked once
    assert len(logs) == 1, logs
    level, line = logs[0]
    assert level == "warning"
    assert origin.key in line and "HTTP/1.1" in line and "h2c" in line


async def test_an_origin_that_spoke_http2_is_not_taken_for_http1(nursery: trio.Nursery) -> None:
    async def h2_then_closed(stream: trio.SocketStream, n: int) -> None:
        if n == 0:
            await _h2(stream)
        else:
            await _closed_at_once(stream, n)

    origin, opened = await _server(nursery, h2_then_closed)
    logs: list[tuple[str, str]] = []
    wire = await _wire(nursery, logs, keepalive_expiry=0)  # a new connection per call
    with trio.fail_after(20):
        response = await wire.request(origin, FIELDS, b"one")
        assert response is not None and await response.read() == b'{"echo": "one"}'
        await trio.sleep(0.01)  # the connection has idled past its (zero) keep-alive
        with pytest.raises(WireError):
            await wire.request(origin, FIELDS, b"two")
        assert await wire.speaks_http2(origin)
    assert len(opened) == 2
    assert logs == []


async def test_many_asking_at_once_open_one_connection(nursery: trio.Nursery) -> None:
    async def h2(stream: trio.SocketStream, n: int) -> None:
        await _h2(stream)

    origin, opened = await _server(nursery, h2)
    wire = await _wire(nursery, [])
    answers: list[bool] = []

    async def ask() -> None:
        answers.append(await wire.speaks_http2(origin))

    with trio.fail_after(20):
        async with trio.open_nursery() as asking:
            for _ in range(250):  # more than first fit puts on one connection
                asking.start_soon(ask)
    assert answers == [True] * 250
    assert opened == [0]
