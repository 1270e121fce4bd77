"""The exit code the daemon reports for a run child it did not reap (launcher.daemon.status): one
it adopted after a restart, or one that ended while no daemon ran, gets the code its own
envelope, else the run's end state, implies, marked ``inferred``; an observed code is ``exit``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from launcher.daemon.children import ChildRecord
from launcher.daemon.status import run_view

TOTAL = 3


def _run(tmp_path: Path, *, done: int, status: str, halted: str | None = None) -> Path:
    """A run directory of ``TOTAL`` items, ``done`` of them recorded, metrics.json saying
    ``status`` (``running`` is what a ``kill -9`` leaves behind)."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "progress.json").write_text(json.dumps({"total_runs": TOTAL}))
    lines = [
        {
            "rollout_id": f"id{i}",
            "row_index": i,
            "run_index": 0,
            "source_row_index": i,
            "status": "success",
            "reward": 1.0,
        }
        for i in range(done)
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "metrics.json").write_text(json.dumps({"eval_run": {"status": status}}))
    lines = ["2026-12-04T20:00:00.000000Z INFO [run] evaluation run started"]
    if halted:
        halt = json.dumps({"reason": halted})
        lines.append(f"2026-12-04T20:00:01.000000Z ERROR [dispatch] halting dispatch {halt}")
    (run / "logs.txt").write_text("".join(line + "\n" for line in lines))
    return run


def _record(returncode: int | None = None, cancel_stage: int = 0) -> ChildRecord:
    return ChildRecord(
        name="r",
        pid=2**22 + 1,  # never a live process: the view is told alive=False anyway
        start_token="x",
        started_at="2026-12-04T20:00:00Z",
        log_offset=0,
        cancel_stage=cancel_stage,
        returncode=returncode,
    )


def _envelope(status: str, **result: Any) -> dict[str, Any]:
    if status == "error":
        return {"status": "error", "error": {"code": "LOCAL_EVAL", "message": "it broke"}}
    return {"status": status, "result": {"cancelled": False, "halted": None, **result}}


@pytest.mark.parametrize(
    ("done", "status", "envelope", "state", "returncode"),
    [
        # An adopted child that finished: its envelope says so, and so does the run directory.
        (TOTAL, "finished", _envelope("success"), "finished", 0),
        (TOTAL, "finished", None, "finished", 0),
        # Its envelope's error, or an interrupt (a Ctrl-C in no daemon's hands), or a halt.
        (1, "incomplete", _envelope("error"), "failed", 1),
        (1, "incomplete", _envelope("partial", cancelled=True), "interrupted", 130),
        (1, "incomplete", _envelope("partial", cancelled=True, halted="too few"), "failed", 1),
    ],
)
def test_an_unreaped_child_gets_the_code_its_end_implies(
    tmp_path: Path,
    done: int,
    status: str,
    envelope: dict[str, Any] | None,
    state: str,
    returncode: int,
) -> None:
    halted = envelope["result"]["halted"] if envelope and "result" in envelope else None
    run = _run(tmp_path, done=done, status=status, halted=halted)
    view = run_view(run, record=_record(), alive=False, child_envelope=envelope)
    assert view.state == state, view.doc
    assert (view.doc["returncode"], view.doc["returncode_source"]) == (returncode, "inferred")


def test_an_interrupted_envelope_names_the_interrupt(tmp_path: Path) -> None:
    run = _run(tmp_path, done=1, status="incomplete")
    view = run_view(
        run, record=_record(), alive=False, child_envelope=_envelope("partial", cancelled=True)
    )
    assert view.doc["cause"] == "the run's process was interrupted (SIGINT or SIGTERM)"


def test_a_cancel_sent_by_a_daemon_implies_the_ctrl_c_code(tmp_path: Path) -> None:
    run = _run(tmp_path, done=1, status="incomplete")
    view = run_view(run, record=_record(cancel_stage=1), alive=False, child_envelope=None)
    assert view.state == "cancelled"
    assert (view.doc["returncode"], view.doc["returncode_source"]) == (130, "inferred")


def test_a_child_killed_unseen_has_no_code_and_says_why(tmp_path: Path) -> None:
    # kill -9 of an adopted child: no envelope, metrics.json still says "running".
    run = _run(tmp_path, done=1, status="running")
    view = run_view(run, record=_record(), alive=False, child_envelope=None)
    assert view.state == "interrupted"
    assert (view.doc["returncode"], view.doc["returncode_source"]) == (None, None)
    assert view.doc["cause"] == "the run's process ended while no daemon could see its exit"


def test_an_exit_the_daemon_saw_is_reported_as_it_was(tmp_path: Path) -> None:
    run = _run(tmp_path, done=1, status="running")
    view = run_view(
        run, record=_record(returncode=-signal.SIGKILL), alive=False, child_envelope=None
    )
    assert (view.doc["returncode"], view.doc["returncode_source"]) == (-signal.SIGKILL, "exit")
    assert view.doc["cause"] == "the run's process was killed by SIGKILL"


def test_a_live_child_has_no_code_yet(tmp_path: Path) -> None:
    run = _run(tmp_path, done=1, status="running")
    view = run_view(run, record=_record(), alive=True, child_envelope=None)
    assert view.state in ("starting", "running")
    assert (view.doc["returncode"], view.doc["returncode_source"]) == (None, None)
