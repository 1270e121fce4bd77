"""HTTP/2 to the provider on the direct path (bridge.upstreams.h2pool): a real bridge on port 0
in front of the lean fake provider's h2c side (tests.fakes.lean_h2), in its own process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeHandle
from bridge.retry import RetryPolicy
from bridge.upstreams.direct import h2c_refused
from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.fakes.lean_upstream import LeanUpstream, run_lean_upstream

pytest.importorskip("h2", reason="HTTP/2 needs the h2 package")


async def _provider(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, h2_streams: int
) -> LeanUpstream:
    with trio.fail_after(60):
        lean: LeanUpstream = await nursery.start(partial(run_lean_upstream, h2_streams=h2_streams))
    monkeypatch.setenv("OPENAI_BASE_URL", lean.v1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    return lean


@pytest.fixture
async def h2c(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> LeanUpstream:
    """The lean fake provider, 20 streams per HTTP/2 connection."""
    return await _provider(nursery, monkeypatch, 20)


@pytest.fixture
async def h2_bridge(start_bridge: StartBridge, h2c: LeanUpstream) -> BridgeHandle:
    return await start_bridge(upstream_http2=True)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        timeout=60, limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)
    ) as c:
        yield c


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


async def test_non_streamed_call_over_h2c(
    h2_bridge: BridgeHandle, h2c: LeanUpstream, client: httpx.AsyncClient
) -> None:
    with trio.fail_after(30):
        reply = await client.post(url(h2_bridge), json=_chat("hello there"), headers=AUTH)
        counters = await h2c.counters()
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["choices"][0]["message"]["content"] == "echo: hello there"
    assert body["usage"]["completion_tokens"] == 3
    assert counters["h2_connections"] == 1
    assert counters["connections"] == 2  # the h2 one, and the counters' own HTTP/1.1 one


async def test_streamed_call_over_h2c(
    h2_bridge: BridgeHandle, h2c: LeanUpstream, client: httpx.AsyncClient
) -> None:
    body = _chat("one two three", stream=True, stream_options={"include_usage": True})
    words: list[str] = []
    usage: dict[str, Any] | None = None
    with trio.fail_after(30):
        async with client.stream("POST", url(h2_bridge), json=body, headers=AUTH) as reply:
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                for choice in chunk.get("choices", []):
                    words.append(choice["delta"].get("content") or "")
                usage = chunk.get("usage") or usage
        counters = await h2c.counters()
    assert "".join(words).strip() == "echo: one two three"
    assert usage is not None and usage["completion_tokens"] == 4
    # httpx's, and the lean client's that found first that the provider speaks h2c.
    assert counters["h2_connections"] == 2


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/responses", {"model": "gpt-test", "input": "hi there"}),
        (
            "/v1/messages",
            {
                "model": "claude-test",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi there"}],
            },
        ),
    ],
)
async def test_responses_and_messages_routes_take_the_same_path(
    h2_bridge: BridgeHandle,
    h2c: LeanUpstream,
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
) -> None:
    with trio.fail_after(30):
        reply = await client.post(h2_bridge.rollout_url("r") + path, json=body, headers=AUTH)
        counters = await h2c.counters()
    assert reply.status_code == 200, reply.text
    assert "echo: hi there" in reply.text
    assert counters["h2_connections"] == 1
    assert counters["completed"] == 1


async def test_many_concurrent_calls_share_few_connections(
    h2_bridge: BridgeHandle, h2c: LeanUpstream, client: httpx.AsyncClient
) -> None:
    calls, streams = 120, 20  # the fake advertises 20 streams per connection
    with trio.fail_after(30):  # one call first: its answer tells the bridge the server's limit
        first = await client.post(url(h2_bridge), json=_chat("first"), headers=AUTH)
    assert first.status_code == 200
    await h2c.set_delay(5)  # long enough for all the calls to be held at once, even under load
    answers: list[int] = []

    async def one(i: int) -> None:
        reply = await client.post(url(h2_bridge, f"r{i}"), json=_chat(f"n{i}"), headers=AUTH)
        answers.append(reply.status_code)

    with trio.fail_after(60):
        async with trio.open_nursery() as calls_nursery:
            for i in range(calls):
                calls_nursery.start_soon(one, i)
        counters = await h2c.counters()
    assert answers == [200] * calls
    assert counters["completed"] == calls + 1
    # No call waited for a stream: all were held by the provider at once, over one connection
    # per 20 calls (the provider drops a connection that opens more streams than it allows).
    assert counters["in_flight_peak"] == calls
    assert counters["h2_connections"] == calls // streams


async def test_a_provider_closing_connections_gracefully_loses_no_call(
    start_bridge: StartBridge,
    nursery: trio.Nursery,
    monkeypatch: pytest.MonkeyPatch,
    client: httpx.AsyncClient,
) -> None:
    # GOAWAY after 10 requests per connection (20 streams each) (hypercorn and nginx: after 1,000), with calls
    # in flight on it: those it kept are answered on it, the others go out again elsewhere.
    # Retries are off: no call may fail and be retried by the bridge's retry policy instead.
    with trio.fail_after(60):
        lean: LeanUpstream = await nursery.start(
            partial(run_lean_upstream, h2_streams=20, h2_goaway_after=10)
        )
    monkeypatch.setenv("OPENAI_BASE_URL", lean.v1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    handle = await start_bridge(upstream_http2=True, retry=RetryPolicy(max_attempts=1))
    await lean.set_delay(0.5)
    calls = 100
    answers: list[int] = []

    async def one(i: int) -> None:
        reply = await client.post(url(handle, f"r{i}"), json=_chat(f"n{i}"), headers=AUTH)
        answers.append(reply.status_code)

    with trio.fail_after(60):
        async with trio.open_nursery() as calls_nursery:
            for i in range(calls):
                calls_nursery.start_soon(one, i)
        counters = await lean.counters()
    assert answers == [200] * calls
    assert counters["completed"] == calls
    assert counters["h2_connections"] >= calls // 10


async def _stream_text(client: httpx.AsyncClient, handle: BridgeHandle, text: str) -> str:
    body = _chat(text, stream=True, stream_options={"include_usage": True})
    words: list[str] = []
    async with client.stream("POST", url(handle), json=body, headers=AUTH) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            assert "error" not in chunk, chunk
            for choice in chunk.get("choices", []):
                words.append(choice["delta"].get("content") or "")
    return "".join(words).strip()


@pytest.fixture
async def http1_only(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> LeanUpstream:
    """The lean fake refusing HTTP/2 (a 400 to the preface), as an HTTP/1.1-only server does."""
    return await _provider(nursery, monkeypatch, 0)


async def _fallback_bridge(start_bridge: StartBridge, logs: list[tuple[str, str]]) -> BridgeHandle:
    # Retries off: the call that finds the provider speaks only HTTP/1.1 must succeed by
    # itself, not by the bridge's retry policy sending it again.
    return await start_bridge(
        upstream_http2=True,
        retry=RetryPolicy(max_attempts=1),
        log=lambda level, message: logs.append((level, message)),
    )


def _h2c_notices(logs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(level, line) for level, line in logs if "does not speak HTTP/2" in line]


async def test_http1_only_provider_gets_non_streamed_calls_over_http1(
    start_bridge: StartBridge, http1_only: LeanUpstream, client: httpx.AsyncClient
) -> None:
    logs: list[tuple[str, str]] = []
    handle = await _fallback_bridge(start_bridge, logs)
    with trio.fail_after(30):
        first = await client.post(url(handle), json=_chat("first"), headers=AUTH)
        after_first = await http1_only.counters()
        answers: list[httpx.Response] = []

        async def one(i: int) -> None:
            reply = await client.post(url(handle, f"r{i}"), json=_chat(f"n{i}"), headers=AUTH)
            answers.append(reply)

        async with trio.open_nursery() as calls:
            for i in range(5):
                calls.start_soon(one, i)
        streamed = await _stream_text(client, handle, "and streamed")
        counters = await http1_only.counters()
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["message"]["content"] == "echo: first"
    assert sorted(reply.status_code for reply in answers) == [200] * 5
    assert streamed == "echo: and streamed"
    # One connection opened with the HTTP/2 preface (the first call's), then HTTP/1.1 only.
    assert after_first["h2_refused"] == 1
    assert counters["h2_refused"] == 1
    assert counters["h2_connections"] == 0
    assert counters["completed"] == 7
    notices = _h2c_notices(logs)
    assert len(notices) == 1, logs
    level, line = notices[0]
    assert level == "warning"
    assert http1_only.base_url in line and "HTTP/1.1" in line


async def test_http1_only_provider_gets_streamed_calls_over_http1(
    start_bridge: StartBridge, http1_only: LeanUpstream, client: httpx.AsyncClient
) -> None:
    logs: list[tuple[str, str]] = []
    handle = await _fallback_bridge(start_bridge, logs)
    with trio.fail_after(30):
        first = await _stream_text(client, handle, "one two three")
        after_first = await http1_only.counters()
        second = await _stream_text(client, handle, "four five")
        plain = await client.post(url(handle), json=_chat("plain"), headers=AUTH)
        counters = await http1_only.counters()
    assert first == "echo: one two three"
    assert second == "echo: four five"
    assert plain.status_code == 200, plain.text
    assert after_first["h2_refused"] == 1
    assert counters["h2_refused"] == 1
    assert counters["h2_connections"] == 0
    assert counters["completed"] == 3
    assert len(_h2c_notices(logs)) == 1, logs


async def test_a_run_asks_whether_the_provider_speaks_h2c(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before it budgets descriptors for HTTP/2 (launcher.services), on a connection of its own."""
    speaks = await _provider(nursery, monkeypatch, 20)
    with trio.fail_after(30):
        assert await h2c_refused("openai/test-model") is None
        refuses = await _provider(nursery, monkeypatch, 0)
        assert await h2c_refused("openai/test-model") == refuses.base_url
        assert await h2c_refused("rollbridge/echo") is None  # not the direct path
        monkeypatch.setenv("OPENAI_BASE_URL", "https://127.0.0.1:1/v1")
        assert await h2c_refused("openai/test-model") is None  # ALPN decides over https
        counters = await speaks.counters(), await refuses.counters()
    assert counters[0]["h2_connections"] == 1
    assert counters[1]["h2_refused"] == 1


