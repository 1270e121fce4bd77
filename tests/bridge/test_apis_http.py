"""The Responses and Messages routes over HTTP on the echo model: auth, paths, refusals in the
caller's shape, model echo, streaming grammar and the per-rollout ledger."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeHandle
from tests.bridge.conftest import AUTH, TOKEN, StartBridge

MSG = {
    "model": "claude-test",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi there"}],
}
RESP = {"model": "gpt-test", "input": "hi there"}


@pytest.fixture
async def echo(start_bridge: StartBridge) -> BridgeHandle:
    return await start_bridge(model="rollbridge/echo")


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of an SSE body, comments skipped."""
    out = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith(":")]
        if not lines:
            continue
        kind = next((line[7:] for line in lines if line.startswith("event: ")), "message")
        data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
        if data != "[DONE]":
            out.append((kind, json.loads(data)))
    return out


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Authorization": f"Bearer {TOKEN}"}, 200),
        ({"x-api-key": TOKEN}, 200),
        ({"Authorization": "", "x-api-key": TOKEN}, 200),  # empty counts as absent
        ({"Authorization": f"Bearer {TOKEN}", "x-api-key": ""}, 200),
        ({"Authorization": "Bearer wrong", "x-api-key": TOKEN}, 401),  # Authorization decides
        ({"x-api-key": "wrong"}, 401),
        ({}, 401),
    ],
)
async def test_messages_auth_matrix(
    echo: BridgeHandle, client: httpx.AsyncClient, headers: dict[str, str], status: int
) -> None:
    with trio.fail_after(20):
        answer = await client.post(
            f"{echo.rollout_url('r')}/v1/messages", json=MSG, headers=headers
        )
    assert answer.status_code == status
    if status == 401:
        assert answer.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "Unauthorized"},
        }
    usage = echo.ledger.get("r")
    assert (usage.calls if usage is not None else 0) == (0 if status == 401 else 1)


async def test_responses_auth_is_bearer_only(echo: BridgeHandle, client: httpx.AsyncClient) -> None:
    url = f"{echo.rollout_url('r')}/responses"
    with trio.fail_after(20):
        refused = await client.post(url, json=RESP, headers={"x-api-key": TOKEN})
        accepted = await client.post(url, json=RESP, headers=AUTH)
    assert refused.status_code == 401 and refused.json()["detail"] == "Unauthorized"
    assert accepted.status_code == 200


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages?beta=true", "/messages"])
async def test_messages_paths(echo: BridgeHandle, client: httpx.AsyncClient, path: str) -> None:
    with trio.fail_after(20):
        answer = await client.post(echo.rollout_url("p") + path, json=MSG, headers=AUTH)
    assert answer.status_code == 200
    doc = answer.json()
    assert doc["type"] == "message" and doc["model"] == "claude-test"
    assert doc["content"] == [{"type": "text", "text": "hi there"}]


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "service_tier": "priority"},
            "service_tier",
        ),
        ("/responses", {**RESP, "store": True}, "store"),
        ("/responses", {**RESP, "previous_response_id": "resp_1"}, "previous_response_id"),
        ("/responses", {**RESP, "service_tier": "flex"}, "service_tier"),
        ("/responses", {**RESP, "tools": [{"type": "web_search"}]}, "web_search"),
        ("/responses", {**RESP, "api_base": "http://x"}, "api_base"),
        ("/v1/messages", {**MSG, "service_tier": "auto"}, "service_tier"),
        ("/v1/messages", {**MSG, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        (
            "/v1/messages",
            {**MSG, "tools": [{"type": "web_search_20250305", "name": "w"}]},
            "web_search_20250305",
        ),
        ("/v1/messages", {k: v for k, v in MSG.items() if k != "max_tokens"}, "max_tokens"),
    ],
)
async def test_refused_fields_are_a_400_naming_them(
    echo: BridgeHandle, client: httpx.AsyncClient, path: str, body: dict[str, Any], named: str
) -> None:
    for stream in (False, True):
        with trio.fail_after(20):
            answer = await client.post(
                echo.rollout_url("x") + path, json={**body, "stream": stream}, headers=AUTH
            )
        if path == "/chat/completions" and stream:
            # The chat route commits its stream at once (unchanged): the refusal is an event.
            assert answer.status_code == 200 and named in events(answer.text)[0][1]["detail"]
            continue
        assert answer.status_code == 400, answer.text
        doc = answer.json()
        if path == "/v1/messages":
            assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
            assert named in doc["error"]["message"]
        else:
            assert named in doc["error"]["message"] and named in doc["detail"]
    assert echo.ledger.get("x") is None


