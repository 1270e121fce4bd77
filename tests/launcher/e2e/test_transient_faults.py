"""Transient provider faults through the whole stack (real CLI, bridge and rollout server; the
fake upstream behind its resetting relay): 10% of calls answered 500, 429 or reset end with no
failed row and the retries counted per row, and a 429 storm lowers the rollouts in flight and
then brings them back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fakes.upstream import FakeUpstream, run_fake_upstream
from tests.launcher.e2e.helpers import fake_model_config, journal, run_cli, run_dir, write_config

pytestmark = pytest.mark.slow


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> AsyncIterator[FakeUpstream]:
    fake: FakeUpstream = await nursery.start(partial(run_fake_upstream, resets=True))
    yield fake
    fake.stop()


def _env(env: dict[str, str], upstream: FakeUpstream) -> dict[str, str]:
    return {**env, "OPENAI_BASE_URL": upstream.v1, "OPENAI_API_KEY": "sk-fake-transient-key"}


def _index(run: Path) -> list[dict[str, Any]]:
    lines = (run / "index.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def test_ten_percent_transient_faults_leave_no_failed_row(
    workspace: Path, env: dict[str, str], tmp_path: Path, upstream: FakeUpstream
) -> None:
    # The seeded draw spares the first call (the preflight, which is a single probe), so the
    # faults all land on the rollouts' calls.
    upstream.fault_rate = 0.1
    upstream.retry_after = "0"
    config = fake_model_config(batch_size=8).replace("batch_size = 8", "batch_size = 8\nn = 6")
    write_config(workspace, "fake", config)
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/fake.toml", "--name", "flaky", "--rows", "0-9", "--yes"],
        cwd=tmp_path,
        env=_env(env, upstream),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    run = run_dir(workspace, "flaky")
    records = journal(run)
    assert len(records) == 60
    assert [r for r in records if r["status"] != "success"] == []
    injected = sum(upstream.faults.values())
    assert injected > 0 and set(upstream.faults) <= {"500", "429", "reset"}
    assert sum(r.get("retries", 0) for r in records) == injected
    rows = _index(run)
    assert sum(r.get("retries", 0) for r in rows) == injected
    assert all(list(r).index("retries") > list(r).index("tokens") for r in rows if "retries" in r)


async def test_a_429_storm_lowers_in_flight_and_recovers(
    workspace: Path, env: dict[str, str], tmp_path: Path, upstream: FakeUpstream
) -> None:
    # 200 rollouts of about 0.2 s each at 4 in flight (the example server's capacity): the run
    # outlasts a 3 s storm and the seconds it takes to come back to 4.
    upstream.delay = 0.2
    upstream.retry_after = "1"
    config = fake_model_config(batch_size=4).replace("batch_size = 4", "batch_size = 4\nn = 20")
    write_config(workspace, "fake", config)

    async def storm_once_dispatching() -> None:
        # Starts when the first rollout's call arrives (the preflight is one call before it).
        while len(upstream.requests) < 2:
            await trio.sleep(0.01)
        upstream.rate_limit_for(3.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(storm_once_dispatching)
        result = await run_cli(
            [
                "eval",
                "run",
                "ws/configs/eval/fake.toml",
                "--name",
                "storm",
                "--rows",
                "0-9",
                "--yes",
            ],
            cwd=tmp_path,
            env=_env(env, upstream),
        )
    assert result.returncode == 0, result.stderr + result.stdout
    assert upstream.faults["429"] > 0
    out = result.stdout
    lowered = out.index("→ in flight lowered to ")
    assert "(upstream rate limits)" in out[lowered:].splitlines()[0]
    assert out.index("→ in flight back to 4") > lowered
    records = journal(run_dir(workspace, "storm"))
    assert len(records) == 200 and all(r["status"] == "success" for r in records)
    logs = (run_dir(workspace, "storm") / "logs.txt").read_text()
    assert "in flight lowered to" in logs and "in flight back to 4" in logs
