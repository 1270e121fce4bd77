"""A run's invocations (each ``eval run`` that worked on it: the first, then every resume or
``--retry-failed``), read from ``logs.txt``, so the report's wall time is the run's total and
each invocation's share, not the latest invocation's alone (``metrics.json`` keeps only that).

An invocation starts with its ``INFO [run] <name>: N of M work items pending`` line and ends
with ``INFO [finalize] invocation ended {"duration_ms", "started_at", "status"}``. One that
never finalized (a ``kill -9``, or a run directory from before that line existed) gets the
time from its start to its last log line, marked ``approximate``; the one still running gets
``metrics.json``'s refreshed duration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from launcher.rundir.logs import INVOCATION_ENDED, INVOCATION_STEP

__all__ = ["Invocation", "parse_invocations"]

_LINE = re.compile(r"^(?P<ts>\S+) (?P<level>[A-Z]+) \[(?P<step>[^\]]+)\] (?P<message>.*)$")
_START = re.compile(r"^\S+: \d+ of \d+ work items pending")


@dataclass(frozen=True)
class Invocation:
    """One invocation: when it started, how long it took (ms), how it ended."""

    started_at: str
    duration_ms: float | None
    status: str
    """``finished`` / ``incomplete`` (from its end line), ``running``, or ``ended without
    finalizing``."""
    approximate: bool = False

    def to_json(self) -> dict[str, Any]:
        """For the page."""
        return {
            "started_at": self.started_at,
            "duration_ms": self.duration_ms,
            "status": self.status,
            "approximate": self.approximate,
        }


def _seconds(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _between(start: str, end: str) -> float | None:
    a, b = _seconds(start), _seconds(end)
    return None if a is None or b is None else max(0.0, (b - a) * 1000.0)


def parse_invocations(lines: Iterable[str], latest: dict[str, Any]) -> list[Invocation]:
    """The invocations ``logs.txt``'s ``lines`` tell; ``latest`` is ``metrics.json``'s
    ``eval_run`` (the status and duration of the invocation still open at the end)."""
    found: list[Invocation] = []
    open_at: str | None = None
    last_ts: str | None = None
    for line in lines:
        match = _LINE.match(line.rstrip("\n"))
        if match is None:
            continue
        ts, step, message = match["ts"], match["step"], match["message"]
        if match["level"] == "INFO" and step == "run" and _START.match(message):
            if open_at is not None and last_ts is not None:
                gone = _between(open_at, last_ts)
                found.append(Invocation(open_at, gone, "ended without finalizing", True))
            open_at = ts
        elif step == INVOCATION_STEP and message.startswith(INVOCATION_ENDED):
            found.append(_ended(message[len(INVOCATION_ENDED) :], open_at or ts))
            open_at = None
        last_ts = ts
    if open_at is not None:
        duration = latest.get("duration_ms")
        status = latest.get("status")
        if status == "running" and isinstance(duration, int | float):
            found.append(Invocation(open_at, float(duration), "running"))
        elif last_ts is not None:
            gone = _between(open_at, last_ts)
            found.append(Invocation(open_at, gone, "ended without finalizing", True))
    return found


def _ended(details: str, fallback_start: str) -> Invocation:
    try:
        doc = json.loads(details)
    except ValueError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    duration = doc.get("duration_ms")
    started = doc.get("started_at")
    return Invocation(
        started_at=started if isinstance(started, str) else fallback_start,
        duration_ms=float(duration) if isinstance(duration, int | float) else None,
        status=str(doc.get("status") or "ended"),
    )
