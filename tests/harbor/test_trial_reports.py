"""What a failed trial says, without the sandbox test bed: the compose shim's reports of a task
container that is not running and of the tests' exit code, the trial stopped as soon as the
first appears, the reasons built from them (scrubbed, bounded), a task image build that fails
once per server with its cause first, and Harbor's own failures put cause first.

Stand-ins play podman and Harbor; ``test_broken_tasks.py`` does the same with the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from rollout_server.backend import ExecutionOutcome, ExecutionRequest, ExecutionResult
from rollout_server.harbor import HarborBackend
from rollout_server.harbor.fastexec import install_compose_shim
from rollout_server.harbor.process import run_trial_process
from rollout_server.harbor.results import outcome_from_result, trial_outcome
from rollout_server.harbor.taskimage import TaskImageError, TaskImages, build_failure_cause
from rollout_server.harbor.trialreport import (
    CONTAINER_EXIT,
    REPORTS_ENV,
    VERIFIER_EXIT,
    container_exit,
    container_exit_outcome,
    with_verifier_detail,
)
from rollout_server.protocol import RolloutErrorCategory, RolloutStatus

GLOBALS = ["--in-pod=false", "--project-name", "trial-x__env", "-f", "a.yaml"]
CONTAINER = "trial-x__env_main_1"
BEARER = "rb-bearer-0123456789abcdef"
VERIFIER_RUN = "(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1"

# The state `container inspect` answers comes from $PODMAN_STATE; `logs` prints a line on each
# stream; `exec` exits with $PODMAN_EXEC_RC.
FAKE_PODMAN = """#!/bin/sh
echo "podman $*" >> "$PODMAN_LOG"
case "$1 $2" in
  "container inspect") [ -n "$PODMAN_STATE" ] || exit 125; echo "$PODMAN_STATE" ;;
  "logs --tail") echo "starting up"; echo "fatal: dying on purpose" >&2 ;;
  "exec --interactive") exit "${PODMAN_EXEC_RC:-0}" ;;
