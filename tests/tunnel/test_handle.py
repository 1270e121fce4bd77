"""The handle's contract with the supervisor: current URL, waiting across restarts, failure."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tunnel import TunnelFailed, TunnelHandle
from tunnel.cloudflared import _TunnelState


async def test_waiters_follow_restarts(autojump_clock: trio.testing.MockClock) -> None:
    state = _TunnelState()
    handle = TunnelHandle(state)
    seen: list[str] = []

    async def dispatcher() -> None:
        seen.append(await handle.wait_available())
        seen.append(await handle.wait_url_change(handle.generation))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dispatcher)
            await trio.sleep(5)
            assert seen == [] and not handle.available
            state.publish("https://a.trycloudflare.com", 10)
            await trio.sleep(5)
            state.lost()
            assert handle.public_url == "https://a.trycloudflare.com" and not handle.available
            await trio.sleep(5)
            state.publish("https://b.trycloudflare.com", 11)
    assert seen == ["https://a.trycloudflare.com", "https://b.trycloudflare.com"]
    assert handle.generation == 2 and handle.pid == 11


async def test_failure_wakes_every_waiter(autojump_clock: trio.testing.MockClock) -> None:
    state = _TunnelState()
    handle = TunnelHandle(state)
    state.publish("https://a.trycloudflare.com", 10)
    state.lost()
    errors: list[str] = []

    async def wait_url() -> None:
        with pytest.raises(TunnelFailed) as info:
            await handle.wait_available()
        errors.append(str(info.value))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_url)
            await trio.sleep(1)
            state.fail("the cloudflared tunnel exited with code 1; gone")
            assert await handle.wait_failed() == "the cloudflared tunnel exited with code 1; gone"
    assert errors == ["the cloudflared tunnel exited with code 1; gone"]
    assert handle.failure is not None and not handle.available
    with pytest.raises(TunnelFailed):
        await handle.wait_url_change(0)
