"""The daemon's loopback HTTP listener refuses from the head, without reading a body, and is
bounded by the floor's limits (it is served by the lean loop, in this process here)."""

from __future__ import annotations

from typing import cast

import trio

from launcher.daemon.api import ControlApp
from launcher.daemon.door import HttpGuard
from launcher.daemon.listen import bind_tcp, serve
from launcher.daemon.registry import Registry
from tests.wire_attacks import eight_stalled, post_head, rss, stalled_body

MIB = 1024 * 1024
TOKEN = "daemon-token-0123456789"


async def _shutdown(cancel: bool) -> None:
    raise AssertionError("no request should get this far")


async def test_tokenless_and_unknown_requests_are_refused_unread(nursery: trio.Nursery) -> None:
    sock = bind_tcp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    # The guard refuses before any route touches the registry.
    app = ControlApp(cast(Registry, None), lambda: {}, _shutdown, HttpGuard(TOKEN, port))
    await nursery.start(serve, [(sock, app)])
    host = f"127.0.0.1:{port}"
    with trio.fail_after(30):
        await stalled_body(port, post_head("/v1/runs", host))
        before = rss()
        answers = await eight_stalled(port, post_head("/v1/runs", host))
        after = rss()
        auth = b"authorization: Bearer %s\r\n" % TOKEN.encode()
        unknown = await stalled_body(port, post_head("/v1/elsewhere", host, auth))
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:80]
        assert b"connection: close" in answer.lower()
    assert after - before < 10 * MIB
    assert unknown.startswith(b"HTTP/1.1 404 ")
    assert b"connection: close" in unknown.lower()


async def test_a_body_that_breaks_its_framing_is_named_as_such(nursery: trio.Nursery) -> None:
    sock = bind_tcp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    app = ControlApp(cast(Registry, None), lambda: {}, _shutdown, HttpGuard(TOKEN, port))
    await nursery.start(serve, [(sock, app)])
    head = (
        f"POST /v1/runs HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"authorization: Bearer {TOKEN}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    with trio.fail_after(30):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(head.encode() + b'5\r\n{"a":\r\nZZ\r\n')  # not a chunk size
            answer = b""
            while chunk := await stream.receive_some(4096):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
    body = answer.partition(b"\r\n\r\n")[2]
    assert b"did not arrive whole" in body and b"went away" not in body