async def test_off_by_default_keeps_http1(
    start_bridge: StartBridge, h2c: LeanUpstream, client: httpx.AsyncClient
) -> None:
    handle = await start_bridge()
    with trio.fail_after(30):
        reply = await client.post(url(handle), json={"model": "m", "messages": HI}, headers=AUTH)
        counters = await h2c.counters()
    assert reply.status_code == 200
    assert counters["h2_connections"] == 0


async def test_the_setting_crosses_to_the_bridges_own_process(
    nursery: trio.Nursery, h2c: LeanUpstream, client: httpx.AsyncClient
) -> None:
    from bridge.process import BridgeProcessHandle, run_bridge_process
    from bridge.server import BridgeConfig
    from tests.bridge.conftest import TOKEN

    config = BridgeConfig(model="openai/test-model", token=TOKEN, upstream_http2=True)
    with trio.fail_after(60):
        handle: BridgeProcessHandle = await nursery.start(
            partial(run_bridge_process, config, redact_values=(TOKEN,))
        )
        chat = handle.rollout_url("r1") + "/chat/completions"
        reply = await client.post(chat, json=_chat("over there"), headers=AUTH)
        counters = await h2c.counters()
    assert reply.status_code == 200, reply.text
    assert counters["h2_connections"] == 1


async def test_a_rollout_that_goes_away_resets_its_stream(
    h2_bridge: BridgeHandle, h2c: LeanUpstream, client: httpx.AsyncClient
) -> None:
    await h2c.set_delay(30)
    with trio.fail_after(30):
        with trio.move_on_after(1):  # the rollout gives up while the provider works
            await client.post(url(h2_bridge), json=_chat("never mind"), headers=AUTH)
        # The bridge cancels the call: RST_STREAM, and the provider stops holding it.
        counters = await h2c.counters()
        while counters["in_flight"]:
            await trio.sleep(0.05)
            counters = await h2c.counters()
        await h2c.set_delay(0)
        reply = await client.post(url(h2_bridge), json=_chat("after"), headers=AUTH)
        counters = await h2c.counters()
    assert reply.status_code == 200  # the connection carries on
    assert counters["in_flight_peak"] == 1
    assert counters["completed"] == 1
    assert counters["h2_connections"] == 1
