"""docs/hazards.md #1: 1000 keep-alive POSTs with bodies at 32 concurrent, every one answered."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from .helpers import start


async def test_keepalive_posts_all_answered(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(90):
        running, client = await start(nursery, tmp_path)
        await client.aclose()
        answered = 0
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(
            base_url=running.url, limits=limits, timeout=httpx.Timeout(20.0)
        ) as http:
            send, receive = trio.open_memory_channel[int](1000)
            for index in range(1000):
                send.send_nowait(index)
            send.close()

            async def worker() -> None:
                nonlocal answered
                async for index in receive:
                    if index % 4 == 0:
                        # Admissions: the real body path (grade:false, no grading needed).
                        r = await http.post(
                            "/rollout",
                            json={
                                "initial_messages": [{"role": "user", "content": "x" * 200}],
                                "rollout_id": f"k{index}",
                                "chat_completions_url": "http://127.0.0.1:9",
                                "grade": False,
                            },
                        )
                        assert r.status_code == 202
                    else:
                        r = await http.post(
                            "/rollout/cancel", json={"ids": [f"none-{index}", "x" * 100]}
                        )
                        assert r.status_code == 200
                    answered += 1

            async with trio.open_nursery() as workers:
                for _ in range(32):
                    workers.start_soon(worker)
        assert answered == 1000
        running.force_stop()
