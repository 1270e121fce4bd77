"""The bridge's retries of transient provider faults: the policy in virtual time, the handler's
accounting, and the HTTP path against the real fake upstream with injected 500s, 429s and
connection resets."""

from __future__ import annotations

import email.utils
import random
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from bridge import BridgeHandle
from bridge.errors import UpstreamError
from bridge.handler import Bridge
from bridge.policy import PreparedRequest
from bridge.retry import (
    ProviderFault,
    RetryPolicy,
    parse_retry_after,
    retrying,
    retrying_stream,
    status_fault,
)
from bridge.upstreams.litellm import to_upstream_error
from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.fakes.upstream import FakeUpstream, run_fake_upstream

NOW = 1_700_000_000.0


# -- Retry-After and which faults are transient ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("3", 3.0),
        (" 0 ", 0.0),
        ("1.5", 1.5),
        ("-4", 0.0),
        (email.utils.formatdate(NOW + 7, usegmt=True), 7.0),
        (email.utils.formatdate(NOW - 30, usegmt=True), 0.0),
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
    ],
)
def test_retry_after_seconds_and_http_dates(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_transient_statuses_are_faults(status: int) -> None:
    fault = status_fault(status, "busy", {"retry-after": "2"})
    assert isinstance(fault, ProviderFault) and fault.retry_after == 2.0
    assert fault.status == status


def test_a_429_for_an_account_out_of_credit_is_final() -> None:
    quota = '{"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}}'
    assert not isinstance(status_fault(429, quota, {"retry-after": "1"}), ProviderFault)
    assert isinstance(
        status_fault(429, '{"error": {"code": "rate_limit_exceeded"}}', None, retry_after="1"),
        ProviderFault,
    )


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 409, 413, 422, 501])
def test_other_statuses_are_final(status: int) -> None:
    assert not isinstance(status_fault(status, "no", {"retry-after": "1"}), ProviderFault)


def test_litellm_errors_keep_retry_after() -> None:
    class RateLimitError(Exception):
        status_code = 429
        message = "slow down"
        litellm_response_headers = httpx.Headers({"Retry-After": "4", "X-Request-Id": "req_9"})

    class AuthenticationError(Exception):
        status_code = 401
        message = "bad key"

    limited = to_upstream_error(RateLimitError())
    assert isinstance(limited, ProviderFault) and limited.retry_after == 4.0
    assert limited.kind == "RateLimitError"
    assert limited.request_id == "req_9"
    assert not isinstance(to_upstream_error(AuthenticationError()), ProviderFault)


def test_backoff_grows_with_jitter_and_respects_retry_after() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=8.0, rng=random.Random(1))
    plain = ProviderFault(500, "x")
    for retry, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (6, 8.0)]:
        for _ in range(50):
            assert ceiling / 2 <= policy.delay(retry, plain) <= ceiling
    assert policy.delay(1, ProviderFault(429, "x", retry_after=5.0)) == 5.0


# -- the loop, in virtual time --------------------------------------------------------------------


class Script:
    """Raises the queued exceptions in turn, then answers."""

    def __init__(self, *faults: Exception) -> None:
        self.faults = deque(faults)
        self.calls: list[float] = []

    async def __call__(self) -> str:
        self.calls.append(trio.current_time())
        if self.faults:
            raise self.faults.popleft()
        return "answer"


def _seen() -> tuple[list[tuple[int, bool]], Callable[[ProviderFault, bool], None]]:
    seen: list[tuple[int, bool]] = []
    return seen, lambda fault, again: seen.append((fault.status, again))


async def test_transient_faults_are_retried_until_an_answer(autojump_clock: Any) -> None:
    script = Script(ProviderFault(500, "a"), ProviderFault(429, "b", retry_after=3.0))
    seen, on_fault = _seen()
    policy = RetryPolicy(base_delay=1.0, rng=random.Random(0))
    assert await retrying(script, policy, on_fault) == "answer"
    assert seen == [(500, True), (429, True)]
    first_wait = script.calls[1] - script.calls[0]
    assert 0.5 <= first_wait <= 1.0
    assert script.calls[2] - script.calls[1] >= 3.0  # Retry-After is a floor


