"""The real bridge behind the (fake) tunnel: what a sandbox sees through the public URL."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import trio

from bridge import OFFLINE_MODEL, BridgeConfig, BridgeHandle, run_bridge
from tests.tunnel.conftest import FakeCloudflared
from tunnel import TunnelHandle, TunnelOptions, run_cloudflared_tunnel

TOKEN = "per-run-bearer-0123456789abcdef"


async def test_rollout_calls_reach_the_bridge_through_the_public_url(
    nursery: trio.Nursery,
    fake_cloudflared: FakeCloudflared,
    make_options: Callable[..., TunnelOptions],
) -> None:
    # No registration line: readiness must come from probing the bare root through the tunnel,
    # where the bridge's 404 is the proof.
    fake_cloudflared.knobs(REGISTER="0")
    with trio.fail_after(60):
        bridge: BridgeHandle = await nursery.start(
            run_bridge, BridgeConfig(model=OFFLINE_MODEL, token=TOKEN, keepalive=True)
        )
        tunnel: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(bridge.port)
        )
        chat_url = bridge.rollout_url("rollout-1", tunnel.public_url)
        assert chat_url == f"{tunnel.public_url}/v1/rollouts/rollout-1"
        body = {"model": "osmosis-rollout", "messages": [{"role": "user", "content": "ping"}]}
        async with httpx.AsyncClient(transport=fake_cloudflared.transport(), timeout=20) as client:
            ok = await client.post(
                chat_url + "/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            denied = await client.post(
                chat_url + "/chat/completions",
                json=body,
                headers={"Authorization": "Bearer wrong"},
            )
            events: list[str] = []
            async with client.stream(
                "POST",
                chat_url + "/chat/completions",
                json={**body, "stream": True},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as streamed:
                assert streamed.status_code == 200
                async for line in streamed.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
        assert ok.status_code == 200
        assert ok.json()["choices"][0]["message"]["content"] == "ping"
        assert denied.status_code == 401
        assert events[-1] == "[DONE]"
        text = "".join(
            choice["delta"].get("content") or ""
            for event in events[:-1]
            for choice in json.loads(event).get("choices", [])
        )
        assert text == "ping"
        usage = bridge.ledger.get("rollout-1")
        assert usage is not None
        tunnel.stop()
        await tunnel.wait_closed()
