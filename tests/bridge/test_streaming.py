"""Real streaming, heartbeats, keepalive mode and cancellation reaching the provider."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import httpx
import trio

from bridge.retry import RetryPolicy
from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.bridge.scripted import Reply, Scripted, sse
from tests.fakes.upstream import FakeUpstream

#: Retries off: these tests pin down how a final upstream answer is relayed.
NO_RETRY = RetryPolicy(max_attempts=1)

USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


USAGE_CHUNK = {**chunk({}), "choices": [], "usage": USAGE}


def frames(text: str) -> list[str]:
    return [f for f in text.split("\n\n") if f]


def data(frame: str) -> Any:
    assert frame.startswith("data: "), frame
    return json.loads(frame.removeprefix("data: "))


async def test_stream_body_exact(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(
        Reply(200, content_type="text/event-stream", parts=sse(
            chunk({"role": "assistant", "content": "hello"}), chunk({}, "stop"), USAGE_CHUNK
        ))
    )  # fmt: skip
    handle = await start_bridge()
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url(handle), json={"model": "m", "messages": HI, "stream": True}, headers=AUTH
            )
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    first = {
        "id": "chatcmpl-up1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
    }
    assert frames(response.text) == [
        ": ping",
        "data: " + json.dumps(
            {**first, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": None}]},
            separators=(",", ":"),
        ),
        "data: " + json.dumps(
            {**first, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": USAGE},
            separators=(",", ":"),
        ),
        "data: [DONE]",
    ]  # fmt: skip
    sent = scripted.requests[-1]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 18 and usage.calls == 1


async def test_stream_from_fake_upstream(
    start_bridge: StartBridge, provider_env: FakeUpstream
) -> None:
    handle = await start_bridge()
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url(handle),
                json={"messages": [{"role": "user", "content": "one two three"}], "stream": True},
                headers=AUTH,
            )
    chunks = [data(f) for f in frames(response.text)[1:-1]]
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        == "echo: one two three"
    )
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert all("usage" not in c for c in chunks[:-1])


async def test_streamed_tool_call_indices(start_bridge: StartBridge, scripted: Scripted) -> None:
    calls = [
        {
            "index": 0,
            "id": "call_a",
            "type": "function",
            "function": {"name": "f", "arguments": ""},
        },
        {
            "index": 1,
            "id": "call_b",
            "type": "function",
            "function": {"name": "g", "arguments": ""},
        },
    ]
    scripted.reply(
        Reply(200, content_type="text/event-stream", parts=sse(
            chunk({"role": "assistant", "tool_calls": [calls[0]]}),
            chunk({"tool_calls": [calls[1]]}),
            chunk({}, "tool_calls"),
            USAGE_CHUNK,
        ))
    )  # fmt: skip
    handle = await start_bridge()
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url(handle), json={"messages": HI, "stream": True}, headers=AUTH
            )
    chunks = [data(f) for f in frames(response.text)[1:-1]]
    seen = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [(c["index"], c["id"]) for c in seen] == [(0, "call_a"), (1, "call_b")]


async def test_non_streaming_provider_answer_becomes_one_chunk(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    scripted.reply(
        Reply(200, {
            "id": "chatcmpl-up1", "created": 1700000000,
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [tool_call]}}],
            "usage": USAGE,
        })
    )  # fmt: skip
    handle = await start_bridge()
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url(handle), json={"messages": HI, "stream": True}, headers=AUTH
            )
    body = frames(response.text)
    assert body[0] == ": ping" and body[-1] == "data: [DONE]" and len(body) == 3
    only = data(body[1])
    assert only["object"] == "chat.completion.chunk"
    assert only["choices"][0]["delta"]["tool_calls"] == [{**tool_call, "index": 0}]
    assert only["usage"] == USAGE


async def test_relay_is_live_with_heartbeats(start_bridge: StartBridge, scripted: Scripted) -> None:
    release = trio.Event()
    parts = sse(chunk({"content": "first"}), done=False)
    parts += [
        (release, b"data: " + json.dumps(chunk({"content": " second"}, "stop")).encode() + b"\n\n")
    ]
    parts += sse(USAGE_CHUNK)
    scripted.reply(Reply(200, content_type="text/event-stream", parts=parts))
    handle = await start_bridge(heartbeat_interval=0.01)
    seen: list[str] = []
    with trio.fail_after(20):
        async with (
            httpx.AsyncClient() as client,
            client.stream(
                "POST", url(handle), json={"messages": HI, "stream": True}, headers=AUTH
            ) as response,
        ):
            buffer = ""
            async for text in response.aiter_text():
                buffer += text
                *done, buffer = buffer.split("\n\n")
                seen.extend(done)
                # The first chunk arrived while the provider still holds the rest: relayed live.
                # Released once three heartbeats followed it (those before it do not count).
                first = next((i for i, f in enumerate(seen) if "first" in f), None)
                if first is not None and seen[first + 1 :].count(": ping") >= 3:
                    release.set()
    assert seen[0] == ": ping"
    contents = [i for i, f in enumerate(seen) if f.startswith("data: {")]
    assert "first" in seen[contents[0]] and "second" in seen[contents[1]]
    assert seen[contents[0] + 1 : contents[1]].count(": ping") >= 3
    assert seen[-1] == "data: [DONE]"


async def test_error_status_in_stream_mode(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(Reply(500, '{"error":{"message":"boom"}}'))
    handle = await start_bridge(retry=NO_RETRY)
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url(handle), json={"messages": HI, "stream": True}, headers=AUTH
            )
    assert response.status_code == 200
    body = frames(response.text)
    assert body[0] == ": ping" and body[-1] == "data: [DONE]"
    assert body[1].startswith("event: error\ndata: ")
    error = json.loads(body[1].split("data: ", 1)[1])
    assert error["error"] == {
        "message": '{"error":{"message":"boom"}}',
        "type": "bridge_error",
        "code": 502,
        "upstream_status": 500,
    }
    assert handle.ledger.pop("r1") is None


async def test_error_mid_stream(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(
        Reply(200, content_type="text/event-stream", parts=sse(
            chunk({"content": "par"}), {"error": {"message": "provider fell over", "code": 500}}
        ))
    )  # fmt: skip
    handle = await start_bridge()
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url(handle), json={"messages": HI, "stream": True}, headers=AUTH
            )
    body = frames(response.text)
    assert "par" in body[1]
    assert body[2].startswith("event: error\n")
    assert '"code":502' in body[2] and "provider fell over" in body[2]
    assert body[3] == "data: [DONE]"


async def test_a_null_error_field_in_a_chunk_is_no_error(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    """Some OpenAI-compatible servers write `"error": null` in every chunk."""
    scripted.reply(
        Reply(200, content_type="text/event-stream", parts=sse(
            chunk({"content": "fine"}, error=None), chunk({}, "stop", error=None), USAGE_CHUNK
        ))
    )  # fmt: skip
    handle = await start_bridge(retry=NO_RETRY)
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url(handle), json={"messages": HI, "stream": True}, headers=AUTH
            )
    assert "event: error" not in response.text and "fine" in response.text
    assert frames(response.text)[-1] == "data: [DONE]"
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 18


async def test_client_gone_mid_stream_cancels_provider_and_counts_call(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    never = trio.Event()
    parts = [*sse(chunk({"content": "first"}), done=False), (never, b"data: [DONE]\n\n")]
    scripted.reply(Reply(200, content_type="text/event-stream", parts=parts))
    handle = await start_bridge()
    with trio.fail_after(20):
        async with (
            httpx.AsyncClient() as client,
            client.stream(
                "POST", url(handle), json={"messages": HI, "stream": True}, headers=AUTH
            ) as response,
        ):
            async for text in response.aiter_text():
                if "first" in text:
                    break
        while scripted.disconnects == 0:
            await trio.sleep(0.01)
        while handle.ledger.get("r1") is None:
            await trio.sleep(0.01)
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.calls == 1


async def test_client_gone_cancels_non_streaming_call(
    start_bridge: StartBridge, provider_env: FakeUpstream
) -> None:
    provider_env.delay = 60
    handle = await start_bridge()
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(client.post, url(handle), json={"messages": HI}, headers=AUTH)
            )
            while provider_env.in_flight == 0:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        while provider_env.disconnects == 0:
            await trio.sleep(0.01)
    assert provider_env.completed == 0
    assert handle.ledger.pop("r1") is None


# Keepalive mode -----------------------------------------------------------------------------


async def test_keepalive_slow_call_trickles_spaces(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    release = trio.Event()
    body = json.dumps({
        "id": "chatcmpl-up1", "created": 1700000000, "usage": USAGE,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "late"}}],
    }).encode()  # fmt: skip
    scripted.reply(Reply(200, parts=[(release, body)]))
    handle = await start_bridge(keepalive=True, keepalive_grace=0.01, keepalive_interval=0.01)
    received = b""
    with trio.fail_after(20):
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", url(handle), json={"messages": HI}, headers=AUTH) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/json"
            async for part in response.aiter_bytes():
                received += part
                if received.count(b" ") >= 3:
                    release.set()
    assert received.startswith(b"   ")
    answer = json.loads(received)
    assert answer["choices"][0]["message"]["content"] == "late"


async def test_keepalive_slow_failure_is_200_with_error(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    release = trio.Event()
    scripted.reply(Reply(400, parts=[(release, b'{"error":{"message":"bad"}}')]))
    handle = await start_bridge(keepalive=False, keepalive_grace=0.01, keepalive_interval=0.01)
    handle.keepalive = True
    received = b""
    with trio.fail_after(20):
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", url(handle), json={"messages": HI}, headers=AUTH) as response,
        ):
            assert response.status_code == 200
            async for part in response.aiter_bytes():
                received += part
                release.set()
    assert received.startswith(b" ")
    assert json.loads(received)["error"]["code"] == 400


async def test_keepalive_fast_call_keeps_real_status(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    scripted.reply(Reply(502, "bad gateway"))
    handle = await start_bridge(keepalive=True, retry=NO_RETRY)
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            response = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
            assert response.status_code == 502
            assert response.json()["error"]["message"] == "bad gateway"
            response = await client.post(url(handle), json={"messages": HI, "n": 3}, headers=AUTH)
            assert response.status_code == 400


async def test_answer_already_arriving_is_counted_when_client_leaves(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    release = trio.Event()
    body = json.dumps({
        "id": "chatcmpl-up1", "created": 1700000000, "usage": USAGE,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}],
    }).encode()  # fmt: skip
    # Headers go out at once, the body only after the client has gone.
    scripted.reply(Reply(200, parts=[(release, body)]))
    handle = await start_bridge()
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(client.post, url(handle), json={"messages": HI}, headers=AUTH)
            )
            while not scripted.requests:
                await trio.sleep(0.01)
            await trio.sleep(0.5)  # let the provider's headers reach the bridge
            nursery.cancel_scope.cancel()
        release.set()
        while handle.ledger.get("r1") is None:
            await trio.sleep(0.01)
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 18
