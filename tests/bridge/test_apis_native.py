"""Native pass-through: Responses to an OpenAI-style ``/responses``, Messages to an Anthropic-style
``/v1/messages`` (tests/fakes/api_upstream.py), with faults retried or reported in the caller's
shape, provider usage normalized into the ledger, and the run's bearer never sent upstream."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeHandle
from bridge.apis import ApiOptions
from bridge.retry import RetryPolicy
from tests.bridge.conftest import AUTH, TOKEN, StartBridge
from tests.bridge.test_apis_http import MSG, RESP, events
from tests.fakes.api_upstream import ApiUpstream, run_api_upstream

OPENAI_KEY = "sk-provider-key-for-tests-000000"
ANTHROPIC_KEY = "sk-ant-provider-key-000000000000"
FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)


@pytest.fixture
async def fake(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> ApiUpstream:
    upstream: ApiUpstream = await nursery.start(run_api_upstream, ApiUpstream())
    monkeypatch.setenv("OPENAI_BASE_URL", upstream.v1)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_BASE", upstream.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    return upstream


@pytest.fixture
async def openai_native(start_bridge: StartBridge, fake: ApiUpstream) -> BridgeHandle:
    return await start_bridge(
        model="openai/gpt-native",
        retry=FAST,
        apis=ApiOptions(responses="native"),
        keep_calls=True,
    )


@pytest.fixture
async def anthropic_native(start_bridge: StartBridge, fake: ApiUpstream) -> BridgeHandle:
    return await start_bridge(model="anthropic/claude-native", retry=FAST, keep_calls=True)


async def test_responses_pass_through(
    openai_native: BridgeHandle, fake: ApiUpstream, client: httpx.AsyncClient
) -> None:
    url = f"{openai_native.rollout_url('n')}/responses"
    body = {**RESP, "reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"]}
    with trio.fail_after(20):
        plain = await client.post(url, json=body, headers={**AUTH, "OpenAI-Project": "p"})
        streamed = await client.post(url, json={**body, "stream": True}, headers=AUTH)
    assert plain.status_code == 200
    doc = plain.json()
    assert (
        doc["model"] == "gpt-test" and doc["usage"]["input_tokens_details"]["cached_tokens"] == 40
    )
    got = events(streamed.text)
    assert got[0][1]["response"]["model"] == got[-1][1]["response"]["model"] == "gpt-test"
    assert got[-1][0] == "response.completed"
    for request in fake.requests:
        assert request.path == "/v1/responses"
        # The bridge's fields: the configured model, never stored; the client's other fields as sent.
        assert request.body["model"] == "gpt-native" and request.body["store"] is False
        assert request.body["reasoning"] == {"effort": "low"}
        assert request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
        assert "openai-project" not in request.headers
        assert TOKEN not in json.dumps(request.headers)
    usage = openai_native.ledger.get("n")
    assert usage is not None
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (2, 200, 14)
    assert (usage.cached_tokens, usage.reasoning_tokens, usage.total_tokens) == (80, 4, 214)


async def test_messages_pass_through(
    anthropic_native: BridgeHandle, fake: ApiUpstream, client: httpx.AsyncClient
) -> None:
    url = f"{anthropic_native.rollout_url('a')}/v1/messages"
    headers = {
        "x-api-key": TOKEN,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "b1,b2",
        "x-claude-code-session-id": "s",
    }
    with trio.fail_after(20):
        plain = await client.post(url, json=MSG, headers=headers)
        streamed = await client.post(url, json={**MSG, "stream": True}, headers=headers)
        counted = await client.post(f"{url}/count_tokens", json=MSG, headers=headers)
    assert plain.status_code == 200 and plain.json()["model"] == "claude-test"
    # The provider's usage reaches the client unchanged (Claude Code reads the cache fields).
    assert plain.json()["usage"]["cache_read_input_tokens"] == 60
    got = events(streamed.text)
    assert [k for k, _ in got][:2] == ["message_start", "ping"]
    assert got[0][1]["message"]["model"] == "claude-test" and got[-1][0] == "message_stop"
    assert counted.json() == {"input_tokens": 42}
    for request in fake.requests:
        assert request.body["model"] == "claude-native"
        assert request.headers["x-api-key"] == ANTHROPIC_KEY
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert request.headers["anthropic-beta"] == "b1,b2"
        assert "authorization" not in request.headers
        assert "x-claude-code-session-id" not in request.headers
    # Anthropic's input_tokens excludes the cache: 10 + 60 + 30 = 100 prompt tokens a call; the
    # streamed call's output is the final running total (5), not 1 + 5; count_tokens adds nothing.
    usage = anthropic_native.ledger.get("a")
    assert usage is not None
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (2, 200, 10)
    assert (usage.cached_tokens, usage.cache_write_tokens, usage.max_context_tokens) == (
        120,
        60,
        105,
    )


@pytest.mark.parametrize("fault", ["429", "529", "500", "reset"])
async def test_transient_faults_are_retried(
    anthropic_native: BridgeHandle, fake: ApiUpstream, client: httpx.AsyncClient, fault: str
) -> None:
    for stream in (False, True):
        fake.faults.extend([fault, fault])
        with trio.fail_after(20):
            answer = await client.post(
                f"{anthropic_native.rollout_url('t')}/v1/messages",
                json={**MSG, "stream": stream},
                headers=AUTH,
            )
        assert answer.status_code == 200, answer.text
    usage = anthropic_native.ledger.get("t")
    assert usage is not None and (usage.calls, usage.retries) == (2, 4)


async def test_exhausted_retries_are_answered_in_the_callers_shape(
    anthropic_native: BridgeHandle,
    openai_native: BridgeHandle,
    fake: ApiUpstream,
    client: httpx.AsyncClient,
) -> None:
    fake.faults.extend(["529"] * 3)
    with trio.fail_after(20):
        m = await client.post(
            f"{anthropic_native.rollout_url('e')}/v1/messages",
            json={**MSG, "stream": True},
            headers=AUTH,
        )
    # The provider's own error type survives (the status is the bridge's 502 for any 5xx).
    assert m.status_code == 502 and m.json()["error"]["type"] == "overloaded_error"
    fake.faults.extend(["429"] * 3)
    with trio.fail_after(20):
        r = await client.post(
            f"{openai_native.rollout_url('e')}/responses", json=RESP, headers=AUTH
        )
    assert r.status_code == 429 and r.json()["error"]["code"] == 429


async def test_an_error_mid_stream_reaches_the_client_in_its_shape(
    anthropic_native: BridgeHandle,
    openai_native: BridgeHandle,
    fake: ApiUpstream,
    client: httpx.AsyncClient,
) -> None:
    fake.faults.append("midstream")
    with trio.fail_after(20):
        m = await client.post(
            f"{anthropic_native.rollout_url('x')}/v1/messages",
            json={**MSG, "stream": True},
            headers=AUTH,
        )
    got = events(m.text)
    assert got[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    fake.faults.append("midstream")
    with trio.fail_after(20):
        r = await client.post(
            f"{openai_native.rollout_url('x')}/responses",
            json={**RESP, "stream": True},
            headers=AUTH,
        )
    assert events(r.text)[-1][0] == "error"
    # Not retried (it had started), but counted: the provider began answering. Its record is
    # that of a failed call, with the status the provider's error type stands for.
    for handle, upstream, kind in (
        (anthropic_native, 529, "APIError"),
        (openai_native, 500, "InternalServerError"),
    ):
        usage = handle.ledger.get("x")
        assert usage is not None and (usage.calls, usage.retries) == (1, 0)
        (record,) = handle.calls.pop("x")
        assert (record["status"], record["upstream_status"], record["error"]) == (
            502,
            upstream,
            kind,
        )


async def test_a_whole_answer_that_breaks_off_is_not_retried(
    anthropic_native: BridgeHandle,
    openai_native: BridgeHandle,
    fake: ApiUpstream,
    client: httpx.AsyncClient,
) -> None:
    """The provider's 200 arrives, then its body stops short of its Content-Length: the
    provider has billed that call, so it is answered as a failure at once, never made again,
    and its record says the answer broke off (not that the provider was unreachable)."""
    for handle, path, body in (
        (anthropic_native, "/v1/messages", MSG),
        (openai_native, "/responses", RESP),
    ):
        sent = len(fake.requests)
        fake.faults.append("truncated")
        with trio.fail_after(20):
            answer = await client.post(f"{handle.rollout_url('b')}{path}", json=body, headers=AUTH)
        assert answer.status_code == 502, answer.text
        assert "broke off" in answer.text
        assert len(fake.requests) == sent + 1  # one attempt
        (record,) = handle.calls.pop("b")
        assert record["error"] == "APIConnectionError" and "retries" not in record
        assert "upstream_status" not in record


async def test_native_call_records_name_the_answering_model_and_why_it_stopped(
    anthropic_native: BridgeHandle,
    openai_native: BridgeHandle,
    client: httpx.AsyncClient,
) -> None:
    """The record names the model the provider says answered (its snapshot), not the client's
    name the answer is rewritten to, streamed or not, with the stop reason of each API."""
    for handle, path, body, model, reason in (
        (anthropic_native, "/v1/messages", MSG, "claude-native-20250101", "end_turn"),
        (openai_native, "/responses", RESP, "gpt-native-20250101", "completed"),
    ):
        with trio.fail_after(20):
            for stream in (False, True):
                answer = await client.post(
                    f"{handle.rollout_url('m')}{path}",
                    json={**body, "stream": stream},
                    headers=AUTH,
                )
                assert answer.status_code == 200, answer.text
        records = handle.calls.pop("m")
        assert [(r["stream"], r["model"], r["finish_reason"]) for r in records] == [
            (False, model, reason),
            (True, model, reason),
        ]
        # The provider's id of its answer, what its support asks for.
        ident = "msg_1" if path == "/v1/messages" else "resp_1"
        assert [r["response_id"] for r in records] == [ident, ident]


async def test_a_native_stream_cut_off_before_its_last_event_is_an_error(
    anthropic_native: BridgeHandle,
    openai_native: BridgeHandle,
    fake: ApiUpstream,
    client: httpx.AsyncClient,
) -> None:
    """The provider closes its body cleanly before ``message_stop`` / ``response.completed``:
    the client's stream ends in an error event, not as if the answer were whole."""
    answers = []
    for handle, path, body in (
        (anthropic_native, "/v1/messages", MSG),
        (openai_native, "/responses", RESP),
    ):
        fake.faults.append("cutoff")
        with trio.fail_after(20):
            answer = await client.post(
                f"{handle.rollout_url('x')}{path}", json={**body, "stream": True}, headers=AUTH
            )
        answers.append(events(answer.text))
    messages, responses = answers
    assert [kind for kind, _ in messages][-1] == "error"
    assert "message_stop" not in [kind for kind, _ in messages]
    assert "message_stop" in json.dumps(messages[-1][1])
    assert [kind for kind, _ in responses][-1] in ("error", "response.failed")
    assert "response.completed" not in [kind for kind, _ in responses]


