"""One failure vocabulary for the rollout client, on real servers on port 0, both paths.

Each kind of failure (a refused connection, a server that stalls, an answer that is not
HTTP/1.1, a connection reset after the request left) is raised by the lean pool as its
:mod:`rollout_server.net.wireerrors` type, and reaches a :class:`RolloutClient` caller as
:class:`RolloutServerUnreachable` caused by that same type whether the call went through the
lean pool or through httpx.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from rollout_server.client import RolloutClient, RolloutProtocolError, RolloutServerUnreachable
from rollout_server.net.h1client import H1Pool
from rollout_server.net.wireerrors import (
    BadAnswer,
    ConnectFailed,
    NotSent,
    ReadFailed,
    ReadTimeout,
)

Handler = Callable[[trio.SocketStream], Awaitable[None]]
PATHS = ("lean", "httpx")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "all_proxy", "https_proxy", "no_proxy"):
            monkeypatch.delenv(name)  # a proxy would take the call away from the lean pool


async def _serve(nursery: trio.Nursery, handler: Handler) -> int:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, handler, listeners)
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def _read_head(stream: trio.SocketStream) -> None:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = await stream.receive_some()
        if not chunk:
            return
        buffer += chunk


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def _stall(stream: trio.SocketStream) -> None:
    await _read_head(stream)
    await trio.sleep_forever()


async def _garbage(stream: trio.SocketStream) -> None:
    await _read_head(stream)
    await stream.send_all(b"SPDY/9 banana\r\n\r\n")
    await stream.aclose()


async def _reset(stream: trio.SocketStream) -> None:
    await _read_head(stream)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


def _client(port: int, path: str, **options: Any) -> RolloutClient:
    url = f"http://127.0.0.1:{port}"
    if path == "lean":
        client = RolloutClient(url, **options)
        assert client._lean is not None
        return client
    return RolloutClient(url, http_client=httpx.AsyncClient(), **options)


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> str:
    """Which way the client's calls go: its lean pool, or httpx."""
    value: str = request.param
    return value


async def _health_failure(port: int, path: str, **options: Any) -> BaseException | None:
    async with _client(port, path, **options) as client:
        with pytest.raises(RolloutServerUnreachable) as caught:
            await client.health()
    return caught.value.__cause__


async def test_a_refused_connection_is_connect_failed(path: str) -> None:
    port = _closed_port()
    with trio.fail_after(10):
        with pytest.raises(ConnectFailed) as caught:
            await H1Pool("127.0.0.1", port).request(b"GET", b"/health")
        assert isinstance(caught.value, NotSent)
        cause = await _health_failure(port, path)
    assert isinstance(cause, ConnectFailed)


async def test_a_stalled_server_is_a_read_timeout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, path: str
) -> None:
    port = await _serve(nursery, _stall)
    with trio.fail_after(120):
        start = trio.current_time()
        with pytest.raises(ReadTimeout) as caught:
            await H1Pool("127.0.0.1", port).request(b"GET", b"/", total_sec=30)
        assert trio.current_time() - start == pytest.approx(30)
        assert not isinstance(caught.value, NotSent)
        cause = await _health_failure(port, path, health_timeout_sec=30)
    assert isinstance(cause, ReadTimeout)


async def test_an_answer_that_is_not_http_is_a_bad_answer(nursery: trio.Nursery, path: str) -> None:
    port = await _serve(nursery, _garbage)
    with trio.fail_after(10):
        with pytest.raises(BadAnswer):
            await H1Pool("127.0.0.1", port).request(b"GET", b"/")
        cause = await _health_failure(port, path)
    assert isinstance(cause, BadAnswer)


async def test_a_reset_after_the_request_left_is_a_read_failure(
    nursery: trio.Nursery, path: str
) -> None:
    port = await _serve(nursery, _reset)
    with trio.fail_after(10):
        with pytest.raises(ReadFailed):
            await H1Pool("127.0.0.1", port).request(b"POST", b"/rollout", body=b"{}")
        cause = await _health_failure(port, path)
    assert isinstance(cause, ReadFailed) and not isinstance(cause, NotSent)


async def test_the_message_names_the_call_and_the_failure(path: str) -> None:
    with trio.fail_after(10):
        async with _client(_closed_port(), path) as client:
            with pytest.raises(RolloutServerUnreachable, match=r"^GET /health: ConnectFailed: "):
                await client.health()


async def test_an_error_status_is_a_reply_on_both_paths(nursery: trio.Nursery, path: str) -> None:
    """A 503 is an answer, not a failure: the same status and detail either way."""

    async def unavailable(stream: trio.SocketStream) -> None:
        await _read_head(stream)
        body = b'{"detail": "draining"}'
        head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        await stream.send_all(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        await stream.aclose()

    port = await _serve(nursery, unavailable)
    with trio.fail_after(10):
        async with _client(port, path) as client:
            with pytest.raises(RolloutProtocolError) as caught:
                await client.health()
    assert (caught.value.status_code, caught.value.detail) == (503, "draining")
    assert caught.value.__cause__ is None