esac
exit 0
"""


def _shim(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    """The installed shim first on PATH, then the fake podman and a fake real podman-compose;
    the environment and the reports dir it names."""
    bin_dir = tmp_path / "harbor-bin"
    bin_dir.mkdir()
    for name, text in (("podman", FAKE_PODMAN), ("podman-compose", '#!/bin/sh\necho "real $*"\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    directory = install_compose_shim(tmp_path / "root", bin_dir)
    assert directory is not None
    reports = tmp_path / "reports"
    reports.mkdir()  # the backend's, in the trial's staging dir
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(directory), str(bin_dir), os.environ["PATH"]]),
        PODMAN_LOG=str(tmp_path / "podman.log"),
        **{REPORTS_ENV: str(reports)},
        **extra,
    )
    return env, reports


def _compose(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["podman-compose", *GLOBALS, *args], env=env, capture_output=True, timeout=30
    )


def _podman_calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "podman.log").read_text().splitlines()


def test_an_exec_into_an_exited_container_is_reported_once_with_its_code_and_log(
    tmp_path: Path,
) -> None:
    env, reports = _shim(tmp_path, PODMAN_STATE="exited 3")
    done = _compose(env, "exec", "-T", "main", "true")
    assert done.returncode == 125
    assert f"container {CONTAINER} is not running (exited, exit code 3)" in done.stderr.decode()
    report = json.loads((reports / CONTAINER_EXIT).read_text())
    assert report["container"] == CONTAINER
    assert (report["status"], report["exit_code"]) == ("exited", 3)
    assert "starting up" in report["log"] and "fatal: dying on purpose" in report["log"]
    # Harbor polls again: the first report stands, the log is not read twice, nothing is run.
    assert _compose(env, "exec", "-T", "main", "true").returncode == 125
    calls = _podman_calls(tmp_path)
    assert sum(c.startswith("podman logs") for c in calls) == 1
    assert not any(c.startswith("podman exec") for c in calls)


def test_a_container_that_never_started_is_reported_too(tmp_path: Path) -> None:
    env, reports = _shim(tmp_path, PODMAN_STATE="created 0")
    assert _compose(env, "exec", "-T", "main", "true").returncode == 125
    gone = container_exit(reports, [])
    assert gone is not None
    assert gone.reason().startswith("the task's container never started")


def test_a_container_harbor_stopped_itself_is_not_reported(tmp_path: Path) -> None:
    env, reports = _shim(tmp_path, PODMAN_STATE="exited 137")
    # A separate verifier's trial stops its main service, then execs into it once more.
    assert _compose(env, "stop", "main").stdout.decode().startswith("real ")
    assert _compose(env, "exec", "-T", "main", "chown", "-R", "0:0", "/logs").returncode == 125
    assert not (reports / CONTAINER_EXIT).exists()
    # Harbor's `down` before `up` marks the project too; `up` starts it afresh.
    assert _compose(env, "down", "--remove-orphans").stdout.decode().startswith("real ")
    assert _compose(env, "up", "-d").stdout.decode().startswith("real ")
    assert _compose(env, "exec", "-T", "main", "true").returncode == 125
    assert container_exit(reports, []) is not None


def test_nothing_is_written_once_the_trials_staging_dir_is_gone(tmp_path: Path) -> None:
    env, reports = _shim(tmp_path, PODMAN_STATE="exited 3")
    reports.rmdir()  # the trial ended: a Harbor process that outlived its server calls on
    assert _compose(env, "down", "--remove-orphans").returncode == 0
    assert _compose(env, "exec", "-T", "main", "true").returncode == 125
    assert not reports.exists()


def test_a_running_container_runs_the_exec_and_reports_nothing(tmp_path: Path) -> None:
    env, reports = _shim(tmp_path, PODMAN_STATE="running 0", PODMAN_EXEC_RC="4")
    assert _compose(env, "exec", "-T", "main", "sh", "-c", "exit 4").returncode == 4
    assert _podman_calls(tmp_path)[-1].startswith(f"podman exec --interactive {CONTAINER} sh")
    assert list(reports.iterdir()) == []
    # podman does not know the container: podman-compose resolves it, as before.
    unknown = dict(env, PODMAN_STATE="")
    assert _compose(unknown, "exec", "-T", "main", "true").stdout.decode().startswith("real ")


def test_the_tests_exit_code_is_reported_and_returned(tmp_path: Path) -> None:
    env, reports = _shim(tmp_path, PODMAN_STATE="running 0", PODMAN_EXEC_RC="2")
    done = _compose(env, "exec", "-T", "main", "bash", "-c", VERIFIER_RUN)
    assert done.returncode == 2
    assert json.loads((reports / VERIFIER_EXIT).read_text()) == {
        "container": CONTAINER,
        "exit_code": 2,
    }
    # Any other command is no test run: nothing reported.
    (reports / VERIFIER_EXIT).unlink()
    assert _compose(env, "exec", "-T", "main", "bash", "-c", "ls /tests").returncode == 2
    assert not (reports / VERIFIER_EXIT).exists()


def _reports(tmp_path: Path, **files: dict[str, object]) -> Path:
    reports = tmp_path / "reports"
    reports.mkdir(exist_ok=True)
    for name, document in files.items():
        (reports / f"{name.replace('_', '-')}.json").write_text(json.dumps(document))
    return reports


def test_the_container_exit_reason_comes_first_and_is_scrubbed(tmp_path: Path) -> None:
    reports = _reports(
        tmp_path,
        container_exit={
            "container": CONTAINER,
            "status": "exited",
            "exit_code": 3,
            "log": f"token {BEARER}\nfatal: dying on purpose\n",
        },
    )
    gone = container_exit(reports, [BEARER])
    assert gone is not None
    result = container_exit_outcome(gone, {"harbor_trial": "trial-x"}).reported()
    assert result.status == RolloutStatus.FAILURE
    assert result.err_category == RolloutErrorCategory.INTERNAL_ERROR
    assert result.err_message == (
        f"the task's container exited with code 3 ({CONTAINER}); its log ends: "
        "token [REDACTED] | fatal: dying on purpose"
    )
    assert result.extra_fields is not None
    assert result.extra_fields["failure"]["type"] == "ContainerExited"


def _graded_failure() -> ExecutionOutcome:
    ok = ExecutionResult(RolloutStatus.SUCCESS)
    failed = ExecutionResult(
        RolloutStatus.FAILURE,
        err_message="RewardFileNotFoundError: No reward file found",
        err_category=RolloutErrorCategory.AGENT_ERROR,
    )
    return ExecutionOutcome(ok, failed)


def test_a_failed_gradings_reason_ends_with_the_tests_code_and_output(tmp_path: Path) -> None:
    trial = tmp_path / "trial-x"
    (trial / "verifier").mkdir(parents=True)
    lines = [f"noise {i}" for i in range(200)] + [f"key={BEARER}", "AssertionError: not hello"]
    (trial / "verifier" / "test-stdout.txt").write_text("\n".join(lines) + "\n")
    reports = _reports(tmp_path, verifier_exit={"container": CONTAINER, "exit_code": 2})
    outcome = with_verifier_detail(_graded_failure(), trial, reports, [BEARER])
    reason = outcome.reported().err_message or ""
    assert reason.startswith("RewardFileNotFoundError: No reward file found (the task's tests ")
    assert "exited with code 2; their output ends: " in reason
    assert reason.endswith("key=[REDACTED] | AssertionError: not hello)")
    assert BEARER not in reason
    assert "noise 181" not in reason and "noise 182" in reason  # the last 20 lines only
    assert (outcome.reported().extra_fields or {})["harbor_verifier_exit_code"] == 2
    # A very long line is cut at the front, so the reason stays bounded.
    (trial / "verifier" / "test-stdout.txt").write_text("x" * 10_000 + " the end\n")
    long = with_verifier_detail(_graded_failure(), trial, reports, []).reported()
    assert len(long.err_message or "") < 2300 and (long.err_message or "").endswith(" the end)")


def test_a_successful_row_only_gets_the_exit_code_in_its_diagnostics(tmp_path: Path) -> None:
    trial = tmp_path / "trial-x"
    (trial / "verifier").mkdir(parents=True)
    (trial / "verifier" / "test-stdout.txt").write_text("ok\n")
    reports = _reports(tmp_path, verifier_exit={"container": CONTAINER, "exit_code": 1})
    success = ExecutionOutcome(ExecutionResult(RolloutStatus.SUCCESS))
    result = with_verifier_detail(success, trial, reports, []).reported()
    assert result.err_message is None
    assert result.extra_fields == {"harbor_verifier_exit_code": 1}


FAKE_HARBOR = """import signal, sys, time
from pathlib import Path
here = Path(sys.argv[0]).parent
def stop(*_):
    (here / "interrupted").write_text("SIGINT")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
