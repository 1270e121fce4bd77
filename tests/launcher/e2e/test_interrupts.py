"""Ctrl-C once and twice (real SIGINT to a real CLI process), SIGTERM, and a rollout server
that dies mid-run: the exit code, what stays pending, and no process left behind."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fakes.upstream import FakeUpstream
from tests.launcher.e2e.helpers import (
    bridge_child_pid,
    count_log,
    fake_model_config,
    journal,
    metrics,
    processes_in_group,
    run_cli,
    run_dir,
    server_record,
    start_cli,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.slow

# A workflow that ignores cancellation: the rollout server cannot finish its cleanup, so only a
# second Ctrl-C (5 s grace, then SIGKILL of the group) ends the run quickly.
STUBBORN = """
import trio
from rollout_server import AgentWorkflow, AgentWorkflowOutput, LocalBackend, serve


class Stubborn(AgentWorkflow):
    async def run(self, ctx):
        with trio.CancelScope(shield=True):
            await trio.sleep(600)
        return AgentWorkflowOutput(messages=[])


if __name__ == "__main__":
    serve(LocalBackend(workflow=Stubborn))
"""


def hang_rollout_calls(upstream: FakeUpstream) -> Callable[[], None]:
    """Make every model call except the preflight's ``hi`` hang; returns an undo function."""
    original = upstream._answer

    async def answer(request: dict[str, Any], send: Any) -> None:
        messages = request.get("messages") or [{}]
        if messages[-1].get("content") != "hi":
            await trio.sleep(600)
        await original(request, send)

    upstream._answer = answer  # type: ignore[method-assign]

    def undo() -> None:
        upstream._answer = original  # type: ignore[method-assign]

    return undo


def _fake_env(env: dict[str, str], upstream: FakeUpstream) -> dict[str, str]:
    return {**env, "OPENAI_BASE_URL": upstream.v1, "OPENAI_API_KEY": "sk-fake-interrupt-key"}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_one_interrupt_cancels_in_flight_and_leaves_them_pending(
    sig: int,
    workspace: Path,
    env: dict[str, str],
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    no_orphans: list[int],
) -> None:
    write_config(workspace, "slow", fake_model_config(batch_size=3))
    release = hang_rollout_calls(fake_upstream)
    secrets = tmp_path / "run.env"
    secrets.write_text("UNUSED_SETTING=1\n")
    args = ["eval", "run", "ws/configs/eval/slow.toml", "--name", "c1", "--yes"]
    args += ["--max-in-flight", "3", "--secrets-file", str(secrets)]
    run = run_dir(workspace, "c1")
    live = await start_cli(
        args, cwd=tmp_path, env=_fake_env(env, fake_upstream), logdir=tmp_path / "o"
    )
    # Three rollouts admitted and waiting on their model call.
    await wait_for(lambda: fake_upstream.in_flight >= 3)
    record = server_record(run)
    assert record is not None
    no_orphans.append(record["pgid"])
    live.signal(sig)
    result = await live.wait(timeout=60)
    assert result.returncode == 130, result.stderr + result.stdout
    assert (
        "interrupted: cancelling in-flight rollouts, press Ctrl-C again to exit now"
        in result.stdout
    )
    assert "Results (incomplete)" in result.stdout
    # How it ran is repeated: without the secrets file a resume would stop at a secret.
    assert (
        "Resume: rollbridge eval run ws/configs/eval/slow.toml --name c1 --max-in-flight 3 "
        f"--secrets-file {secrets}\n" in result.stdout
    )
    assert not (run / "server.json").exists()
    assert not processes_in_group(record["pgid"])
    assert journal(run) == []
    assert metrics(run)["eval_run"]["status"] == "incomplete"
    assert count_log(run, "rollout cancelled") == 3
    await wait_for(lambda: fake_upstream.in_flight == 0)

    release()
    resumed = await run_cli(args, cwd=tmp_path, env=_fake_env(env, fake_upstream))
    assert resumed.returncode == 0, resumed.stderr
    keys = [(r["row_index"], r["run_index"]) for r in journal(run)]
    assert len(keys) == len(set(keys)) == 21


async def test_second_interrupt_skips_the_long_wait_and_kills_the_server(
    workspace: Path, env: dict[str, str], tmp_path: Path, no_orphans: list[int]
) -> None:
    (workspace / "rollouts" / "echo" / "stubborn.py").write_text(STUBBORN)
    config = (workspace / "configs" / "eval" / "echo.toml").read_text()
    write_config(workspace, "stubborn", config.replace('"main.py"', '"stubborn.py"'))
    args = ["eval", "run", "ws/configs/eval/stubborn.toml", "--name", "c2", "--yes"]
    run = run_dir(workspace, "c2")
    live = await start_cli(args, cwd=tmp_path, env=env, logdir=tmp_path / "o")
    await wait_for(lambda: count_log(run, "dispatching rollout") >= 2)
    record = server_record(run)
    assert record is not None
    no_orphans.append(record["pgid"])
    live.signal(signal.SIGINT)
    await wait_for(lambda: count_log(run, "interrupted: cancelling") >= 1)
    live.signal(signal.SIGINT)
    # Without the second interrupt this would wait 120 s per rollout, then 330 s for the server.
    result = await live.wait(timeout=45)
    assert result.returncode == 130, result.stderr + result.stdout
    assert "second interrupt: exiting now" in result.stdout
    assert not processes_in_group(record["pgid"])
    assert not (run / "server.json").exists()
    assert journal(run) == []


@pytest.mark.parametrize(
    ("victim", "reason"),
    [
        ("server", "the rollout server exited with code -9"),
        ("bridge", "the LLM bridge process was killed by signal 9"),
    ],
)
async def test_a_dead_service_halts_dispatch(
    victim: str,
    reason: str,
    workspace: Path,
    env: dict[str, str],
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    no_orphans: list[int],
) -> None:
    write_config(workspace, "slow", fake_model_config(batch_size=2))
    fake_upstream.delay = 0.3
    args = ["eval", "run", "ws/configs/eval/slow.toml", "--name", "dead", "--yes"]
    run = run_dir(workspace, "dead")
    live = await start_cli(
        args, cwd=tmp_path, env=_fake_env(env, fake_upstream), logdir=tmp_path / "o"
    )
    await wait_for(lambda: count_log(run, "work item finished") >= 1)
    record = server_record(run)
    assert record is not None
    no_orphans.append(record["pgid"])
    if victim == "server":
        os.killpg(record["pgid"], signal.SIGKILL)
    else:
        bridge = bridge_child_pid(live.process.pid)
        assert bridge is not None
        os.kill(bridge, signal.SIGKILL)
    result = await live.wait(timeout=60)
    assert result.returncode == 1, result.stderr + result.stdout
    assert f"stopping dispatch: {reason}; see logs.txt" in result.stdout
    assert "Results (incomplete)" in result.stdout
    assert count_log(run, "halting dispatch") == 1
    done = journal(run)
    assert 1 <= len(done) < 21  # what finished before is kept
    assert metrics(run)["eval_run"]["status"] == "incomplete"
    assert not processes_in_group(record["pgid"])
