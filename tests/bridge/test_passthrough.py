"""The bridge relays every response field it does not own (docs/bridge.md, "What the rollout
receives"), on the direct and the LiteLLM path, streaming and not, against a scripted upstream
that sends them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.bridge.scripted import Reply, Scripted, sse

pytestmark = pytest.mark.timeout(120)

USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
LOGPROBS = {
    "content": [{"token": "hi", "logprob": -0.25, "bytes": [104, 105], "top_logprobs": []}],
    "refusal": None,
}
ANNOTATIONS = [
    {
        "type": "url_citation",
        "url_citation": {"url": "https://x.test", "title": "t", "start_index": 0, "end_index": 2},
    }
]
ENVELOPE_EXTRAS = {"system_fingerprint": "fp_9", "service_tier": "default"}


def completion(**message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "test-model",
        **ENVELOPE_EXTRAS,
        "vendor_extra": {"region": "eu"},
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "logprobs": LOGPROBS,
                "message": {"role": "assistant", "content": "hi", **message},
            }
        ],
        "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 1}},
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "test-model",
        **ENVELOPE_EXTRAS,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": LOGPROBS}],
    }


STREAM = sse(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "hi", "annotations": ANNOTATIONS}),
    chunk({}, "stop"),
    {**chunk({}), "choices": [], "usage": USAGE},
)

PATHS = pytest.mark.parametrize("via_litellm", [False, True], ids=["direct", "litellm"])


async def _post(start_bridge: StartBridge, via_litellm: bool, body: dict[str, Any]) -> str:
    handle = await start_bridge(via_litellm=via_litellm)
    with trio.fail_after(60):
        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.post(url(handle), json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.text


async def _complete(start_bridge: StartBridge, scripted: Scripted, via_litellm: bool) -> Any:
    scripted.reply(Reply(200, completion(annotations=ANNOTATIONS, audio=None)))
    return json.loads(await _post(start_bridge, via_litellm, {"model": "m", "messages": HI}))


async def _stream(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> list[dict[str, Any]]:
    scripted.reply(Reply(200, content_type="text/event-stream", parts=STREAM))
    text = await _post(start_bridge, via_litellm, {"model": "m", "messages": HI, "stream": True})
    frames = [f for f in text.split("\n\n") if f]
    assert frames[0] == ": ping" and frames[-1] == "data: [DONE]"
    return [json.loads(f.removeprefix("data: ")) for f in frames[1:-1]]


# Non-streaming ---------------------------------------------------------------------------


@PATHS
async def test_logprobs(start_bridge: StartBridge, scripted: Scripted, via_litellm: bool) -> None:
    data = await _complete(start_bridge, scripted, via_litellm)
    assert data["choices"][0]["logprobs"] == LOGPROBS


@PATHS
async def test_system_fingerprint_and_service_tier(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    data = await _complete(start_bridge, scripted, via_litellm)
    assert data["system_fingerprint"] == "fp_9"
    assert data["service_tier"] == "default"


@PATHS
async def test_annotations(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    data = await _complete(start_bridge, scripted, via_litellm)
    assert data["choices"][0]["message"]["annotations"] == ANNOTATIONS


@PATHS
async def test_a_provider_specific_envelope_field(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    data = await _complete(start_bridge, scripted, via_litellm)
    assert data["vendor_extra"] == {"region": "eu"}


async def test_a_provider_specific_message_field_on_the_direct_path(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    # (LiteLLM's message model keeps only the fields it knows; the direct path keeps them all.)
    scripted.reply(Reply(200, completion(vendor_score=0.5)))
    data = json.loads(await _post(start_bridge, False, {"messages": HI}))
    assert data["choices"][0]["message"]["vendor_score"] == 0.5


@PATHS
async def test_owned_fields_stay_the_bridges(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    data = await _complete(start_bridge, scripted, via_litellm)
    assert data["model"] == "m" and data["object"] == "chat.completion"
    assert data["usage"] == USAGE  # normalized: the provider's details are the ledger's
    message = data["choices"][0]["message"]
    # Nulls are not relayed (LiteLLM fills every field it knows with null), nor is LiteLLM's
    # own bookkeeping.
    assert "audio" not in message and "function_call" not in message
    assert "provider_specific_fields" not in json.dumps(data)


# Streaming -------------------------------------------------------------------------------


@PATHS
async def test_first_delta_keeps_the_role(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    chunks = await _stream(start_bridge, scripted, via_litellm)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "hi"


@PATHS
async def test_streamed_logprobs(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    chunks = await _stream(start_bridge, scripted, via_litellm)
    assert len(chunks) == 3
    assert all(c["choices"][0]["logprobs"] == LOGPROBS for c in chunks)


@PATHS
async def test_streamed_system_fingerprint_and_service_tier(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    chunks = await _stream(start_bridge, scripted, via_litellm)
    assert all(c["system_fingerprint"] == "fp_9" for c in chunks)
    assert all(c["service_tier"] == "default" for c in chunks)


@PATHS
async def test_streamed_annotations(
    start_bridge: StartBridge, scripted: Scripted, via_litellm: bool
) -> None:
    chunks = await _stream(start_bridge, scripted, via_litellm)
    assert chunks[1]["choices"][0]["delta"] == {"content": "hi", "annotations": ANNOTATIONS}
    # The finish chunk still carries the usage, owned and normalized.
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == USAGE


async def test_a_whole_answer_to_a_stream_keeps_role_and_logprobs(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    scripted.reply(Reply(200, completion(annotations=ANNOTATIONS)))
    text = await _post(start_bridge, False, {"messages": HI, "stream": True})
    frames = [f for f in text.split("\n\n") if f]
    assert len(frames) == 3
    only = json.loads(frames[1].removeprefix("data: "))
    assert only["object"] == "chat.completion.chunk"
    assert only["system_fingerprint"] == "fp_9"
    choice = only["choices"][0]
    assert choice["delta"] == {"role": "assistant", "content": "hi", "annotations": ANNOTATIONS}
    assert choice["logprobs"] == LOGPROBS and choice["finish_reason"] == "stop"


async def test_a_chunk_of_provider_fields_without_choices_is_relayed(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    filters = [{"prompt_index": 0, "content_filter_results": {}}]
    first = {**chunk({}), "choices": [], "prompt_filter_results": filters}
    parts = sse(first, chunk({"role": "assistant", "content": "hi"}, "stop"))
    scripted.reply(Reply(200, content_type="text/event-stream", parts=parts))
    text = await _post(start_bridge, False, {"messages": HI, "stream": True})
    chunks = [json.loads(f.removeprefix("data: ")) for f in text.split("\n\n")[1:-2]]
    assert chunks[0]["choices"] == [] and chunks[0]["prompt_filter_results"] == filters
    assert chunks[1]["choices"][0]["delta"] == {"role": "assistant", "content": "hi"}