(here / "trial-x").mkdir(exist_ok=True)
(here / "reports" / "container-exit.json").write_text("{}")
while True:
    time.sleep(1)
"""


async def test_a_trial_is_stopped_once_its_container_is_reported_gone(tmp_path: Path) -> None:
    harbor = tmp_path / "harbor.py"
    harbor.write_text(FAKE_HARBOR)
    (tmp_path / "reports").mkdir()
    config = tmp_path / "staging" / "trial-config.json"
    config.parent.mkdir()
    config.write_text("{}")
    with trio.fail_after(60):
        code = await run_trial_process(
            [sys.executable, str(harbor)],
            config,
            tmp_path / "harbor.log",
            dict(os.environ),
            tmp_path / "trial-x",
            grace=30,
            engine=None,
            stop_when=lambda: (tmp_path / "reports" / CONTAINER_EXIT).exists(),
        )
    assert (tmp_path / "interrupted").read_text() == "SIGINT"  # stopped, as a cancel would
    assert code is not None and code != 0
    assert (tmp_path / "trial-x").is_dir()  # kept: the caller archives it


RUN_FAILED = """fatal: the thing is broken
Error: building at STEP "RUN make": while running runtime: exit status 7
"""
PULL_FAILED = """time="2026-12-05T01:34:14Z" level=warning msg="Failed, retrying in 2s ... (1/3). Error: x"
Error: creating build container: initializing source docker://localhost/local/nope:latest: connection refused
"""


def test_the_cause_of_a_failed_build_is_podmans_error_and_the_steps_last_words() -> None:
    assert build_failure_cause(RUN_FAILED) == (
        'building at STEP "RUN make": while running runtime: exit status 7 '
        "(last output: fatal: the thing is broken)"
    )
    assert build_failure_cause(PULL_FAILED) == (
        "creating build container: initializing source docker://localhost/local/nope:latest: "
        "connection refused"
    )
    assert build_failure_cause("") == "the build printed nothing"
    assert len(build_failure_cause("Error: " + "y" * 5000)) == 400


# `image inspect` finds nothing, every `build` fails the way podman does (and is counted).
FAKE_ENGINE = """#!/bin/sh
echo "$*" >> "$ENGINE_LOG"
case "$1" in
  image) exit 1 ;;
  build) printf '%s' "$BUILD_OUTPUT" >&2; exit 7 ;;
