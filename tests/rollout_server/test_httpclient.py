"""The bridge's sharded connection pool: calls spread over shards and release them."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from bridge.upstreams.direct import ShardedTransport

BODY = {"model": "m", "messages": [{"role": "user", "content": "a b c"}]}


async def test_calls_spread_and_release_their_shard(fake_upstream: Any) -> None:
    transport = ShardedTransport(shards=3)
    url = fake_upstream.v1 + "/chat/completions"
    with trio.fail_after(20):
        async with httpx.AsyncClient(transport=transport) as client:
            first = await client.send(client.build_request("POST", url, json=BODY), stream=True)
            second = await client.send(client.build_request("POST", url, json=BODY), stream=True)
            # Open responses hold their shard: the second call went to another one.
            assert transport._busy == [1, 1, 0]
            await first.aread()
            await first.aclose()
            assert transport._busy == [0, 1, 0]
            await second.aclose()
            assert transport._busy == [0, 0, 0]
            # A lone caller keeps to the first shard (one connection, reused).
            for _ in range(3):
                assert (await client.post(url, json=BODY)).status_code == 200
            assert transport._busy == [0, 0, 0]


async def test_failed_call_releases_its_shard() -> None:
    transport = ShardedTransport(shards=2)
    with trio.fail_after(20):
        async with httpx.AsyncClient(transport=transport) as client:
            try:
                await client.post("http://127.0.0.1:1/v1/chat/completions", json=BODY)
            except httpx.TransportError:
                pass
            else:
                raise AssertionError("a call to a closed port should fail")
    assert transport._busy == [0, 0]
