"""The LiteLLM path: a native provider (Anthropic, against a fake /v1/messages) and the
OpenAI-compatible route forced through LiteLLM, against the fake upstream.

LiteLLM is imported once per session (on the bridge's worker thread); the first test here
pays for it.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeHandle
from bridge.retry import RetryPolicy
from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.bridge.scripted import Reply, Scripted, run_scripted
from tests.fakes.upstream import FakeUpstream

#: Retries off: these tests pin down how a final upstream answer is relayed.
NO_RETRY = RetryPolicy(max_attempts=1)

pytestmark = pytest.mark.timeout(120)

ANTHROPIC_MODEL = "anthropic/claude-sonnet-4-6"


def anthropic_message(content: list[dict[str, Any]], stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }


@pytest.fixture
async def anthropic(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> Scripted:
    upstream: Scripted = await nursery.start(run_scripted, Scripted())
    upstream.reply(Reply(200, anthropic_message([{"type": "text", "text": "hello"}])))
    monkeypatch.setenv("ANTHROPIC_API_BASE", upstream.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-0123456789abcdef")
    return upstream


async def call(handle: BridgeHandle, body: Any, rid: str = "r1") -> httpx.Response:
    with trio.fail_after(60):
        async with httpx.AsyncClient(timeout=60) as client:
            return await client.post(url(handle, rid), json=body, headers=AUTH)


async def test_anthropic_native_call(start_bridge: StartBridge, anthropic: Scripted) -> None:
    handle = await start_bridge(model=ANTHROPIC_MODEL)
    body = {
        "model": "osmosis-rollout",
        "messages": HI,
        "max_tokens": 100,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "foo_custom": 1,
    }
    response = await call(handle, body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["model"] == "osmosis-rollout"
    assert data["choices"][0]["message"]["content"] == "hello"
    assert data["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    sent = anthropic.requests[-1]
    assert anthropic.paths[-1] == "/v1/messages"
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert sent["foo_custom"] == 1
    assert anthropic.headers[-1]["x-api-key"] == "sk-ant-test-key-0123456789abcdef"
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 18


async def test_anthropic_unsupported_param_is_400_not_dropped(
    start_bridge: StartBridge, anthropic: Scripted
) -> None:
    handle = await start_bridge(model=ANTHROPIC_MODEL)
    response = await call(handle, {"messages": HI, "max_tokens": 10, "logit_bias": {"5": 1}})
    assert response.status_code == 400
    assert "logit_bias" in response.json()["error"]["message"]
    assert anthropic.requests == []


@pytest.mark.parametrize(
    ("model", "metadata", "message"),
    [
        (ANTHROPIC_MODEL, {"foo": 1}, "Anthropic metadata supports only user_id"),
        (
            "gemini/gemini-2.0-flash",
            {},
            "LiteLLM cannot forward metadata to gemini; use its provider-specific parameter",
        ),
    ],
)
async def test_metadata_rules(
    start_bridge: StartBridge, anthropic: Scripted, model: str, metadata: Any, message: str
) -> None:
    handle = await start_bridge(model=model)
    response = await call(handle, {"messages": HI, "metadata": metadata})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message


async def test_anthropic_user_id_metadata_forwarded(
    start_bridge: StartBridge, anthropic: Scripted
) -> None:
    handle = await start_bridge(model=ANTHROPIC_MODEL)
    response = await call(handle, {"messages": HI, "max_tokens": 5, "metadata": {"user_id": "u"}})
    assert response.status_code == 200
    assert anthropic.requests[-1]["metadata"] == {"user_id": "u"}


@pytest.mark.parametrize(("status", "expected"), [(401, 401), (429, 429), (529, 502), (500, 502)])
async def test_anthropic_errors_map(
    start_bridge: StartBridge, anthropic: Scripted, status: int, expected: int
) -> None:
    body = {"type": "error", "error": {"type": "x", "message": "upstream says no"}}
    anthropic.reply(Reply(status, body))
    handle = await start_bridge(model=ANTHROPIC_MODEL, retry=NO_RETRY)
    response = await call(handle, {"messages": HI, "max_tokens": 5})
    assert response.status_code == expected
    assert "upstream says no" in response.json()["error"]["message"]
    assert len(anthropic.requests) == 1  # LiteLLM did not retry
    assert handle.ledger.pop("r1") is None


async def test_anthropic_stream(start_bridge: StartBridge, anthropic: Scripted) -> None:
    def event(name: str, payload: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()

    start = anthropic_message([])
    start["usage"] = {"input_tokens": 11, "output_tokens": 1}
    anthropic.reply(
        Reply(200, content_type="text/event-stream", parts=[
            (0, event("message_start", {"type": "message_start", "message": start})),
            (0, event("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": {"type": "text", "text": ""}})),
            (0, event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": "hel"}})),
            (0, event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": "lo"}})),
            (0, event("content_block_stop", {"type": "content_block_stop", "index": 0})),
            (0, event("message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                        "usage": {"output_tokens": 7}})),
            (0, event("message_stop", {"type": "message_stop"})),
        ])
    )  # fmt: skip
    handle = await start_bridge(model=ANTHROPIC_MODEL)
    response = await call(handle, {"messages": HI, "max_tokens": 5, "stream": True})
    frames = [f for f in response.text.split("\n\n") if f]
    assert frames[0] == ": ping" and frames[-1] == "data: [DONE]"
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames[1:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "hello"
    assert any(c.get("usage", {}).get("completion_tokens") == 7 for c in chunks)
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.completion_tokens == 7


async def test_invalid_model_string_is_400(start_bridge: StartBridge) -> None:
    handle = await start_bridge(model="bogusmodel")
    response = await call(handle, {"messages": HI})
    assert response.status_code == 400


# OpenAI-compatible route forced through LiteLLM -----------------------------------------------


async def test_forced_litellm_wire_path_forwards_verbatim(
    start_bridge: StartBridge, provider_env: FakeUpstream
) -> None:
    handle = await start_bridge(via_litellm=True)
    body = {
        "model": "m",
        "messages": HI,
        "temperature": 0.2,
        "made_up_field": 1,
        "provider": {"x": 1},
    }
    response = await call(handle, body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "echo: hi"
    sent = provider_env.requests[-1].body
    assert sent["model"] == "test-model"
    assert sent["made_up_field"] == 1
    assert sent["provider"] == {"x": 1}
    assert sent["temperature"] == 0.2
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 3


async def test_forced_litellm_does_not_retry(
    start_bridge: StartBridge, provider_env: FakeUpstream
) -> None:
    provider_env.fail_statuses.extend([500, 500, 500])
    handle = await start_bridge(via_litellm=True, retry=NO_RETRY)  # LiteLLM itself must not
    response = await call(handle, {"messages": HI})
    assert response.status_code == 502
    assert len(provider_env.requests) == 1


async def test_forced_litellm_stream(start_bridge: StartBridge, provider_env: FakeUpstream) -> None:
    handle = await start_bridge(via_litellm=True)
    response = await call(handle, {"messages": HI, "stream": True})
    frames = [f for f in response.text.split("\n\n") if f]
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames[1:-1]]
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        == "echo: hi"
    )
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 3


async def test_cancellation_reaches_upstream_through_litellm(
    start_bridge: StartBridge, provider_env: FakeUpstream
) -> None:
    provider_env.delay = 60
    handle = await start_bridge(via_litellm=True)
    with trio.fail_after(60):
        async with httpx.AsyncClient(timeout=60) as client, trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(client.post, url(handle), json={"messages": HI}, headers=AUTH)
            )
            while provider_env.in_flight == 0:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        while provider_env.disconnects == 0:
            await trio.sleep(0.02)
    assert provider_env.completed == 0


async def _broken_provider(
    how: str, seen: list[bytes], task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """A provider that reads each request, then closes with no answer (``"silent"``) or
    after half of a 200's body (``"truncated"``, or ``"stream"``: an event stream's first
    event and no more)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}")

    async def one(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some()
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += await stream.receive_some()
            seen.append(body)
            if how == "truncated":
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b'content-length: 400\r\n\r\n{"id": "msg_1", "type": '
                )
            elif how == "stream":
                start = {"type": "message_start", "message": anthropic_message([])}
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
                    + f"event: message_start\ndata: {json.dumps(start)}\n\n".encode()
                )

    await trio.serve_listeners(one, listeners)