async def test_a_streamed_call_answered_with_a_page_says_what_came(
    openai_native: BridgeHandle, fake: ApiUpstream, client: httpx.AsyncClient
) -> None:
    fake.faults.append("html")
    with trio.fail_after(20):
        answer = await client.post(
            f"{openai_native.rollout_url('h')}/responses",
            json={**RESP, "stream": True},
            headers=AUTH,
        )
    # Before any event: the failure is the answer's status (502) in the caller's shape.
    assert answer.status_code == 502
    assert answer.json()["error"]["message"] == (
        "the provider answered a streamed call with text/html, not an event stream: "
        "<html><body>Gateway says hi</body></html>"
    )


async def test_native_refusals_happen_before_anything_is_sent(
    anthropic_native: BridgeHandle, fake: ApiUpstream, client: httpx.AsyncClient
) -> None:
    body: dict[str, Any] = {**MSG, "container": "c"}
    with trio.fail_after(20):
        answer = await client.post(
            f"{anthropic_native.rollout_url('r')}/v1/messages", json=body, headers=AUTH
        )
    assert answer.status_code == 400 and "container" in answer.json()["error"]["message"]
    assert fake.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_encrypted_reasoning_is_replayed_per_rollout(
    openai_native: BridgeHandle, fake: ApiUpstream, client: httpx.AsyncClient, stream: bool
) -> None:
    """Stateless Responses: the bridge asks for the reasoning's encrypted content and fills it
    into a reasoning item the client replays by id alone (on the same rollout only)."""
    url = f"{openai_native.rollout_url('rs')}/responses"
    first = {**RESP, "reasoning": {"effort": "low"}, "stream": stream}
    replay = {
        "model": "gpt-test",
        "reasoning": {"effort": "low"},
        "input": [
            {"role": "user", "content": "hi there"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "user", "content": "again"},
        ],
    }
    other = f"{openai_native.rollout_url('other')}/responses"
    with trio.fail_after(20):
        assert (await client.post(url, json=first, headers=AUTH)).status_code == 200
        assert (await client.post(url, json=replay, headers=AUTH)).status_code == 200
        assert (await client.post(other, json=replay, headers=AUTH)).status_code == 200
    asked, replayed, elsewhere = (r.body for r in fake.requests)
    assert asked["include"] == ["reasoning.encrypted_content"]
    assert replayed["input"][1] == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "ENC-1",
    }
    assert "encrypted_content" not in elsewhere["input"][1]
    openai_native.ledger.discard("rs")
    with trio.fail_after(20):
        await client.post(url, json=replay, headers=AUTH)
    assert "encrypted_content" not in fake.requests[-1].body["input"][1]


