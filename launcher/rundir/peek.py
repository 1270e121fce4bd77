"""Read-only looks at an existing run directory: its ``metrics.json`` and whether it is
already complete for the same inputs (so a re-run can report it without touching it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher.dataset import SelectedRow
from launcher.rundir.directory import compute_pending
from launcher.rundir.journal import TerminalRecord, WorkKey, replay_journal
from launcher.rundir.manifest import changed_groups, read_manifest

__all__ = ["peek_complete", "read_metrics", "read_status", "read_summary"]


def read_metrics(run_dir: Path) -> dict[str, Any]:
    """``metrics.json`` as a dict; ``{}`` when it is missing or unreadable."""
    try:
        doc = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``metrics.json``'s ``summary`` object, if there is one."""
    summary = read_metrics(run_dir).get("summary")
    return summary if isinstance(summary, dict) else None


def read_status(run_dir: Path) -> str | None:
    """``metrics.json``'s ``eval_run.status`` (``running``, ``finished``, ``incomplete``)."""
    eval_run = read_metrics(run_dir).get("eval_run")
    status = eval_run.get("status") if isinstance(eval_run, dict) else None
    return status if isinstance(status, str) else None


def peek_complete(
    run_dir: Path,
    inputs: dict[str, Any],
    rows: Sequence[SelectedRow],
    n: int,
    *,
    retry_failed: bool,
) -> Mapping[WorkKey, TerminalRecord] | None:
    """The journal's latest records when ``run_dir`` exists for the same inputs, has nothing
    pending and was finalized as ``finished``; else None.

    A changed input returns None too: opening the run then refuses with the exact
    ``Changed: …`` message. A run killed before it finalized returns None, so it is opened
    and finalized (nothing is dispatched)."""
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        return None
    if changed_groups(read_manifest(manifest_path).inputs, inputs):
        return None
    latest = replay_journal(run_dir / "events.jsonl").latest
    if compute_pending(latest, rows, n, retry_failed):
        return None
    if read_status(run_dir) != "finished":
        return None
    return latest
