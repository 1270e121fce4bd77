"""A run whose supervisor was killed (``kill -9``) before it finalized: metrics.json still says
``running``, and the daemon's view says what ``eval list`` and ``eval report`` say, by the run
lock the kernel released: not running (launcher.daemon.status)."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.daemon.status import run_view
from launcher.rundir.lock import RunLock
from tests.launcher.test_runs import make_run, ok


def _killed_run(tmp_path: Path) -> Path:
    run = make_run(tmp_path / "evals", "killed", records=[ok(0)])
    (run / "progress.json").write_text(json.dumps({"total_runs": 3}))
    (run / "metrics.json").write_text(json.dumps({"eval_run": {"status": "running"}}))
    return run


def test_a_run_whose_supervisor_is_gone_is_not_shown_running(tmp_path: Path) -> None:
    run = _killed_run(tmp_path)
    doc = run_view(run, record=None, alive=False, child_envelope=None).doc
    assert (doc["state"], doc["metrics_status"]) == ("interrupted", "incomplete")


def test_a_run_whose_supervisor_holds_its_lock_keeps_its_metrics_status(tmp_path: Path) -> None:
    run = _killed_run(tmp_path)
    with RunLock.acquire(run.parent, run.name):  # a supervisor at work (in a terminal)
        doc = run_view(run, record=None, alive=False, child_envelope=None).doc
    assert doc["metrics_status"] == "running"
