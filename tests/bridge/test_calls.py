"""Per-call records (bridge.calls): what each call of a rollout did, in the bridge's own process
and in the caller's, known before the call's answer reaches the rollout."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from bridge.calls import CallBook, compact_logprobs
from bridge.process import BridgeProcessHandle, run_bridge_process
from bridge.server import BridgeConfig, BridgeHandle
from tests.bridge.conftest import AUTH, HI, TOKEN, StartBridge, url
from tests.fakes.upstream import FakeUpstream

DETAILS = {
    "prompt_tokens_details": {"cached_tokens": 2},
    "completion_tokens_details": {"reasoning_tokens": 1},
}


async def _process(nursery: trio.Nursery) -> BridgeProcessHandle:
    config = BridgeConfig(model="openai/test-model", token=TOKEN)
    handle: BridgeProcessHandle = await nursery.start(
        lambda task_status: run_bridge_process(
            config, redact_values=(TOKEN,), task_status=task_status
        )
    )
    return handle


async def test_each_call_crosses_the_hop_before_its_answer(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    provider_env.usage_extra = DETAILS
    provider_env.fail_statuses.extend([429])
    provider_env.retry_after = "0"
    with trio.fail_after(60):
        handle = await _process(nursery)
        async with httpx.AsyncClient(timeout=30) as client:
            first = await client.post(
                url(handle, "r1"), json={"messages": HI, "logprobs": True}, headers=AUTH
            )
            calls = handle.calls.get("r1")  # no wait: it must already be here
            streamed = await client.post(
                url(handle, "r1"),
                json={
                    "messages": HI,
                    "stream": True,
                    "logprobs": True,
                    "stream_options": {"include_usage": True},
                },
                headers=AUTH,
            )
            provider_env.fail_statuses.extend([400])
            refused = await client.post(url(handle, "r1"), json={"messages": HI}, headers=AUTH)
    assert (first.status_code, streamed.status_code, refused.status_code) == (200, 200, 400)
    assert len(calls) == 1
    done, stream, failed = handle.calls.pop("r1")
    assert handle.calls.pop("r1") == []
    assert done["kind"] == "rollout" and done["rollout_id"] == "r1"
    assert done["api"] == "chat.completions" and done["model"] == "test-model"
    assert done["status"] == 200 and done["finish_reason"] == "stop"
    assert done["retries"] == [
        {"status": 429, "kind": "RateLimitError", "request_id": "req_fail_1"}
    ]
    assert (done["prompt_tokens"], done["completion_tokens"]) == (1, 2)
    assert (done["cached_tokens"], done["reasoning_tokens"]) == (2, 1)
    assert done["logprobs"] == {"token": ["echo:", "hi"], "logprob": [0.0, -0.5]}
    assert done["duration_ms"] >= done["ttfb_ms"] >= 0
    assert stream["stream"] is True and stream["finish_reason"] == "stop"
    assert done["response_id"].startswith("chatcmpl-") and stream["response_id"]
    assert "response_id" not in failed
    assert stream["logprobs"]["token"] == ["echo:", " hi"]
    assert stream["total_tokens"] == 3 and stream["cached_tokens"] == 2
    assert failed["status"] == 400 and failed["upstream_status"] == 400
    assert failed["request_id"] == "req_fail_2" and "request_id" not in done
    assert "prompt_tokens" not in failed and "retries" not in failed


async def test_an_in_process_bridge_keeps_its_calls_per_rollout(
    start_bridge: StartBridge, provider_env: FakeUpstream, client: httpx.AsyncClient
) -> None:
    with trio.fail_after(30):
        handle: BridgeHandle = await start_bridge(keep_calls=True)
        standalone: BridgeHandle = await start_bridge()
        for rid in ("a", "a", "b"):
            for bridge in (handle, standalone):
                reply = await client.post(url(bridge, rid), json={"messages": HI}, headers=AUTH)
                assert reply.status_code == 200
    assert [c["rollout_id"] for c in handle.calls.pop("a")] == ["a", "a"]
    handle.calls.discard("b")
    assert handle.calls.pop("b") == []
    # A standalone bridge (`rollbridge bridge serve`) runs for days: it keeps no records.
    assert standalone.calls.get("a") == [] and standalone.calls.get("b") == []


def test_logprobs_are_kept_as_columns() -> None:
    content: list[Any] = [
        {"token": "a", "logprob": -1.0, "top_logprobs": [{"token": "b", "logprob": -2.0}]},
        {"token": "c", "logprob": -0.5, "top_logprobs": []},
    ]
    assert compact_logprobs(content) == {
        "token": ["a", "c"],
        "logprob": [-1.0, -0.5],
        "top": [[["b", -2.0]], []],
    }
    assert compact_logprobs(None) is None and compact_logprobs([]) is None


def test_a_call_finishing_after_its_rollout_was_forgotten_is_not_kept() -> None:
    book = CallBook()
    book.add({"kind": "rollout", "rollout_id": "gone", "status": 200})
    book.discard("gone")
    book.add({"kind": "rollout", "rollout_id": "gone", "status": None, "error": "cancelled"})
    assert book.pop("gone") == []


async def test_the_record_names_the_model_the_provider_says_answered(
    start_bridge: StartBridge, provider_env: FakeUpstream, client: httpx.AsyncClient
) -> None:
    """On all three routes, streamed or not: the fake provider answers as ``test-model`` (the
    configured ``openai/test-model`` without its prefix); a translated stream sends the caller
    its opening events before the provider's first chunk, which must not hide that name."""
    chat = {"messages": HI}
    responses = {"model": "gpt-x", "input": "hi"}
    messages = {"model": "claude-x", "max_tokens": 16, "messages": HI}
    with trio.fail_after(30):
        handle: BridgeHandle = await start_bridge(keep_calls=True)
        for path, body in (
            ("/chat/completions", chat),
            ("/responses", responses),
            ("/v1/messages", messages),
        ):
            for stream in (False, True):
                reply = await client.post(
                    handle.rollout_url("m") + path, json={**body, "stream": stream}, headers=AUTH
                )
                assert reply.status_code == 200, reply.text
    records = handle.calls.pop("m")
    assert [(c["api"], c["stream"]) for c in records] == [
        (api, stream)
        for api in ("chat.completions", "responses", "messages")
        for stream in (False, True)
    ]
    assert {c["model"] for c in records} == {"test-model"}


