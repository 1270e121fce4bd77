"""An interactive terminal (a real pty): the confirmation prompt, the live progress bar, and the
"start a new run?" offer for a name that is already complete."""

from __future__ import annotations

import os
import pty
import re
from pathlib import Path

import pytest
import trio

from tests.launcher.e2e.helpers import cli_argv, journal, run_dir

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """The CLI on a pseudo-terminal: read what it shows, type answers."""

    def __init__(self, process: trio.Process, master: trio.lowlevel.FdStream) -> None:
        self.process = process
        self.master = master
        self.screen = ""

    async def expect(self, text: str, timeout: float = 60.0) -> None:
        with trio.fail_after(timeout):
            while text not in _ANSI.sub("", self.screen):
                try:
                    chunk = await self.master.receive_some(65536)
                except (OSError, trio.BrokenResourceError):  # EIO: the terminal closed
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{text!r} never appeared in:\n{self.screen}")
                self.screen += chunk.decode("utf-8", "replace")

    async def type(self, text: str) -> None:
        await self.master.send_all(text.encode())

    async def finish(self, timeout: float = 60.0) -> int:
        with trio.fail_after(timeout):
            while True:
                try:
                    chunk = await self.master.receive_some(65536)
                except (OSError, trio.BrokenResourceError):
                    break
                if not chunk:
                    break
                self.screen += chunk.decode("utf-8", "replace")
            return await self.process.wait()


async def open_terminal(args: list[str], cwd: Path, env: dict[str, str]) -> Terminal:
    master, slave = pty.openpty()
    try:
        process = await trio.lowlevel.open_process(
            cli_argv(*args),
            cwd=str(cwd),
            env={**env, "TERM": "xterm", "COLUMNS": "120"},
            stdin=slave,
            stdout=slave,
            stderr=slave,
        )
    finally:
        os.close(slave)
    return Terminal(process, trio.lowlevel.FdStream(master))


async def test_confirmation_progress_bar_and_new_run_offer(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    term = await open_terminal(["eval", "run", CONFIG, "--name", "tty"], tmp_path, env)
    await term.expect("21 rollouts x model rollbridge/echo — continue? [y/N]")
    await term.type("y\n")
    assert await term.finish() == 0, term.screen
    screen = _ANSI.sub("", term.screen)
    assert "rollouts" in screen and "━" in screen and "21/21" in screen
    assert "Evaluation run finished" in screen
    original = journal(run_dir(workspace, "tty"))
    assert len(original) == 21

    term = await open_terminal(["eval", "run", CONFIG, "--name", "tty"], tmp_path, env)
    await term.expect("run 'tty' already has all 21 results — start a new run? [Y/n]")
    await term.type("\n")
    await term.expect("tty is complete and stays untouched; starting new run '")
    await term.expect("continue? [y/N]")
    await term.type("n\n")
    assert await term.finish() == 0, term.screen
    assert "Cancelled." in term.screen
    assert journal(run_dir(workspace, "tty")) == original
    # The declined new run recorded nothing, so it leaves no directory and no lock behind.
    evals = workspace / ".osmosis" / "evals"
    runs = [p.name for p in evals.iterdir() if not p.name.startswith(".")]
    assert runs == ["tty"]
    assert [p.name for p in (evals / ".locks").iterdir()] == ["tty.lock"]
