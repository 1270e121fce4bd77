"""RunDirectory: lock, open/resume, pending items, record_result, finalize (docs/spec/supervisor.md §3, §4)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import trio

from launcher.dataset import DatasetSelection, dataset_rows_jsonl, select_rows
from launcher.errors import CLIError
from launcher.redact import REDACTED, Redactor
from launcher.rundir import RunDirectory, RunLock, RunMeta, compute_pending, lock_path
from launcher.rundir.journal import TerminalRecord

N = 2


def selection(tmp_path: Path, rows: int = 3, select: str | None = None) -> DatasetSelection:
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"user_prompt": f"q{i}", "ground_truth": str(i)}) + "\n" for i in range(rows)
        )
    )
    return select_rows(data, rows=select)


def meta_for(sel: DatasetSelection, n: int = N) -> RunMeta:
    return RunMeta(
        n=n,
        pass_threshold=0.5,
        sampled_rows=len(sel.rows),
        total_dataset_rows=sel.total_dataset_rows,
        dataset_name=sel.name,
        model_name="openai/m",
        rollout_name="echo",
    )


def open_rd(
    tmp_path: Path,
    sel: DatasetSelection,
    *,
    inputs: dict | None = None,
    fresh: bool = False,
    redactor: Redactor | None = None,
    n: int = N,
) -> RunDirectory:
    return RunDirectory.open(
        output_root=tmp_path / "out",
        name="run1",
        inputs=inputs or {"model_path": "m", "n": n},
        provenance={"sdk_version": "t"},
        fresh=fresh,
        meta=meta_for(sel, n),
        selected_rows=sel.rows,
        redactor=redactor or Redactor(),
        metrics_interval_s=0.0,
    )


def record(
    row: int, run: int, status: str = "success", reward: float | None = 1.0, **kw: object
) -> TerminalRecord:
    return TerminalRecord(
        row_index=row,
        run_index=run,
        rollout_id=str(kw.pop("rollout_id", f"{row:016x}{run:08x}{os.urandom(4).hex()}")),
        status=status,
        reward=reward,
        source_row_index=row,
        duration_ms=5.0,
        **kw,  # type: ignore[arg-type]
    )


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lock_is_exclusive_and_reusable(tmp_path: Path) -> None:
    root = tmp_path / "out"
    first = RunLock.acquire(root, "run1")
    assert RunLock.try_acquire(root, "run1") is None
    with pytest.raises(CLIError) as info:
        RunLock.acquire(root, "run1")
    assert info.value.code == "CONFLICT"
    assert info.value.message == (
        f"another `rollbridge eval run` already holds {lock_path(root, 'run1')}. "
        "Wait for it to finish, or use a different --name."
    )
    other = RunLock.acquire(root, "run2")  # other names are independent
    first.release()
    first.release()
    with RunLock.acquire(root, "run1") as again:
        assert again.path == root / ".locks" / "run1.lock"
    other.release()
    assert stat.S_IMODE(lock_path(root, "run1").stat().st_mode) == 0o600
    assert lock_path(root, "run1").exists()  # never deleted
    assert stat.S_IMODE((root / ".locks").stat().st_mode) == 0o700


def test_lock_failures_other_than_held_raise(tmp_path: Path) -> None:
    root = tmp_path / "out"
    root.mkdir()
    (root / ".locks").write_text("not a directory")
    with pytest.raises(OSError):
        RunLock.try_acquire(root, "run1")


async def test_new_run_writes_every_file_before_dispatch(tmp_path: Path) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    run_dir = tmp_path / "out" / "run1"
    assert rd.gate.created and rd.path == run_dir
    for name in (
        "manifest.json",
        "events.jsonl",
        "logs.txt",
        "index.jsonl",
        "summary.jsonl",
        "progress.json",
        "metrics.json",
        "dataset_rows.jsonl",
    ):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    assert (run_dir / "rollout_trials").is_dir()
    for directory in (tmp_path / "out", run_dir, run_dir / "rollout_trials"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert (run_dir / "dataset_rows.jsonl").read_bytes() == dataset_rows_jsonl(sel.rows)
    assert json.loads((run_dir / "progress.json").read_text()) == {
        "total_runs": 6,
        "sampled_rows": 3,
        "total_dataset_rows": 3,
    }
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "running" and metrics["eval_run"]["duration_ms"] == 0.0
    assert metrics["eval_run"]["id"] == rd.manifest.local_run_id
    assert (run_dir / "index.jsonl").read_bytes() == b""
    items = rd.pending_items(sel.rows, N, False)
    assert [(i.row_index, i.run_index) for i in items] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    rd.close()


async def test_record_result_then_resume(tmp_path: Path) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0, tokens=11, max_context_tokens=7))
        await rd.record_result(record(0, 1, "failed", None, error_type="timeout"))
        await rd.record_result(record(1, 0, "skipped", None))
    assert (rd.counters.completed, rd.counters.failed, rd.counters.skipped, rd.counters.passed) == (
        3,
        1,
        1,
        1,
    )
    assert rd.counters.pass_rate == 0.5
    run_dir = rd.path
    live = lines(run_dir / "index.jsonl")
    assert [(x["row_index"], x["run_index"]) for x in live] == [(0, 0), (0, 1), (1, 0)]
    assert live[0]["tokens"] == 11 and live[0]["max_context_tokens"] == 7
    assert (run_dir / "summary.jsonl").read_bytes() == (run_dir / "index.jsonl").read_bytes()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["summary"]["total_samples"] == 3 and metrics["eval_run"]["status"] == "running"
    log = (run_dir / "logs.txt").read_text()
    assert log.count("INFO [result] work item finished") == 3
    rd.close()

    rd2 = open_rd(tmp_path, sel)
    assert not rd2.gate.created
    assert rd2.recorded_count == 3 and rd2.resumed_count == 3
    pending = rd2.pending_items(sel.rows, N, False)
    assert [(i.row_index, i.run_index) for i in pending] == [(1, 1), (2, 0), (2, 1)]
    retry = rd2.pending_items(sel.rows, N, True)
    assert [(i.row_index, i.run_index) for i in retry] == [(0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(x.get("resumed") is True for x in lines(run_dir / "index.jsonl"))
    assert rd2.counters.completed == 3
    rd2.close()


async def test_retry_failed_supersedes_and_finalize_dedupes(tmp_path: Path) -> None:
    sel = selection(tmp_path, rows=2)
    rd = open_rd(tmp_path, sel, n=1)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0, "success", 0.1))  # low reward: never retried
        await rd.record_result(record(1, 0, "failed", None, error_type="agent_error"))
    rd.close()

    rd = open_rd(tmp_path, sel, n=1)
    pending = rd.pending_items(sel.rows, 1, retry_failed=True)
    assert [(i.row_index, i.run_index) for i in pending] == [(1, 0)]
    with trio.fail_after(20):
        await rd.record_result(record(1, 0, "success", 1.0, rollout_id="f" * 32))
    assert rd.counters.failed == 0 and rd.counters.passed == 1
    result = rd.finalize(cancelled=False)
    rows = lines(rd.path / "index.jsonl")
    assert [(x["row_index"], x["status"], x.get("resumed")) for x in rows] == [
        (0, "success", True),
        (1, "success", None),
    ]
    assert rows[1]["rollout_id"] == "f" * 32
    assert (
        result.complete and result.resumed == 1 and result.failed == 0 and result.failed_rows == []
    )
    assert result.metrics["eval_run"]["status"] == "finished"
    assert "completed_at" in result.metrics["eval_run"]
    assert result.summary["passed"] == 1 and result.summary["pass_threshold"] == 0.5
    rd.close()


async def test_finalize_incomplete_and_cancelled(tmp_path: Path) -> None:
    sel = selection(tmp_path, rows=2)
    rd = open_rd(tmp_path, sel, n=1)
    with trio.fail_after(20):
        await rd.record_result(record(1, 0, "failed", None, error_type="timeout"))
    result = rd.finalize(cancelled=False)
    assert not result.complete and result.metrics["eval_run"]["status"] == "incomplete"
    assert "completed_at" not in result.metrics["eval_run"]
    assert result.metrics["eval_run"]["duration_ms"] > 0
    (failed,) = result.failed_rows
    assert (failed.row_index, failed.source_row_index, failed.error_type) == (1, 1, "timeout")
    assert failed.rollout_dir == rd.path / "rollout_trials" / failed.rollout_id
    with trio.fail_after(20):
        await rd.record_result(record(0, 0))
    assert not rd.finalize(cancelled=True).complete
    assert rd.finalize(cancelled=False).complete
    rd.close()


async def test_changed_inputs_refused_without_damage(tmp_path: Path) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel, inputs={"model_path": "m", "n": 2})
    with trio.fail_after(20):
        await rd.record_result(record(0, 0))
    rd.close()
    before = {p.name: p.read_bytes() for p in rd.path.iterdir() if p.is_file()}
    with pytest.raises(CLIError) as info:
        open_rd(tmp_path, sel, inputs={"model_path": "other", "n": 2})
    assert "Changed: model_path." in info.value.message
    after = {p.name: p.read_bytes() for p in rd.path.iterdir() if p.is_file()}
    assert after == before


async def test_fresh_archives_and_starts_clean(tmp_path: Path) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0))
    rd.close()
    rd2 = open_rd(tmp_path, sel, fresh=True)
    assert rd2.gate.archived_to is not None
    assert rd2.gate.archived_to.name.startswith("run1.archive-")
    assert len(lines(rd2.gate.archived_to / "events.jsonl")) == 1
    assert rd2.recorded_count == 0 and len(rd2.pending_items(sel.rows, N, False)) == 6
    assert rd2.manifest.local_run_id != rd.manifest.local_run_id
    rd2.close()


async def test_torn_journal_tail_is_repaired_and_logged(tmp_path: Path) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0))
    rd.close()
    events = rd.path / "events.jsonl"
    # A complete-looking line without its newline.
    events.write_bytes(events.read_bytes() + record(0, 1).to_line()[:-1])
    rd2 = open_rd(tmp_path, sel)
    assert rd2.recorded_count == 1
    assert len(events.read_bytes().splitlines()) == 1
    log = (rd.path / "logs.txt").read_text()
    assert 'WARNING [resume] discarded a partial trailing journal record {"bytes":' in log
    rd2.close()


def test_corrupt_journal_is_refused_before_anything_changes(tmp_path: Path) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)
    rd.close()
    events = rd.path / "events.jsonl"
    events.write_bytes(b"{garbage}\n" + record(0, 0).to_line())
    before = {p.name: p.read_bytes() for p in rd.path.iterdir() if p.is_file()}
    with pytest.raises(CLIError) as info:
        open_rd(tmp_path, sel)
    assert info.value.message.startswith(f"{events}:1: invalid JSON")
    assert {p.name: p.read_bytes() for p in rd.path.iterdir() if p.is_file()} == before


async def test_failed_append_is_not_counted_or_projected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sel = selection(tmp_path)
    rd = open_rd(tmp_path, sel)

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(CLIError), trio.fail_after(20):
        await rd.record_result(record(0, 0))
    monkeypatch.undo()
    assert rd.counters.completed == 0
    assert (rd.path / "index.jsonl").read_bytes() == b""
    rd.close()
    assert open_rd(tmp_path, sel).recorded_count == 0


def test_dataset_rows_jsonl_is_byte_identical_and_repaired(tmp_path: Path) -> None:
    sel = selection(tmp_path, rows=5, select="1,3-4")
    rd = open_rd(tmp_path, sel)
    rd.close()
    path = rd.path / "dataset_rows.jsonl"
    first = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    open_rd(tmp_path, sel).close()
    assert path.read_bytes() == first and path.stat().st_mtime_ns == mtime  # untouched
    path.write_bytes(b"tampered\n")
    open_rd(tmp_path, sel).close()
    assert path.read_bytes() == first
    assert "dataset_rows.jsonl did not match" in (rd.path / "logs.txt").read_text()
    assert [json.loads(x)["row_index"] for x in first.splitlines()] == [0, 1, 2]


async def test_trajectory_projection_and_token_fallback(tmp_path: Path) -> None:
    sel = selection(tmp_path, rows=1)
    rd = open_rd(tmp_path, sel, n=1)
    rid = "d" * 32
    trial = rd.trial_dir(rid)
    (trial / "artifacts").mkdir(parents=True)
    (trial / "artifacts" / "out.txt").write_text("hello")
    (trial / "artifacts" / "escape").symlink_to(tmp_path / "data.jsonl")
    (trial / "trajectory.json").write_text(
        json.dumps(
            {
                "session_id": rid,
                "final_metrics": {"total_prompt_tokens": 4, "total_completion_tokens": 6},
                "steps": [{"metrics": {"prompt_tokens": 4, "completion_tokens": 6}}],
            }
        )
    )
    with trio.fail_after(20):
        await rd.record_result(record(0, 0, rollout_id=rid), wait_for_trajectory=True)
    (row,) = lines(rd.path / "index.jsonl")
    assert row["trajectory_filename"] == "trajectory.json"
    assert row["tokens"] == 10 and row["max_context_tokens"] == 10
    assert (rd.path / "trajectories" / "row_0_run_0.json").exists()
    assert (rd.path / "artifacts" / "row_0_run_0" / "out.txt").read_text() == "hello"
    log = (rd.path / "logs.txt").read_text()
    assert "no parseable trajectory" not in log
    assert "WARNING [trajectory] skipped an unsafe artifact" in log and '"path":"escape"' in log
    assert not (rd.path / "artifacts" / "row_0_run_0" / "escape").exists()
    rd.close()


async def test_missing_trajectory_warns_after_grace(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    sel = selection(tmp_path, rows=1)
    rd = open_rd(tmp_path, sel, n=1)
    await rd.record_result(record(0, 0, rollout_id="e" * 32), wait_for_trajectory=True)
    log = (rd.path / "logs.txt").read_text()
    assert "WARNING [trajectory] no parseable trajectory within the archive grace period" in log
    assert "e" * 32 in log
    rd.close()


async def test_log_lines_are_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-12345")
    sel = selection(tmp_path, rows=1)
    rd = open_rd(tmp_path, sel, n=1, redactor=Redactor(["tok-secret"]))
    rd.log.info("run", "keys sk-ambient-12345 tok-secret")
    with trio.fail_after(20):
        await rd.record_result(record(0, 0, "failed", None, error_type="tok-secret leaked"))
    rd.close()
    text = (rd.path / "logs.txt").read_text()
    assert "sk-ambient-12345" not in text and "tok-secret" not in text
    assert f"keys {REDACTED} {REDACTED}" in text
    for name in ("events.jsonl", "index.jsonl", "summary.jsonl", "metrics.json", "manifest.json"):
        assert "tok-secret" not in (rd.path / name).read_text(), name
    assert lines(rd.path / "events.jsonl")[0]["error_type"] == f"{REDACTED} leaked"


def test_compute_pending_order() -> None:
    class Row:
        def __init__(self, r: int, s: int) -> None:
            self.row_index, self.source_row_index = r, s

    rows = [Row(0, 5), Row(1, 9)]
    latest = {(0, 1): record(0, 1, "skipped", None), (1, 0): record(1, 0)}
    got = compute_pending(latest, rows, 2, retry_failed=False)  # type: ignore[arg-type]
    assert [(w.row_index, w.run_index, w.source_row_index) for w in got] == [(0, 0, 5), (1, 1, 9)]
    got = compute_pending(latest, rows, 2, retry_failed=True)  # type: ignore[arg-type]
    assert [(w.row_index, w.run_index) for w in got] == [(0, 0), (0, 1), (1, 1)]


def test_stale_temp_files_from_a_killed_writer_are_removed(tmp_path: Path) -> None:
    sel = selection(tmp_path, rows=1)
    rd = open_rd(tmp_path, sel, n=1)
    rd.close()
    (rd.path / ".metrics.json.k3j2l1.tmp").write_text("{")
    (rd.path / "trajectories").mkdir()
    (rd.path / "trajectories" / ".row_0_run_0.json.x.tmp").write_text("{")
    open_rd(tmp_path, sel, n=1).close()
    assert not list(rd.path.glob(".*.tmp"))
    assert not list((rd.path / "trajectories").glob(".*.tmp"))


async def test_non_finite_reward_is_recorded_as_ungraded(tmp_path: Path) -> None:
    sel = selection(tmp_path, rows=1)
    rd = open_rd(tmp_path, sel, n=1)
    with trio.fail_after(20):
        await rd.record_result(record(0, 0, "success", float("nan")))
    result = rd.finalize(cancelled=False)
    assert "reward" not in lines(rd.path / "events.jsonl")[0]
    assert "reward" not in lines(rd.path / "index.jsonl")[0]
    assert result.summary["graded"] == 0 and result.complete
    rd.close()


async def test_finalize_picks_up_a_trajectory_that_came_after_the_result(tmp_path: Path) -> None:
    # Projections made while the run went are kept at finalize; an item projected without
    # its trajectory is looked at again.
    sel = selection(tmp_path, rows=2)
    rd = open_rd(tmp_path, sel, n=1)
    early, late = "a" * 32, "b" * 32
    for rid in (early, late):
        rd.trial_dir(rid).mkdir(parents=True)
    (rd.trial_dir(early) / "trajectory.json").write_text(json.dumps({"session_id": early}))
    with trio.fail_after(20):
        await rd.record_result(record(0, 0, rollout_id=early), wait_for_trajectory=True)
        await rd.record_result(record(1, 0, rollout_id=late), wait_for_trajectory=False)
    before = {row["row_index"]: row for row in lines(rd.path / "index.jsonl")}
    assert "trajectory_filename" in before[0] and "trajectory_filename" not in before[1]
    (rd.trial_dir(late) / "trajectory.json").write_text(json.dumps({"session_id": late}))
    result = rd.finalize(cancelled=False)
    assert result.complete
    after = {row["row_index"]: row for row in lines(rd.path / "index.jsonl")}
    assert after[0] == before[0]
    assert after[1]["trajectory_filename"] == "trajectory.json"
    assert (rd.path / "trajectories" / "row_1_run_0.json").exists()
    assert lines(rd.path / "summary.jsonl") == lines(rd.path / "index.jsonl")
    rd.close()


async def test_a_slow_metrics_refresh_is_spaced_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a run so large that aggregating every row is slow, metrics.json is refreshed less
    # often than metrics_interval_s (0 here), and finalize still writes the whole summary.
    import time

    import launcher.rundir.directory as directory

    real = directory.aggregate_index_values

    def slow(*args: object, **kwargs: object) -> dict:
        time.sleep(0.1)  # like 50,000 rows: the next refresh waits about 5 s
        return real(*args, **kwargs)  # type: ignore[arg-type]

    sel = selection(tmp_path, rows=3)
    rd = open_rd(tmp_path, sel, n=1)
    monkeypatch.setattr(directory, "aggregate_index_values", slow)
    with trio.fail_after(20):
        for row in range(3):
            await rd.record_result(record(row, 0))
    running = json.loads((rd.path / "metrics.json").read_text())
    assert running["eval_run"]["status"] == "running"
    assert running["summary"]["total_samples"] == 1
    result = rd.finalize(cancelled=False)
    assert result.summary["total_samples"] == 3
    assert json.loads((rd.path / "metrics.json").read_text())["summary"]["total_samples"] == 3
    rd.close()
