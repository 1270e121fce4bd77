"""Upstream faults seen through the whole stack (fake OpenAI-compatible upstream, real bridge,
real rollout server): 500 and 429 answers, a slow model, and a fatal preflight."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstream
from tests.launcher.e2e.helpers import (
    fake_model_config,
    journal,
    metrics,
    run_cli,
    run_dir,
    write_config,
)

pytestmark = pytest.mark.slow

ROWS = "0-9"  # rows whose label is in the prompt: every one passes when the model answers


def _env(env: dict[str, str], upstream: FakeUpstream) -> dict[str, str]:
    return {**env, "OPENAI_BASE_URL": upstream.v1, "OPENAI_API_KEY": "sk-fake-faults-key"}


async def _run(
    workspace: Path,
    env: dict[str, str],
    tmp_path: Path,
    upstream: FakeUpstream,
    name: str,
    config: str | None = None,
) -> tuple[int, str, str]:
    write_config(workspace, "fake", config or fake_model_config(batch_size=1))
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/fake.toml", "--name", name, "--rows", ROWS, "--yes"],
        cwd=tmp_path,
        env=_env(env, upstream),
    )
    return result.returncode, result.stdout, result.stderr


async def test_upstream_500s_at_start_are_retried_by_the_preflight(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    # Issue 27 item 11: three 500s at start used to be one preflight warning and two retried
    # rollout calls; the preflight now retries them as a rollout call would, and passes.
    fake_upstream.fail_statuses = deque([500] * 3)
    code, out, err = await _run(workspace, env, tmp_path, fake_upstream, "e500")
    assert code == 0, err + out
    records = journal(run_dir(workspace, "e500"))
    assert len(records) == 10 and all(r["status"] == "success" for r in records)
    assert sum(r.get("retries", 0) for r in records) == 0
    assert metrics(run_dir(workspace, "e500"))["summary"]["passed"] == 10
    logs = (run_dir(workspace, "e500") / "logs.txt").read_text()
    retried = "WARNING [preflight] retrying the model preflight after a provider fault"
    assert logs.count(retried) == 3
    assert "INFO [preflight] model preflight passed" in logs


async def test_preflight_tolerates_429_and_rollouts_record_it(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    # The preflight tolerates the first 429; the second reaches a rollout, whose call the
    # bridge retries.
    fake_upstream.fail_statuses = deque([429, 429])
    code, out, err = await _run(workspace, env, tmp_path, fake_upstream, "e429")
    assert code == 0, err + out
    records = journal(run_dir(workspace, "e429"))
    assert sum(r["status"] == "success" for r in records) == 10
    assert sum(r.get("retries", 0) for r in records) == 1


async def test_slow_model_hits_the_agent_timeout(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    config = fake_model_config(batch_size=4).replace(
        "agent_workflow_timeout_s = 60", "agent_workflow_timeout_s = 0.3"
    )
    fake_upstream.delay = 1.0
    code, out, err = await _run(workspace, env, tmp_path, fake_upstream, "slow", config)
    assert code == 0, err + out
    records = journal(run_dir(workspace, "slow"))
    assert len(records) == 10
    assert {r["error_type"] for r in records} == {"timeout"}
    assert "error_type=timeout" in out


async def test_fatal_preflight_stops_before_any_dispatch(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    # The refusal comes late enough that the rollout server has usually started meanwhile
    # (it starts alongside the preflight): it must be stopped, and nothing dispatched.
    fake_upstream.delay = 1.5
    fake_upstream.fail_statuses = deque([401])
    fake_upstream.fail_body = '{"error": {"message": "bad key sk-fake-faults-key"}}'
    code, out, err = await _run(workspace, env, tmp_path, fake_upstream, "auth")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: model preflight failed for 'openai/fake-model': ")
    assert "sk-fake-faults-key" not in err + out
    run = run_dir(workspace, "auth")
    assert journal(run) == []
    assert not (run / "server.json").exists()
    logs = (run / "logs.txt").read_text()
    assert "dispatching rollout" not in logs
    assert metrics(run)["eval_run"]["status"] == "incomplete"


async def test_rollout_server_starts_while_a_slow_model_is_checked(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    # A model that takes 4 s per answer: the server is healthy before the preflight returns,
    # and the first dispatch still waits for the preflight.
    fake_upstream.delay = 4.0
    write_config(workspace, "fake", fake_model_config(batch_size=1))
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/fake.toml", "--name", "slowcheck", "--rows", "0", "--yes"],
        cwd=tmp_path,
        env=_env(env, fake_upstream),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    lines = (run_dir(workspace, "slowcheck") / "logs.txt").read_text().splitlines()

    def first(needle: str) -> int:
        return next(i for i, line in enumerate(lines) if needle in line)

    healthy = first("[server] rollout server healthy")
    passed = first("[preflight] model preflight passed")
    dispatched = first("[dispatch] dispatching rollout")
    assert healthy < passed < dispatched
