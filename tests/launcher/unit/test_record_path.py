"""The per-item record path: journal group commit and the one-look trajectory projection."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path

import pytest
import trio

import launcher.rundir.directory as rundir_module
from launcher.errors import CLIError
from launcher.redact import Redactor
from launcher.rundir.journal import Journal, replay_journal
from launcher.rundir.projections import TrajectoryFile
from tests.launcher.unit.test_journal import rec
from tests.launcher.unit.test_rundir import open_rd, record, selection


def _slow_fsync_spy(
    monkeypatch: pytest.MonkeyPatch, journal: Journal, seen: list[int]
) -> threading.Event:
    """Make fsync slow enough that appends queue up behind it; record ``len(latest)``."""
    real_fsync = os.fsync
    first = threading.Event()

    def spy(fd: int) -> None:
        seen.append(len(journal.latest))
        if not first.is_set():
            first.set()
            time.sleep(0.2)  # only widens the window in which others queue; not asserted on
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return first


async def test_appends_queued_during_a_write_share_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    seen: list[int] = []
    _slow_fsync_spy(monkeypatch, journal, seen)
    durable_on_return: list[bool] = []

    async def append(i: int) -> None:
        await journal.append(rec(i, 0))
        durable_on_return.append((i, 0) in replay_journal(path).latest)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(append, i)
    assert len(seen) < 20  # grouped: fewer fsyncs than records
    # No record was counted before the fsync covering it: each fsync saw only earlier groups.
    assert seen[0] == 0 and all(a < b for a, b in itertools.pairwise(seen))
    assert durable_on_return == [True] * 20
    assert sorted(journal.latest) == [(i, 0) for i in range(20)]
    journal.close()
    assert sorted(replay_journal(path).latest) == [(i, 0) for i in range(20)]


async def test_a_failed_group_commit_fails_every_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    journal.append_sync(rec(99, 0))

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    failures: list[str] = []

    async def append(i: int) -> None:
        try:
            await journal.append(rec(i, 0))
        except CLIError as exc:
            failures.append(str(exc))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(append, i)
    assert len(failures) == 5
    assert list(journal.latest) == [(99, 0)]
    monkeypatch.undo()
    journal.close()
    assert list(replay_journal(path).latest) == [(99, 0)]


async def test_cancelled_appends_are_never_half_counted(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(journal.append, rec(i, 0))
            await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
        await journal.append(rec(10, 0))  # still usable afterwards
    on_disk = replay_journal(path).latest
    assert sorted(on_disk) == sorted(journal.latest)
    assert (10, 0) in on_disk
    journal.close()


async def test_a_cancel_during_the_write_returns_no_caller_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waiting in append cannot be cancelled: the committer and the callers queued behind it
    # all return only once the fsync covering their record did, cancelled or not.
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    seen: list[int] = []
    first = _slow_fsync_spy(monkeypatch, journal, seen)
    durable_on_return: list[bool] = []

    async def append(i: int) -> None:
        try:
            await journal.append(rec(i, 0))
        finally:
            durable_on_return.append((i, 0) in replay_journal(path).latest)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(append, i)
            await trio.to_thread.run_sync(first.wait)  # the first group is being written
            nursery.cancel_scope.cancel()
    assert durable_on_return == [True] * 8
    assert sorted(journal.latest) == [(i, 0) for i in range(8)]
    journal.close()


def _write_trajectory(trial: Path, rollout_id: str) -> None:
    trial.mkdir(parents=True, exist_ok=True)
    (trial / "trajectory.json").write_text(json.dumps({"session_id": rollout_id}))


async def test_a_present_trajectory_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sel = selection(tmp_path, rows=1)
    rd = open_rd(tmp_path, sel, n=1)
    rid = "a" * 32
    _write_trajectory(rd.trial_dir(rid), rid)
    loads: list[str] = []
    real_read = rundir_module.read_valid_trajectory
    real_load = rundir_module.load_valid_trajectory

    def counting_read(
        trials_dir: Path, rollout_id: str, *, redactor: Redactor | None = None
    ) -> TrajectoryFile | None:
        loads.append(rollout_id)
        return real_read(trials_dir, rollout_id, redactor=redactor)

    def counting_load(trials_dir: Path, rollout_id: str) -> dict | None:
        loads.append(rollout_id)
        return real_load(trials_dir, rollout_id)

    monkeypatch.setattr(rundir_module, "read_valid_trajectory", counting_read)
    monkeypatch.setattr(rundir_module, "load_valid_trajectory", counting_load)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0, rollout_id=rid), wait_for_trajectory=True)
    assert loads == [rid]
    (row,) = [json.loads(x) for x in (rd.path / "index.jsonl").read_text().splitlines()]
    assert row["trajectory_filename"] == "trajectory.json"
    assert (rd.path / "trajectories" / "row_0_run_0.json").exists()
    rd.close()


async def test_a_late_trajectory_is_waited_for_then_projected(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    sel = selection(tmp_path, rows=1)
    rd = open_rd(tmp_path, sel, n=1)
    rid = "b" * 32

    async def publish_later() -> None:
        await trio.sleep(1.0)
        _write_trajectory(rd.trial_dir(rid), rid)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_later)
        await rd.record_result(record(0, 0, rollout_id=rid), wait_for_trajectory=True)
        assert trio.current_time() >= 1.0
    (row,) = [json.loads(x) for x in (rd.path / "index.jsonl").read_text().splitlines()]
    assert row["trajectory_filename"] == "trajectory.json"
    assert (rd.path / "trajectories" / "row_0_run_0.json").exists()
    assert "no parseable trajectory" not in (rd.path / "logs.txt").read_text()
    rd.close()
