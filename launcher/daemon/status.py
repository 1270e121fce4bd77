"""A run's state and progress, derived from its run directory plus what the daemon knows of its
child: the journal (``events.jsonl``) is the truth for results, ``progress.json`` for the
total, ``logs.txt`` for the stage, the child's record for cancel requests and its exit.

States: ``starting`` (with ``stage``), ``running``, ``cancelling`` (with ``cancel_stage``),
``finished`` (every work item has a result), ``cancelled`` (stopped by a cancel request),
``failed`` (the run ended with an error: the child's envelope, or the ``ERROR [run]`` line
an invocation logs when an error stops it, so one started in a terminal counts too),
``interrupted`` (pending items and no live child, and no error: a signal killed the child, a
Ctrl-C in some terminal, a crash). An ended run's ``cause`` says which, in words. A run whose
lock another process holds (a supervisor started in a terminal) is ``starting`` or
``running`` too, with ``pid`` null: it is not this daemon's to cancel.

``returncode`` is the latest daemon child's exit code. The daemon sees it only for a child it
started itself; for one it adopted after a restart (or one that ended while no daemon ran) it
is the code the child's own JSON envelope, else the run's end state, implies, and
``returncode_source`` says which of the two it is (docs/daemon.md, "Run fields").
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.daemon.children import ChildRecord
from launcher.daemon.live_usage import read_live_usage
from launcher.daemon.logfacts import LogFacts, log_facts
from launcher.errors import EXIT_INTERRUPTED
from launcher.rundir.journal import TerminalRecord, replay_tolerant
from launcher.rundir.lock import run_is_live
from launcher.rundir.metrics import LiveCounters
from launcher.rundir.peek import read_metrics

__all__ = ["RUN_STATES", "LogFacts", "RunView", "log_facts", "percentile", "run_view"]

#: Every state a run can be in (``GET /v1/runs?state=`` takes one of them).
RUN_STATES = (
    "starting",
    "running",
    "cancelling",
    "finished",
    "cancelled",
    "failed",
    "interrupted",
)


def percentile(values: list[int], q: float) -> int | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass
class RunView:
    """Everything ``GET /v1/runs/{name}`` reports."""

    name: str
    run_dir: Path
    state: str
    doc: dict[str, Any]


def _counts(latest: Mapping[tuple[int, int], TerminalRecord], threshold: float) -> dict[str, Any]:
    counters = LiveCounters(pass_threshold=threshold)
    for r in latest.values():
        counters.apply(r.status, r.reward)
    contexts = [r.max_context_tokens for r in latest.values() if r.max_context_tokens is not None]
    errors = Counter(r.error_type or "unknown" for r in latest.values() if r.status == "failed")
    return {
        "succeeded": counters.succeeded,
        "failed": counters.failed,
        "skipped": counters.skipped,
        "passed": counters.passed,
        "pass_rate": counters.pass_rate,
        "tokens": sum(r.tokens or 0 for r in latest.values()),
        "max_context_tokens": {
            "p50": percentile(contexts, 0.5),
            "p95": percentile(contexts, 0.95),
            "max": max(contexts) if contexts else None,
        },
        "errors_by_category": dict(sorted(errors.items())),
    }


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _envelope_code(envelope: Mapping[str, Any] | None) -> int | None:
    """The exit code ``eval run`` gives with this result envelope (launcher.supervisor): 0 for
    a complete run, 130 for one a Ctrl-C or SIGTERM cut short, 1 for an error or a run left
    incomplete otherwise (a halt, a write failure); None without an envelope."""
    status = envelope.get("status") if envelope is not None else None
    if status == "success":
        return 0
    if status == "partial":
        result = envelope.get("result") if envelope is not None else None
        result = result if isinstance(result, dict) else {}
        interrupted = result.get("cancelled") is True and not result.get("halted")
        return EXIT_INTERRUPTED if interrupted else 1
    return 1 if status == "error" else None


#: The exit code an end state implies, for a child whose exit this daemon did not see.
#: ``interrupted`` implies none: a signal (``kill -9``) or a crash ended it, or it vanished.
_CODE_OF_STATE = {"finished": 0, "failed": 1, "cancelled": EXIT_INTERRUPTED}


def _returncode(
    record: ChildRecord, alive: bool, state: str, envelope: Mapping[str, Any] | None
) -> tuple[int | None, str | None]:
    """The latest child's exit code and where it comes from: ``exit`` when this daemon reaped
    the child; ``inferred`` for a child it could not reap (adopted after a restart, or ended
    while no daemon ran), from the child's envelope, else from the run's end state; no code
    (and no source) while the child lives, or when its end leaves none."""
    if record.returncode is not None:
        return record.returncode, "exit"
    if alive:
        return None, None
    code = _envelope_code(envelope)
    if code is None:
        code = _CODE_OF_STATE.get(state)
    return code, None if code is None else "inferred"


def _state(
    *,
    alive: bool,
    record: ChildRecord | None,
    facts: LogFacts,
    pending: int,
    total: int | None,
    status: str | None,
    error: str | None,
    corrupt: str | None,
    envelope_code: int | None = None,
) -> tuple[str, str | None]:
    """The state and, once the run has ended, its cause in words."""
    if corrupt is not None and not alive:
        return "failed", f"its journal (events.jsonl) is corrupt {corrupt}"
    if alive:
        if record is not None and record.cancel_stage:
            return "cancelling", None
        return ("running" if facts.dispatching else "starting"), None
    if pending == 0 and status == "finished":
        return "finished", "every work item has a result"
    if record is not None and record.cancel_stage:
        return "cancelled", f"cancelled through the daemon (stage {record.cancel_stage})"
    if error is not None:
        return "failed", error
    if facts.halted is not None and pending > 0:
        return "failed", f"dispatch halted: {facts.halted}"
    code = record.returncode if record is not None else None
    if code is not None and code < 0:
        return "interrupted", f"the run's process was killed by {_signal_name(-code)}"
    if code == 130:
        return "interrupted", "the run's process was interrupted (SIGINT, a Ctrl-C)"
    if code not in (None, 0):
        return "failed", f"the run's process exited with code {code}"
    if pending == 0 and (status is not None or total is not None):
        # metrics.json may be unreadable: the journal and the total alone say it is done.
        return "finished", "every work item has a result"
    if record is not None and code is None:
        # Not this daemon's own child (an earlier daemon started it): its exit went unseen.
        if envelope_code == EXIT_INTERRUPTED:
            return "interrupted", "the run's process was interrupted (SIGINT or SIGTERM)"
        return "interrupted", "the run's process ended while no daemon could see its exit"
    if total is None:
        return "interrupted", "its total is unknown (no progress.json) and no process runs it"
    return "interrupted", "work items are pending and no process runs them"


def run_view(
    run_dir: Path,
    *,
    record: ChildRecord | None,
    alive: bool,
    child_envelope: dict[str, Any] | None,
) -> RunView:
    """The merged view of one run (reads the run directory; cheap for a few thousand items)."""
    name = run_dir.name
    latest: Mapping[tuple[int, int], TerminalRecord] = {}
    corrupt = None
    if run_dir.is_dir():
        # A corrupt line must not hide the run (nor, in a listing, every other run): the view
        # counts the lines that parse and says where the journal is corrupt.
        latest, corrupt = replay_tolerant(run_dir / "events.jsonl")
    total = _read_json(run_dir / "progress.json").get("total_runs")
    total = total if isinstance(total, int) else None
    done = len(latest)
    pending = max(0, total - done) if total is not None else 0
    facts = log_facts(run_dir / "logs.txt", record.log_offset if record else 0)
    metrics = read_metrics(run_dir)
    eval_run = metrics.get("eval_run")
    eval_run = eval_run if isinstance(eval_run, dict) else {}
    status = eval_run.get("status") if isinstance(eval_run.get("status"), str) else None
    # A run this daemon has no live child of may be run by another process (a supervisor
    # started in a terminal, which holds the run's lock): it is running, not interrupted. One
    # probe of the lock, and none for a finished run.
    elsewhere = not alive and not (pending == 0 and status == "finished") and run_is_live(run_dir)
    if status == "running" and not alive and not elsewhere:
        # Only a supervisor that finalizes rewrites it: one killed (kill -9) left "running"
        # behind, and the run lock, which the kernel released with it, says otherwise (as
        # `eval list` and `eval report` read it).
        status = "incomplete"
    summary = metrics.get("summary")
    threshold = summary.get("pass_threshold", 1.0) if isinstance(summary, dict) else 1.0
    error = child_envelope.get("error") if child_envelope else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        message = facts.error
    live = read_live_usage(run_dir, record.pid) if alive and record is not None else None
    live_totals = live.get("totals") if live is not None else None
    running = alive or elsewhere
    state, cause = _state(
        alive=running,
        record=None if elsewhere else record,  # its cancel stage was an earlier child's
        facts=facts,
        pending=pending,
        total=total,
        status=status,
        error=message,
        corrupt=corrupt,
        envelope_code=_envelope_code(child_envelope),
    )
    doc: dict[str, Any] = {
        "name": name,
        "run_dir": str(run_dir),
        "state": state,
        "cause": cause,
        "total": total,
        "done": done,
        "pending": pending,
        # While the child dispatches: rollouts in flight and the tokens they spent so far.
        "in_flight": live.get("in_flight") if live is not None else None,
        "tokens_in_flight": live_totals.get("total_tokens")
        if isinstance(live_totals, dict)
        else None,
        **_counts(latest, float(threshold)),
        "stage": facts.stage if running else None,
        "stage_message": facts.stage_message if running else None,
        "tunnel_url": facts.tunnel_url if running else None,
        "metrics_status": status,
        "eta_s": None,
    }
    if state == "cancelling" and record is not None:
        doc["cancel_stage"] = record.cancel_stage
    if record is not None:
        doc["pid"] = record.pid if alive else None
        doc["started_at"] = record.started_at
        doc["returncode"], doc["returncode_source"] = _returncode(
            record, running, state, child_envelope
        )
        doc["eta_s"] = _eta(record, done, pending, alive)
    if corrupt is not None:
        doc["error"] = {"code": "JOURNAL_CORRUPT", "message": f"events.jsonl is corrupt {corrupt}"}
    elif isinstance(error, dict):
        doc["error"] = {"code": error.get("code"), "message": error.get("message")}
    elif state == "failed" and facts.error is not None:
        doc["error"] = {"code": None, "message": facts.error}
    return RunView(name=name, run_dir=run_dir, state=state, doc=doc)


def _eta(record: ChildRecord, done: int, pending: int, alive: bool) -> float | None:
    """Seconds left at this child's pace so far (None before its first result)."""
    finished_here = done - record.done_at_start
    if not alive or pending == 0 or finished_here <= 0:
        return None
    try:
        started = datetime.fromisoformat(record.started_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    elapsed = time.time() - started
    return round(elapsed / finished_here * pending, 1) if elapsed > 0 else None
