"""The direct path's lean HTTP client (bridge/upstreams/wire.py): reuse, stale connections,
compressed answers, and proxy variables."""

from __future__ import annotations

import gzip
import json
from functools import partial

import h11
import httpx
import pytest
import trio

from bridge.upstreams.wire import Origin, WirePool
from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.fakes.upstream import FakeUpstream


async def test_reuses_connections_and_replaces_one_the_server_closed(
    nursery: trio.Nursery,
) -> None:
    """Two requests per connection, then the server closes it while idle: every call still
    succeeds, on two connections, and gzip answers arrive decoded."""
    opened = 0
    closed = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal opened
        opened += 1
        conn = h11.Connection(h11.SERVER)
        for served in range(2):
            while type(event := conn.next_event()) is not h11.EndOfMessage:
                if type(event) is h11.ConnectionClosed:
                    return
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
            body = gzip.compress(json.dumps({"n": served}).encode())
            head = [(b"content-encoding", b"gzip"), (b"content-length", b"%d" % len(body))]
            await stream.send_all(
                (conn.send(h11.Response(status_code=200, headers=head)) or b"")
                + (conn.send(h11.Data(data=body)) or b"")
                + (conn.send(h11.EndOfMessage()) or b"")
            )
            conn.start_next_cycle()
        await stream.aclose()
        closed.set()

    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    origin = Origin.parse(f"http://127.0.0.1:{port}/v1/chat/completions")
    pool = WirePool(connect_timeout=10, timeout=10)
    answers = []
    with trio.fail_after(20):
        for i in range(3):
            if i == 2:
                await closed.wait()
            response = await pool.request(origin, [(b"content-type", b"application/json")], b"{}")
            assert response.status == 200
            answers.append(json.loads(await response.read()))
            await response.aclose()
        await pool.aclose()
    assert answers == [{"n": 0}, {"n": 1}, {"n": 0}]
    assert opened == 2


async def test_proxy_variables_do_not_redirect_calls(
    start_bridge: StartBridge, provider_env: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As before the lean client (httpx ignores proxy variables when given its own transport,
    as the bridge's client always was): a proxy variable, here naming a port nothing listens
    on, does not take a call away from the provider's URL."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    handle = await start_bridge()
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        with trio.fail_after(20):
            response = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
    assert response.status_code == 200
    assert len(provider_env.requests) == 1
