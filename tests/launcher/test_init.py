"""``rollbridge init``: the scaffold, where its rollout finds rollbridge, and the SDK guide's
quick start followed literally in a temporary directory outside this repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.init import requirement, scaffold
from tests.launcher.e2e.helpers import base_env

REPO = Path(__file__).resolve().parents[2]


def test_the_rollout_names_rollbridge_never_a_path() -> None:
    assert requirement("9.9.9") == "rollbridge>=9.9.9"
    assert requirement() == f"rollbridge>={metadata.version('rollbridge')}"


def test_scaffold_files(tmp_path: Path) -> None:
    written = scaffold(tmp_path, "qa", "rollbridge>=9.9.9")
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "configs/eval/qa.toml",
        "data/qa.jsonl",
        "rollouts/qa/main.py",
        "rollouts/qa/pyproject.toml",
        ".gitignore",
    ]
    project = tomllib.loads((tmp_path / "rollouts/qa/pyproject.toml").read_text())
    assert project["project"]["dependencies"] == ["rollbridge>=9.9.9"]
    assert "sources" not in project["tool"]["uv"]
    config = tomllib.loads((tmp_path / "configs/eval/qa.toml").read_text())
    assert config["experiment"] == {
        "rollout": "qa",
        "entrypoint": "main.py",
        "model_path": "rollbridge/echo",
        "dataset": "qa.jsonl",
    }
    compile((tmp_path / "rollouts/qa/main.py").read_text(), "main.py", "exec")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_init_never_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(capsys, "init", "ws", "--rollout", "qa")
    assert code == 0
    assert out.splitlines()[-1] == (
        "Run it on the offline model: cd ws && rollbridge eval run configs/eval/qa.toml --yes"
    )
    main_py = tmp_path / "ws/rollouts/qa/main.py"
    main_py.write_text("# mine\n")
    code, _, err = _run(capsys, "init", "ws", "--rollout", "qa")
    assert code == 1 and err == (
        "Error: ws/configs/eval/qa.toml already exists; choose another DIR or --rollout\n"
    )
    assert main_py.read_text() == "# mine\n"
    code, _, _ = _run(capsys, "init", "ws", "--rollout", "second")  # a second rollout: fine
    assert code == 0 and (tmp_path / "ws/rollouts/second/main.py").is_file()
    code, _, err = _run(capsys, "init", "ws", "--rollout", "../x")
    assert code == 1 and err.startswith("Error: --rollout must be a lower-case name")
    code, _, err = _run(capsys, "init", "ws", "--rollout", "1abc")  # the rule says why
    assert code == 1 and "name that starts with a letter" in err


def _quick_start() -> list[str]:
    text = (REPO / "docs" / "rollout-sdk.md").read_text()
    block = re.search(r"runs this block line by line.*?```bash\n(.*?)```", text, re.S)
    assert block is not None, "the quick start block of docs/rollout-sdk.md is gone"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.slow
def test_the_sdk_guide_works_outside_the_repository(tmp_path: Path) -> None:
    home = tmp_path / "user"
    home.mkdir()
    assert not home.resolve().is_relative_to(REPO)
    bin_dir = Path(sys.executable).parent  # where `rollbridge` and `uv` are installed
    env = base_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("UV_PROJECT_ENVIRONMENT", None)
    script = "set -e\n" + "\n".join(_quick_start()) + "\n"
    result = subprocess.run(
        ["bash", "-c", script], cwd=home, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Evaluation run finished:" in result.stdout
    runs = [p for p in (home / "my-evals/.osmosis/evals").iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1
    summary = json.loads((runs[0] / "metrics.json").read_text())["summary"]
    assert (summary["total_samples"], summary["passed"]) == (4, 3)
