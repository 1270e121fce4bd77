"""A run that fails before its first record leaves no directory and no lock behind; a
directory that stays is named in the error; a rollout whose code cannot load is reported with
file, line and source line and is not retried on a new port."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launcher.e2e.helpers import run_cli, run_dir

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"


def _one_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: ") and "Traceback" not in stderr
    return lines[0]


def _evals(workspace: Path) -> Path:
    return workspace / ".osmosis" / "evals"


def _run_dirs(workspace: Path) -> list[str]:
    root = _evals(workspace)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _lock_files(workspace: Path) -> list[str]:
    locks = _evals(workspace) / ".locks"
    return sorted(p.name for p in locks.iterdir()) if locks.is_dir() else []


def _break_rollout(workspace: Path) -> None:
    main = workspace / "rollouts" / "echo" / "main.py"
    main.write_text("import os\n\nx = = 1\n")


async def test_syntax_error_is_reported_once_and_leaves_nothing(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _break_rollout(workspace)
    result = await run_cli(["eval", "run", CONFIG, "--yes"], cwd=tmp_path, env=env)
    assert result.returncode == 1
    line = _one_error(result.stderr)
    assert (
        "rollout server failed to start: SyntaxError: invalid syntax (main.py, line 3: x = = 1)"
        in line
    ), line
    assert _run_dirs(workspace) == [] and _lock_files(workspace) == []
    # The log moved out of the removed directory, and the error points at it.
    kept = list((_evals(workspace) / ".failed-starts").iterdir())
    assert len(kept) == 1 and f"Logs: ws/.osmosis/evals/.failed-starts/{kept[0].name}" in line
    log = kept[0].read_text()
    assert log.count("starting rollout server") == 1, log
    assert "retrying startup" not in log
    # Its own lines name the run's logs.txt, removed with the directory: its end says where
    # it went.
    assert log.endswith(
        f"moved to ws/.osmosis/evals/.failed-starts/{kept[0].name} when the "
        "run's directory, which held no record, was removed)\n"
    ), log[-300:]


async def test_import_error_names_the_importing_line(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    main = workspace / "rollouts" / "echo" / "main.py"
    lines = main.read_text().splitlines()
    line_no = next(i for i, text in enumerate(lines) if text.startswith("from __future__")) + 2
    lines.insert(line_no - 1, "import nothere_at_all")
    main.write_text("\n".join(lines) + "\n")
    result = await run_cli(["eval", "run", CONFIG, "--yes"], cwd=tmp_path, env=env)
    assert result.returncode == 1
    line = _one_error(result.stderr)
    assert (
        "rollout server failed to start: ModuleNotFoundError: No module named 'nothere_at_all' "
        f"(main.py, line {line_no}: import nothere_at_all)" in line
    ), line
    assert _run_dirs(workspace) == [] and _lock_files(workspace) == []


async def test_missing_yes_leaves_no_run_directory(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    for args in (["eval", "run", CONFIG], ["eval", "run", CONFIG, "--name", "asked"]):
        result = await run_cli(args, cwd=tmp_path, env=env)
        assert result.returncode == 1
        assert _one_error(result.stderr) == "Error: Use --yes to confirm in non-interactive mode."
        assert _run_dirs(workspace) == [] and _lock_files(workspace) == []


async def test_a_named_or_existing_run_is_kept_and_named(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _break_rollout(workspace)
    first = await run_cli(["eval", "run", CONFIG, "--yes", "--name", "keep"], cwd=tmp_path, env=env)
    assert first.returncode == 1
    line = _one_error(first.stderr)
    assert "SyntaxError: invalid syntax (main.py, line 3: x = = 1)" in line
    assert "Logs: ws/.osmosis/evals/keep/logs.txt" in line
    assert line.endswith("(run 'keep' kept: resume with --name keep)"), line
    # The existing directory, refused later (no --yes), is never removed.
    again = await run_cli(["eval", "run", CONFIG, "--name", "keep"], cwd=tmp_path, env=env)
    assert again.returncode == 1
    assert _one_error(again.stderr).endswith("(run 'keep' kept: resume with --name keep)")
    assert _run_dirs(workspace) == ["keep"] and _lock_files(workspace) == ["keep.lock"]
    assert (run_dir(workspace, "keep") / "manifest.json").is_file()
