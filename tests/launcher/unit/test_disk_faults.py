"""A full disk or an I/O error while a run writes its directory (issue 12, item 6).

``os.write``/``os.fsync`` are made to fail with ENOSPC: ``logs.txt`` never raises into its
caller and never keeps a torn line, the journal keeps only whole lines, and ``finalize``
returns the results it has (naming the file that failed) instead of raising.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import trio

from launcher.errors import CLIError, LocalEvalError
from launcher.redact import Redactor
from launcher.rundir.journal import replay_journal
from launcher.rundir.logs import RunLog

from .test_rundir import open_rd, record, selection

_REAL_WRITE = os.write


def _enospc(*_: object) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_log_line_that_cannot_be_written_never_raises_nor_tears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "logs.txt"
    echoed: list[str] = []
    log = RunLog(path, Redactor(), echo=echoed.append)
    log.info("run", "first line")
    calls = {"n": 0}

    def half_then_enospc(fd: int, data: bytes) -> int:
        # The disk fills in the middle of a line: half of it lands, then ENOSPC.
        calls["n"] += 1
        if calls["n"] == 1:
            return _REAL_WRITE(fd, bytes(data)[: len(data) // 2])
        return _enospc()

    monkeypatch.setattr(os, "write", half_then_enospc)
    log.error("dispatch", "halting dispatch", {"reason": "disk full"})
    monkeypatch.undo()
    assert echoed[-1].endswith('halting dispatch {"reason":"disk full"}')
    assert log.write_failure is not None and log.write_failure.path == path
    assert "No space left on device" in log.write_failure.cause()
    # Space is back: later lines are written again, each whole.
    log.info("run", "after")
    log.close()
    text = path.read_text()
    assert text.endswith("\n")
    assert [line.split(" ", 3)[3] for line in text.splitlines()] == ["first line", "after"]


def test_closing_a_log_whose_close_fails_does_not_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = RunLog(tmp_path / "logs.txt", Redactor())
    real_close = os.close
    fd = log._fd

    def failing_close(descriptor: int) -> None:
        real_close(descriptor)
        if descriptor == fd:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "close", failing_close)
    log.close()


async def test_finalize_on_a_full_disk_returns_the_results_and_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0))
        await rd.record_result(record(1, 0, status="failed", reward=None))
    monkeypatch.setattr(os, "write", _enospc)
    monkeypatch.setattr(os, "fsync", _enospc)
    result = rd.finalize(cancelled=False)
    monkeypatch.undo()
    rd.close()
    assert (result.recorded, result.succeeded, result.failed) == (2, 1, 1)
    assert not result.complete
    assert result.write_failure is not None
    assert result.write_failure.path.parent == rd.path
    assert result.write_failure.error.errno == errno.ENOSPC
    cause = result.write_failure.cause()
    assert cause == (
        f"could not write {result.write_failure.path}: No space left on device; "
        "free space on that disk"
    )
    assert result.summary["completed_samples"] == 2


async def test_finalize_rewrites_metrics_in_place_when_no_new_file_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0))
    assert json.loads((rd.path / "metrics.json").read_text())["eval_run"]["status"] == "running"
    real_temp_dir = rd.path

    def no_new_files(*args: object, **kwargs: object) -> tuple[int, str]:
        # A full disk: a new file's first block cannot be had, an existing file's blocks can.
        raise OSError(errno.ENOSPC, "No space left on device", str(real_temp_dir))

    monkeypatch.setattr("launcher.rundir.atomic._open_temp", no_new_files)
    result = rd.finalize(cancelled=False)
    monkeypatch.undo()
    rd.close()
    assert result.write_failure is not None
    metrics = json.loads((rd.path / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    assert metrics["summary"]["completed_samples"] == 1


async def test_a_journal_that_fills_the_disk_keeps_whole_lines_and_is_the_named_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    journal_fd = rd.journal._fd

    def torn_journal_write(fd: int, data: bytes) -> int:
        if fd == journal_fd:
            _REAL_WRITE(fd, bytes(data)[:10])
            return _enospc()
        return _REAL_WRITE(fd, data)

    with trio.fail_after(20):
        await rd.record_result(record(0, 0))
        monkeypatch.setattr(os, "write", torn_journal_write)
        with pytest.raises(LocalEvalError, match="No space left"):
            await rd.record_result(record(1, 0))
        with pytest.raises(CLIError):
            await rd.record_result(record(2, 0))
        monkeypatch.undo()
    result = rd.finalize(cancelled=False)
    rd.close()
    assert result.write_failure is not None
    assert result.write_failure.path == rd.path / "events.jsonl"
    replay = replay_journal(rd.path / "events.jsonl")
    assert replay.torn_bytes == 0
    assert [(r.row_index, r.run_index) for r in replay.records] == [(0, 0)]
    assert result.recorded == 1


def test_an_unwritable_run_directory_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sel = selection(tmp_path)
    monkeypatch.setattr(os, "write", _enospc)
    with pytest.raises(LocalEvalError) as err:
        open_rd(tmp_path, sel)
    message = str(err.value)
    assert message.startswith(f"could not write {tmp_path / 'out' / 'run1'}")
    assert "No space left on device; free space on that disk" in message
    assert "\n" not in message
