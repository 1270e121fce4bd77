"""The long-lived Harbor worker (``rollout_server/harbor/forkserver.py``), against a stand-in
``harbor.cli.main`` (so these run without the sandbox test bed): each trial is a forked process
of its own, with its own log, environment, directory and session; cancelling stops its group;
closing the worker stops its trials."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest
import trio

from rollout_server.harbor.forkserver import HarborWorker, WorkerUnavailable

FAKE_MAIN = """
import os, signal, sys, time

def app(prog_name=None):
    args = sys.argv[1:]
    print("argv", args, "cwd", os.getcwd(), "token", os.environ.get("TRIAL_TOKEN"), flush=True)
    print("sid", os.getsid(0) == os.getpid(), "pythonpath", os.environ.get("PYTHONPATH"), flush=True)
    if args[:1] == ["sleep"]:
        with open(args[1], "w") as handle:
            handle.write(str(os.getpid()))
        try:
            time.sleep(300)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    sys.exit(int(args[0]) if args and args[0].isdigit() else 0)
"""


@pytest.fixture
def fake_harbor(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``harbor.cli.main`` is the stand-in above."""
    package = tmp_path / "fake" / "harbor" / "cli"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(FAKE_MAIN)
    return dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))


def _worker(env: dict[str, str]) -> HarborWorker:
    return HarborWorker(Path(sys.executable), env, grace=10.0)


async def test_each_trial_is_its_own_process_with_its_log_env_and_exit_code(
    fake_harbor: dict[str, str], tmp_path: Path
) -> None:
    worker = _worker(fake_harbor)
    with trio.fail_after(60):
        try:
            codes: dict[int, int | None] = {}

            async def one(index: int) -> None:
                cwd = tmp_path / f"cwd{index}"
                cwd.mkdir()
                env = dict(fake_harbor, TRIAL_TOKEN=f"t{index}")
                codes[index] = await worker.run([str(index)], env, cwd, tmp_path / f"{index}.log")

            # At once: the requests share the worker's pipe.
            async with trio.open_nursery() as nursery:
                for index in range(4):
                    nursery.start_soon(one, index)
        finally:
            await worker.aclose()
    assert codes == {0: 0, 1: 1, 2: 2, 3: 3}
    for index in range(4):
        log = (tmp_path / f"{index}.log").read_text()
        assert f"argv ['{index}'] cwd {tmp_path / f'cwd{index}'} token t{index}" in log
        assert "sid True" in log
        assert oct((tmp_path / f"{index}.log").stat().st_mode & 0o777) == "0o600"


async def test_cancel_interrupts_the_trials_group(
    fake_harbor: dict[str, str], tmp_path: Path
) -> None:
    worker = _worker(fake_harbor)
    marker = tmp_path / "pid"
    log = tmp_path / "t.log"
    with trio.fail_after(60):
        try:
            with trio.CancelScope() as scope:

                async def cancel_when_running() -> None:
                    while not marker.exists() or not marker.read_text():
                        await trio.sleep(0.05)
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_when_running)
                    await worker.run(["sleep", str(marker)], fake_harbor, tmp_path, log)
            assert scope.cancelled_caught
        finally:
            await worker.aclose()
    pid = int(marker.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "interrupted" in log.read_text()


async def test_closing_the_worker_stops_its_trials(
    fake_harbor: dict[str, str], tmp_path: Path
) -> None:
    worker = _worker(fake_harbor)
    marker = tmp_path / "pid"
    outcome: list[int | None] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def trial() -> None:
                outcome.append(
                    await worker.run(["sleep", str(marker)], fake_harbor, tmp_path, tmp_path / "l")
                )

            nursery.start_soon(trial)
            while not marker.exists() or not marker.read_text():
                await trio.sleep(0.05)
            # What the owner's death looks like to the worker: its stdin closes.
            await worker.aclose()
    # The worker stopped the trial on its way out; its exit code went with the worker.
    assert outcome == [None]
    pid = int(marker.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(WorkerUnavailable):
        await worker.run(["0"], fake_harbor, tmp_path, tmp_path / "late.log")


async def test_a_worker_that_cannot_import_harbor_still_reports_ready_then_trials_fail_alone(
    tmp_path: Path,
) -> None:
    # No harbor package at all: the worker starts (imports are best effort) and the trial's
    # own process fails with its traceback in its log; the worker stays usable.
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    worker = _worker(env)
    with trio.fail_after(60):
        try:
            code = await worker.run(["0"], env, tmp_path, tmp_path / "a.log")
            again = await worker.run(["0"], env, tmp_path, tmp_path / "b.log")
        finally:
            await worker.aclose()
    assert code == again == 1
    assert "ModuleNotFoundError" in (tmp_path / "a.log").read_text()
