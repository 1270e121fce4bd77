"""CLI conventions a user notices: ``--version``, help for a bare group, usage errors (exit 2
with click's usage line), shell completion, the base install's one-line message, and the
announced concurrency cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import trio

from launcher.cli import main
from launcher.services import cap_notice

REPO = Path(__file__).resolve().parents[2]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--version")
    assert (code, err) == (0, "")
    assert out == f"rollbridge {metadata.version('rollbridge')}\n"


@pytest.mark.parametrize(
    ("args", "usage"),
    [((), "Usage: rollbridge [OPTIONS] COMMAND"), (("eval",), "Usage: rollbridge eval [OPTIONS]")],
)
def test_bare_group_prints_help_and_exits_0(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], usage: str
) -> None:
    code, out, err = _run(capsys, *args)
    assert (code, err) == (0, "")
    assert out.startswith(usage)
    assert "Commands:" in out and "Error" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "run", "c.toml", "--no-such-flag"], "Error: No such option '--no-such-flag'"),
        (
            ["eval", "run", "c.toml", "--max-in-flight", "many"],
            "Error: Invalid value for '--max-in-flight': 'many' is not a valid integer.",
        ),
        (["eval", "run"], "Error: Missing argument 'CONFIG'."),
        (["nosuch"], "Error: No such command 'nosuch'."),
    ],
)
def test_usage_errors_exit_2_with_the_usage_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = _run(capsys, *args)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert lines[0].startswith("Usage: rollbridge")
    assert lines[1].startswith("Try 'rollbridge") and lines[1].endswith(" --help' for help.")
    assert lines[2] == ""
    assert lines[3].startswith(message) and len(lines) == 4
    assert "Traceback" not in err


def test_usage_error_in_json_mode_is_an_envelope(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--json", "eval", "run", "c.toml", "--bogus")
    assert (code, err) == (2, "")
    envelope = json.loads(out)
    assert envelope["status"] == "error" and envelope["error"]["code"] == "VALIDATION"
    assert "No such option '--bogus'" in envelope["error"]["message"]


def test_an_error_that_is_not_a_usage_error_still_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "eval", "run", "configs/eval/nothere.toml", "--yes")
    assert code == 1
    assert err.startswith("Error: ") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "run", "c.toml", "--json", "--plain", "--yes"],
        ["--json", "eval", "run", "c.toml", "--plain"],
        ["eval", "list", "--json", "--plain"],
        ["--json", "eval", "list", "--plain"],
        ["--plain", "eval", "list", "--json"],
        ["--json", "--plain", "eval", "list"],
        ["--json", "--plain", "ctl", "list"],
        ["eval", "clean", "--json", "--plain", "--yes"],
        ["eval", "report", "r", "--json", "--plain"],
        ["eval", "diff", "a", "b", "--json", "--plain"],
        ["eval", "export", "r", "--json", "--plain"],
        ["eval", "merge", "a", "b", "-o", "m", "--json", "--plain"],
        ["eval", "upload", "r", "--json", "--plain"],
        ["eval", "rubric", "--run", "r", "-r", "x", "--json", "--plain"],
        # (a workspace that is not there, so that the command fails rather than serves
        # if the pair were let through)
        ["--plain", "daemon", "--json", "--workspace", "nowhere"],
        ["--plain", "bridge", "serve", "--json", "--model", "x", "--token", ""],
        ["--plain", "ctl", "watch", "r", "--json"],
    ],
)
def test_json_with_plain_is_a_usage_error_on_every_command(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
) -> None:
    # Neither mode wins silently (the reference refuses the pair too); nothing is run or written.
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, *args)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert lines[0].startswith("Usage: rollbridge")
    assert lines[-1] == (
        "Error: Conflicting output format selectors: json, plain. "
        "Choose at most one of --json or --plain."
    )
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_shell_completion_completes_commands_and_options() -> None:
    script = _cli(env={"_ROLLBRIDGE_COMPLETE": "bash_source"})
    assert script.returncode == 0 and "_rollbridge_completion()" in script.stdout
    words = _cli(
        env={
            "_ROLLBRIDGE_COMPLETE": "bash_complete",
            "COMP_WORDS": "rollbridge eval run c.toml --max",
            "COMP_CWORD": "4",
        }
    )
    assert words.stdout.split() == ["plain,--max-in-flight"]


# Item 1: the base install ---------------------------------------------------------------

_WITHOUT = (
    "import sys; sys.modules[{name!r}] = None; sys.argv = ['rollbridge', '--version']; "
    "from launcher.entry import main; main()"
)


@pytest.mark.parametrize("missing", ["rich", "click"])
def test_without_the_cli_extra_one_line_and_exit_2(missing: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT.format(name=missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: the rollbridge command needs the cli extra ({missing} is not installed): "
        "pip install 'rollbridge[cli]'\n"
    )


def test_an_import_error_of_the_project_itself_keeps_its_traceback() -> None:
    # `eval list` needs launcher.ui (``--version`` no longer does: the CLI imports lazily).
    code = _WITHOUT.format(name="launcher.ui").replace("'--version'", "'eval', 'list'")
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "rollbridge[cli]" not in result.stderr


def test_the_console_script_goes_through_the_shim() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["rollbridge"] == "launcher.entry:main"


@pytest.mark.slow
async def test_base_install_rollbridge_names_the_extra(tmp_path: Path) -> None:
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        pytest.skip("no uv binary next to the test interpreter")
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    with trio.fail_after(300):
        await trio.run_process([str(uv), "venv", "-q", "--python", sys.executable, str(venv)])
        await trio.run_process(
            [str(uv), "pip", "install", "-q", "--python", str(python), str(REPO)]
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        result = await trio.run_process(
            [str(venv / "bin" / "rollbridge"), "eval", "run", "x.toml"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=tmp_path,
            env=env,
        )
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert len(err.splitlines()) == 1 and "pip install 'rollbridge[cli]'" in err


# Item 6: the concurrency cap is announced -------------------------------------------------


def test_cap_notice() -> None:
    assert cap_notice(16, 8, 4) == (
        "--max-in-flight 16 is above the rollout server's capacity; running 4 rollouts at a time"
    )
    assert cap_notice(None, 8, 4) == (
        "evaluation.batch_size 8 is above the rollout server's capacity; "
        "running 4 rollouts at a time"
    )
    # The flag wins over batch_size, as in resolve_concurrency: within the capacity, no notice.
    assert cap_notice(2, 8, 4) is None
    assert cap_notice(None, 4, 4) is None
    assert cap_notice(16, None, None) is None
    assert cap_notice(None, None, 4) is None


def test_a_ctrl_c_while_the_cli_is_imported_exits_130_without_a_traceback() -> None:
    """The interrupt lands during ``import launcher.cli`` (here: a module it imports raises
    KeyboardInterrupt, as Python's SIGINT handler would), before the CLI takes over SIGINT."""
    code = (
        "import sys, types\n"
        "class Interrupting(types.ModuleType):\n"
        "    def __getattr__(self, name): raise KeyboardInterrupt\n"
        "sys.modules['launcher.cli'] = Interrupting('launcher.cli')\n"
        "sys.argv = ['rollbridge', 'eval', 'list']\n"
        "from launcher.entry import main; main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr
