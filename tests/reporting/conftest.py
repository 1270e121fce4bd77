"""Fixtures for the report tests: real runs of the example workspace made with the real CLI
(session scoped: three runs for the whole module set) and the Chromium binary, if any.

``example_runs`` makes, in one copy of the example workspace: ``a`` (the example as it is),
``b`` (the same rows with the grader inverted: a reply containing the label now scores 0) and
``c`` (rows 0-9 only, to be refused by the diff).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launcher.e2e.conftest import shared_env
from tests.launcher.e2e.helpers import base_env, cli_argv, make_workspace, run_dir
from tests.reporting.cdp import chromium_path

__all__ = ["ExampleRuns", "chromium", "example_runs", "shared_env"]

CONFIG = "configs/eval/echo.toml"
GRADER_LINE = "ctx.set_reward(1.0 if label and label in text.lower() else 0.0)"
INVERTED_LINE = "ctx.set_reward(1.0 if label and label not in text.lower() else 0.0)"


@dataclass(frozen=True)
class ExampleRuns:
    """The workspace and the three run directories."""

    workspace: Path
    a: Path
    b: Path
    c: Path


def _run(ws: Path, env: dict[str, str], *args: str) -> None:
    proc = subprocess.run(
        cli_argv("eval", "run", CONFIG, "--yes", "--plain", *args),
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def example_runs(tmp_path_factory: pytest.TempPathFactory, shared_env: Path) -> ExampleRuns:
    """Three real runs of the example workspace (see the module docstring)."""
    ws = make_workspace(tmp_path_factory.mktemp("report-runs") / "ws")
    env = base_env(UV_PROJECT_ENVIRONMENT=str(shared_env))
    _run(ws, env, "--name", "a")
    main = ws / "rollouts" / "echo" / "main.py"
    source = main.read_text()
    assert GRADER_LINE in source, "the example grader changed; update this fixture"
    main.write_text(source.replace(GRADER_LINE, INVERTED_LINE))
    _run(ws, env, "--name", "b")
    main.write_text(source)
    _run(ws, env, "--name", "c", "--rows", "0-9")
    return ExampleRuns(ws, run_dir(ws, "a"), run_dir(ws, "b"), run_dir(ws, "c"))


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium binary; the test is skipped (with the install line) when there is none."""
    found = chromium_path()
    if found is None:
        reason = "chromium is not installed (apt-get install -y chromium)"
        print(f"SKIPPED: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return found
