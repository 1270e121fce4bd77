"""The lean fake upstream (tests/fakes/lean_upstream.py) answers as FakeUpstream does, in a
process of its own that does not outlive the task that started it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psutil
import pytest
import trio

from rollout_server.net.h1client import H1Pool
from tests.fakes.lean_upstream import REPO, LeanUpstream, run_lean_upstream
from tests.fakes.upstream import FakeUpstream

CONVERSATIONS: list[Any] = [
    [{"role": "user", "content": "Repeat after me: word7"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question here"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "  and  a   second\tone  "},
    ],
    [{"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "text"}, "x"]}],
    [{"role": "system", "content": "no user message at all"}],
    [{"role": "user", "content": "ünïcode wörds ✓"}],
    [],
    "not a list",
]


@pytest.fixture
async def lean(nursery: trio.Nursery) -> AsyncIterator[LeanUpstream]:
    with trio.fail_after(60):
        upstream: LeanUpstream = await nursery.start(run_lean_upstream)
    yield upstream


def _events(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as is)."""
    events = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def _both(
    fake: FakeUpstream, lean: LeanUpstream, path: str, body: Any
) -> tuple[httpx.Response, httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        expected = await client.post(fake.base_url + path, content=content)
        got = await client.post(lean.base_url + path, content=content)
    return expected, got


async def test_answers_match_the_fake_upstream(
    fake_upstream: FakeUpstream, lean: LeanUpstream
) -> None:
    with trio.fail_after(60):
        for messages in CONVERSATIONS:
            for extra in ({}, {"model": "some/model"}):
                body = {"messages": messages, **extra}
                expected, got = await _both(fake_upstream, lean, "/v1/chat/completions", body)
                assert got.status_code == expected.status_code == 200
                assert got.headers["content-type"] == "application/json"
                assert got.json() == expected.json()
        expected, got = await _both(fake_upstream, lean, "/chat/completions", {"messages": []})
        assert got.json() == expected.json()
        assert got.json()["choices"][0]["message"]["content"] == "echo: "


async def test_streamed_answers_match_the_fake_upstream(
    fake_upstream: FakeUpstream, lean: LeanUpstream
) -> None:
    with trio.fail_after(60):
        for messages in CONVERSATIONS[:3]:
            for options in ({}, {"stream_options": {"include_usage": True}}):
                body = {"model": "m", "stream": True, "messages": messages, **options}
                expected, got = await _both(fake_upstream, lean, "/v1/chat/completions", body)
                assert got.status_code == expected.status_code == 200
                assert got.headers["content-type"] == "text/event-stream"
                assert _events(got.text) == _events(expected.text)
                texts = [
                    e["choices"][0]["delta"].get("content", "")
                    for e in _events(got.text)
                    if isinstance(e, dict) and e["choices"]
                ]
                assert "".join(texts).startswith("echo: ")
                has_usage = any(isinstance(e, dict) and "usage" in e for e in _events(got.text))
                assert has_usage == bool(options)


async def test_bad_requests_get_the_fake_upstreams_statuses(
    fake_upstream: FakeUpstream, lean: LeanUpstream
) -> None:
    with trio.fail_after(60):
        for path, body in (
            ("/v1/chat/completions", b"not json"),
            ("/v1/chat/completions", b"[1, 2]"),
            ("/v1/chat/completions", b""),
            ("/v1/elsewhere", b"{}"),
        ):
            expected, got = await _both(fake_upstream, lean, path, body)
            assert got.status_code == expected.status_code, (path, body)
        async with httpx.AsyncClient(timeout=30) as client:
            models = await client.get(lean.v1 + "/models")
        assert models.json()["data"][0]["id"] == "fake-model"


async def test_requests_the_fast_path_declines_are_answered_by_h11(lean: LeanUpstream) -> None:
    body = {"messages": [{"role": "user", "content": "sent in chunks"}]}

    async def chunks() -> AsyncIterator[bytes]:
        data = json.dumps(body).encode()
        yield data[:10]
        yield data[10:]

    with trio.fail_after(30):
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(lean.v1 + "/chat/completions", content=chunks())
            assert reply.status_code == 200
            assert reply.json()["choices"][0]["message"]["content"] == "echo: sent in chunks"
            # The same connection serves a plain request next.
            again = await client.post(lean.v1 + "/chat/completions", json=body)
            assert again.json()["usage"]["prompt_tokens"] == 3
        stream = await trio.open_tcp_stream("127.0.0.1", lean.port)
        async with stream:
            await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
            answer = await stream.receive_some()
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert (await lean.counters())["completed"] == 2


async def test_delay_is_applied_and_counted(lean: LeanUpstream) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}]}
    with trio.fail_after(30):
        await lean.set_delay(0.5)
        assert (await lean.counters())["delay"] == 0.5
        seen: list[float] = []
        async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:

            async def call() -> None:
                started = time.monotonic()
                reply = await client.post(lean.v1 + "/chat/completions", json=body)
                assert reply.status_code == 200
                seen.append(time.monotonic() - started)

            nursery.start_soon(call)
            while (await lean.counters())["in_flight"] != 1:
                await trio.sleep(0.01)
        assert seen[0] >= 0.5
        assert await lean.counters() == {
            "completed": 1,
            "in_flight": 0,
            "in_flight_peak": 1,
            "connections": 2,
            "h2_connections": 0,
            "h2_refused": 0,
            "delay": 0.5,
        }
        await lean.set_delay(0)
        async with httpx.AsyncClient(timeout=30) as client:
            for bad in ({"delay": -1}, {"delay": "1"}, {"delay": True}, [0.5]):
                refused = await client.post(lean.base_url + "/_control", json=bad)
                assert refused.status_code == 400, bad
        assert (await lean.counters())["delay"] == 0


