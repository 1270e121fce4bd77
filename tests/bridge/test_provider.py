"""Provider errors, response shaping and usage accounting, against a scripted upstream."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeHandle
from bridge.retry import RetryPolicy
from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.bridge.scripted import Reply, Scripted

#: Retries off: these tests pin down how a final upstream answer is relayed.
NO_RETRY = RetryPolicy(max_attempts=1)

USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def completion(message: dict[str, Any], finish: str = "stop", usage: Any = USAGE) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-up1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "test-model",
        "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


HELLO = completion({"role": "assistant", "content": "hello"})


async def call(handle: BridgeHandle, body: Any, rid: str = "r1") -> httpx.Response:
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as client:
            return await client.post(url(handle, rid), json=body, headers=AUTH)


async def test_upstream_400_keeps_status_and_redacts(
    start_bridge: StartBridge, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_API_KEY", "SECRETVALUE123")
    body = (
        '{"error":{"message":"bad param foo sk-abcdefghijklmnopqrstuvwxyz012345 SECRETVALUE123"}}'
    )
    scripted.reply(Reply(400, body))
    handle = await start_bridge()
    response = await call(handle, {"messages": HI})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == 400
    assert error["message"] == '{"error":{"message":"bad param foo REDACTED [REDACTED]"}}'
    assert response.json()["detail"] == error["message"]


async def test_key_in_query_url_is_redacted(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(
        Reply(
            403,
            "denied for https://example.test/v1/models/x:generate?key=AIzaSyD-abcdefghijklmnopqrstuvwx&alt=sse",
        )
    )
    handle = await start_bridge()
    response = await call(handle, {"messages": HI})
    assert response.status_code == 403
    message = response.json()["error"]["message"]
    assert "AIza" not in message
    assert "abcdefghijklmnop" not in message
    assert "&alt=sse" in message


async def test_provider_key_and_bridge_token_never_leak(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    from tests.bridge.conftest import TOKEN

    scripted.reply(Reply(401, f"invalid key sk-provider-key-for-tests-000000, token {TOKEN}"))
    logs: list[tuple[str, str]] = []
    handle = await start_bridge(log=lambda level, msg: logs.append((level, msg)))
    response = await call(handle, {"messages": HI})
    assert response.status_code == 401
    text = response.text + repr(logs)
    assert "sk-provider-key-for-tests" not in text
    assert TOKEN not in text
    assert any(level == "warning" and msg.startswith("LLM bridge error: ") for level, msg in logs)


async def test_run_redactor_is_applied(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(Reply(400, "the run secret is hunter2"))
    handle = await start_bridge(redact=lambda s: s.replace("hunter2", "***"))
    response = await call(handle, {"messages": HI})
    assert response.json()["error"]["message"] == "the run secret is ***"


@pytest.mark.parametrize("status", [401, 403, 404, 422, 429])
async def test_upstream_4xx_kept(
    start_bridge: StartBridge, scripted: Scripted, status: int
) -> None:
    scripted.reply(Reply(status, '{"error":{"message":"nope"}}'))
    handle = await start_bridge(retry=NO_RETRY)  # the final answer, not the retries
    response = await call(handle, {"messages": HI})
    assert response.status_code == status
    assert response.json()["error"] == {
        "message": '{"error":{"message":"nope"}}',
        "type": "bridge_error",
        "code": status,
    }
    assert len(scripted.requests) == 1  # no retries


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, '{"error":{"message":"boom"}}', '{"error":{"message":"boom"}}'),
        (503, "upstream unavailable", "upstream unavailable"),
        (529, "overloaded", "overloaded"),
    ],
)
async def test_upstream_5xx_becomes_502(
    start_bridge: StartBridge, scripted: Scripted, status: int, body: str, message: str
) -> None:
    scripted.reply(Reply(status, body, content_type="text/plain"))
    handle = await start_bridge(retry=NO_RETRY)  # the final answer, not the retries
    response = await call(handle, {"messages": HI})
    assert response.status_code == 502
    assert response.json()["error"] == {
        "message": message,
        "type": "bridge_error",
        "code": 502,
        "upstream_status": status,  # what the provider answered, for the run's failure reason
    }
    assert len(scripted.requests) == 1


async def test_connection_error_is_502(
    start_bridge: StartBridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    handle = await start_bridge()
    response = await call(handle, {"messages": HI})
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "bridge_error"


async def test_missing_key_is_502(
    start_bridge: StartBridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    handle = await start_bridge()
    response = await call(handle, {"messages": HI})
    assert response.status_code == 502
    assert "OPENAI_API_KEY" in response.json()["error"]["message"]


async def test_upstream_timeout_is_408(
    start_bridge: StartBridge, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bridge.upstreams.direct

    monkeypatch.setattr(bridge.upstreams.direct, "_READ_TIMEOUT", 0.2)
    scripted.reply(Reply(200, parts=[(5.0, b"{}")]))
    handle = await start_bridge()
    response = await call(handle, {"messages": HI})
    assert response.status_code == 408
    assert response.json()["error"]["code"] == 408


async def test_empty_choices_is_502_but_counted(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    scripted.reply(Reply(200, {**HELLO, "choices": []}))
    handle = await start_bridge()
    response = await call(handle, {"messages": HI})
    assert response.status_code == 502
    assert response.json()["error"]["message"] == (
        "LLM response carried no choices; refusing to emit an empty completion"
    )
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 18


async def test_long_message_truncated_and_whitespace_collapsed(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    scripted.reply(Reply(400, "a  \n\t b " + "x" * 5000))
    handle = await start_bridge()
    message = (await call(handle, {"messages": HI})).json()["error"]["message"]
    assert len(message) == 1000
    assert message.startswith("a b xxx")


async def test_invalid_json_from_provider_is_502(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    scripted.reply(Reply(200, "<html>oops</html>", content_type="text/html"))
    handle = await start_bridge()
    assert (await call(handle, {"messages": HI})).status_code == 502


# Response shaping --------------------------------------------------------------------------


async def test_tool_call_shape(start_bridge: StartBridge, scripted: Scripted) -> None:
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q":"x"}'},
    }
    scripted.reply(
        Reply(
            200,
            completion(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call],
                    "reasoning_content": "thinking...",
                    "annotations": [],
                },
                finish="tool_calls",
            ),
        )
    )
    handle = await start_bridge()
    data = (await call(handle, {"messages": HI})).json()
    assert data["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "",
                "reasoning_content": "thinking...",
                "tool_calls": [tool_call],
                "annotations": [],
            },
            "finish_reason": "tool_calls",
        }
    ]
    assert data["system_fingerprint"] == "fp_1"  # fields the bridge does not own pass through


async def test_refusal_shape(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(
        Reply(200, completion({"role": "assistant", "content": None, "refusal": "I refuse"}))
    )
    handle = await start_bridge()
    data = (await call(handle, {"messages": HI})).json()
    assert data["choices"][0]["message"] == {
        "role": "assistant",
        "content": "",
        "refusal": "I refuse",
    }


async def test_no_usage_counts_zero(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(Reply(200, completion({"role": "assistant", "content": "x"}, usage=None)))
    handle = await start_bridge()
    data = (await call(handle, {"messages": HI})).json()
    assert data["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    usage = handle.ledger.pop("r1")
    assert usage is not None and usage.total_tokens == 0 and usage.calls == 1


async def test_reported_total_is_kept_and_details_counted(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    scripted.reply(Reply(200, completion({"role": "assistant", "content": "x"}, usage=usage)))
    handle = await start_bridge()
    data = (await call(handle, {"messages": HI})).json()
    assert data["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 20}
    totals = handle.ledger.pop("r1")
    assert totals is not None
    assert totals.to_json() == {
        "calls": 1,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 20,
        "max_context_tokens": 15,
        "cached_tokens": 4,
        "reasoning_tokens": 3,
    }


# Usage accounting --------------------------------------------------------------------------


async def test_usage_per_rollout(start_bridge: StartBridge, scripted: Scripted) -> None:
    scripted.reply(Reply(200, HELLO))
    handle = await start_bridge()
    for rid in ("r1", "r1", "r2"):
        assert (await call(handle, {"messages": HI}, rid)).status_code == 200
    scripted.reply(Reply(500, "down"))
    assert (await call(handle, {"messages": HI}, "r1")).status_code == 502
    r1 = handle.ledger.pop("r1")
    assert r1 is not None and (r1.calls, r1.total_tokens, r1.max_context_tokens) == (2, 36, 18)
    assert handle.ledger.pop("r1") is None
    r2 = handle.ledger.pop("r2")
    assert r2 is not None and r2.total_tokens == 18
    assert handle.ledger.pop("never") is None


async def test_max_context_is_largest_call(start_bridge: StartBridge, scripted: Scripted) -> None:
    small = completion(
        {"role": "assistant", "content": "x"}, usage={"prompt_tokens": 5, "completion_tokens": 2}
    )
    big = completion(
        {"role": "assistant", "content": "x"}, usage={"prompt_tokens": 50, "completion_tokens": 9}
    )
    scripted.reply(Reply(200, small), Reply(200, big), Reply(200, small))
    handle = await start_bridge()
    for _ in range(3):
        await call(handle, {"messages": HI})
    usage = handle.ledger.pop("r1")
    assert usage is not None
    assert (usage.calls, usage.total_tokens, usage.max_context_tokens) == (3, 73, 59)


# Reasoning replay --------------------------------------------------------------------------


async def test_reasoning_replayed_on_same_rollout_only(
    start_bridge: StartBridge, scripted: Scripted
) -> None:
    details = [{"type": "reasoning.encrypted", "data": "opaque"}]
    tool_call = {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    first = completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call],
            "reasoning_details": details,
        },
        finish="tool_calls",
    )
    scripted.reply(Reply(200, first), Reply(200, HELLO))
    handle = await start_bridge()
    await call(handle, {"messages": HI})
    history = [
        *HI,
        {"role": "assistant", "content": "", "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
    ]
    await call(handle, {"messages": history})
    assert scripted.requests[-1]["messages"][1]["reasoning_details"] == details
    await call(handle, {"messages": history}, rid="other")
    assert "reasoning_details" not in scripted.requests[-1]["messages"][1]
    handle.ledger.discard("r1")
    await call(handle, {"messages": history})
    assert "reasoning_details" not in scripted.requests[-1]["messages"][1]
