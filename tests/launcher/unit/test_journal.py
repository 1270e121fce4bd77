"""events.jsonl: canonical lines, durable append, torn-tail repair, corruption refusal (docs/spec/supervisor.md §3.3)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import CLIError
from launcher.rundir.journal import Journal, TerminalRecord, replay_journal
from rollout_server.protocol import is_single_path_segment


def rec(row: int = 0, run: int = 0, status: str = "success", **kw: object) -> TerminalRecord:
    return TerminalRecord(
        row_index=row,
        run_index=run,
        rollout_id=kw.pop("rollout_id", f"r{row}x{run}"),
        status=status,
        **kw,  # type: ignore[arg-type]
    )


def test_line_is_canonical_and_omits_none() -> None:
    line = rec(
        source_row_index=7, reward=1, tokens=812, error_type=None, duration_ms=None
    ).to_line()
    assert line == (
        b'{"duration_ms":0.0,"reward":1.0,"rollout_id":"r0x0","row_index":0,"run_index":0,'
        b'"source_row_index":7,"status":"success","tokens":812}\n'
    )
    unicode_line = rec(error_type="é").to_line()
    assert "é".encode() in unicode_line


def test_invalid_records_are_refused_before_writing() -> None:
    with pytest.raises(ValueError):
        rec(status="weird").to_line()
    with pytest.raises(ValueError):
        rec(rollout_id="a/b").to_line()


def test_non_finite_numbers_are_not_written() -> None:
    line = json.loads(rec(reward=float("nan"), duration_ms=float("inf")).to_line())
    assert "reward" not in line and line["duration_ms"] == 0.0


async def test_append_is_durable_and_replayed(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with trio.fail_after(10):
        await journal.append(rec(0, 0, "failed", error_type="timeout", max_context_tokens=9))
        await journal.append(rec(0, 0, "success", rollout_id="newer", reward=0.5))
        await journal.append(rec(1, 0, "skipped"))
    journal.close()
    replay = replay_journal(path)
    assert len(replay.records) == 3
    assert replay.latest[(0, 0)].rollout_id == "newer"
    assert replay.records[0].max_context_tokens == 9
    assert replay.latest[(1, 0)].status == "skipped"


def test_missing_file_is_empty(tmp_path: Path) -> None:
    replay = replay_journal(tmp_path / "none.jsonl")
    assert replay.records == [] and replay.torn_bytes == 0


def test_torn_tail_is_discarded_even_if_it_parses(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = rec(0, 0).to_line()
    torn = rec(1, 0).to_line().rstrip(b"\n")
    path.write_bytes(good + torn)
    seen: list[int] = []
    journal = Journal.open(path, on_torn=seen.append)
    assert seen == [len(torn)]
    assert list(journal.latest) == [(0, 0)]
    assert path.read_bytes() == good
    journal.append_sync(rec(2, 0))
    journal.close()
    assert [r.row_index for r in replay_journal(path).records] == [0, 2]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"\n", "blank journal record"),
        (b"   \n", "blank journal record"),
        (b"{nope\n", "invalid JSON ("),
        (b"[1]\n", "record must be a JSON object"),
        (b'{"run_index":0,"rollout_id":"a","status":"success"}\n', "row_index is missing"),
        (
            b'{"row_index":null,"run_index":0,"rollout_id":"a","status":"success"}\n',
            "row_index is missing",
        ),
        (
            b'{"row_index":true,"run_index":0,"rollout_id":"a","status":"success"}\n',
            "row_index must be an integer",
        ),
        (
            b'{"row_index":0,"run_index":0,"rollout_id":5,"status":"success"}\n',
            "rollout_id must be a string",
        ),
        (
            b'{"row_index":0,"run_index":0,"rollout_id":"a","status":"success","reward":"1"}\n',
            "reward must be a number",
        ),
        (
            b'{"row_index":0,"run_index":0,"rollout_id":"a","status":"success","tokens":1.5}\n',
            "tokens must be an integer",
        ),
        (
            b'{"row_index":0,"run_index":0,"rollout_id":"../x","status":"success"}\n',
            "rollout_id must be a single path segment",
        ),
        *(
            (
                b'{"row_index":0,"run_index":0,"rollout_id":"%s","status":"success"}\n'
                % bad.encode(),
                "rollout_id must be a single path segment",
            )
            for bad in ("..", ".", "", "C:x", "a\\\\b", "a\\u0000b")
        ),
        (
            b'{"row_index":0,"run_index":0,"rollout_id":"a","status":"done"}\n',
            "status must be one of ['failed', 'skipped', 'success']",
        ),
    ],
)
def test_corruption_in_committed_lines_is_refused(
    tmp_path: Path, line: bytes, message: str
) -> None:
    path = tmp_path / "events.jsonl"
    original = rec(0, 0).to_line() + line + rec(1, 0).to_line()
    path.write_bytes(original)
    with pytest.raises(CLIError) as info:
        Journal.open(path)
    assert info.value.message.startswith(f"{path}:2: {message}")
    assert path.read_bytes() == original  # nothing repaired or truncated


def test_replay_tolerates_unknown_keys_and_nulls(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b'{"row_index":0,"run_index":1,"rollout_id":"a","status":"failed","reward":null,'
        b'"future":{"x":1},"duration_ms":3}\n'
    )
    (record,) = replay_journal(path).records
    assert record.reward is None and record.duration_ms == 3.0 and record.run_index == 1


def test_replay_returns_exactly_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [rec(i, i % 3, "success", reward=i / 10, tokens=i).to_line() for i in range(50)]
    path.write_bytes(b"".join(lines))
    fast = replay_journal(path).records
    assert [r.to_dict() for r in fast] == [json.loads(line) for line in lines]


async def test_a_record_whose_fsync_fails_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    journal.append_sync(rec(0, 0))

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(CLIError, match="could not write journal"), trio.fail_after(10):
        await journal.append(rec(1, 0))
    assert (1, 0) not in journal.latest
    # The journal refuses further appends rather than risk a line after a partial one.
    with pytest.raises(CLIError, match="unusable"):
        journal.append_sync(rec(2, 0))
    monkeypatch.undo()
    journal.close()
    # The partially written line was cut away, so a re-open only counts the durable record.
    reopened = Journal.open(path)
    assert list(reopened.latest) == [(0, 0)]
    reopened.close()


def test_append_writes_before_counting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    order: list[str] = []
    real_fsync = os.fsync

    def spy_fsync(fd: int) -> None:
        order.append(f"fsync latest={len(journal.latest)}")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    journal.append_sync(rec(0, 0))
    assert order == ["fsync latest=0"]
    assert len(journal.latest) == 1
    journal.close()


async def test_concurrent_appends_are_serialized_and_all_counted(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(journal.append, rec(i, 0, error_type="x" * (i * 50)))
    journal.close()
    replay = replay_journal(path)
    assert sorted(r.row_index for r in replay.records) == list(range(64))
    assert replay.torn_bytes == 0


_RECORDS = st.builds(
    TerminalRecord,
    row_index=st.integers(0, 10**6),
    run_index=st.integers(0, 64),
    # Any id the protocol accepts as one path segment (the journal applies the same rule).
    rollout_id=st.text(min_size=1, max_size=40).filter(is_single_path_segment),
    status=st.sampled_from(["success", "failed", "skipped"]),
    source_row_index=st.none() | st.integers(0, 10**6),
    reward=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    tokens=st.none() | st.integers(0, 10**9),
    max_context_tokens=st.none() | st.integers(0, 10**7),
    duration_ms=st.none() | st.floats(0, 1e9),
    error_type=st.none() | st.text(max_size=30),
)


@settings(max_examples=100, deadline=None)
@given(records=st.lists(_RECORDS, max_size=20))
def test_written_records_replay_identically(records: list[TerminalRecord]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(b"".join(r.to_line() for r in records))
        replayed = replay_journal(path).records
    assert [r.to_dict() for r in replayed] == [r.to_dict() for r in records]


def test_lone_surrogates_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    record = rec(error_type="bad \ud800 text")
    path.write_bytes(record.to_line())
    (replayed,) = replay_journal(path).records
    assert replayed.error_type == "bad \ud800 text"


def test_replay_keeps_ids_that_only_look_odd(tmp_path: Path) -> None:
    # Ids the fast path must not refuse: a leading dot that is not "." or "..", a dot or a
    # colon past the first two characters.
    path = tmp_path / "events.jsonl"
    ids = ["a.b", "ab:c", "x..", "b.", ".hidden", "...", "1" * 40]
    path.write_bytes(b"".join(rec(i, 0, rollout_id=rid).to_line() for i, rid in enumerate(ids)))
    assert [r.rollout_id for r in replay_journal(path).records] == ids


async def test_then_runs_after_the_commit_and_its_error_reaches_its_caller(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal.open(path)
    seen: list[tuple[int, int]] = []

    def then(row: int) -> None:
        # The record is durable and counted by the time its follow-up work runs.
        lines = path.read_bytes().splitlines()
        seen.append((row, len(lines)))
        assert (row, 0) in journal.latest
        if row == 2:
            raise OSError("projection failed")

    async def append(row: int) -> None:
        try:
            await journal.append(rec(row, 0), then=lambda: then(row))
        except OSError:
            seen.append((row, -1))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for row in range(4):
                nursery.start_soon(append, row)
    assert sorted(row for row, n in seen if n > 0) == [0, 1, 2, 3]
    assert (2, -1) in seen  # the follow-up's error, raised to its own caller only
    assert set(journal.latest) == {(row, 0) for row in range(4)}  # ... whose record counts
    journal.close()
