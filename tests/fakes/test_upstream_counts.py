"""FakeUpstream's own counters: an answered call counts as completed, a client that left as a
disconnect (tests rely on both, e.g. that a cancelled bridge call never completed upstream)."""

from __future__ import annotations

import httpx
import trio

from tests.fakes.upstream import FakeUpstream

HI = [{"role": "user", "content": "hi there"}]


async def test_answered_calls_are_completed_not_disconnects(fake_upstream: FakeUpstream) -> None:
    with trio.fail_after(10):
        async with httpx.AsyncClient() as client:
            for _ in range(3):
                answer = await client.post(
                    fake_upstream.v1 + "/chat/completions", json={"messages": HI}
                )
                assert answer.status_code == 200
            async with client.stream(
                "POST",
                fake_upstream.v1 + "/chat/completions",
                json={"messages": HI, "stream": True},
            ) as streamed:
                assert b"[DONE]" in await streamed.aread()
        while fake_upstream.in_flight:
            await trio.sleep(0.01)
    assert (fake_upstream.completed, fake_upstream.disconnects) == (4, 0)


async def test_a_client_that_leaves_is_a_disconnect(fake_upstream: FakeUpstream) -> None:
    fake_upstream.delay = 5.0
    with trio.fail_after(10):
        async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: client.post(fake_upstream.v1 + "/chat/completions", json={"messages": HI})
            )
            while fake_upstream.in_flight == 0:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        while fake_upstream.disconnects == 0:
            await trio.sleep(0.01)
    assert fake_upstream.completed == 0