async def test_responses_stream_grammar_and_ledger(
    echo: BridgeHandle, client: httpx.AsyncClient
) -> None:
    with trio.fail_after(20):
        plain = await client.post(f"{echo.rollout_url('s')}/responses", json=RESP, headers=AUTH)
        streamed = await client.post(
            f"{echo.rollout_url('s')}/responses", json={**RESP, "stream": True}, headers=AUTH
        )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    got = events(streamed.text)
    kinds = [k for k, _ in got]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [d["sequence_number"] for _, d in got] == list(range(len(got)))
    assert all(k == t["type"] for k, t in got)
    final = got[-1][1]["response"]
    assert final["model"] == got[0][1]["response"]["model"] == "gpt-test"
    assert final["output"][0]["content"][0]["text"] == "hi there"
    assert final["usage"] == plain.json()["usage"]
    usage = echo.ledger.get("s")
    assert usage is not None and usage.calls == 2
    assert usage.total_tokens == 2 * plain.json()["usage"]["total_tokens"]


async def test_messages_stream_grammar_and_ledger(
    echo: BridgeHandle, client: httpx.AsyncClient
) -> None:
    url = f"{echo.rollout_url('m')}/v1/messages"
    with trio.fail_after(20):
        plain = await client.post(url, json=MSG, headers=AUTH)
        streamed = await client.post(url, json={**MSG, "stream": True}, headers=AUTH)
    got = events(streamed.text)
    kinds = [k for k, _ in got]
    assert kinds[0] == "message_start" and got[0][1]["message"]["model"] == "claude-test"
    assert kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "".join(d["delta"]["text"] for k, d in got if k == "content_block_delta") == "hi there"
    assert got[-2][1]["usage"] == plain.json()["usage"]
    assert got[-2][1]["delta"]["stop_reason"] == "end_turn"
    usage = echo.ledger.get("m")
    u = plain.json()["usage"]
    assert usage is not None and usage.calls == 2
    assert usage.total_tokens == 2 * (u["input_tokens"] + u["output_tokens"])


async def test_count_tokens_on_echo_adds_nothing(
    echo: BridgeHandle, client: httpx.AsyncClient
) -> None:
    with trio.fail_after(20):
        answer = await client.post(
            f"{echo.rollout_url('c')}/v1/messages/count_tokens",
            json={"model": "c", "messages": MSG["messages"]},
            headers=AUTH,
        )
        created = await client.post(f"{echo.rollout_url('c2')}/v1/messages", json=MSG, headers=AUTH)
    assert answer.status_code == 200
    assert answer.json() == {"input_tokens": created.json()["usage"]["input_tokens"]}
    assert echo.ledger.get("c") is None


async def test_count_tokens_is_a_404_on_a_translated_upstream(
    start_bridge: StartBridge, client: httpx.AsyncClient, provider_env: Any
) -> None:
    handle = await start_bridge()  # openai/test-model: Messages are translated to chat
    with trio.fail_after(20):
        answer = await client.post(
            f"{handle.rollout_url('c')}/v1/messages/count_tokens",
            json={"model": "c", "messages": MSG["messages"]},
            headers=AUTH,
        )
    assert answer.status_code == 404
    assert answer.json()["error"]["type"] == "not_found_error"


async def test_translated_to_a_direct_chat_upstream(
    start_bridge: StartBridge, client: httpx.AsyncClient, provider_env: Any
) -> None:
    """Both APIs reach an OpenAI-compatible chat provider through the translators; the
    provider sees its own key, never the run's bearer, and a chat request."""
    handle = await start_bridge()
    with trio.fail_after(20):
        r = await client.post(f"{handle.rollout_url('d')}/responses", json=RESP, headers=AUTH)
        m = await client.post(
            f"{handle.rollout_url('d')}/v1/messages", json={**MSG, "stream": True}, headers=AUTH
        )
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "echo: hi there"
    assert m.status_code == 200 and events(m.text)[-1][0] == "message_stop"
    seen = provider_env.requests[-2:]
    for request in seen:
        assert request.path.endswith("/chat/completions")
        assert TOKEN not in json.dumps(request.headers) and TOKEN not in json.dumps(request.body)
        assert request.headers["authorization"] == "Bearer sk-provider-key-for-tests-000000"
    usage = handle.ledger.get("d")
    assert usage is not None and usage.calls == 2


