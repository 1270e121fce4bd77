"""Shell completion (docs/eval-run.md, *Shell completion*): path arguments hand the shell back
its file or directory completion (click offers nothing at all for a plain ``str`` argument), and
arguments that take a run complete the workspace's run names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.shell_completion import ShellComplete

from launcher.cli import cli
from tests.launcher.test_runs import make_run, ok


def _complete(args: list[str], incomplete: str) -> list[tuple[str, str]]:
    shell = ShellComplete(cli, {}, "rollbridge", "_ROLLBRIDGE_COMPLETE")
    return [(c.type, c.value) for c in shell.get_completions(args, incomplete)]


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / ".osmosis" / "evals"
    make_run(root, "alpha-run", records=[ok(0)])
    make_run(root, "alpha-two")
    make_run(root, "beta")
    (root / "alpha-run.archive-20260101").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["eval", "run"], "file"),
        (["eval", "run", "c.toml", "--dataset-file"], "file"),
        (["eval", "run", "c.toml", "--secrets-file"], "file"),
        (["eval", "run", "c.toml", "-o"], "dir"),
        (["eval", "list", "-o"], "dir"),
        (["init"], "dir"),
        (["eval", "report", "r", "-o"], "file"),
        (["ctl", "start"], "file"),
    ],
)
def test_path_arguments_complete_paths(ws: Path, args: list[str], kind: str) -> None:
    assert _complete(args, "con") == [(kind, "con")]


def test_run_arguments_complete_run_names(ws: Path) -> None:
    assert _complete(["eval", "report"], "alp") == [("plain", "alpha-run"), ("plain", "alpha-two")]
    assert _complete(["eval", "diff", "alpha-run"], "b") == [("plain", "beta")]
    assert _complete(["eval", "export"], "") == [
        ("plain", "alpha-run"),
        ("plain", "alpha-two"),
        ("plain", "beta"),
    ]
    assert _complete(["eval", "rubric", "--run"], "be") == [("plain", "beta")]
    # A path, or no run of that name: the shell's own file names (a run directory works too).
    assert _complete(["eval", "report"], "./x") == [("file", "./x")]
    assert _complete(["eval", "report"], "zeta") == [("file", "zeta")]


def test_run_names_outside_a_workspace_fall_back_to_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _complete(["eval", "report"], "a") == [("file", "a")]


def test_the_documented_bash_completion_offers_files(ws: Path) -> None:
    env = {
        **os.environ,
        "_ROLLBRIDGE_COMPLETE": "bash_complete",
        "COMP_WORDS": "rollbridge eval run configs/",
        "COMP_CWORD": "3",
    }
    done = subprocess.run(
        [sys.executable, "-m", "launcher"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines() == ["file,configs/"]
