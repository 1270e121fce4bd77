"""chat(): the lean loopback path and when it is not taken (real servers on port 0)."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
import trio

from rollout_server.chat import ChatError, _lean_target, chat, reply_text
from rollout_server.sdk import RolloutContext, shared_client
from tests.fakes.upstream import FakeUpstream

HI = [{"role": "user", "content": "héllo"}]


def _ctx(url: str, client: httpx.AsyncClient | None = None) -> RolloutContext:
    return RolloutContext(
        chat_completions_url=url, api_key="bearer-0123456789", rollout_id="r1", http_client=client
    )


async def test_loopback_calls_share_one_kept_alive_connection(fake_upstream: FakeUpstream) -> None:
    ctx = _ctx(fake_upstream.v1)
    with trio.fail_after(30):
        replies = [reply_text(await chat(HI, ctx=ctx, temperature=0)) for _ in range(3)]
    assert replies == ["echo: héllo"] * 3
    seen = fake_upstream.requests
    assert [r.path for r in seen] == ["/v1/chat/completions"] * 3
    assert seen[0].headers["authorization"] == "Bearer bearer-0123456789"
    assert seen[0].body == {"model": "osmosis-rollout", "messages": HI, "temperature": 0}
    lean = _lean_target(fake_upstream.v1 + "/chat/completions")
    assert lean is not None
    pool, target = lean
    assert target == b"/v1/chat/completions"
    assert pool._wire._idle_count == 1  # three calls, one connection, back in the pool


async def test_an_error_answer_is_a_chat_error_with_its_body(fake_upstream: FakeUpstream) -> None:
    fake_upstream.fail_statuses.extend([400])
    with trio.fail_after(30), pytest.raises(ChatError) as caught:
        await chat(HI, ctx=_ctx(fake_upstream.v1))
    assert caught.value.status_code == 400
    assert "injected failure" in caught.value.body


async def test_a_closed_port_raises_httpx_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with trio.fail_after(30), pytest.raises(httpx.ConnectError):
        await chat(HI, ctx=_ctx(f"http://127.0.0.1:{port}/v1"))


def _recording_client(seen: list[str]) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"choices": [{"message": {"content": "via httpx"}}]})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    ("url", "kwargs"),
    [
        ("http://127.0.0.1:9/v1", {"http_timeout": 5.0}),  # custom timeouts
        ("https://127.0.0.1:9/v1", {}),  # TLS
        ("http://model.example/v1", {}),  # not loopback
    ],
)
async def test_other_calls_go_through_httpx(url: str, kwargs: dict[str, Any]) -> None:
    seen: list[str] = []
    async with shared_client(_recording_client(seen)) as client:
        with trio.fail_after(30):
            reply = await chat(HI, ctx=_ctx(url, client), **kwargs)
    assert reply_text(reply) == "via httpx"
    assert seen == [url + "/chat/completions"]


async def test_a_client_put_in_the_context_by_a_caller_is_honoured(
    fake_upstream: FakeUpstream,
) -> None:
    seen: list[str] = []
    async with _recording_client(seen) as client:  # not the server's shared client
        with trio.fail_after(30):
            reply = await chat(HI, ctx=_ctx(fake_upstream.v1, client))
    assert reply_text(reply) == "via httpx" and len(seen) == 1
    assert fake_upstream.requests == []


async def test_the_servers_shared_client_is_bypassed_on_loopback(
    fake_upstream: FakeUpstream,
) -> None:
    seen: list[str] = []
    async with shared_client(_recording_client(seen)) as client:
        with trio.fail_after(30):
            reply = await chat(HI, ctx=_ctx(fake_upstream.v1, client))
    assert reply_text(reply) == "echo: héllo"
    assert seen == [] and len(fake_upstream.requests) == 1


def test_importing_the_chat_module_keeps_the_exported_function() -> None:
    import rollout_server
    import rollout_server.chat as module_or_function

    assert callable(rollout_server.chat) and rollout_server.chat is chat
    assert module_or_function is chat
    from rollout_server import chat as exported

    assert exported is chat