async def test_a_final_error_is_never_retried(autojump_clock: Any) -> None:
    script = Script(UpstreamError(400, "bad parameter"))
    seen, on_fault = _seen()
    with pytest.raises(UpstreamError, match="bad parameter"):
        await retrying(script, RetryPolicy(), on_fault)
    assert len(script.calls) == 1 and seen == []


async def test_attempts_are_bounded(autojump_clock: Any) -> None:
    script = Script(*[ProviderFault(503, "down") for _ in range(10)])
    seen, on_fault = _seen()
    with pytest.raises(ProviderFault):
        await retrying(script, RetryPolicy(max_attempts=3), on_fault)
    assert len(script.calls) == 3
    assert seen == [(503, True), (503, True), (503, False)]


async def test_no_wait_runs_past_the_budget(autojump_clock: Any) -> None:
    # The provider asks for 120 s; the call has 60 s: answer the 429 now, do not sleep first.
    script = Script(ProviderFault(429, "later", retry_after=120.0))
    seen, on_fault = _seen()
    start = trio.current_time()
    with pytest.raises(ProviderFault):
        await retrying(script, RetryPolicy(budget=60.0), on_fault)
    assert trio.current_time() == start and seen == [(429, False)]


async def test_cancelling_stops_the_wait(autojump_clock: Any) -> None:
    script = Script(ProviderFault(429, "later", retry_after=30.0))
    with trio.move_on_after(5.0) as scope:
        await retrying(script, RetryPolicy(), lambda fault, again: None)
    assert scope.cancelled_caught and len(script.calls) == 1


def _stream_of(*events: Any) -> Callable[[], AsyncGenerator[str, None]]:
    """Each open plays the next script: a list of items, ending with an exception or not."""
    scripts = deque(events)

    async def stream() -> AsyncGenerator[str, None]:
        for event in scripts.popleft():
            if isinstance(event, Exception):
                raise event
            yield event

    return stream


async def test_a_stream_is_reopened_only_before_its_first_item(autojump_clock: Any) -> None:
    seen, on_fault = _seen()
    opened = _stream_of([ProviderFault(502, "reset")], ["a", "b"])
    assert [x async for x in retrying_stream(opened, RetryPolicy(), on_fault)] == ["a", "b"]
    assert seen == [(502, True)]
    seen.clear()
    broken = _stream_of(["a", ProviderFault(502, "reset")], ["never"])
    got: list[str] = []
    with pytest.raises(ProviderFault):
        async for item in retrying_stream(broken, RetryPolicy(), on_fault):
            got.append(item)
    assert got == ["a"] and seen == []


# -- the handler's accounting -----------------------------------------------------------------------


class FlakyUpstream:
    """An in-memory upstream failing with the queued faults first."""

    model = "openai/flaky"

    def __init__(self, *faults: Exception) -> None:
        self.faults = deque(faults)
        self.calls: list[PreparedRequest] = []

    def secrets(self) -> list[str]:
        return []

    async def complete(
        self, prepared: PreparedRequest, record: Callable[[Any], None]
    ) -> dict[str, Any]:
        self.calls.append(prepared)
        if self.faults:
            raise self.faults.popleft()
        usage = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
        record(usage)
        return {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": usage,
        }

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError
        yield {}


async def test_retries_are_counted_per_rollout(autojump_clock: Any) -> None:
    upstream = FlakyUpstream(ProviderFault(429, "slow down"), ProviderFault(500, "oops"))
    async with trio.open_nursery() as nursery:
        bridge = Bridge(upstream, token="tok", nursery=nursery, retry=RetryPolicy())
        body = {"messages": HI, "temperature": 0.2, "seed": 7}
        out = await bridge.complete("r1", body)
        assert out["choices"][0]["message"]["content"] == "ok"
        await bridge.complete("r2", body)
    usage = bridge.ledger.pop("r1")
    assert usage is not None and usage.retries == 2 and usage.to_json()["retries"] == 2
    plain = bridge.ledger.pop("r2")
    assert plain is not None and plain.retries == 0 and "retries" not in plain.to_json()
    assert bridge.ledger.pressure().rate_limited == 1
    assert bridge.ledger.pressure().answered == 2
    # Every attempt sent the same parameters: nothing is stripped to make a retry pass.
    assert len({repr(call.params) for call in upstream.calls}) == 1
    assert upstream.calls[0].params == {"temperature": 0.2, "seed": 7}


