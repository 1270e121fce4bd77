"""H1Pool: keep-alive reuse, stale connections, and the wireerrors types for failures."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
import trio

from rollout_server.client import RolloutClient, RolloutServerUnreachable
from rollout_server.net.h1client import H1Pool
from rollout_server.net.wireerrors import BadAnswer, NotSent, ReadFailed, WireError
from tests.rollout_server.helpers import request

Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def _serve(nursery: trio.Nursery, handler: Handler) -> tuple[int, list[int]]:
    """A raw TCP server on a free port; returns the port and a list counting connections."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    connections: list[int] = []

    async def counted(stream: trio.SocketStream) -> None:
        connections.append(1)
        await handler(stream)

    nursery.start_soon(trio.serve_listeners, counted, listeners)
    return listeners[0].socket.getsockname()[1], connections


async def _read_request(stream: trio.SocketStream, buffer: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buffer:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += await stream.receive_some()
    buffer[:] = rest[length:]
    return head + b"\r\n\r\n" + rest[:length]


async def _keep_alive(stream: trio.SocketStream) -> None:
    buffer = bytearray()
    while (request := await _read_request(stream, buffer)) is not None:
        body = request.split(b"\r\n", 1)[0]
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)


async def test_sequential_calls_reuse_one_connection(nursery: trio.Nursery) -> None:
    port, connections = await _serve(nursery, _keep_alive)
    pool = H1Pool("127.0.0.1", port)
    with trio.fail_after(10):
        for index in range(3):
            reply = await pool.request(b"POST", b"/r/%d" % index, body=b"x")
            assert (reply.status, reply.body) == (200, b"POST /r/%d HTTP/1.1" % index)
        assert reply.header("content-length") == "18"
        await pool.aclose()
    assert len(connections) == 1


async def test_concurrent_calls_get_connections_of_their_own(nursery: trio.Nursery) -> None:
    port, connections = await _serve(nursery, _keep_alive)
    pool = H1Pool("127.0.0.1", port)
    with trio.fail_after(10):
        async with trio.open_nursery() as calls:
            for index in range(5):
                calls.start_soon(pool.request, b"GET", b"/%d" % index)
        await pool.request(b"GET", b"/again")
        await pool.aclose()
    assert len(connections) == 5


async def test_a_connection_the_server_closed_is_not_reused(nursery: trio.Nursery) -> None:
    async def one_answer_then_close(stream: trio.SocketStream) -> None:
        await _read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await stream.aclose()

    port, connections = await _serve(nursery, one_answer_then_close)
    pool = H1Pool("127.0.0.1", port)
    with trio.fail_after(10):
        assert (await pool.request(b"GET", b"/")).body == b"ok"
        await trio.sleep(0.1)  # the server's FIN arrives
        assert (await pool.request(b"GET", b"/")).body == b"ok"
        await pool.aclose()
    assert len(connections) == 2


async def test_chunked_answers_are_read_whole(nursery: trio.Nursery) -> None:
    async def chunked(stream: trio.SocketStream) -> None:
        await _read_request(stream, bytearray())
        await stream.send_all(
            b"HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n"
        )
        await stream.send_all(b"0\r\n\r\n")

    port, _ = await _serve(nursery, chunked)
    pool = H1Pool("127.0.0.1", port)
    with trio.fail_after(10):
        reply = await pool.request(b"GET", b"/")
        await pool.aclose()
    assert (reply.status, reply.body) == (202, b"abcde")


def _reset(stream: trio.SocketStream) -> None:
    """Close ``stream``'s socket with a TCP reset instead of a FIN."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def test_a_failure_after_the_request_left_is_never_a_connect_error(
    nursery: trio.Nursery,
) -> None:
    """A connection reset once the request was written is a read error, even on a fresh
    connection: only a failure to connect says the request never left."""

    async def reset_after_request(stream: trio.SocketStream) -> None:
        await _read_request(stream, bytearray())
        _reset(stream)

    port, _ = await _serve(nursery, reset_after_request)
    with trio.fail_after(10):
        with pytest.raises(WireError) as caught:
            await H1Pool("127.0.0.1", port).request(b"POST", b"/rollout", body=b"{}")
    assert isinstance(caught.value, ReadFailed)
    assert not isinstance(caught.value, NotSent)


async def test_the_rollout_client_does_not_resend_an_admission_that_left(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end through the lean pool, with the connect-phase retry on: an admission whose
    connection is reset or closed after the server read it is not sent again."""
    requests: list[bytes] = []

    async def read_then_drop(stream: trio.SocketStream) -> None:
        got = await _read_request(stream, bytearray())
        if got is not None:
            requests.append(got.split(b"\r\n", 1)[0])
        if len(requests) % 2:
            _reset(stream)
        else:
            await stream.aclose()

    for name in list(os.environ):
        if name.lower() in ("http_proxy", "all_proxy"):
            monkeypatch.delenv(name)  # a proxy would take the call away from the lean pool
    port, _ = await _serve(nursery, read_then_drop)
    async with RolloutClient(f"http://127.0.0.1:{port}", server_alive=lambda: True) as client:
        assert client._lean is not None
        for rollout_id, cause in (("r1", ReadFailed), ("r2", BadAnswer)):
            with trio.fail_after(10), pytest.raises(RolloutServerUnreachable) as caught:
                await client.admit(request(rollout_id), admission_timeout_sec=5.0)
            assert isinstance(caught.value.__cause__, cause)
    assert requests == [b"POST /rollout HTTP/1.1"] * 2
