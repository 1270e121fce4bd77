"""A run child's liveness as the daemon's worker threads read it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from launcher.daemon.children import ChildRecord, RunChild


async def _exited_unreaped(pid: int) -> None:
    """Until ``pid`` has exited, without reaping it (``WNOWAIT``)."""
    while True:
        # WNOHANG|WNOWAIT: look, never reap (the child's own watch() does that).
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # noqa: ASYNC222
        if info is not None:
            return
        await trio.sleep(0.01)


async def test_a_child_that_just_exited_is_read_from_a_worker_thread(tmp_path: Path) -> None:
    # The run views are built in worker threads. Asking trio.Process.returncode there for a
    # child that had just exited raised "must be called from async context" (a 500 from
    # GET /v1/runs/<name> at the moment a run ended).
    with trio.fail_after(30):
        process = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
        record = ChildRecord(
            name="r", pid=process.pid, start_token="t", started_at="", log_offset=0
        )
        child = RunChild(record, tmp_path, process)
        await _exited_unreaped(process.pid)
        assert await trio.to_thread.run_sync(lambda: child.alive) is True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child.watch)
        assert await trio.to_thread.run_sync(lambda: child.alive) is False
        assert record.returncode == 0