async def test_200_concurrent_keep_alive_clients(lean: LeanUpstream) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "many at once"}]}).encode()
    pool = H1Pool("127.0.0.1", lean.port)
    answers: list[bytes] = []

    async def call() -> None:
        reply = await pool.request(b"POST", b"/v1/chat/completions", body=body, total_sec=30)
        assert reply.status == 200
        answers.append(reply.body)

    with trio.fail_after(60):
        # Long enough for a loaded machine to start all 200 calls within it (at 0.3 s the
        # first calls of a round could finish before the last started, and the wait below
        # then never saw 200 in flight).
        await lean.set_delay(2.0)
        before = (await lean.counters())["connections"]
        try:
            for round_ in range(3):
                async with trio.open_nursery() as nursery:
                    for _ in range(200):
                        nursery.start_soon(call)
                    # Every call of the round waits out the delay at the same time.
                    while (await lean.counters())["in_flight"] != 200:
                        assert len(answers) < 200 * (round_ + 1), (
                            "the round's calls never overlapped"
                        )
                        await trio.sleep(0.02)
        finally:
            await pool.aclose()
        counters = await lean.counters()
    assert len(answers) == 600
    assert {json.loads(a)["choices"][0]["message"]["content"] for a in answers} == {
        "echo: many at once"
    }
    assert counters["completed"] == 600
    assert counters["connections"] - before == 200  # each client kept its connection


async def test_the_process_is_gone_after_cancellation() -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            upstream: LeanUpstream = await nursery.start(run_lean_upstream)
            assert psutil.pid_exists(upstream.pid)
            nursery.cancel_scope.cancel()
    assert not psutil.pid_exists(upstream.pid)
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(timeout=5) as client:
            await client.get(upstream.base_url + "/_control")


async def test_the_standalone_server_stops_when_its_stdin_closes() -> None:
    argv = [sys.executable, "-m", "tests.fakes.lean_upstream", "--until-stdin-closes"]
    process = await trio.lowlevel.open_process(
        argv, cwd=str(REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        with trio.fail_after(60):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some()
            async with httpx.AsyncClient(timeout=10) as client:
                reply = await client.get(f"http://127.0.0.1:{int(line)}/_control")
            assert reply.json()["completed"] == 0
            await process.stdin.aclose()
            assert await process.wait() == 0
    finally:
        process.kill()
        await process.wait()
