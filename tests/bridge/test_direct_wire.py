"""The direct path's lean client (rollout_server/net/wire.py) as the bridge uses it: proxy
variables are not read. The client itself is tested in tests/rollout_server/net/test_wire.py."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.bridge.conftest import AUTH, HI, StartBridge, url
from tests.fakes.upstream import FakeUpstream


async def test_proxy_variables_do_not_redirect_calls(
    start_bridge: StartBridge, provider_env: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As before the lean client (httpx ignores proxy variables when given its own transport,
    as the bridge's client always was): a proxy variable, here naming a port nothing listens
    on, does not take a call away from the provider's URL."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    handle = await start_bridge()
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        with trio.fail_after(20):
            response = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
    assert response.status_code == 200
    assert len(provider_env.requests) == 1
