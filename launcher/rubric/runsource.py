"""The records of ``eval rubric --run``: one per finished rollout of a run directory.

A rollout's candidate is the last agent step of its trajectory
(``rollout_trials/<rollout_id>/trajectory.json``) with a non-empty message; the row's prompt
and label (``dataset_rows.jsonl``) are the judge's original input and ground truth. Only the
latest attempt of each work item counts (the journal's view, so a ``--retry-failed`` re-run
is judged anew). Everything is read, nothing written: a run may even still be going.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import NotFoundError, ValidationError
from launcher.rubric.inputs import JudgeRecord
from launcher.rundir.journal import replay_journal
from launcher.rundir.names import validate_run_name
from launcher.rundir.projections import load_valid_trajectory, projection_stem

__all__ = ["RunItem", "RunSource", "load_run", "resolve_run_dir"]

_EVALS = Path(".osmosis") / "evals"


def resolve_run_dir(value: str, cwd: Path) -> Path:
    """``value`` as a run directory path, else as a run name under ``.osmosis/evals/`` of
    ``cwd`` or one of its parents."""
    path = (cwd / Path(value).expanduser()).resolve()
    if path.is_dir():
        if not (path / "events.jsonl").is_file():
            raise ValidationError(f"'{path}' is not a run directory: it has no events.jsonl")
        return path
    try:
        validate_run_name(value)
    except ValidationError:
        raise NotFoundError(f"Run directory '{path}' does not exist.") from None
    for parent in (cwd, *cwd.parents):
        candidate = parent / _EVALS / value
        if (candidate / "events.jsonl").is_file():
            return candidate
    raise NotFoundError(
        f"run '{value}' not found: no .osmosis/evals/{value} in {cwd} or its parents; "
        "pass the run directory's path instead"
    )


@dataclass(frozen=True)
class RunItem:
    """A finished work item and the record judged for it."""

    row_index: int
    run_index: int
    rollout_id: str
    status: str
    reward: float | None
    record: JudgeRecord


@dataclass(frozen=True)
class RunSource:
    """What a run directory offers the judge."""

    run_dir: Path
    items: list[RunItem]
    skipped: list[tuple[str, str]]
    """``(label, reason)`` of finished items that cannot be judged."""

    @property
    def records(self) -> list[JudgeRecord]:
        """The judged records, in work-item order."""
        return [item.record for item in self.items]


def _dataset_rows(run_dir: Path) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    try:
        data = (run_dir / "dataset_rows.jsonl").read_bytes()
    except OSError:
        return rows
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # UnicodeDecodeError included: a damaged line gives no context
            continue
        if isinstance(row, dict) and isinstance(row.get("row_index"), int):
            rows[row["row_index"]] = row
    return rows


def final_agent_message(trajectory: dict[str, Any]) -> str | None:
    """The last non-empty message of an agent step of an ATIF trajectory."""
    steps = trajectory.get("steps")
    for step in reversed(steps if isinstance(steps, list) else []):
        if isinstance(step, dict) and step.get("source") == "agent":
            message = step.get("message")
            if isinstance(message, str) and message.strip():
                return message.strip()
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def load_run(run_dir: Path) -> RunSource:
    """The judgeable records of ``run_dir`` and the finished items that have none."""
    latest = replay_journal(run_dir / "events.jsonl").latest
    rows = _dataset_rows(run_dir)
    items: list[RunItem] = []
    skipped: list[tuple[str, str]] = []
    for (row_index, run_index), terminal in sorted(latest.items()):
        label = projection_stem(row_index, run_index)
        trajectory = load_valid_trajectory(run_dir / "rollout_trials", terminal.rollout_id)
        if trajectory is None:
            skipped.append((label, "no trajectory"))
            continue
        candidate = final_agent_message(trajectory)
        if candidate is None:
            skipped.append((label, "no assistant message in the trajectory"))
            continue
        row = rows.get(row_index, {})
        record = JudgeRecord(
            index=len(items) + 1,
            label=label,
            candidate=candidate,
            original_input=_text(row.get("prompt")),
            ground_truth=_text(row.get("label")),
        )
        items.append(
            RunItem(
                row_index, run_index, terminal.rollout_id, terminal.status, terminal.reward, record
            )
        )
    if not items and not skipped:
        raise ValidationError(f"run directory '{run_dir}' has no finished rollouts yet")
    if not items:
        raise ValidationError(
            f"no finished rollout of '{run_dir}' has a trajectory with an assistant message "
            f"to judge ({len(skipped)} skipped)"
        )
    return RunSource(run_dir, items, skipped)