@pytest.mark.parametrize(("how", "stream"), [("truncated", False), ("stream", True)])
async def test_an_answer_that_broke_off_through_litellm_is_not_retried(
    start_bridge: StartBridge,
    nursery: trio.Nursery,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    stream: bool,
) -> None:
    """LiteLLM calls any failed exchange a 500 of its own; an answer that began arriving was
    billed, so the bridge neither retries it nor records a status the provider never sent."""
    seen: list[bytes] = []
    base = await nursery.start(_broken_provider, how, seen)
    monkeypatch.setenv("ANTHROPIC_API_BASE", base)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-0123456789abcdef")
    fast = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
    handle = await start_bridge(model=ANTHROPIC_MODEL, retry=fast, keep_calls=True)
    response = await call(handle, {"messages": HI, "max_tokens": 5, "stream": stream})
    assert "broke off" in response.text
    assert len(seen) == 1
    (record,) = handle.calls.pop("r1")
    assert record["status"] == 502 and record["error"] == "APIConnectionError"
    assert "upstream_status" not in record and "retries" not in record


async def test_a_provider_lost_before_answering_through_litellm_is_retried(
    start_bridge: StartBridge, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bytes] = []
    base = await nursery.start(_broken_provider, "silent", seen)
    monkeypatch.setenv("ANTHROPIC_API_BASE", base)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-0123456789abcdef")
    fast = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
    handle = await start_bridge(model=ANTHROPIC_MODEL, retry=fast, keep_calls=True)
    response = await call(handle, {"messages": HI, "max_tokens": 5})
    assert response.status_code == 502 and "could not reach the provider" in response.text
    assert len(seen) == 3
    (record,) = handle.calls.pop("r1")
    assert "upstream_status" not in record
    assert record["retries"] == [{"status": 502, "kind": "APIConnectionError"}] * 2