async def test_a_provider_error_quoting_the_key_is_redacted_in_the_callers_shape(
    anthropic_native: BridgeHandle,
    openai_native: BridgeHandle,
    fake: ApiUpstream,
    client: httpx.AsyncClient,
) -> None:
    fake.faults.extend(["echo_key", "echo_key"])
    with trio.fail_after(20):
        m = await client.post(
            f"{anthropic_native.rollout_url('k')}/v1/messages", json=MSG, headers=AUTH
        )
        r = await client.post(
            f"{openai_native.rollout_url('k')}/responses",
            json={**RESP, "stream": True},
            headers=AUTH,
        )
    assert m.status_code == r.status_code == 400
    assert m.json()["type"] == "error" and "REDACTED" in m.json()["error"]["message"]
    assert "REDACTED" in r.json()["error"]["message"]
    for answer in (m, r):
        assert ANTHROPIC_KEY not in answer.text and OPENAI_KEY not in answer.text
        assert TOKEN not in answer.text
    # The provider's own error is unwrapped: its words and (on Messages) its type.
    assert m.json()["error"]["type"] == "invalid_request_error"
    assert m.json()["error"]["message"].startswith("bad request for key ")


async def test_codex_compaction_is_native_only(
    openai_native: BridgeHandle,
    fake: ApiUpstream,
    echo_bridge: BridgeHandle,
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "gpt-test", "input": [{"role": "user", "content": "long history"}]}
    with trio.fail_after(20):
        native = await client.post(
            f"{openai_native.rollout_url('c')}/responses/compact", json=body, headers=AUTH
        )
        translated = await client.post(
            f"{echo_bridge.rollout_url('c')}/responses/compact", json=body, headers=AUTH
        )
    assert native.status_code == 200 and fake.requests[-1].path == "/v1/responses/compact"
    assert fake.requests[-1].body == {**body, "model": "gpt-native"}
    assert native.json()["output"][0]["type"] == "compaction"
    usage = openai_native.ledger.get("c")
    assert usage is not None and usage.calls == 1  # counted as a call
    assert translated.status_code == 400 and "compact" in translated.json()["error"]["message"]


