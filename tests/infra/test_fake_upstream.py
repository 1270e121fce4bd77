"""The fake upstream behaves like an OpenAI-compatible server; other suites rely on it."""

from __future__ import annotations

import json

import httpx
import trio

from tests.fakes.upstream import FakeUpstream


async def test_non_streaming_answer_has_usage(fake_upstream: FakeUpstream) -> None:
    with trio.fail_after(10):
        async with httpx.AsyncClient() as client:
            response = await client.post(
                fake_upstream.v1 + "/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hello there"}]},
            )
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "echo: hello there"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert fake_upstream.requests[0].body["model"] == "m"


async def test_streaming_sends_chunks_then_usage(fake_upstream: FakeUpstream) -> None:
    events: list[str] = []
    with trio.fail_after(10):
        async with (
            httpx.AsyncClient() as client,
            client.stream(
                "POST",
                fake_upstream.v1 + "/chat/completions",
                json={
                    "model": "m",
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": "a b"}],
                },
            ) as response,
        ):
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "echo: a b"
    assert chunks[-1]["usage"]["total_tokens"] == 5


async def test_injected_failure_then_recovery(fake_upstream: FakeUpstream) -> None:
    fake_upstream.fail_statuses.extend([429])
    with trio.fail_after(10):
        async with httpx.AsyncClient() as client:
            url = fake_upstream.v1 + "/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            first = await client.post(url, json=body)
            second = await client.post(url, json=body)
    assert (first.status_code, second.status_code) == (429, 200)


async def test_client_going_away_is_counted(fake_upstream: FakeUpstream) -> None:
    fake_upstream.delay = 30
    with trio.fail_after(10):
        async with httpx.AsyncClient() as client:
            with trio.move_on_after(0.3):
                await client.post(
                    fake_upstream.v1 + "/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                )
        while fake_upstream.disconnects == 0:
            await trio.sleep(0.01)
    assert fake_upstream.completed == 0
