"""Fixtures for bridge tests: a running bridge in front of the fake upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeConfig, BridgeHandle, run_bridge
from tests.bridge.scripted import Scripted, run_scripted
from tests.fakes.upstream import FakeUpstream

TOKEN = "T0k3n-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HI = [{"role": "user", "content": "hi"}]

StartBridge = Callable[..., Awaitable[BridgeHandle]]


@pytest.fixture
def provider_env(monkeypatch: pytest.MonkeyPatch, fake_upstream: FakeUpstream) -> FakeUpstream:
    """Point the OpenAI env vars at the fake upstream."""
    monkeypatch.setenv("OPENAI_BASE_URL", fake_upstream.v1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    return fake_upstream


@pytest.fixture
async def start_bridge(nursery: trio.Nursery) -> StartBridge:
    """Start a bridge with the given config overrides; returns its handle."""

    async def start(**overrides: Any) -> BridgeHandle:
        fields: dict[str, Any] = {"model": "openai/test-model", "token": TOKEN}
        fields.update(overrides)
        return await nursery.start(run_bridge, BridgeConfig(**fields))

    return start


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client with a generous per-call timeout (tests wrap calls in fail_after)."""
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


@pytest.fixture
async def bridge(start_bridge: StartBridge, provider_env: FakeUpstream) -> BridgeHandle:
    """A bridge for ``openai/test-model`` on the direct path, in front of the fake upstream."""
    return await start_bridge()


def url(handle: BridgeHandle, rollout_id: str = "r1") -> str:
    """The chat completions URL of a rollout."""
    return f"{handle.base_url}/v1/rollouts/{rollout_id}/chat/completions"


@pytest.fixture
async def scripted(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> Scripted:
    """A scripted upstream, with the OpenAI env vars pointing at it."""
    upstream: Scripted = await nursery.start(run_scripted, Scripted())
    monkeypatch.setenv("OPENAI_BASE_URL", upstream.v1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    return upstream
