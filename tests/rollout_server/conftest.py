"""Fixtures: a real rollout server on 127.0.0.1:0 with the scripted workflow and grader."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from rollout_server import RunningServer
from rollout_server.client import RolloutClient

from .helpers import start


@dataclass
class Served:
    running: RunningServer
    client: RolloutClient
    http: httpx.AsyncClient
    root: Path


@pytest.fixture
async def served(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Served]:
    """Server with a 1 s hold and a 10 s lease, plus our client and a raw httpx client."""
    running, client = await start(
        nursery, tmp_path, result_wait_timeout_sec=1.0, polling_lease_timeout_sec=10.0
    )
    async with httpx.AsyncClient(base_url=running.url, timeout=10.0) as http:
        yield Served(running, client, http, tmp_path / "trials")
    await client.aclose()
    running.force_stop()