def test_a_provider_answer_keeps_its_status_and_no_answer_has_none() -> None:
    """A 502 the provider answered is its own status (``upstream_status``, kind
    ``BadGatewayError``); a connection that failed answered nothing."""
    from bridge.calls import CallTrace
    from bridge.errors import UpstreamError
    from bridge.retry import status_fault

    answered = CallTrace("r", api="chat.completions", model="m", stream=False)
    record = answered.finish(None, status_fault(502, "bad gateway", None))
    assert (record["status"], record["upstream_status"], record["error"]) == (
        502,
        502,
        "BadGatewayError",
    )
    unreachable = CallTrace("r", api="chat.completions", model="m", stream=False)
    error = UpstreamError(502, "could not reach the provider", kind="APIConnectionError")
    record = unreachable.finish(None, error)
    assert record["status"] == 502 and "upstream_status" not in record
    assert record["error"] == "APIConnectionError"


def test_what_is_unknown_is_left_out_of_a_record() -> None:
    """docs/calls.md: no usage reported, no token counts (not zeros); no first byte, no
    ``ttfb_ms`` (not null)."""
    from bridge.calls import CallTrace
    from bridge.retry import status_fault
    from bridge.usage import CallUsage

    silent = CallTrace("r", api="chat.completions", model="m", stream=True)
    silent.chunk({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]})
    record = silent.finish(CallUsage.from_json(None))
    assert record["status"] == 200 and "ttfb_ms" in record
    assert not {"prompt_tokens", "completion_tokens", "total_tokens"} & set(record)
    zero = CallTrace("r", api="chat.completions", model="m", stream=False)
    zero.answered({"choices": []})
    reported = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    record = zero.finish(CallUsage.from_json(reported))
    assert {k: record[k] for k in reported} == reported  # a reported zero is a count
    failed = CallTrace("r", api="chat.completions", model="m", stream=False)
    record = failed.finish(None, status_fault(500, "boom", None))
    assert "ttfb_ms" not in record and "prompt_tokens" not in record
    assert record["duration_ms"] >= 0


async def test_a_failed_answer_keeps_the_providers_request_id(
    start_bridge: StartBridge, provider_env: FakeUpstream, client: httpx.AsyncClient
) -> None:
    """What a provider's support asks for when no answer came: its ``x-request-id``, on the
    record of a call it refused and on each retried fault, streamed or not."""
    provider_env.retry_after = "0"
    with trio.fail_after(30):
        handle: BridgeHandle = await start_bridge(keep_calls=True)
        statuses = []
        for stream in (False, True):
            provider_env.fail_statuses.extend([500, 400])
            reply = await client.post(
                url(handle, "q"), json={"messages": HI, "stream": stream}, headers=AUTH
            )
            statuses.append(reply.status_code if not stream else "error" in reply.text)
    assert statuses == [400, True]
    plain, streamed = handle.calls.pop("q")
    assert plain["retries"] == [
        {"status": 500, "kind": "InternalServerError", "request_id": "req_fail_1"}
    ]
    assert (plain["status"], plain["request_id"]) == (400, "req_fail_2")
    assert streamed["retries"][0]["request_id"] == "req_fail_3"
    assert streamed["request_id"] == "req_fail_4"