async def test_plain_daemon_routes_take_the_rollout_id_from_a_header(
    start_bridge: StartBridge, client: httpx.AsyncClient
) -> None:
    handle = await start_bridge(model="rollbridge/echo", plain_chat_route=True)
    headers = {**AUTH, "X-Rollbridge-Rollout-Id": "ide"}
    with trio.fail_after(20):
        r = await client.post(f"{handle.base_url}/v1/responses", json=RESP, headers=headers)
        m = await client.post(f"{handle.base_url}/v1/messages", json=MSG, headers=headers)
    assert r.status_code == m.status_code == 200
    usage = handle.ledger.get("ide")
    assert usage is not None and usage.calls == 2


async def test_upstream_failure_before_the_stream_is_a_status_in_the_callers_shape(
    start_bridge: StartBridge, client: httpx.AsyncClient, provider_env: Any
) -> None:
    from bridge.retry import RetryPolicy

    handle = await start_bridge(retry=RetryPolicy(max_attempts=1))
    provider_env.fail_statuses.extend([400, 400])
    with trio.fail_after(20):
        m = await client.post(
            f"{handle.rollout_url('f')}/v1/messages", json={**MSG, "stream": True}, headers=AUTH
        )
        r = await client.post(
            f"{handle.rollout_url('f')}/responses", json={**RESP, "stream": True}, headers=AUTH
        )
    assert m.status_code == 400 and m.json()["type"] == "error"
    assert r.status_code == 400 and "error" in r.json()


@pytest.mark.parametrize(("path", "body"), [("/responses", RESP), ("/v1/messages", MSG)])
async def test_keepalive_mode_trickles_a_slow_answer(
    start_bridge: StartBridge, scripted: Any, path: str, body: dict[str, Any]
) -> None:
    """Behind a public URL, a slow non-streaming call commits a 200 and trickles spaces, then
    the answer in the caller's shape (as on the chat route)."""
    from tests.bridge.scripted import Reply

    release = trio.Event()
    completion = json.dumps({
        "id": "chatcmpl-up1", "created": 1700000000,
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "late"}}],
    }).encode()  # fmt: skip
    scripted.reply(Reply(200, parts=[(release, completion)]))
    handle = await start_bridge(keepalive=True, keepalive_grace=0.01, keepalive_interval=0.01)
    received = b""
    with trio.fail_after(20):
        async with (
            httpx.AsyncClient() as client,
            client.stream(
                "POST", handle.rollout_url("k") + path, json=body, headers=AUTH
            ) as answer,
        ):
            assert answer.status_code == 200
            async for part in answer.aiter_bytes():
                received += part
                if received.count(b" ") >= 3:
                    release.set()
    assert received.startswith(b"   ")
    doc = json.loads(received)
    text = (
        doc["output"][0]["content"][0]["text"]
        if path == "/responses"
        else doc["content"][0]["text"]
    )
    assert text == "late"


async def test_exact_totals_under_concurrency_across_the_three_apis(
    echo: BridgeHandle, client: httpx.AsyncClient
) -> None:
    """Calls on the three APIs, streamed and not, interleaved on many rollouts: each rollout's
    ledger is exactly the sum of the usage its answers reported."""
    chat = {"messages": [{"role": "user", "content": "hi there"}]}
    calls = [
        ("/chat/completions", chat),
        ("/responses", RESP),
        ("/v1/messages", MSG),
    ]
    reported: dict[str, int] = {}

    async def one(rollout: str, path: str, body: dict[str, Any], stream: bool) -> None:
        answer = await client.post(
            echo.rollout_url(rollout) + path, json={**body, "stream": stream}, headers=AUTH
        )
        assert answer.status_code == 200
        if path == "/chat/completions":
            usage = (
                [d for _, d in events(answer.text) if d.get("usage")][-1]["usage"]
                if stream
                else answer.json()["usage"]
            )
            total = usage["total_tokens"]
        elif path == "/responses":
            doc = events(answer.text)[-1][1]["response"] if stream else answer.json()
            total = doc["usage"]["total_tokens"]
        else:
            usage = events(answer.text)[-2][1]["usage"] if stream else answer.json()["usage"]
            total = usage["input_tokens"] + usage["output_tokens"]
        reported[rollout] = reported.get(rollout, 0) + total

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for n in range(24):
                path, body = calls[n % 3]
                nursery.start_soon(one, f"c{n % 4}", path, body, n % 2 == 0)
    for rollout, total in reported.items():
        usage = echo.ledger.get(rollout)
        assert usage is not None and usage.calls == 6 and usage.total_tokens == total


