"""The OpenAI Python SDK, as rollouts use it, talks to the bridge unchanged."""

from __future__ import annotations

import pytest
import trio

from tests.bridge.conftest import TOKEN, StartBridge

openai = pytest.importorskip("openai")


def _use_sdk(base_url: str) -> tuple[str, str, str, str]:
    client = openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    hello = [{"role": "user", "content": "hello world"}]
    plain = client.chat.completions.create(model="osmosis-rollout", messages=hello)
    stream = client.chat.completions.create(model="osmosis-rollout", messages=hello, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    with pytest.raises(openai.BadRequestError) as rejected:
        client.chat.completions.create(model="x", messages=hello, extra_body={"api_key": "x"})
    with pytest.raises(openai.APIError) as in_stream:
        for _ in client.chat.completions.create(
            model="x", messages=hello, stream=True, extra_body={"api_key": "x"}
        ):
            pass
    return (
        plain.choices[0].message.content or "",
        streamed,
        rejected.value.message,
        in_stream.value.message,
    )


async def test_openai_sdk_round_trip(start_bridge: StartBridge) -> None:
    handle = await start_bridge(model="rollbridge/echo")
    with trio.fail_after(60):
        plain, streamed, rejected, in_stream = await trio.to_thread.run_sync(
            _use_sdk, handle.rollout_url("sdk")
        )
    assert plain == streamed == "hello world"
    assert "Request fields cannot override eval bridge configuration: api_key" in rejected
    assert "api_key" in in_stream
    usage = handle.ledger.pop("sdk")
    assert usage is not None and usage.calls == 2
