"""Concurrency: exact usage totals across many rollouts, and the keep-alive POST hazard."""

from __future__ import annotations

import httpx
import trio

from tests.bridge.conftest import AUTH, StartBridge, url
from tests.fakes.upstream import FakeUpstream


async def test_usage_exact_under_concurrency(
    start_bridge: StartBridge, provider_env: FakeUpstream
) -> None:
    handle = await start_bridge()
    rollouts, calls_each = 20, 5
    limits = httpx.Limits(max_connections=64)
    with trio.fail_after(60):
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:

            async def rollout(i: int) -> None:
                for j in range(calls_each):
                    words = " ".join(["w"] * (j + 1))
                    body = {"messages": [{"role": "user", "content": words}], "stream": j % 2 == 1}
                    response = await client.post(url(handle, f"r{i}"), json=body, headers=AUTH)
                    assert response.status_code == 200

            async with trio.open_nursery() as nursery:
                for i in range(rollouts):
                    nursery.start_soon(rollout, i)
    # Call j sends j+1 words; the fake answers "echo: <words>" (j+2 words).
    expected_total = sum((j + 1) + (j + 2) for j in range(calls_each))
    for i in range(rollouts):
        usage = handle.ledger.pop(f"r{i}")
        assert usage is not None
        assert usage.calls == calls_each
        assert usage.total_tokens == expected_total
        assert usage.max_context_tokens == calls_each + calls_each + 1


async def test_keepalive_posts_all_answered(start_bridge: StartBridge) -> None:
    """docs/hazards.md #1: 1000 keep-alive POSTs with bodies at 32 concurrent, every one answered."""
    handle = await start_bridge(model="rollbridge/echo")
    answered = 0
    with trio.fail_after(120):
        async with httpx.AsyncClient(
            timeout=10, limits=httpx.Limits(max_connections=32, max_keepalive_connections=32)
        ) as client:

            async def worker(n: int) -> None:
                nonlocal answered
                for k in range(n):
                    body = {"messages": [{"role": "user", "content": f"ping {k}"}]}
                    # Some answered before the app reads the body (401), most after.
                    bad = k % 4 == 3
                    headers = {"Authorization": "Bearer wrong"} if bad else AUTH
                    response = await client.post(url(handle, "load"), json=body, headers=headers)
                    assert response.status_code == (401 if bad else 200)
                    answered += 1

            async with trio.open_nursery() as nursery:
                for i in range(32):
                    nursery.start_soon(worker, 1000 // 32 + (1 if i < 1000 % 32 else 0))
    assert answered == 1000
    usage = handle.ledger.pop("load")
    assert usage is not None and usage.calls == sum(
        1 for i in range(32) for k in range(1000 // 32 + (1 if i < 1000 % 32 else 0)) if k % 4 != 3
    )
