"""The sharded connection pool: concurrent calls spread over shards, and every call releases one.

Which shard a call went to shows on the wire: each shard has its own connections, so the
client-side port of the connection a response came over tells the shards apart.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from rollout_server.net.httpclient import ShardedTransport

BODY = {"model": "m", "messages": [{"role": "user", "content": "a b c"}]}


def _port(response: httpx.Response) -> int:
    """The client-side port of the connection ``response`` came over."""
    address = response.extensions["network_stream"].get_extra_info("client_addr")
    return int(address[1])


async def _open(client: httpx.AsyncClient, url: str) -> httpx.Response:
    return await client.send(client.build_request("POST", url, json=BODY), stream=True)


async def test_calls_spread_and_release_their_shard(fake_upstream: Any) -> None:
    transport = ShardedTransport(shards=3)
    url = fake_upstream.v1 + "/chat/completions"
    with trio.fail_after(20):
        async with httpx.AsyncClient(transport=transport) as client:
            first = await _open(client, url)
            second = await _open(client, url)
            first_port, second_port = _port(first), _port(second)
            # Open responses hold their shard: the second call went to another one.
            assert first_port != second_port
            # Read to the end, so each connection stays in its shard's pool once released.
            await first.aread()
            await first.aclose()
            # Released: the least busy shard is the first one again, with its connection.
            third = await _open(client, url)
            assert _port(third) == first_port
            await second.aread()
            await second.aclose()
            # With the first shard busy, the second one (released too) is the least busy.
            fourth = await _open(client, url)
            assert _port(fourth) == second_port
            for response in (third, fourth):
                await response.aread()
                await response.aclose()
            # A lone caller keeps to the first shard (one connection, reused).
            for _ in range(3):
                response = await client.post(url, json=BODY)
                assert response.status_code == 200
                assert _port(response) == first_port


async def test_failed_call_releases_its_shard(fake_upstream: Any) -> None:
    transport = ShardedTransport(shards=2)
    url = fake_upstream.v1 + "/chat/completions"
    with trio.fail_after(20):
        async with httpx.AsyncClient(transport=transport) as client:
            before = await client.post(url, json=BODY)
            try:
                await client.post("http://127.0.0.1:1/v1/chat/completions", json=BODY)
            except httpx.TransportError:
                pass
            else:
                raise AssertionError("a call to a closed port should fail")
            # Had the failed call kept the first shard busy, this one would use the second.
            after = await client.post(url, json=BODY)
            assert _port(after) == _port(before)
