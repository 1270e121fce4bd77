"""The live progress bar on a real terminal (a pty): Ctrl-C after some results leaves the last
frame at ``k/N … stopped``, not a bar stretched to ``k/k``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path

import pytest
import trio

from tests.fakes.upstream import FakeUpstream
from tests.launcher.e2e.helpers import (
    cli_argv,
    fake_model_config,
    journal,
    run_dir,
    server_record,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.slow

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _drain(master: int, sink: bytearray) -> None:
    """Read the pty until the child side closes (EIO), so the CLI never blocks on output."""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            return
        if not chunk:
            return
        sink.extend(chunk)


async def test_progress_line_after_ctrl_c_shows_the_true_count(
    workspace: Path,
    env: dict[str, str],
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    no_orphans: list[int],
) -> None:
    write_config(workspace, "slow", fake_model_config(batch_size=2))
    fake_upstream.delay = 0.4
    run = run_dir(workspace, "tty")
    master, slave = pty.openpty()
    # Wide enough that rich shows every column of the bar on one line.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 220, 0, 0))
    output = bytearray()
    reader = threading.Thread(target=_drain, args=(master, output), daemon=True)
    args = ["eval", "run", "ws/configs/eval/slow.toml", "--name", "tty", "--yes"]
    fake_env = {**env, "OPENAI_BASE_URL": fake_upstream.v1, "OPENAI_API_KEY": "sk-fake-pty"}
    fake_env.pop("PYTHONUNBUFFERED", None)
    try:
        process = await trio.lowlevel.open_process(
            cli_argv(*args),
            cwd=str(tmp_path),
            env={**fake_env, "TERM": "xterm-256color"},
            stdout=slave,
            stderr=slave,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(slave)
    reader.start()
    try:
        await wait_for(lambda: len(journal(run)) >= 3)
        record = server_record(run)
        if record is not None:
            no_orphans.append(record["pgid"])
        process.send_signal(signal.SIGINT)
        with trio.fail_after(60):
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        await trio.to_thread.run_sync(reader.join, 10)
        os.close(master)
    text = ANSI.sub("", output.decode(errors="replace"))
    assert code == 130, text
    done = len(journal(run))
    assert 3 <= done < 21
    frames = [f for f in text.replace("\r", "\n").splitlines() if "rollouts" in f and "/21" in f]
    assert frames, text
    final = frames[-1]
    assert f" {done}/21 " in final and "stopped" in final, final
    # No frame ever claimed the run was complete, neither k/k nor 21/21.
    assert not any(f" {done}/{done} " in f or " 21/21 " in f for f in frames), frames
    assert f"{done}/21 complete" in text  # the results table agrees
