"""Shared fixtures. Keep LiteLLM offline before anything imports it."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from collections.abc import AsyncIterator

import pytest
import trio

from tests.fakes.upstream import FakeUpstream, run_fake_upstream


@pytest.fixture
async def fake_upstream(nursery: trio.Nursery) -> AsyncIterator[FakeUpstream]:
    """A fake OpenAI-compatible upstream on a real loopback port (see tests/fakes/upstream.py)."""
    upstream: FakeUpstream = await nursery.start(run_fake_upstream)
    yield upstream
    upstream.stop()
