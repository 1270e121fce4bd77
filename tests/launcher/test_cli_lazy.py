"""The CLI's subcommands from other modules load only when used: ``--help`` stays fast, and
lists each command as the command itself would."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from launcher.cli import _LazyGroup, cli

HEAVY = ("trio", "rich", "bridge", "httpx", "msgspec", "litellm", "launcher.ui")


def _lazy_groups() -> list[tuple[str, _LazyGroup]]:
    ctx = click.Context(cli)
    groups = [("rollbridge", cli)]
    eval_group = cli.get_command(ctx, "eval")
    assert isinstance(eval_group, _LazyGroup)
    groups.append(("rollbridge eval", eval_group))
    assert all(isinstance(group, _LazyGroup) for _, group in groups)
    return groups  # type: ignore[return-value]


@pytest.mark.parametrize("limit", [30, 45, 60, 100])
def test_listed_help_is_the_commands_own(limit: int) -> None:
    for path, group in _lazy_groups():
        for name, (_, listed) in group.lazy.items():
            command = group.get_command(click.Context(group), name)
            assert command is not None, f"{path} {name}"
            stub = click.Command(name, help=listed)
            assert stub.get_short_help_str(limit) == command.get_short_help_str(limit), (
                f"{path} {name}: the listing's help differs from the command's docstring"
            )


def test_help_imports_click_only() -> None:
    code = (
        "import sys\n"
        "from launcher.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "Commands:" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_lazy_command_runs_and_version_prints() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "eval", "list", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "Usage: rollbridge eval list" in result.stdout
    version = subprocess.run(
        [sys.executable, "-m", "launcher", "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0 and version.stdout.startswith("rollbridge ")
