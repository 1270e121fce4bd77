"""A run whose dispatch halted shows why (launcher.daemon.status): the daemon's view names the
halt's reason from the run's log, whoever started the run."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.daemon.status import log_facts, run_view

REASON = (
    "only 2 of the 3 replicas the run needs are healthy (--ray-min-replicas / "
    "[ray].min_replicas): head 4 in flight · 10.203.0.2 4 in flight"
)


def _run(tmp_path: Path, *lines: str) -> Path:
    run = tmp_path / "d4"
    run.mkdir()
    (run / "progress.json").write_text(json.dumps({"total_runs": 42}))
    (run / "events.jsonl").write_text("")
    (run / "logs.txt").write_text("".join(line + "\n" for line in lines))
    return run


HALT = "2026-12-04T19:59:55.991783Z ERROR [dispatch] halting dispatch " + json.dumps(
    {"reason": REASON}
)
START = "2026-12-04T20:00:00.000000Z INFO [run] evaluation run started"


def test_a_halted_run_says_why(tmp_path: Path) -> None:
    run = _run(tmp_path, START, HALT)
    assert log_facts(run / "logs.txt", 0).halted == REASON
    view = run_view(run, record=None, alive=False, child_envelope=None)
    assert view.state == "failed"
    assert view.doc["cause"] == f"dispatch halted: {REASON}"


def test_a_later_invocation_forgets_an_earlier_halt(tmp_path: Path) -> None:
    run = _run(tmp_path, HALT, START)
    assert log_facts(run / "logs.txt", 0).halted is None
    view = run_view(run, record=None, alive=False, child_envelope=None)
    assert view.state == "interrupted"
