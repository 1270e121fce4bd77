"""A rollout whose ``[tool.uv.sources]`` points at nothing is refused in one line, naming the
package and the entry, before ``uv sync`` runs (launcher.rollout_env)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from launcher.errors import DependencyError
from launcher.rollout_env import missing_path_sources, uv_sync

HEAD = '[project]\nname = "r"\nversion = "0"\ndependencies = ["rollbridge", "helper"]\n'


def _rollout(root: Path, sources: str) -> Path:
    rollout = root / "repo" / "ws" / "rollouts" / "echo"  # ../../../.. is root
    rollout.mkdir(parents=True)
    (rollout / "pyproject.toml").write_text(HEAD + sources)
    return rollout


def test_path_sources_that_hold_no_project_are_found(tmp_path: Path) -> None:
    project = tmp_path / "lib"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    wheel = tmp_path / "helper-0-py3-none-any.whl"
    wheel.write_bytes(b"")
    rollout = _rollout(
        tmp_path,
        "[tool.uv.sources]\n"
        'rollbridge = { path = "../../../..", editable = true }\n'
        'lib = { path = "../../../../lib" }\n'
        'helper = [{ path = "../../../../helper-0-py3-none-any.whl" },'
        ' { path = "../../gone", marker = "sys_platform == \'win32\'" }]\n'
        'other = { git = "https://example.invalid/x.git" }\n',
    )
    assert missing_path_sources(rollout) == [
        ("rollbridge", "../../../..", tmp_path.resolve()),
        ("helper", "../../gone", (tmp_path / "repo" / "ws" / "gone").resolve()),
    ]


@pytest.mark.parametrize(
    "text", ["", "[tool.uv]\npackage = false\n", "[tool.uv.sources\n", "[tool]\nuv = 1\n"]
)
def test_no_sources_or_a_file_uv_must_judge_is_not_refused_here(tmp_path: Path, text: str) -> None:
    assert missing_path_sources(_rollout(tmp_path, text)) == []
    assert missing_path_sources(tmp_path / "nowhere") == []


async def test_uv_sync_refuses_a_copied_example_s_source_before_running_uv(tmp_path: Path) -> None:
    rollout = _rollout(
        tmp_path, '[tool.uv.sources]\nrollbridge = { path = "../../../..", editable = true }\n'
    )
    with trio.fail_after(10), pytest.raises(DependencyError) as raised:
        await uv_sync(
            tmp_path / "no-uv-here",  # never run
            rollout,
            "echo",
            env={},
            sink=lambda line: None,
            logs_hint="logs.txt",
            redact=str,
        )
    where = await trio.Path(tmp_path).resolve()
    assert str(raised.value) == (
        "rollouts/echo/pyproject.toml takes rollbridge from the path '../../../..' "
        f"({where}) in [tool.uv.sources], where there is no Python project: "
        "remove that entry to use the running rollbridge's own wheel"
    )


UV = Path(sys.executable).parent / "uv"


async def _sync_empty(rollout: Path, env: dict[str, str]) -> list[str]:
    lines: list[str] = []
    with trio.fail_after(120):
        await uv_sync(
            UV,
            rollout,
            "echo",
            env=env,
            sink=lines.append,
            logs_hint="logs.txt",
            redact=lambda text: text,
        )
    return lines


@pytest.mark.slow
async def test_a_new_environment_gets_this_interpreter_when_path_has_none(tmp_path: Path) -> None:
    """uv finds interpreters on PATH (and downloads others): a machine whose one suitable Python
    runs rollbridge from outside PATH still gets its rollout environment, offline. A rollout
    this interpreter cannot run is left to uv (which, forbidden to download, says so)."""
    if not UV.is_file():
        pytest.skip("needs uv next to this interpreter (the cli extra)")
    here = ".".join(map(str, sys.version_info[:2]))
    env = {
        "PATH": str(tmp_path / "nothing"),
        "HOME": str(tmp_path),
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_OFFLINE": "1",
        "UV_PYTHON_INSTALL_DIR": str(tmp_path / "no-managed-pythons"),
    }
    fits = tmp_path / "fits"
    fits.mkdir()
    project = f'[project]\nname = "r"\nversion = "0"\nrequires-python = ">={here}"\n'
    (fits / "pyproject.toml").write_text(project)
    await _sync_empty(fits, env)
    assert f"version_info = {here}." in (fits / ".venv" / "pyvenv.cfg").read_text()
    beyond = tmp_path / "beyond"
    beyond.mkdir()
    (beyond / "pyproject.toml").write_text(project.replace(f">={here}", ">=3.99"))
    with pytest.raises(DependencyError, match=r"No interpreter found for Python >=3\.99"):
        await _sync_empty(beyond, env)
