"""Each item's model calls for the report: its ``calls.jsonl`` records as a timeline
(docs/calls.md), without the per-token data the page has no use for."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.reporting.model import ReportItem
from launcher.rundir.calls import CALLS_FILENAME, read_calls

__all__ = ["attach_calls", "call_timeline"]

_KEPT = (
    "index",
    "model",
    "stream",
    "ttfb_ms",
    "duration_ms",
    "status",
    "upstream_status",
    "error",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "finish_reason",
)


def _seconds(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def call_timeline(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per call: ``start_ms`` (from the rollout's first call), the kept fields of
    :data:`_KEPT` that are present, ``retries`` (how many) and their causes."""
    records = list(records)
    starts = [_seconds(r.get("started_at")) for r in records]
    first = min((s for s in starts if s is not None), default=None)
    out = []
    for record, start in zip(records, starts, strict=True):
        entry: dict[str, Any] = {k: record[k] for k in _KEPT if record.get(k) is not None}
        if start is not None and first is not None:
            entry["start_ms"] = round((start - first) * 1000, 3)
        retries = record.get("retries") or []
        if retries:
            entry["retries"] = len(retries)
            entry["retry_causes"] = [
                f"{r.get('kind')} ({r.get('status')})" for r in retries if isinstance(r, dict)
            ]
        out.append(entry)
    return out


def attach_calls(run_dir: Path, items: list[ReportItem]) -> None:
    """Put each item's call timeline on it (items of a run without ``calls.jsonl`` get none)."""
    path = run_dir / CALLS_FILENAME
    if not path.is_file():
        return
    per_rollout, _ = read_calls(path, (item.rollout_id for item in items))
    for item in items:
        records = per_rollout.get(item.rollout_id)
        if records:
            item.calls = call_timeline(records)