@pytest.fixture
async def echo_bridge(start_bridge: StartBridge) -> BridgeHandle:
    return await start_bridge(model="rollbridge/echo")


async def test_chat_callers_of_a_responses_only_model_are_served_through_responses(
    start_bridge: StartBridge, fake: ApiUpstream, client: httpx.AsyncClient
) -> None:
    """``o1-pro`` is served only by /responses (LiteLLM's model map says so): the chat route
    carries its calls there and back, streamed or not, with the usage in the ledger."""
    handle = await start_bridge(model="openai/o1-pro", retry=FAST)
    chat = {
        "model": "osmosis-rollout",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi there"},
        ],
        "max_tokens": 50,
    }
    url = f"{handle.rollout_url('ro')}/chat/completions"
    with trio.fail_after(20):
        plain = await client.post(url, json=chat, headers=AUTH)
        streamed = await client.post(url, json={**chat, "stream": True}, headers=AUTH)
        refused = await client.post(url, json={**chat, "stop": ["x"]}, headers=AUTH)
    assert plain.status_code == 200, plain.text
    doc = plain.json()
    assert doc["choices"][0]["message"]["content"].startswith("native: ")
    assert doc["model"] == "osmosis-rollout" and doc["usage"]["total_tokens"] == 107
    chunks = [d for _, d in events(streamed.text)]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
    assert text == doc["choices"][0]["message"]["content"]
    assert refused.status_code == 400 and "'stop'" in refused.json()["error"]["message"]
    for request in fake.requests:
        assert request.path == "/v1/responses"
        assert request.body["store"] is False and request.body["instructions"] == "be brief"
        assert request.body["max_output_tokens"] == 50 and request.body["model"] == "o1-pro"
    usage = handle.ledger.get("ro")
    assert usage is not None and (usage.calls, usage.total_tokens, usage.cached_tokens) == (
        2,
        214,
        80,
    )


async def test_native_failures_keep_the_providers_request_id(
    anthropic_native: BridgeHandle, fake: ApiUpstream, client: httpx.AsyncClient
) -> None:
    """Anthropic names each request in ``request-id``: a retried 529, and the provider's own
    error event in the middle of a stream (relayed as is, nothing raised), keep it."""
    url = f"{anthropic_native.rollout_url('rid')}/v1/messages"
    with trio.fail_after(20):
        fake.faults.append("529")
        first = await client.post(url, json=MSG, headers=AUTH)
        fake.faults.append("midstream")
        second = await client.post(url, json={**MSG, "stream": True}, headers=AUTH)
    assert first.status_code == 200 and "event: error" in second.text
    retried, failed = anthropic_native.calls.pop("rid")
    assert retried["status"] == 200 and "request_id" not in retried
    assert [r["request_id"].startswith("req_") for r in retried["retries"]] == [True]
    assert failed["error"] and failed["request_id"].startswith("req_")
    assert failed["request_id"] != retried["retries"][0]["request_id"]
