"""Per-call records of a real run (``calls.jsonl``, docs/calls.md): one per call the provider
received, summing to the rows' and the run's totals, and exact after a ``kill -9`` and resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fakes.upstream import FakeUpstream
from tests.launcher.e2e.helpers import (
    count_log,
    fake_model_config,
    journal,
    metrics,
    run_cli,
    run_dir,
    server_record,
    start_cli,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.slow

TURNS = 3
ROWS = 21
DETAILS = {
    "prompt_tokens_details": {"cached_tokens": 4},
    "completion_tokens_details": {"reasoning_tokens": 2},
}
ONE_CALL = """        response = await chat(messages)
        reply = {"role": "assistant", "content": reply_text(response)}
        return AgentWorkflowOutput(messages=[*messages, reply])
"""
THREE_CALLS = f"""        for turn in range({TURNS}):
            if turn:
                messages.append(dict(ctx.prompt[-1]))
            response = await chat(messages, logprobs=turn == 0)
            messages.append({{"role": "assistant", "content": reply_text(response)}})
        return AgentWorkflowOutput(messages=messages, metrics={{"turns": {TURNS}}})
"""


def _multi_call_workspace(workspace: Path) -> None:
    main = workspace / "rollouts" / "echo" / "main.py"
    text = main.read_text()
    assert ONE_CALL in text
    main.write_text(text.replace(ONE_CALL, THREE_CALLS))


def _calls(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines()]


def _index(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "index.jsonl").read_text().splitlines()]


def _fake_env(env: dict[str, str], upstream: FakeUpstream) -> dict[str, str]:
    return {**env, "OPENAI_BASE_URL": upstream.v1, "OPENAI_API_KEY": "sk-fake-calls-key"}


async def test_every_call_the_provider_received_is_recorded_once(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    _multi_call_workspace(workspace)
    write_config(workspace, "multi", fake_model_config(batch_size=4))
    fake_upstream.usage_extra = DETAILS
    args = ["eval", "run", "ws/configs/eval/multi.toml", "--name", "calls", "--yes"]
    result = await run_cli(args, cwd=tmp_path, env=_fake_env(env, fake_upstream))
    assert result.returncode == 0, result.stderr + result.stdout
    run = run_dir(workspace, "calls")
    calls = _calls(run)
    rollout_calls = [c for c in calls if c["kind"] == "rollout"]
    # The preflight's probe is the one call of no rollout.
    assert [c["kind"] for c in calls if c["kind"] != "rollout"] == ["preflight"]
    assert len(calls) == len(fake_upstream.requests)
    assert len(rollout_calls) == ROWS * TURNS
    summary = metrics(run)["summary"]
    assert summary["calls"] == ROWS * TURNS
    assert summary["cached_tokens"] == 4 * ROWS * TURNS
    assert summary["reasoning_tokens"] == 2 * ROWS * TURNS
    assert summary["tokens_used"] == sum(c["total_tokens"] for c in rollout_calls)
    for row in _index(run):
        mine = [c for c in rollout_calls if c["rollout_id"] == row["rollout_id"]]
        assert [c["index"] for c in mine] == list(range(TURNS))
        assert row["calls"] == TURNS and row["cached_tokens"] == 4 * TURNS
        assert row["tokens"] == sum(c["total_tokens"] for c in mine)
        assert row["metrics"] == {"turns": TURNS}
    # The export carries each row's calls, the logprobs the rollout asked for included.
    exported = await run_cli(
        ["eval", "export", str(run), "-o", "-"], cwd=tmp_path, env=_fake_env(env, fake_upstream)
    )
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert len(rows) == ROWS
    for row in rows:
        first, *rest = row["call_records"]
        assert first["logprobs"]["token"][0] == "echo:" and first["cached_tokens"] == 4
        assert [c["logprobs"] for c in rest] == [None] * (TURNS - 1)
        assert row["cached_tokens"] == 4 * TURNS and row["reasoning_tokens"] == 2 * TURNS


async def test_kill_9_then_resume_keeps_each_acknowledged_call_once(
    workspace: Path,
    env: dict[str, str],
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    no_orphans: list[int],
) -> None:
    _multi_call_workspace(workspace)
    write_config(workspace, "multi", fake_model_config(batch_size=2))
    fake_upstream.delay = 0.1
    run_env = _fake_env(env, fake_upstream)
    args = ["eval", "run", "ws/configs/eval/multi.toml", "--name", "k9calls", "--yes"]
    run = run_dir(workspace, "k9calls")
    live = await start_cli(args, cwd=tmp_path, env=run_env, logdir=tmp_path / "first")
    await wait_for(lambda: count_log(run, "work item finished") >= 4)
    record = server_record(run)
    live.kill9()
    await live.wait()
    assert record is not None
    no_orphans.append(record["pgid"])
    acknowledged = {r["rollout_id"] for r in journal(run)}
    before = [c for c in _calls(run) if c["kind"] == "rollout"]
    # Every acknowledged result's calls were durable before it (possibly more: a group
    # whose journal lines the kill cut off, which the next open removes).
    for rollout_id in acknowledged:
        assert sum(c["rollout_id"] == rollout_id for c in before) == TURNS

    fake_upstream.delay = 0.0
    again = await run_cli(args, cwd=tmp_path, env=run_env)
    assert again.returncode == 0, again.stderr + again.stdout
    records = journal(run)
    assert len({(r["row_index"], r["run_index"]) for r in records}) == ROWS
    calls = [c for c in _calls(run) if c["kind"] == "rollout"]
    ids = [r["rollout_id"] for r in records]
    assert {c["rollout_id"] for c in calls} == set(ids)  # nothing of an unacknowledged attempt
    keys = [(c["rollout_id"], c["index"]) for c in calls]
    assert len(keys) == len(set(keys)) == TURNS * len(ids)  # and nothing twice
    assert metrics(run)["summary"]["calls"] == TURNS * ROWS


def _interop_python_or_skip() -> str:
    from tests.rollout_server.interop_env import NoPython312, interop_python

    try:
        return interop_python()
    except NoPython312 as exc:
        pytest.skip(f"the reference's run-directory check needs Python 3.12: {exc}")


CHECK = (
    "import sys; from pathlib import Path; "
    "from osmosis_ai.eval.local.upload import build_eval_upload_plan; "
    "build_eval_upload_plan(Path(sys.argv[1])); print('accepted')"
)


@pytest.mark.interop
async def test_the_reference_still_accepts_the_run_directory(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    """osmosis-ai 0.3.8's ``build_eval_upload_plan`` (what ``eval upload`` checks) accepts a
    run directory whose index rows carry the per-call totals and workflow metrics."""
    python = await trio.to_thread.run_sync(_interop_python_or_skip)
    _multi_call_workspace(workspace)
    write_config(workspace, "multi", fake_model_config(batch_size=4))
    fake_upstream.usage_extra = DETAILS
    args = ["eval", "run", "ws/configs/eval/multi.toml", "--name", "upload", "--yes"]
    result = await run_cli(args, cwd=tmp_path, env=_fake_env(env, fake_upstream))
    assert result.returncode == 0, result.stderr + result.stdout
    run = run_dir(workspace, "upload")
    assert _index(run)[0]["calls"] == TURNS and "metrics" in _index(run)[0]
    with trio.fail_after(120):
        checked = await trio.run_process(
            [python, "-c", CHECK, str(run)], capture_stdout=True, capture_stderr=True, check=False
        )
    assert checked.returncode == 0, checked.stderr.decode()
    assert checked.stdout.decode().strip() == "accepted"
