"""The daemon's state machine as docs/daemon.md states it, each end state with its cause
(issue 27 item 15): a run child killed by a signal is ``interrupted``, a run that failed to
start is ``failed`` with the CLI's error, a cancelled one says which stage."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest
import trio

from tests.daemon.helpers import pace, running_daemon, wait_state
from tests.launcher.e2e.helpers import run_cli

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/echo.toml"
ENDED = {"finished", "failed", "interrupted", "cancelled"}


async def test_a_killed_run_child_is_interrupted_with_its_cause(
    workspace: Path, env: dict[str, str]
) -> None:
    pace(workspace, 5.0)
    with trio.fail_after(180):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            body = {"config": CONFIG, "name": "killed", "max_in_flight": 2}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            running = await wait_state(client, "killed", {"running"})
            os.kill(running["pid"], signal.SIGKILL)
            doc = await wait_state(client, "killed", ENDED)
            assert doc["state"] == "interrupted", doc
            assert doc["cause"] == "the run's process was killed by SIGKILL"
            assert doc["returncode"] == -signal.SIGKILL
            assert "error" not in doc
            listed = (await client.get("/v1/runs", params={"state": "interrupted"})).json()
            assert [r["name"] for r in listed["runs"]] == ["killed"]
    # The killed run's rollout server is an orphan by design until the run is resumed (which
    # reaps it); this test does not resume, so it stops the orphan itself.
    _stop_processes_of(workspace)


def _stop_processes_of(workspace: Path) -> None:
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(workspace) in part for part in proc.info["cmdline"] or ()):
            with contextlib.suppress(psutil.Error):
                proc.kill()


async def test_a_run_that_failed_to_start_is_failed_with_the_error(
    workspace: Path, env: dict[str, str]
) -> None:
    main = workspace / "rollouts" / "echo" / "main.py"
    main.write_text("x = = 1\n")
    with trio.fail_after(180):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            answer = await client.post("/v1/runs", json={"config": CONFIG, "name": "broken"})
            doc = await wait_state(client, "broken", ENDED)
            assert doc["state"] == "failed", (answer.text, doc)
            assert doc["error"]["message"].startswith("rollout server failed to start")
            assert doc["cause"] == doc["error"]["message"]


async def test_a_cancelled_run_names_the_cancel_as_its_cause(
    workspace: Path, env: dict[str, str]
) -> None:
    pace(workspace, 3.0)
    with trio.fail_after(180):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            body = {"config": CONFIG, "name": "stopped", "max_in_flight": 2}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            await wait_state(client, "stopped", {"running"})
            await client.post("/v1/runs/stopped/cancel", json={"stage": 1})
            doc = await wait_state(client, "stopped", ENDED)
            assert doc["state"] == "cancelled"
            assert doc["cause"] == "cancelled through the daemon (stage 1)"


async def test_a_terminal_run_that_failed_to_start_is_failed_not_interrupted(
    workspace: Path, env: dict[str, str]
) -> None:
    (workspace / "rollouts" / "echo" / "main.py").write_text("x = = 1\n")
    with trio.fail_after(180):
        cli = await run_cli(
            ["eval", "run", CONFIG, "--name", "elsewhere", "--yes"], cwd=workspace, env=env
        )
        assert cli.returncode == 1
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            doc = (await client.get("/v1/runs/elsewhere")).json()
            assert doc["state"] == "failed", doc
            assert cli.stderr.strip().startswith("Error: " + doc["cause"])
            assert doc["cause"].startswith("rollout server failed to start")