@pytest.mark.parametrize(("path", "body"), [("/responses", RESP), ("/v1/messages", MSG)])
async def test_a_stream_the_client_abandons_is_counted(
    start_bridge: StartBridge, scripted: Any, path: str, body: dict[str, Any]
) -> None:
    """The client leaves after the first text event: the provider call is cancelled and still
    counted (the provider had started answering), as on the chat route."""
    from tests.bridge.scripted import Reply, sse

    never = trio.Event()
    first = {
        "id": "chatcmpl-up1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "choices": [{"index": 0, "delta": {"content": "first"}, "finish_reason": None}],
    }
    parts = [*sse(first, done=False), (never, b"data: [DONE]\n\n")]
    scripted.reply(Reply(200, content_type="text/event-stream", parts=parts))
    handle = await start_bridge()
    with trio.fail_after(20):
        async with (
            httpx.AsyncClient() as client,
            client.stream(
                "POST",
                handle.rollout_url("gone") + path,
                json={**body, "stream": True},
                headers=AUTH,
            ) as answer,
        ):
            async for text in answer.aiter_text():
                if "first" in text:
                    break
        while scripted.disconnects == 0:
            await trio.sleep(0.01)
        while handle.ledger.get("gone") is None:
            await trio.sleep(0.01)
    usage = handle.ledger.get("gone")
    assert usage is not None and usage.calls == 1


@pytest.mark.parametrize(
    ("path", "body", "last"),
    [
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, None),
        ("/responses", RESP, "response.failed"),
        ("/v1/messages", MSG, "error"),
    ],
)
async def test_a_stream_cut_off_without_a_finish_reason_is_a_failure(
    start_bridge: StartBridge,
    scripted: Any,
    path: str,
    body: dict[str, Any],
    last: str | None,
) -> None:
    """The provider sends text, then closes its body cleanly with no ``finish_reason`` and no
    ``[DONE]``: the answer was cut off, so the caller gets an error event (never a completed
    answer) and the call's record says it failed."""
    from tests.bridge.scripted import Reply, sse

    part = {
        "id": "chatcmpl-up1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "choices": [{"index": 0, "delta": {"content": "part1 "}, "finish_reason": None}],
    }
    scripted.reply(Reply(200, content_type="text/event-stream", parts=sse(part, done=False)))
    handle = await start_bridge(keep_calls=True)
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                handle.rollout_url("cut") + path, json={**body, "stream": True}, headers=AUTH
            )
    seen = events(answer.text)
    kinds = [kind for kind, _ in seen]
    assert "part1" in answer.text
    assert "error" in kinds, kinds
    assert "response.completed" not in kinds and "message_stop" not in kinds
    assert all(
        choice.get("finish_reason") is None
        for _, data in seen
        for choice in data.get("choices") or []
    )
    if last is not None:
        assert kinds[-1] == last
    assert "ended before its answer did" in answer.text
    (call,) = handle.calls.pop("cut")
    assert call["status"] == 502


@pytest.mark.parametrize("path", ["/responses", "/v1/messages"])
async def test_a_failure_after_the_first_heartbeat_is_an_error_event_in_the_caller_s_shape(
    start_bridge: StartBridge, scripted: Any, path: str
) -> None:
    """The 200 left with a heartbeat, then the provider refused: the error event says what the
    plain answer would (on Responses, OpenAI's event: code, message and sequence at the top)."""
    from bridge.retry import RetryPolicy
    from tests.bridge.scripted import Reply

    release = trio.Event()
    refusal = b'{"error": {"type": "invalid_request_error", "code": "bad_thing", "message": "no"}}'
    scripted.reply(Reply(400, parts=[(release, refusal)]))
    handle = await start_bridge(heartbeat_interval=0.01, retry=RetryPolicy(max_attempts=1))
    body = {**(RESP if path == "/responses" else MSG), "stream": True}
    received = b""
    with trio.fail_after(20):
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", handle.rollout_url("h") + path, json=body, headers=AUTH) as r,
        ):
            assert r.status_code == 200
            async for part in r.aiter_bytes():
                received += part
                if b": ping" in received:
                    release.set()
    [(kind, data)] = events(received.decode())
    assert kind == "error"
    if path == "/responses":
        assert data["type"] == "error" and data["message"] == "no"
        assert data["code"] == "bad_thing" and data["sequence_number"] == 0
        assert data["error"]["message"] == "no"
    else:
        assert data == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "no"},
        }
