"""A failure's reason in the journal, index.jsonl, the failed-row lines and the ``--json``
envelope; skipped rows listed apart; the run directory's reader of ``diagnostics.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.errors import JournalCorruptError
from launcher.report import RunFacts, count_statuses, result_resource, row_sections
from launcher.rundir.journal import ErrorInfo, TerminalRecord, replay_journal
from launcher.rundir.projections import index_row, load_failure_detail

REASON = ErrorInfo(phase="agent", type="ValueError", message="bad answer\nsecond line")


def _records() -> list[TerminalRecord]:
    return [
        TerminalRecord(
            row_index=3,
            run_index=0,
            rollout_id="r3",
            status="failed",
            error_type="validation_error",
            error=REASON,
        ),
        TerminalRecord(row_index=1, run_index=0, rollout_id="r1", status="skipped"),
        TerminalRecord(
            row_index=2, run_index=0, rollout_id="r2", status="failed", error_type="timeout"
        ),
    ]


def test_journal_keeps_the_reason_and_refuses_a_malformed_one(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(r.to_line() for r in _records()))
    replayed = replay_journal(path).records
    assert replayed[0].error == REASON and replayed[2].error is None
    assert json.loads(_records()[0].to_line())["error"] == {
        "phase": "agent",
        "type": "ValueError",
        "message": "bad answer\nsecond line",
    }
    line = json.loads(_records()[1].to_line())
    line["error"] = {"phase": "agent", "message": 7}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(JournalCorruptError, match=r"events.jsonl:1: error.message must be"):
        replay_journal(path)


def test_index_row_carries_the_reason() -> None:
    row = index_row(_records()[0], None, resumed=False)
    assert list(row)[-2:] == ["error_type", "error"]
    assert row["error"] == REASON.to_json()
    assert "error" not in index_row(_records()[1], None, resumed=False)


def test_failed_rows_show_the_reason_and_skipped_rows_stand_apart(tmp_path: Path) -> None:
    sections = row_sections(_records(), tmp_path, lambda p: p.name)
    assert sections == [
        (
            "Failed rows",
            [
                "row 2 run 0: error_type=timeout -> r2",
                "row 3 run 0: error_type=validation_error -> r3",
                "  agent: ValueError: bad answer second line",
            ],
        ),
        ("Skipped rows", ["row 1 run 0: removed from scoring -> r1"]),
    ]


def test_json_failed_rows_carry_status_and_error(tmp_path: Path) -> None:
    records = _records()
    resource = result_resource(
        RunFacts("d.jsonl", 3, tmp_path),
        "n",
        tmp_path,
        {},
        local_run_id=None,
        counts=count_statuses(records),
        failed_rows=records,
        dispatched=3,
        cancelled=False,
        resumed=0,
        duration_ms=1.0,
    )
    rows = {r["row_index"]: r for r in resource["failed_rows"]}
    assert rows[3]["error"] == REASON.to_json() and rows[3]["status"] == "failed"
    assert rows[1]["status"] == "skipped" and rows[1]["error"] is None


def test_failure_detail_is_read_safely(tmp_path: Path) -> None:
    trial = tmp_path / "r1"
    trial.mkdir()
    assert load_failure_detail(tmp_path, "r1") is None
    (trial / "diagnostics.json").write_text(json.dumps({"failure": {"phase": "grader"}}))
    assert load_failure_detail(tmp_path, "r1") == {"phase": "grader"}
    (trial / "diagnostics.json").write_text("[" * 100_000)
    assert load_failure_detail(tmp_path, "r1") is None
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"failure": {"phase": "agent"}}))
    (trial / "diagnostics.json").unlink()
    os.symlink(outside, trial / "diagnostics.json")
    assert load_failure_detail(tmp_path, "r1") is None


def test_with_detail_ignores_fields_of_the_wrong_kind() -> None:
    base = ErrorInfo(phase="rollout", message="from the wire")
    assert base.with_detail(None) is base
    done = base.with_detail({"phase": "bridge", "type": "ChatError", "status": 502})
    assert done == ErrorInfo(phase="bridge", type="ChatError", status=502, message="from the wire")
    odd = base.with_detail({"phase": "nowhere", "type": 3, "status": True, "message": ""})
    assert odd == base
