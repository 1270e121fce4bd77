"""``calls.jsonl``: per-call records made durable before the results they account for, cut
back to the acknowledged results at open, and the per-row totals they give."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from launcher.rundir.calls import CallLog, call_totals, encode_calls, read_calls
from launcher.rundir.journal import Journal, TerminalRecord, replay_journal
from tests.launcher.unit.test_rundir import lines, open_rd, record, selection


def call(rollout_id: str, **kw: Any) -> dict[str, Any]:
    """A call record as the bridge reports one (bridge.calls.CallTrace.finish)."""
    return {
        "kind": "rollout",
        "rollout_id": rollout_id,
        "api": "chat.completions",
        "model": "m",
        "stream": False,
        "started_at": "2026-12-02T00:00:00.000000Z",
        "ttfb_ms": 1.0,
        "duration_ms": 2.0,
        "status": 200,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        **kw,
    }


def test_totals_count_calls_retries_and_reported_token_kinds() -> None:
    calls = [
        call("a", cached_tokens=4, retries=[{"status": 429, "kind": "RateLimitError"}]),
        call("a", cached_tokens=6, reasoning_tokens=3, cache_write_tokens=7),
        call("a", status=502, error="APIError"),
    ]
    assert call_totals(calls) == {
        "calls": 3,
        "cached_tokens": 10,
        "cache_write_tokens": 7,
        "reasoning_tokens": 3,
        "retries": 1,
    }
    assert call_totals([call("a")])["cached_tokens"] is None  # never reported: unknown, not 0


def test_token_data_is_kept_compactly_or_left_out(tmp_path: Path) -> None:
    logprobs = {"token": ["a", "b"], "logprob": [-0.1, -0.2]}
    calls = [call("r1", logprobs=logprobs, token_ids=[1, 2])]
    kept = encode_calls(calls, row_index=3, run_index=1)
    dropped = encode_calls(calls, row_index=3, run_index=1, keep_tokens=False)
    (tmp_path / "kept.jsonl").write_bytes(kept)
    (tmp_path / "dropped.jsonl").write_bytes(dropped)
    line = read_calls(tmp_path / "kept.jsonl")[0]["r1"][0]
    assert line["logprobs"] == logprobs and line["token_ids"] == [1, 2]
    assert (line["row_index"], line["run_index"], line["index"]) == (3, 1, 0)
    line = read_calls(tmp_path / "dropped.jsonl")[0]["r1"][0]
    assert "logprobs" not in line and "token_ids" not in line and line["total_tokens"] == 15


async def test_a_result_is_durable_only_after_its_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rd = open_rd(tmp_path, selection(tmp_path, rows=3), n=1)
    log = rd.journal.call_log
    assert log is not None
    checked: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        # At each journal fsync, every record about to be made durable has its calls durable.
        if fd == rd.journal._fd:
            written = replay_journal(rd.journal.path).records
            on_disk = read_calls(log.path)[0]
            assert all(len(on_disk.get(r.rollout_id, [])) == 2 for r in written)
            checked.append(len(written))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    done = [record(i, 0, calls=2) for i in range(3)]

    async def one(r: TerminalRecord) -> None:
        await rd.record_result(r, calls=[call(r.rollout_id)] * 2)
        # On return the record and both of its calls are on disk.
        assert (r.row_index, 0) in replay_journal(rd.journal.path).latest
        assert len(read_calls(log.path)[0][r.rollout_id]) == 2

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for r in done:
                nursery.start_soon(one, r)
    rd.close()
    assert checked and checked[-1] == 3
    per_rollout, _ = read_calls(tmp_path / "out" / "run1" / "calls.jsonl")
    assert sorted(len(v) for v in per_rollout.values()) == [2, 2, 2]
    assert [c["index"] for c in per_rollout[done[0].rollout_id]] == [0, 1]


def test_open_cuts_calls_of_unacknowledged_results_and_a_torn_line(tmp_path: Path) -> None:
    """What a kill -9 between the two fsyncs of a group commit (or mid-write) leaves."""
    path = tmp_path / "calls.jsonl"
    journal = Journal.open(tmp_path / "events.jsonl")
    kept = record(0, 0)
    journal.append_sync(kept)
    log = journal.attach_call_log(path)
    preflight = {"kind": "preflight", "rollout_id": None, "status": 200}
    log.write_sync(encode_calls([call(kept.rollout_id), call(kept.rollout_id)]))
    log.write_sync(encode_calls([preflight]))
    # The crash: a group's calls are durable, its journal lines never written.
    log.write_sync(encode_calls([call("lost1"), call("lost1")]) + encode_calls([call("lost2")]))
    journal.close()
    with path.open("ab") as f:
        f.write(b'{"kind":"rollout","rollout_id":"lost3","sta')  # torn mid-line
    journal = Journal.open(tmp_path / "events.jsonl")
    reopened = journal.attach_call_log(path)
    assert reopened.torn_bytes > 0 and reopened.dropped_bytes > 0
    journal.close()
    per_rollout, others = read_calls(path)
    assert list(per_rollout) == [kept.rollout_id] and len(per_rollout[kept.rollout_id]) == 2
    assert others == [preflight]
    assert path.read_bytes().endswith(b"\n")


def test_a_line_longer_than_a_block_is_scanned_whole(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    big = {"token": ["x" * 50] * 4000, "logprob": [-1.0] * 4000}  # ~250 KB, several blocks
    journal = Journal.open(tmp_path / "events.jsonl")
    ok = record(0, 0)
    journal.append_sync(ok)
    log = journal.attach_call_log(path)
    log.write_sync(encode_calls([call(ok.rollout_id, logprobs=big)]))
    log.write_sync(encode_calls([call("lost", logprobs=big)]))
    journal.close()
    journal = Journal.open(tmp_path / "events.jsonl")
    journal.attach_call_log(path)
    journal.close()
    assert list(read_calls(path)[0]) == [ok.rollout_id]
    assert CallLog  # the type readers may hold


async def test_row_and_run_totals_reach_the_index_and_metrics(tmp_path: Path) -> None:
    sel = selection(tmp_path, rows=2)
    rd = open_rd(tmp_path, sel, n=1)
    first = record(
        0,
        0,
        max_context_tokens=9,
        calls=2,
        cached_tokens=7,
        reasoning_tokens=3,
        metrics={"steps": 4},
    )
    second = record(1, 0, calls=1, retries=2)
    with trio.fail_after(10):
        await rd.record_result(first, calls=[call(first.rollout_id), call(first.rollout_id)])
        await rd.record_result(second, calls=[call(second.rollout_id)])
    rd.finalize(cancelled=False)
    rd.close()
    index = lines(rd.path / "index.jsonl")
    assert index[0]["calls"] == 2 and index[0]["cached_tokens"] == 7
    assert index[0]["reasoning_tokens"] == 3 and index[0]["metrics"] == {"steps": 4}
    keys = list(index[0])
    assert keys.index("reward") < keys.index("calls") < keys.index("duration_ms")
    summary = json.loads((rd.path / "metrics.json").read_text())["summary"]
    assert (summary["calls"], summary["cached_tokens"], summary["reasoning_tokens"]) == (3, 7, 3)
    assert summary["retries"] == 2
    per_rollout, _ = read_calls(rd.path / "calls.jsonl")
    assert len(per_rollout[first.rollout_id]) == 2 and len(per_rollout[second.rollout_id]) == 1


def test_keep_logprobs_is_a_boolean_switch() -> None:
    from launcher.config import resolve_run_spec
    from launcher.errors import CLIError
    from tests.launcher.unit.test_config import config_with

    assert resolve_run_spec(config_with({})).keep_logprobs is True
    assert resolve_run_spec(config_with({"keep_logprobs": False})).keep_logprobs is False
    with pytest.raises(CLIError, match=r"evaluation\.keep_logprobs must be true or false"):
        resolve_run_spec(config_with({"keep_logprobs": "no"}))


async def test_a_run_that_keeps_no_logprobs_writes_none(tmp_path: Path) -> None:
    rd = open_rd(tmp_path, selection(tmp_path, rows=1), n=1)
    rd.keep_logprobs = False
    done = record(0, 0, calls=1)
    with trio.fail_after(10):
        await rd.record_result(
            done, calls=[call(done.rollout_id, logprobs={"token": ["a"]}, token_ids=[1])]
        )
        await rd.record_call({"kind": "preflight", "rollout_id": None, "status": 200})
    rd.close()
    per_rollout, others = read_calls(rd.path / "calls.jsonl")
    (kept,) = per_rollout[done.rollout_id]
    assert "logprobs" not in kept and "token_ids" not in kept and kept["total_tokens"] == 15
    assert [o["kind"] for o in others] == ["preflight"]


def test_an_orphan_suffix_spanning_many_blocks_is_cut_at_its_first_line(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    journal = Journal.open(tmp_path / "events.jsonl")
    ok = [record(i, 0) for i in range(300)]
    for r in ok:
        journal.append_sync(r)
    log = journal.attach_call_log(path)
    log.write_sync(b"".join(encode_calls([call(r.rollout_id)] * 3) for r in ok))
    kept_size = path.stat().st_size
    log.write_sync(b"".join(encode_calls([call(f"lost{i}")] * 3) for i in range(400)))
    journal.close()
    assert path.stat().st_size > kept_size + 4 * 65536  # the orphans span several blocks
    journal = Journal.open(tmp_path / "events.jsonl")
    reopened = journal.attach_call_log(path)
    journal.close()
    assert path.stat().st_size == kept_size
    assert reopened.dropped_bytes > 4 * 65536 and reopened.torn_bytes == 0
    assert sorted(read_calls(path)[0]) == sorted(r.rollout_id for r in ok)
