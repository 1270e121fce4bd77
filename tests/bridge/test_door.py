"""The bridge's door (bridge.door): route and token are checked from the head, before the body."""

from __future__ import annotations

import httpx
import trio

from bridge import BridgeHandle
from bridge.bearers import Bearers
from bridge.door import Door, Route, bridge_routes
from tests.bridge.conftest import AUTH, TOKEN, StartBridge
from tests.fakes.upstream import FakeUpstream
from tests.wire_attacks import eight_stalled, post_head, rss, stalled_body

MIB = 1024 * 1024


async def test_eight_tokenless_stalled_bodies_get_401_unread(
    bridge: BridgeHandle, client: httpx.AsyncClient
) -> None:
    with trio.fail_after(30):
        # Warm the path first so that what it allocates once is not counted.
        await stalled_body(bridge.port, post_head("/v1/rollouts/r1/chat/completions"))
        before = rss()
        answers = await eight_stalled(bridge.port, post_head("/v1/rollouts/r1/chat/completions"))
        after = rss()
    assert len(answers) == 8
    for answer in answers:
        # Answered and closed without waiting for the 60 MB announced.
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:80]
        assert b"connection: close" in answer.lower()
        assert answer.endswith(b'{"detail":"Unauthorized"}')
    assert after - before < 10 * MIB


async def test_unknown_route_and_wrong_method_are_refused_before_the_body(
    bridge: BridgeHandle,
) -> None:
    with trio.fail_after(20):
        unknown = await stalled_body(bridge.port, post_head("/v1/elsewhere", extra=AUTH_LINE))
        assert unknown.startswith(b"HTTP/1.1 404 ")
        assert unknown.endswith(b'{"detail":"Not Found"}')
        wrong = await stalled_body(
            bridge.port,
            post_head("/v1/rollouts/r1/chat/completions", extra=AUTH_LINE).replace(
                b"POST", b"PUT", 1
            ),
        )
        assert wrong.startswith(b"HTTP/1.1 405 ")


async def test_declared_body_over_the_cap_is_413_before_the_body(
    start_bridge: StartBridge, provider_env: FakeUpstream
) -> None:
    handle = await start_bridge(max_body_bytes=1000)
    with trio.fail_after(20):
        answer = await stalled_body(
            handle.port, post_head("/v1/rollouts/r1/chat/completions", extra=AUTH_LINE)
        )
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert answer.endswith(b'{"detail":"Request Entity Too Large"}')


async def test_daemon_routes_behind_the_door(
    start_bridge: StartBridge, provider_env: FakeUpstream, client: httpx.AsyncClient
) -> None:
    handle = await start_bridge(plain_chat_route=True)
    models = handle.base_url + "/v1/models"
    with trio.fail_after(20):
        assert (await client.get(models)).status_code == 401
        assert (await client.get(models, headers=AUTH)).status_code == 200
        assert (await client.get(handle.base_url + "/health")).status_code == 200
        assert (await client.post(handle.base_url + "/health")).status_code == 405


def test_a_route_is_served_by_adding_an_entry() -> None:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/messages",
        "headers": [(b"x-api-key", TOKEN.encode()), (b"content-length", b"10")],
    }
    routes = bridge_routes(plain_chat_route=False, probe=False)
    refused = Door(routes, bearers=Bearers(TOKEN), max_body=100).check(scope)  # type: ignore[arg-type]
    assert refused is not None
    assert (refused.status, refused.close) == (404, True)
    door = Door([*routes, Route.post(r"/v1/messages")], bearers=Bearers(TOKEN), max_body=100)
    assert door.check(scope) is None  # type: ignore[arg-type]
    assert door.cap(scope) == 100  # type: ignore[arg-type]
    # Either spelling of the token opens the door; a wrong one of either does not.
    for headers in ([(b"x-api-key", b"nope")], [(b"authorization", b"Bearer nope")], []):
        denied = door.check({**scope, "headers": headers})  # type: ignore[arg-type]
        assert denied is not None and denied.status == 401
    bearer = [(b"authorization", b"bearer " + TOKEN.encode())]
    assert door.check({**scope, "headers": bearer}) is None  # type: ignore[arg-type]
    big = [*bearer, (b"content-length", b"101")]
    too_big = door.check({**scope, "headers": big})  # type: ignore[arg-type]
    assert too_big is not None and too_big.status == 413


AUTH_LINE = b"authorization: Bearer %s\r\n" % TOKEN.encode()


async def test_malformed_chunked_bodies_get_400_not_500(bridge: BridgeHandle) -> None:
    from tests.wire_attacks import read_to_eof

    head = (
        b"POST /v1/rollouts/r1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"transfer-encoding: chunked\r\ncontent-type: application/json\r\n" + AUTH_LINE + b"\r\n"
    )
    for body in (
        b"f" * 40 + b"\r\n{}\r\n0\r\n\r\n",
        b"0x2\r\n{}\r\n0\r\n\r\n",
        b"2\n{}\r\n0\r\n\r\n",
    ):
        stream = await trio.open_tcp_stream("127.0.0.1", bridge.port)
        async with stream:
            with trio.fail_after(20):
                await stream.send_all(head + body)
                answer = await read_to_eof(stream)
        assert answer.startswith(b"HTTP/1.1 400 "), (body, answer[:60])
