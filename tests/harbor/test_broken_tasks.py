"""Broken tasks on the real test bed: each row fails fast, with its cause first.

A task whose container exits at start fails in seconds (not after Harbor's 90 s exec poll) with
the container's exit code and log; a task whose image does not build fails every row at once
with the build's error, built once; a task whose tests fail says their exit code and output,
and its trial is archived into the run and its Harbor dir removed, as a successful one's is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from rollout_server.backend import ExecutionRequest
from rollout_server.harbor import HarborBackend
from rollout_server.protocol import RolloutStatus
from tests.harbor.conftest import EXAMPLE
from tests.harbor.test_teardown import _trial_containers
from tests.launcher.e2e.helpers import journal, run_cli, run_dir

pytestmark = pytest.mark.usefixtures("testbed")


@pytest.fixture(autouse=True)
def _quiet_harbor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _task(tmp_path: Path, dockerfile: str) -> Path:
    task = tmp_path / "tasks" / "hello"
    shutil.copytree(EXAMPLE / "tasks" / "hello", task)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


def _request(rollout_id: str, tmp_path: Path) -> ExecutionRequest:
    return ExecutionRequest(
        id=rollout_id,
        prompt=[{"role": "user", "content": "Write hello to /app/answer.txt"}],
        rollout_dir=tmp_path / "rollouts" / rollout_id,
    )


EXITS = """FROM localhost/local/bookworm-harbor
WORKDIR /app
ENTRYPOINT ["sh", "-c", "echo dying on purpose >&2; exit 3"]
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("worker", [True, False], ids=["worker", "own-process"])
async def test_a_container_that_exits_at_start_fails_its_row_in_seconds(
    tmp_path: Path, worker: bool
) -> None:
    backend = HarborBackend(
        _task(tmp_path, EXITS),
        agent="oracle",
        concurrency=1,
        trials_root=tmp_path / "root",
        harbor_worker=worker,
    )
    rollout_id = f"exits{int(worker)}"
    try:
        # Harbor alone polls `exec true` for 90 s before it gives up on such a container.
        with trio.fail_after(60):
            outcome = await backend.execute(_request(rollout_id, tmp_path))
    finally:
        with trio.CancelScope(shield=True):
            await backend.shutdown()
    result = outcome.reported()
    assert result.status == RolloutStatus.FAILURE
    assert result.err_message == (
        f"the task's container exited with code 3 (trial-{rollout_id}__env_main_1); "
        "its log ends: dying on purpose"
    )
    assert _trial_containers(f"trial-{rollout_id}") == []
    # Archived like any trial (Harbor's log of it included), and its scratch removed.
    assert (tmp_path / "rollouts" / rollout_id / "harbor" / "trial.log").is_file()
    assert not (tmp_path / "root" / "trials" / f"trial-{rollout_id}").exists()


BROKEN_BUILD = """FROM localhost/local/bookworm-harbor
RUN echo "fatal: the thing is broken" >&2; exit 7
"""


@pytest.mark.timeout(300)
async def test_a_task_image_that_does_not_build_fails_every_row_with_its_cause(
    tmp_path: Path,
) -> None:
    backend = HarborBackend(
        _task(tmp_path, BROKEN_BUILD), agent="oracle", trials_root=tmp_path / "root"
    )
    try:
        with trio.fail_after(120):
            results = [
                (await backend.execute(_request(f"broken{row}", tmp_path))).reported()
                for row in range(2)
            ]
    finally:
        with trio.CancelScope(shield=True):
            await backend.shutdown()
    reasons = {result.err_message for result in results}
    assert [r.status for r in results] == [RolloutStatus.FAILURE] * 2
    assert reasons == {
        'task image build failed: building at STEP "RUN echo "fatal: the thing is broken" >&2; '
        'exit 7": while running runtime: exit status 7 (last output: fatal: the thing is broken)'
    }
    # Built once, by the backend: no row got as far as a Harbor trial (and its own build).
    assert not (tmp_path / "root" / "trials").exists()


FAILING_TESTS = """#!/bin/sh
echo "checking /app/answer.txt"
echo "AssertionError: expected hello, got $(cat /app/answer.txt)" >&2
exit 2
"""


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_containers_left")
async def test_failed_tests_say_their_exit_code_and_output_and_the_trial_is_archived(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    (harbor_workspace / "tasks" / "hello" / "tests" / "test.sh").write_text(FAILING_TESTS)
    args = ["eval", "run", "ws/configs/eval/oracle.toml", "--yes", "--name", "ft", "--rows", "0"]
    result = await run_cli(args, cwd=tmp_path, env=harbor_env, timeout=240)
    run = run_dir(harbor_workspace, "ft")
    (record,) = journal(run)
    assert record["status"] == "failed", result.stdout + result.stderr
    message = record["error"]["message"]
    assert message.startswith("RewardFileNotFoundError: "), message
    assert message.endswith(
        "(the task's tests exited with code 2; their output ends: checking /app/answer.txt | "
        "AssertionError: expected hello, got hello)"
    ), message
    # The failed trial is in the run, as a successful one is, and gone from the scratch dir.
    (trial,) = (run / "rollout_trials").iterdir()
    stdout = trial / "harbor" / "verifier" / "test-stdout.txt"
    assert "AssertionError: expected hello" in stdout.read_text()
    assert (trial / "harbor" / "result.json").is_file()
    root = Path(tempfile.gettempdir()) / f"rollbridge-harbor-{os.getuid()}"
    assert not (root / "trials" / f"trial-{trial.name}").exists()
    assert not (root / "staging" / trial.name).exists()
