"""A run's state and progress, derived from its run directory plus what the daemon knows of its
child: the journal (``events.jsonl``) is the truth for results, ``progress.json`` for the
total, ``logs.txt`` for the stage, the child's record for cancel requests and its exit.

States: ``starting`` (with ``stage``), ``running``, ``cancelling`` (with ``cancel_stage``),
``finished`` (every work item has a result), ``cancelled`` (stopped by a cancel request),
``failed`` (the run ended with an error: the child's envelope, or the ``ERROR [run]`` line
an invocation logs when an error stops it, so one started in a terminal counts too),
``interrupted`` (pending items and no live child, and no error: a signal killed the child, a
Ctrl-C in some terminal, a crash). An ended run's ``cause`` says which, in words.
"""

from __future__ import annotations

import json
import re
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
from launcher.rundir.journal import TerminalRecord, replay_tolerant
from launcher.rundir.logs import RUN_FAILED, line_details
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

_LOG_STEP = re.compile(r"^\S+ (?P<level>[A-Z]+) \[(?P<step>[^\]]+)\] (?P<message>.*)$")
_URL = re.compile(r"https://[^\s\"',)]+")
#: Steps that mean the run is past start-up and dispatching.
_DISPATCH_STEP = "schedule"


@dataclass
class LogFacts:
    """What this child's ``logs.txt`` lines say: the last stage, dispatch, the tunnel URL."""

    stage: str | None = None
    stage_message: str | None = None
    dispatching: bool = False
    tunnel_url: str | None = None
    error: str | None = None
    """The error that stopped the latest invocation, from its ``ERROR [run]`` line."""
    halted: str | None = None
    """Why the latest invocation halted dispatch (its ``ERROR [dispatch] halting dispatch``
    line: the same failure again and again, too few cluster replicas, no descriptors)."""


def log_facts(logs_path: Path, offset: int) -> LogFacts:
    """Scan ``logs.txt`` from ``offset`` (where this child's lines begin)."""
    facts = LogFacts()
    try:
        with logs_path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return facts
    for raw in data.decode("utf-8", "replace").splitlines():
        match = _LOG_STEP.match(raw)
        if match is not None and match["level"] == "ERROR" and match["step"] == "run":
            message = match["message"]
            if message.startswith(RUN_FAILED):
                facts.error = message[len(RUN_FAILED) :]
        elif match is not None and match["level"] == "ERROR" and match["step"] == "dispatch":
            facts.halted = _halt_reason(match["message"]) or facts.halted
        if match is None or match["level"] != "INFO":
            continue
        step = match["step"]
        if step == "run":
            facts.error = facts.halted = None  # a later invocation began
        facts.stage, facts.stage_message = step, match["message"]
        if step == _DISPATCH_STEP:
            facts.dispatching = True
        if step == "tunnel":
            url = _URL.search(match["message"])
            facts.tunnel_url = url.group(0) if url else facts.tunnel_url
    return facts


_HALTING = "halting dispatch "


def _halt_reason(message: str) -> str | None:
    """The reason of a ``halting dispatch {"reason": …}`` line, or None."""
    details = line_details(message, _HALTING)
    reason = details.get("reason") if details is not None else None
    return reason if isinstance(reason, str) and reason else None


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
        return "interrupted", "the run's process ended while no daemon watched it"
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
    summary = metrics.get("summary")
    threshold = summary.get("pass_threshold", 1.0) if isinstance(summary, dict) else 1.0
    error = child_envelope.get("error") if child_envelope else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        message = facts.error
    live = read_live_usage(run_dir, record.pid) if alive and record is not None else None
    live_totals = live.get("totals") if live is not None else None
    state, cause = _state(
        alive=alive,
        record=record,
        facts=facts,
        pending=pending,
        total=total,
        status=status,
        error=message,
        corrupt=corrupt,
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
        "stage": facts.stage if alive else None,
        "stage_message": facts.stage_message if alive else None,
        "tunnel_url": facts.tunnel_url if alive else None,
        "metrics_status": status,
        "eta_s": None,
    }
    if state == "cancelling" and record is not None:
        doc["cancel_stage"] = record.cancel_stage
    if record is not None:
        doc["pid"] = record.pid if alive else None
        doc["started_at"] = record.started_at
        doc["returncode"] = record.returncode
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
