"""Real Harbor trials in real podman sandboxes, driven through the real ``rollbridge`` CLI.

Oracle (reward 1.0) and nop (reward 0.0, still a success) over the example's three rows; a
Ctrl-C while trials run (items stay pending, no container left); a ``kill -9`` of the supervisor
and its rollout server mid-trial, then a resume (containers reaped, every row finishes once).
Nothing here talks to anything but this machine: registries are blocked by the test bed and
Harbor's telemetry is off.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.harbor.conftest import labelled_containers
from tests.launcher.e2e.helpers import (
    count_log,
    journal,
    metrics,
    processes_in_group,
    run_cli,
    run_dir,
    server_record,
    start_cli,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("no_containers_left")


def _rewards(run: Path) -> list[tuple[str, float | None]]:
    return sorted((r["status"], r.get("reward")) for r in journal(run))


@pytest.mark.timeout(300)
async def test_oracle_three_rows_all_succeed(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/oracle.toml", "--yes", "--name", "oracle"],
        cwd=tmp_path,
        env=harbor_env,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run = run_dir(harbor_workspace, "oracle")
    assert _rewards(run) == [("success", 1.0)] * 3
    trials = sorted((run / "rollout_trials").iterdir())
    assert len(trials) == 3
    for trial in trials:
        assert (trial / "harbor" / "manifest.json").is_file()
        assert (trial / "harbor" / "result.json").is_file()
    # Successful trials leave no Harbor dir (nor staging dir) behind.
    root = Path(tempfile.gettempdir()) / f"rollbridge-harbor-{os.getuid()}"
    for trial in trials:
        assert not (root / "trials" / f"trial-{trial.name}").exists()
        assert not (root / "staging" / trial.name).exists()


@pytest.mark.timeout(300)
async def test_nop_scores_zero_but_succeeds(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/nop.toml", "--yes", "--name", "nop", "--rows", "0"],
        cwd=tmp_path,
        env=harbor_env,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert _rewards(run_dir(harbor_workspace, "nop")) == [("success", 0.0)]


@pytest.mark.timeout(400)
async def test_ctrl_c_cancels_trials_and_leaves_items_pending(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", "ws/configs/eval/oracle.toml", "--yes", "--name", "cc"]
    run = run_dir(harbor_workspace, "cc")
    live = await start_cli(args, cwd=tmp_path, env=harbor_env, logdir=tmp_path / "o")
    await wait_for(lambda: bool(labelled_containers()), timeout=120, interval=0.5)
    record = server_record(run)
    assert record is not None
    live.signal(signal.SIGINT)
    result = await live.wait(timeout=240)
    assert result.returncode == 130, result.stdout + result.stderr
    assert "interrupted: cancelling in-flight rollouts" in result.stdout
    assert not processes_in_group(record["pgid"])
    assert labelled_containers() == []
    assert journal(run) == []
    assert metrics(run)["eval_run"]["status"] == "incomplete"
    assert count_log(run, "rollout cancelled") == 2


@pytest.mark.timeout(600)
async def test_kill_9_mid_trial_then_resume_reaps_and_finishes_every_row_once(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", "ws/configs/eval/oracle.toml", "--yes", "--name", "k9"]
    run = run_dir(harbor_workspace, "k9")
    live = await start_cli(args, cwd=tmp_path, env=harbor_env, logdir=tmp_path / "first")
    await wait_for(lambda: bool(labelled_containers()), timeout=120, interval=0.5)
    record = server_record(run)
    assert record is not None
    # A crash of the whole tree: supervisor, rollout server and the trials' Harbor processes
    # all die without cleaning up, so the containers outlive every owner.
    trial_groups = _trial_groups(record["pid"])
    assert trial_groups
    live.kill9()
    for pgid in [record["pgid"], *trial_groups]:
        os.killpg(pgid, signal.SIGKILL)
    await live.wait(timeout=30)
    for pgid in [record["pgid"], *trial_groups]:
        await wait_for(lambda pgid=pgid: not processes_in_group(pgid), timeout=30)
    assert labelled_containers()

    again = await run_cli(args, cwd=tmp_path, env=harbor_env, timeout=400)
    assert again.returncode == 0, again.stdout + again.stderr
    records = journal(run)
    keys = [(r["row_index"], r["run_index"]) for r in records]
    assert len(keys) == len(set(keys)) == 3
    assert _rewards(run) == [("success", 1.0)] * 3
    # The new rollout server's start-up reaped the dead trials' containers by label.
    assert count_log(run, "harbor: reaped") == 1


def _trial_groups(server_pid: int) -> list[int]:
    """Process groups of the trial processes a rollout server started: its trial watchdogs, or
    its Harbor worker and the trials it forked (which share the worker's command line)."""
    groups = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        watchdog = [
            i
            for i, arg in enumerate(cmd)
            if arg.endswith(("harbor/_watchdog.py", "harbor/_forkserver.py"))
        ]
        if watchdog:
            at = watchdog[0]
            if cmd[at + 1 : at + 2] == [str(server_pid)]:
                with contextlib.suppress(ProcessLookupError):
                    groups.add(os.getpgid(proc.pid))
    return sorted(groups)


SEPARATE_TASK = """schema_version = "1.4"
artifacts = ["/app/answer.txt"]

[task]
name = "local/hello"

[agent]
timeout_sec = 120

[verifier]
timeout_sec = 60
environment_mode = "separate"

[environment]
network_mode = "public"
build_timeout_sec = 120
"""


@pytest.mark.timeout(300)
async def test_separate_verifier_container_gets_the_labels(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    task = harbor_workspace / "tasks" / "hello"
    (task / "task.toml").write_text(SEPARATE_TASK)
    (task / "tests" / "Dockerfile").write_text(
        "FROM localhost/local/bookworm-harbor\nCOPY . /tests/\n"
    )
    args = ["eval", "run", "ws/configs/eval/oracle.toml", "--yes", "--name", "sep", "--rows", "0"]
    live = await start_cli(args, cwd=tmp_path, env=harbor_env, logdir=tmp_path / "o")
    seen: set[str] = set()

    def finished() -> bool:
        seen.update(labelled_containers())
        return live.process.returncode is not None

    await wait_for(finished, timeout=240, interval=0.2)
    result = await live.wait(timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _rewards(run_dir(harbor_workspace, "sep")) == [("success", 1.0)]
    # Harbor gives a separate verifier no run-level overlay; the staged docker-compose.yaml
    # labels it anyway, so a sweep or a start-up reap can find it.
    assert any("__verifier__" in name for name in seen), seen
    assert any("__env" in name for name in seen), seen


@pytest.mark.timeout(300)
async def test_the_tasks_own_agent_timeout_stops_a_real_trial(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 27 item 14 end to end: the task says ``[agent] timeout_sec = 5``, the eval 300 s;
    the oracle's solution sleeps 120 s first, so only the task's own limit can end the row
    before that (as a timeout), and the rollout server says which limit applied."""
    task = harbor_workspace / "tasks" / "hello"
    toml = (task / "task.toml").read_text()
    assert "timeout_sec = 120" in toml
    (task / "task.toml").write_text(toml.replace("timeout_sec = 120", "timeout_sec = 5", 1))
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/sh\nsleep 120\necho hello > /app/answer.txt\n"
    )
    args = ["eval", "run", "ws/configs/eval/oracle.toml", "--yes", "--name", "to", "--rows", "0"]
    result = await run_cli(args, cwd=tmp_path, env=harbor_env, timeout=240)
    run = run_dir(harbor_workspace, "to")
    (record,) = journal(run)
    assert record["status"] == "failed", record
    assert record["error_type"] == "timeout", record
    assert "AgentTimeoutError" in record["error"]["message"], record
    assert record["error"]["phase"] == "agent", record
    note = (
        "task hello: the agent gets 5 s: its own [agent] timeout_sec is 5 s, "
        "the eval's agent_workflow_timeout_s 300 s; the shorter applies"
    )
    assert count_log(run, note) == 1, result.stdout + result.stderr