async def test_a_rollout_whose_calls_all_failed_keeps_its_retries(autojump_clock: Any) -> None:
    upstream = FlakyUpstream(*[ProviderFault(503, "down") for _ in range(3)])
    async with trio.open_nursery() as nursery:
        bridge = Bridge(upstream, token="tok", nursery=nursery, retry=RetryPolicy(max_attempts=3))
        with pytest.raises(ProviderFault):
            await bridge.complete("r1", {"messages": HI})
    usage = bridge.ledger.pop("r1")
    assert usage is not None and (usage.calls, usage.retries) == (0, 2)


# -- the HTTP path, against the fake upstream ------------------------------------------------------


@pytest.fixture
async def faulty_upstream(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FakeUpstream]:
    """The fake upstream behind its resetting relay, as the bridge's OpenAI provider."""
    upstream: FakeUpstream = await nursery.start(partial(run_fake_upstream, resets=True))
    monkeypatch.setenv("OPENAI_BASE_URL", upstream.v1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    yield upstream
    upstream.stop()


async def _post(
    client: httpx.AsyncClient, handle: BridgeHandle, rid: str, body: dict[str, Any]
) -> httpx.Response:
    return await client.post(url(handle, rid), json=body, headers=AUTH)


async def test_ten_percent_faults_all_recover(
    start_bridge: StartBridge, faulty_upstream: FakeUpstream
) -> None:
    faulty_upstream.fault_rate = 0.1
    faulty_upstream.retry_after = "0"
    handle = await start_bridge()
    statuses: dict[str, int] = {}
    bodies: dict[str, str] = {}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        stream = i % 3 == 0
        body = {"messages": [{"role": "user", "content": f"q{i}"}], "temperature": 0.3}
        if stream:
            body["stream"] = True
        response = await _post(client, handle, f"r{i}", body)
        statuses[f"r{i}"] = response.status_code
        bodies[f"r{i}"] = response.text

    with trio.fail_after(60):
        async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:
            for i in range(150):
                nursery.start_soon(one, client, i)
    assert set(statuses.values()) == {200}
    assert not any("event: error" in text for text in bodies.values())
    injected = sum(faulty_upstream.faults.values())
    assert set(faulty_upstream.faults) == {"500", "429", "reset"}
    usage = handle.ledger.snapshot()
    assert sum(u.retries for u in usage.values()) == injected
    assert sum(u.calls for u in usage.values()) == 150
    # The retried calls carried exactly the parameters of the first attempt.
    chats = [r.body for r in faulty_upstream.requests if r.path.endswith("/chat/completions")]
    assert all(body["temperature"] == 0.3 for body in chats)


async def test_a_rejected_request_is_not_retried(
    start_bridge: StartBridge, faulty_upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    faulty_upstream.fail_statuses.append(400)
    handle = await start_bridge()
    with trio.fail_after(20):
        response = await _post(client, handle, "r1", {"messages": HI, "temperature": 0.3})
    assert response.status_code == 400
    assert len(faulty_upstream.requests) == 1


async def test_a_429_with_retry_after_waits_then_answers(
    start_bridge: StartBridge, faulty_upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    faulty_upstream.retry_after = "1"
    handle = await start_bridge()
    faulty_upstream.rate_limit_for(0.5)
    with trio.fail_after(20):
        response = await _post(client, handle, "r1", {"messages": HI, "stream": True})
    assert response.status_code == 200 and "event: error" not in response.text
    assert '"content":" hi"' in response.text and response.text.endswith("data: [DONE]\n\n")
    assert faulty_upstream.faults["429"] >= 1
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.retries == faulty_upstream.faults["429"]
    assert handle.ledger.pressure().rate_limited == faulty_upstream.faults["429"]
