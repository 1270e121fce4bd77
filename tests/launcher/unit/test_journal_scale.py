"""Replay read in chunks and the latest-record map (issue 29, item 4): the same answers as a
whole-file replay, whichever chunk a line, a bad line or the torn tail falls in."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from launcher.errors import CLIError
from launcher.rundir import journal as journal_module
from launcher.rundir.journal import Journal, TerminalRecord, replay_journal
from launcher.rundir.latest import LatestRecords
from launcher.rundir.metrics import LiveCounters


def rec(row: int, run: int = 0, status: str = "success", rid: str | None = None) -> TerminalRecord:
    return TerminalRecord(
        row_index=row,
        run_index=run,
        rollout_id=rid or f"r{row}x{run}",
        status=status,  # type: ignore[arg-type]
        duration_ms=0.0,
    )


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # A few lines per chunk, so lines, keys and the torn tail straddle chunk boundaries.
    monkeypatch.setattr(journal_module, "_READ_CHUNK", 300)


def write(path: Path, records: list[TerminalRecord], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(r.to_line() for r in records) + tail)


def test_chunked_replay_keeps_order_last_wins_and_torn_tail(
    tmp_path: Path, small_chunks: None
) -> None:
    path = tmp_path / "events.jsonl"
    records = [rec(i % 7, i % 3, ("success", "failed", "skipped")[i % 3]) for i in range(60)]
    records.append(rec(2, 2, "failed", rid="newest"))
    tail = b'{"row_index":99,"run_index":0,"rollout_id":"x","status":"success"}'
    write(path, records, tail)
    replay = replay_journal(path)
    assert replay.records == records
    assert replay.torn_bytes == len(tail)
    assert replay.committed_bytes == path.stat().st_size - len(tail)
    expected: dict[tuple[int, int], TerminalRecord] = {}
    for r in records:
        expected[r.key] = r
    assert dict(replay.latest) == expected
    assert replay.latest[(2, 2)].rollout_id == "newest"
    assert len(replay.latest) == len(expected)
    assert sorted(replay.latest.items()) == sorted(expected.items())
    assert (99, 0) not in replay.latest


def test_a_bad_line_in_a_later_chunk_is_named_by_its_line(
    tmp_path: Path, small_chunks: None
) -> None:
    path = tmp_path / "events.jsonl"
    good = b"".join(rec(i).to_line() for i in range(20))
    path.write_bytes(
        good + b'{"row_index":20,"run_index":0,"rollout_id":"a/b","status":"success"}\n'
    )
    with pytest.raises(CLIError, match=r"events\.jsonl:21: rollout_id"):
        replay_journal(path)
    path.write_bytes(good + b"\n" + rec(21).to_line())
    with pytest.raises(CLIError, match=r"events\.jsonl:21: blank"):
        replay_journal(path)
    path.write_bytes(good + b'{"row_index":20,"run_index":0,"rollout_id":"x","status":"odd"}\n')
    with pytest.raises(CLIError, match=r"events\.jsonl:21: status"):
        replay_journal(path)


def test_a_line_longer_than_a_chunk_is_read_whole(tmp_path: Path, small_chunks: None) -> None:
    path = tmp_path / "events.jsonl"
    records = [rec(0), rec(1, rid="y" * 1000), rec(2)]
    write(path, records)
    assert replay_journal(path).records == records


def test_reopened_journal_appends_to_the_chunked_map(tmp_path: Path, small_chunks: None) -> None:
    path = tmp_path / "events.jsonl"
    write(path, [rec(i) for i in range(30)])
    journal = Journal.open(path)
    try:
        journal.append_sync(rec(3, rid="again"))
        journal.append_sync(rec(3, 1))
    finally:
        journal.close()
    latest = replay_journal(path).latest
    assert latest[(3, 0)].rollout_id == "again" and (3, 1) in latest and len(latest) == 31


def test_latest_records_is_a_mapping_of_work_keys() -> None:
    latest = LatestRecords()
    many_runs = [rec(i % 5, run) for run in range(40) for i in range(5)]
    latest.add_all(many_runs)  # more run indexes than the split handles in C: one by one
    latest.add_all([rec(0, 0, "failed"), rec(1, 1, "failed")])
    assert len(latest) == 200
    assert latest[(0, 0)].status == "failed" and latest[(1, 1)].status == "failed"
    assert latest.get((9, 0)) is None and (9, 0) not in latest and "x" not in latest
    with pytest.raises(KeyError):
        latest[(9, 9)]
    del latest[(0, 0)]
    assert (0, 0) not in latest and len(latest) == 199
    assert set(latest) == {(r.row_index, r.run_index) for r in many_runs} - {(0, 0)}
    assert sorted(latest.values(), key=lambda r: r.key) == sorted(
        (latest[k] for k in latest), key=lambda r: r.key
    )


def test_counting_all_at_once_matches_counting_one_by_one() -> None:
    rng = random.Random(29)
    records = [
        TerminalRecord(
            row_index=i,
            run_index=0,
            rollout_id=f"r{i}",
            status=rng.choice(("success", "failed", "skipped")),
            reward=rng.choice((None, 0.0, 0.5, 1.0, 2, 1)),  # type: ignore[arg-type]
            tokens=rng.choice((None, 0, 17)),
        )
        for i in range(500)
    ]
    odd = [
        *records[:50],
        TerminalRecord(
            row_index=50, run_index=0, rollout_id="x", status="success", reward=math.inf
        ),
    ]
    for batch in (records, odd, []):
        for threshold in (0.5, 1.0):
            one, bulk = (
                LiveCounters(pass_threshold=threshold),
                LiveCounters(pass_threshold=threshold),
            )
            for r in batch:
                one.apply(r.status, r.reward, tokens=r.tokens)
            bulk.add_all(batch)
            assert bulk == one


def test_latest_records_know_whether_every_key_is_expected() -> None:
    latest = LatestRecords()
    latest.add_all([rec(0), rec(4), rec(2, 1)])
    assert latest.within(5, 2)
    assert not latest.within(4, 2) and not latest.within(5, 1)
    latest[(-1, 0)] = rec(0)
    assert not latest.within(5, 2)
    assert LatestRecords().within(0, 0)


@pytest.mark.parametrize("seed", range(6))
def test_latest_records_match_a_plain_dict_whatever_the_rows(seed: int) -> None:
    # Dense rows (list tables), sparse and negative ones (dict tables), bulk adds with repeats,
    # single sets and deletes, checked against a plain dict after every step.
    rng = random.Random(seed)
    latest, model = LatestRecords(), {}
    spread = (50, 5_000, 10**9)[seed % 3]
    for step in range(300):
        action = rng.random()
        if action < 0.3:
            batch = [
                rec(
                    rng.randrange(-2 if seed % 2 else 0, spread),
                    rng.randrange(3),
                    rid=f"b{step}x{i}",
                )
                for i in range(rng.randrange(1, 40))
            ]
            latest.add_all(batch)
            model.update((r.key, r) for r in batch)
        elif action < 0.8:
            r = rec(rng.randrange(0, spread), rng.randrange(3), rid=f"s{step}")
            latest[r.key] = r
            model[r.key] = r
        elif model:
            key = rng.choice(sorted(model))
            del latest[key], model[key]
        assert len(latest) == len(model)
    assert dict(latest) == model
    assert sorted(latest.items()) == sorted(model.items())
    assert sorted(map(id, latest.values())) == sorted(map(id, model.values()))
    for key in [*model, (spread + 1, 0), (0, 7), ("x", 0)]:
        assert (key in latest) == (key in model)


def test_latest_records_dense_rows_iterate_in_row_order_and_sparse_ones_stay_small() -> None:
    latest = LatestRecords()
    latest.add_all([rec(3), rec(1), rec(2), rec(1, rid="again")])
    assert list(latest) == [(1, 0), (2, 0), (3, 0)] and latest[(1, 0)].rollout_id == "again"
    assert isinstance(latest._runs[0], list) and len(latest) == 3
    latest[(10**12, 0)] = rec(5)  # far beyond the rows held: the table becomes a dict
    assert isinstance(latest._runs[0], dict) and len(latest) == 4
    assert latest[(10**12, 0)].row_index == 5 and latest[(2, 0)].row_index == 2
    with pytest.raises(KeyError):
        del latest[(4, 0)]
    for key in list(latest):
        del latest[key]
    assert len(latest) == 0 and not latest._runs
