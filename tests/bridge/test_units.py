"""Usage normalization and the ledger, error mapping and the offline model, as plain functions."""

from __future__ import annotations

import threading

import trio

from bridge.errors import error_body, final_status
from bridge.policy import PreparedRequest
from bridge.upstreams.echo import EchoUpstream, answer
from bridge.usage import CallUsage, UsageLedger


def test_status_mapping() -> None:
    assert [final_status(s) for s in (400, 401, 408, 429, 499, 500, 503, 529, 302, None)] == [
        400, 401, 408, 429, 499, 502, 502, 502, 502, 502,
    ]  # fmt: skip
    assert error_body(400, "m")["error"]["type"] == "invalid_request_error"
    assert error_body(401, "m") == {
        "error": {"message": "m", "type": "bridge_error", "code": 401},
        "detail": "m",
    }


def test_usage_normalization() -> None:
    assert CallUsage.from_json(None) == CallUsage()
    assert CallUsage.from_json({"input_tokens": 3, "output_tokens": 4}).total_tokens == 7
    assert (
        CallUsage.from_json(
            {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 9}
        ).total_tokens
        == 9
    )
    anthropic_style = CallUsage.from_json(
        {"prompt_tokens": 3, "completion_tokens": 4, "cache_read_input_tokens": 2}
    )
    assert anthropic_style.cached_tokens == 2


def test_a_count_that_is_no_count_is_not_taken() -> None:
    """A provider's absurd numbers (2**63, negative, NaN, infinity, text) break no sum, file or
    Parquet export: they are not counted (an absurd total falls back to prompt + completion)."""
    from bridge.apis.usage import from_messages

    absurd = CallUsage.from_json(
        {
            "prompt_tokens": 2**63,
            "completion_tokens": 5,
            "total_tokens": float("inf"),
            "prompt_tokens_details": {"cached_tokens": -4},
            "completion_tokens_details": {"reasoning_tokens": float("nan")},
        }
    )
    assert (absurd.prompt_tokens, absurd.completion_tokens, absurd.total_tokens) == (0, 5, 5)
    assert absurd.cached_tokens is None and absurd.reasoning_tokens is None
    assert CallUsage.from_json({"prompt_tokens": 3.0, "completion_tokens": "4"}).total_tokens == 3
    anthropic = from_messages({"input_tokens": float("inf"), "output_tokens": 2**64})
    assert (anthropic.prompt_tokens, anthropic.completion_tokens) == (0, 0)


def test_ledger_threads_and_forget_hook() -> None:
    forgotten: list[str] = []
    ledger = UsageLedger(on_forget=forgotten.append)

    def work() -> None:
        for _ in range(500):
            ledger.record("r", CallUsage(1, 2, 3))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = ledger.pop("r")
    assert usage is not None
    assert (usage.calls, usage.total_tokens, usage.max_context_tokens) == (2000, 6000, 3)
    assert usage.to_json() == {
        "calls": 2000,
        "prompt_tokens": 2000,
        "completion_tokens": 4000,
        "total_tokens": 6000,
        "max_context_tokens": 3,
    }
    ledger.discard("r2")
    assert forgotten == ["r", "r2"]


async def test_echo_model_deterministic_with_usage() -> None:
    prepared = PreparedRequest(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
        ],
        {},
    )
    assert answer(prepared) == "What is 2+2?"
    recorded: list[object] = []
    echo = EchoUpstream("rollbridge/echo")
    with trio.fail_after(5):
        first = await echo.complete(prepared, recorded.append)
        second = await echo.complete(prepared, recorded.append)
        chunks = [c async for c in echo.stream(prepared)]
    assert first == second
    assert first["usage"]["prompt_tokens"] > first["usage"]["completion_tokens"] > 0
    assert recorded == [first["usage"], first["usage"]]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == "What is 2+2?"
    assert chunks[-1]["usage"] == first["usage"]


def test_litellm_exception_mapping() -> None:
    import httpx

    from bridge.upstreams.litellm import to_upstream_error

    class Timeout(Exception):
        status_code = 500
        message = "litellm.Timeout: took too long"

    assert (to_upstream_error(Timeout()).status, to_upstream_error(Timeout()).kind) == (
        408,
        "Timeout",
    )

    class BadRequestError(Exception):
        status_code = 400

        def __init__(self) -> None:
            super().__init__("litellm.BadRequestError: remapped")

    request = httpx.Request("POST", "http://upstream.test/v1/chat/completions")
    response = httpx.Response(422, text='{"error":"raw upstream body"}', request=request)
    try:
        try:
            raise httpx.HTTPStatusError("422", request=request, response=response)
        except httpx.HTTPStatusError as inner:
            raise BadRequestError() from inner
    except BadRequestError as exc:
        mapped = to_upstream_error(exc)
    # The real upstream status and body win over LiteLLM's remapping.
    assert (mapped.status, mapped.message, mapped.kind) == (
        422,
        '{"error":"raw upstream body"}',
        "BadRequestError",
    )
    plain = to_upstream_error(RuntimeError("no status"))
    assert (plain.status, plain.message) == (500, "no status")
