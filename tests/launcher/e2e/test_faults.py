"""A run whose output disk fills up (issue 12, item 6), on a real tiny tmpfs.

The run ends with one line naming the file that could not be written and what to do, a
resume hint, ``metrics.json`` not left ``running``, a valid journal (no torn or duplicated
line) and private ``rollout_trials/``; once there is space again, the resume finishes the run.
Mounting needs root; otherwise the test is skipped.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from launcher.rundir.journal import replay_journal
from tests.launcher.e2e.helpers import metrics, run_cli, run_dir

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_ends_with_the_cause_and_the_run_resumes(
    workspace: Path, env: dict[str, str], tiny_disk: Path
) -> None:
    args = ["eval", "run", "configs/eval/echo.toml", "--yes", "--plain", "-o", str(tiny_disk)]
    result = await run_cli([*args, "--name", "full"], cwd=workspace, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output and "OSError" not in output.split("could not write")[0]
    run = tiny_disk / "full"
    stopped = [line for line in result.stdout.splitlines() if "could not write" in line]
    assert len(stopped) == 1, output
    assert stopped[0].startswith(f"Evaluation run stopped: could not write {run}/")
    assert stopped[0].endswith(": No space left on device; free space on that disk")
    assert f"Resume: rollbridge eval run configs/eval/echo.toml -o {tiny_disk} --name full" in (
        result.stdout
    )
    replay = replay_journal(run / "events.jsonl")
    assert replay.torn_bytes == 0
    keys = [(r.row_index, r.run_index) for r in replay.records]
    assert len(keys) == len(set(keys)) < 21
    if (run / "metrics.json").exists():
        assert metrics(run)["eval_run"]["status"] != "running"

    await trio.run_process(["mount", "-o", "remount,size=16m", str(tiny_disk)])
    resumed = await run_cli([*args, "--name", "full"], cwd=workspace, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert metrics(run)["eval_run"]["status"] == "finished"
    final = replay_journal(run / "events.jsonl")
    assert len(final.latest) == 21 and final.torn_bytes == 0


async def test_rollout_trials_are_private(workspace: Path, env: dict[str, str]) -> None:
    # docs/eval-run.md: everything under the run directory is 0600, directories 0700.
    result = await run_cli(
        ["eval", "run", "configs/eval/echo.toml", "--yes", "--plain", "--name", "modes"],
        cwd=workspace,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    trials = run_dir(workspace, "modes") / "rollout_trials"
    paths = [trials, *trials.rglob("*")]
    assert len(paths) > 21
    wrong = {
        str(path.relative_to(trials)): oct(mode)
        for path in paths
        if (mode := stat.S_IMODE(path.lstat().st_mode)) != (0o700 if path.is_dir() else 0o600)
    }
    assert not wrong
