"""A piece of a secret in a crashing rollout server's last output lines never reaches the
one-line error or ``logs.txt`` (the retry warning, the run's error): each embedded child line
is redacted as a line, a secret's piece at its edges included."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from launcher.errors import LocalEvalError
from launcher.redact import Redactor
from launcher.rollout_child import ServerLaunch, code_error, start_rollout_server
from launcher.rundir.logs import RunLog

SECRET = "Xq7Lm2Kp9Zr3Np9Rs2Tv5W"  # 21 characters: 9 on one line, 12 on the next
# The rollout's module, failing at import with the secret (from its environment) in two lines.
CRASH = (
    "import os\nt = os.environ['ROLLOUT_TOKEN']\nraise {error}('token ' + t[:9] + '\\n' + t[9:])\n"
)


def _launch(tmp_path: Path, source: str) -> ServerLaunch:
    rollout_dir = tmp_path / "rollout"
    rollout_dir.mkdir()
    entrypoint = rollout_dir / "main.py"
    entrypoint.write_text(source)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return ServerLaunch(
        python=Path(sys.executable),
        entrypoint=entrypoint,
        rollout_dir=rollout_dir,
        run_dir=run_dir,
        base_env={"PATH": "/usr/bin:/bin"},
        secrets={"ROLLOUT_TOKEN": SECRET},
    )


async def _start(tmp_path: Path, source: str) -> tuple[str, str]:
    """The error a start of a server running ``source`` ends with, and ``logs.txt``."""
    redactor = Redactor([SECRET])
    launch = _launch(tmp_path, source)
    logs = tmp_path / "logs.txt"
    with RunLog(logs, redactor) as log, trio.fail_after(60):

        def sink(line: str) -> None:  # as the run's sink for the server's output
            log.info("rollout-server", line)

        def log_line(level: str, step: str, message: str, details: dict[str, Any] | None) -> None:
            log.log(level, step, message, details)

        async with trio.open_nursery() as nursery:
            with pytest.raises(LocalEvalError) as raised:
                await start_rollout_server(
                    nursery,
                    launch,
                    sink=sink,
                    log=log_line,
                    stage=lambda _: None,
                    redact=redactor,
                )
            nursery.cancel_scope.cancel()
        log.error("run", str(raised.value))
    return str(raised.value), logs.read_text()


def _assert_no_piece(text: str) -> None:
    for piece in (SECRET[:9], SECRET[9:], SECRET):
        assert piece not in text


async def test_a_secret_split_over_the_last_lines_of_a_crash(tmp_path: Path) -> None:
    error, logs = await _start(tmp_path, CRASH.format(error="RuntimeError"))
    assert "before becoming healthy: [REDACTED]" in error
    assert "retrying startup on a new port" in logs
    assert "ERROR [run]" in logs
    _assert_no_piece(error)
    _assert_no_piece(logs)


async def test_a_secret_split_in_a_code_error(tmp_path: Path) -> None:
    error, logs = await _start(tmp_path, CRASH.format(error="ImportError"))
    assert "rollout server failed to start: ImportError: token [REDACTED]" in error
    _assert_no_piece(error)
    _assert_no_piece(logs)


def test_code_error_reads_redacted_lines() -> None:
    """The parse still finds the error in lines already redacted."""
    lines = [
        "Traceback (most recent call last):",
        '  File "/r/main.py", line 1, in <module>',
        "ImportError: token [REDACTED]",
    ]
    assert code_error(lines, Path("/r")) == "ImportError: token [REDACTED] (main.py, line 1)"
