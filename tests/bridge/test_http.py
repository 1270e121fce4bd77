"""The bridge over HTTP, against the fake upstream: routes, auth, bodies, policy (docs/spec/bridge.md §15)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeHandle
from tests.bridge.conftest import AUTH, HI, TOKEN, StartBridge, url
from tests.fakes.upstream import FakeUpstream

BLOCKED = "Request fields cannot override eval bridge configuration: "


async def post(
    client: httpx.AsyncClient, handle: BridgeHandle, body: Any, rid: str = "r1", **kw: Any
) -> httpx.Response:
    headers = kw.pop("headers", AUTH)
    with trio.fail_after(20):
        return await client.post(url(handle, rid), json=body, headers=headers, **kw)


# Routing and auth ------------------------------------------------------------------------


async def test_missing_auth(bridge: BridgeHandle, client: httpx.AsyncClient) -> None:
    response = await post(client, bridge, {"messages": HI}, headers={})
    assert response.status_code == 401
    assert response.json() == {"detail": "Unauthorized"}
    assert "www-authenticate" not in response.headers


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer  {TOKEN}"},
        {"Authorization": f"Basic {TOKEN}"},
        {"x-api-key": TOKEN},
    ],
)
async def test_bad_auth(bridge: BridgeHandle, client: httpx.AsyncClient, headers: Any) -> None:
    response = await post(client, bridge, {"messages": HI}, headers=headers)
    assert response.status_code == 401


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
async def test_scheme_case_insensitive(
    bridge: BridgeHandle, client: httpx.AsyncClient, scheme: str
) -> None:
    response = await post(
        client, bridge, {"messages": HI}, headers={"Authorization": f"{scheme} {TOKEN}"}
    )
    assert response.status_code == 200


async def test_other_methods_and_paths(bridge: BridgeHandle, client: httpx.AsyncClient) -> None:
    with trio.fail_after(20):
        for headers in ({}, AUTH):
            response = await client.get(url(bridge), headers=headers)
            assert response.status_code == 405
            assert response.json() == {"detail": "Method Not Allowed"}
        response = await client.put(url(bridge), headers=AUTH)
        assert response.status_code == 405
        for method, path in [
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models"),
            ("GET", "/docs"),
            ("GET", "/openapi.json"),
            ("GET", "/health"),
        ]:
            response = await client.request(method, bridge.base_url + path, headers=AUTH)
            assert response.status_code == 404, path
            assert response.json() == {"detail": "Not Found"}
        response = await client.post(url(bridge) + "/", headers=AUTH)
        assert response.status_code == 307
        assert response.headers["location"] == "/v1/rollouts/r1/chat/completions"
        for call in ("responses", "v1/messages", "messages", "v1/messages/count_tokens"):
            response = await client.post(f"{bridge.base_url}/v1/rollouts/r1/{call}/")
            assert response.status_code == 307, call
            assert response.headers["location"] == f"/v1/rollouts/r1/{call}"


@pytest.mark.parametrize("rid", ["a%5Cb", "%2E%2E", "a%00b", "%2E", "%ff", "a%c3"])
async def test_invalid_rollout_id(
    bridge: BridgeHandle, client: httpx.AsyncClient, rid: str
) -> None:
    response = await post(client, bridge, {"messages": HI}, rid=rid)
    assert response.status_code == 422
    assert response.json() == {"detail": "invalid rollout_id"}


async def test_encoded_slash_and_auth_first(
    bridge: BridgeHandle, client: httpx.AsyncClient
) -> None:
    assert (await post(client, bridge, {"messages": HI}, rid="a%2Fb")).status_code == 404
    response = await post(client, bridge, {"messages": HI}, rid="%2E", headers={})
    assert response.status_code == 401


@pytest.mark.parametrize("raw", [b"{not json", b"[1,2]", b""])
async def test_invalid_body(bridge: BridgeHandle, client: httpx.AsyncClient, raw: bytes) -> None:
    with trio.fail_after(20):
        response = await client.post(url(bridge), content=raw, headers=AUTH)
        assert response.status_code == 400
        assert response.json() == {"detail": "invalid body"}
        response = await client.post(url(bridge), content=raw)
        assert response.status_code == 401


async def test_body_over_cap_is_413(start_bridge: StartBridge, provider_env: FakeUpstream) -> None:
    handle = await start_bridge(max_body_bytes=1000)
    async with httpx.AsyncClient(timeout=20) as client:
        small = await post(client, handle, {"messages": HI})
        assert small.status_code == 200
        big = await post(client, handle, {"messages": [{"role": "user", "content": "x" * 2000}]})
        assert big.status_code == 413
        assert big.json() == {"detail": "Request Entity Too Large"}
    with trio.fail_after(20):
        # Declared too big and not sent: answered at once, closing, with one Connection header.
        stream = await trio.open_tcp_stream("127.0.0.1", handle.port)
        path = "/v1/rollouts/r1/chat/completions"
        await stream.send_all(
            f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: {AUTH['Authorization']}\r\n"
            "content-type: application/json\r\ncontent-length: 100000000\r\n\r\n".encode()
        )
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
        await stream.aclose()
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 413")
    assert head.count(b"\r\nconnection: close") == 1, head


# Body handling -----------------------------------------------------------------------------


async def test_forwarding_exact(
    bridge: BridgeHandle, client: httpx.AsyncClient, provider_env: FakeUpstream
) -> None:
    provider_env.reply_prefix = ""
    body = {
        "model": "placeholder",
        "messages": [{"role": "user", "content": "hello"}],
        "temperature": 0.3,
        "reasoning": {"effort": "low"},
        "provider": {"sort": "latency"},
        "metadata": {"a": 1},
        "stream_options": {"include_usage": True},
        "n": 1,
    }
    response = await post(client, bridge, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "placeholder",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    sent = provider_env.requests[-1]
    assert list(sent.body) == [
        "model",
        "messages",
        "temperature",
        "reasoning",
        "provider",
        "metadata",
    ]
    assert sent.body == {
        "model": "test-model",
        "messages": [{"role": "user", "content": "hello"}],
        "temperature": 0.3,
        "reasoning": {"effort": "low"},
        "provider": {"sort": "latency"},
        "metadata": {"a": 1},
    }
    assert sent.headers["authorization"] == "Bearer sk-provider-key-for-tests-000000"
    assert TOKEN not in json.dumps(sent.headers)


@pytest.mark.parametrize("body", [{"messages": HI}, {"model": "", "messages": HI}])
async def test_model_echo_defaults_to_configured(
    bridge: BridgeHandle, client: httpx.AsyncClient, body: Any
) -> None:
    assert (await post(client, bridge, body)).json()["model"] == "openai/test-model"


async def test_extra_body_merge(
    bridge: BridgeHandle, client: httpx.AsyncClient, provider_env: FakeUpstream
) -> None:
    body = {
        "model": "m",
        "messages": HI,
        "temperature": 0.1,
        "metadata": {"a": 1, "b": {"x": 1}},
        "extra_body": {
            "temperature": 0.9,
            "metadata": {"b": {"y": 2}, "c": 3},
            "messages": [{"role": "user", "content": "IGNORED"}],
            "model": "other",
            "stream": True,
        },
    }
    response = await post(client, bridge, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["model"] == "m"
    sent = provider_env.requests[-1].body
    assert sent["temperature"] == 0.9
    assert sent["metadata"] == {"a": 1, "b": {"x": 1, "y": 2}, "c": 3}
    assert sent["messages"] == HI
    assert sent["model"] == "test-model"
    assert "stream" not in sent


def error(message: str, status: int = 400) -> dict[str, Any]:
    kind = "invalid_request_error" if status == 400 else "bridge_error"
    return {"error": {"message": message, "type": kind, "code": status}, "detail": message}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": HI, "extra_body": [1]}, "extra_body must be a JSON object"),
        ({"messages": HI, "extra_body": "x"}, "extra_body must be a JSON object"),
        (
            {"messages": HI, "extra_body": {"extra_body": {}}},
            "extra_body cannot contain another extra_body",
        ),
        ({"messages": HI, "extra_body": {"extra_body": {}, "api_key": "x"}}, BLOCKED + "api_key"),
        ({"messages": HI, "n": 2}, "The eval bridge supports only n=1"),
        ({"messages": HI, "n": 1, "extra_body": {"n": 2}}, "The eval bridge supports only n=1"),
        ({"messages": HI, "n": "1"}, "The eval bridge supports only n=1"),
        ({"messages": HI, "n": 2, "api_key": "x"}, "The eval bridge supports only n=1"),
        (
            {"messages": HI, "extra_body": {"api_base": "http://evil", "vertex_project": "p"}},
            BLOCKED + "api_base, vertex_project",
        ),
    ],
)
async def test_policy_rejections(
    bridge: BridgeHandle,
    client: httpx.AsyncClient,
    provider_env: FakeUpstream,
    body: Any,
    message: str,
) -> None:
    response = await post(client, bridge, body)
    assert response.status_code == 400
    assert response.json() == error(message)
    assert provider_env.requests == []


@pytest.mark.parametrize(
    "body", [{"messages": HI, "extra_body": None}, {"messages": HI, "n": None}]
)
async def test_null_is_absent(bridge: BridgeHandle, client: httpx.AsyncClient, body: Any) -> None:
    assert (await post(client, bridge, body)).status_code == 200


async def test_blocked_field_list(bridge: BridgeHandle, client: httpx.AsyncClient) -> None:
    names = "base_url api_key timeout num_retries _x litellm_foo aws_region_name models preset usage system prompt extra_headers mock_response"
    body: dict[str, Any] = {"messages": HI, **dict.fromkeys(names.split(), "x")}
    response = await post(client, bridge, body)
    assert response.status_code == 400
    assert response.json() == error(
        BLOCKED + "_x, api_key, aws_region_name, base_url, extra_headers, litellm_foo, "
        "mock_response, models, num_retries, preset, prompt, system, timeout, usage"
    )


async def test_custom_fields_forwarded_verbatim(
    bridge: BridgeHandle, client: httpx.AsyncClient, provider_env: FakeUpstream
) -> None:
    extra = {
        "provider": {"order": ["a"]},
        "transforms": ["middle-out"],
        "route": "fallback",
        "plugins": [{"id": "web"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "reasoning_effort": "low",
        "seed": 7,
        "user": "u1",
        "metadata": {"k": "v"},
        "made_up_field": 1,
    }
    response = await post(client, bridge, {"messages": HI, **extra})
    assert response.status_code == 200
    sent = provider_env.requests[-1].body
    assert {k: sent[k] for k in extra} == extra


async def test_streaming_policy_error_is_an_sse_event(
    bridge: BridgeHandle, client: httpx.AsyncClient
) -> None:
    response = await post(client, bridge, {"messages": HI, "stream": True, "api_key": "x"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    payload = json.dumps(error(BLOCKED + "api_key"), separators=(",", ":"))
    assert response.text == f": ping\n\nevent: error\ndata: {payload}\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(("stream", "sse"), [("yes", True), (0, False), ("false", True)])
async def test_stream_flag_truthiness(
    bridge: BridgeHandle, client: httpx.AsyncClient, stream: Any, sse: bool
) -> None:
    response = await post(client, bridge, {"messages": HI, "stream": stream})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream") is sse


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"messages":[{"role":"user","content":"caf\\udce9"}]}', "lone surrogate"),
        (b'{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}', "NaN is not JSON"),
        (b'{"messages":[{"role":"user","content":"hi"}],"top_p":-Infinity}', "-Infinity is not"),
    ],
)
async def test_json_no_provider_can_be_sent_is_a_400(
    bridge: BridgeHandle, client: httpx.AsyncClient, provider_env: Any, raw: bytes, why: str
) -> None:
    """What Python's json reads but cannot send on (a lone surrogate escape, as
    ``json.dumps`` writes surrogate-escaped text; ``NaN``/``Infinity``) is the caller's 400,
    not a 502 after a call the provider never saw."""
    with trio.fail_after(20):
        response = await client.post(url(bridge), content=raw, headers=AUTH)
    assert response.status_code == 400, response.text
    assert response.json()["detail"].startswith("invalid body: ")
    assert why in response.json()["detail"]
    assert provider_env.requests == []
    assert bridge.ledger.get("r1") is None