esac
exit 0
"""


def _task(root: Path) -> Path:
    task = root / "tasks" / "broken"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM localhost/local/bookworm-harbor\n")
    (task / "task.toml").write_text('schema_version = "1.4"\n\n[task]\nname = "local/broken"\n')
    (task / "instruction.md").write_text("x\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\n")
    return task


@pytest.fixture
def failing_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``podman`` first on PATH whose builds fail; its calls go to the returned log."""
    bin_dir = tmp_path / "engine-bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(FAKE_ENGINE)
    (bin_dir / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ENGINE_LOG", str(tmp_path / "engine.log"))
    monkeypatch.setenv("BUILD_OUTPUT", RUN_FAILED)
    return tmp_path / "engine.log"


def _builds(log: Path) -> int:
    return sum(line.startswith("build ") for line in log.read_text().splitlines())


async def test_a_failed_task_image_build_is_remembered(
    tmp_path: Path, failing_engine: Path
) -> None:
    images = TaskImages("podman")
    task = _task(tmp_path)
    reasons = []
    with trio.fail_after(60):
        for _ in range(2):
            with pytest.raises(TaskImageError) as raised:
                await images.image_for(task)
            reasons.append(str(raised.value))
    assert reasons[0] == reasons[1] == f"task image build failed: {build_failure_cause(RUN_FAILED)}"
    assert _builds(failing_engine) == 1
    # An edited environment is another image: built afresh.
    (task / "environment" / "Dockerfile").write_text("FROM localhost/local/bookworm-harbor\n#\n")
    with trio.fail_after(60), pytest.raises(TaskImageError):
        await images.image_for(task)
    assert _builds(failing_engine) == 2


async def test_every_row_of_a_task_whose_image_fails_fails_at_once_with_the_cause(
    tmp_path: Path, failing_engine: Path
) -> None:
    backend = HarborBackend(
        _task(tmp_path),
        agent="oracle",
        trials_root=tmp_path / "root",
        harbor_command=[str(tmp_path / "no-harbor-runs")],
        reap_orphans=False,
        fast_exec=False,
        harbor_worker=False,
    )
    results = []
    with trio.fail_after(60):
        for row in range(3):
            request = ExecutionRequest(id=f"row{row}", prompt=[{"role": "user", "content": "x"}])
            results.append((await backend.execute(request)).reported())
    for result in results:
        assert result.status == RolloutStatus.FAILURE
        assert result.err_message == (
            'task image build failed: building at STEP "RUN make": while running runtime: '
            "exit status 7 (last output: fatal: the thing is broken)"
        )
    assert _builds(failing_engine) == 1
    assert not (tmp_path / "root" / "trials").exists()  # no trial was started


BUILD_MESSAGE = (
    "Docker compose command failed for environment hello. Command: podman-compose --in-pod=false "
    "--project-name trial-a__env -f /x/docker-compose.yaml build. Return code: 7. Stdout: "
    "STEP 1/3: FROM localhost/local/bookworm-harbor\nSTEP 3/3: RUN make\nfatal: the thing is "
    'broken\nError: building at STEP "RUN make": while running runtime: exit status 7\n. '
    "Stderr: None. "
)


def test_harbors_own_failed_build_is_reported_cause_first() -> None:
    result = {
        "trial_name": "trial-a",
        "environment_setup": {"started_at": "t"},
        "exception_info": {"exception_type": "RuntimeError", "exception_message": BUILD_MESSAGE},
    }
    reported = outcome_from_result(result, prompt=[], label=None, grade=True).reported()
    assert reported.err_message == (
        'task image build failed: building at STEP "RUN make": while running runtime: exit '
        "status 7 (last output: fatal: the thing is broken)"
    )
    assert reported.err_category == RolloutErrorCategory.INTERNAL_ERROR


def test_a_task_harbor_refuses_to_load_is_reported_cause_first(tmp_path: Path) -> None:
    log = tmp_path / "harbor.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "harbor/models/task/task.py", line 180, in _validate_tests\n'
        "    raise FileNotFoundError(\n"
        "FileNotFoundError: Task directory /t declares [environment].os = 'linux' but does not "
        "contain tests/test.sh.\n"
    )
    request = ExecutionRequest(id="a", prompt=[])
    result = trial_outcome(tmp_path / "trial-a", request, 1, log, [], None).reported()
    assert result.err_message == (
        "FileNotFoundError: Task directory /t declares [environment].os = 'linux' but does not "
        "contain tests/test.sh. (Harbor exited with code 1 before writing result.json)"
    )
