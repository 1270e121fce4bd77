"""Load a run directory into a :class:`RunData`: ``manifest.json``, ``metrics.json``,
``index.jsonl``, ``dataset_rows.jsonl``, each item's ``rollout_trials/<id>/trajectory.json`` and
``diagnostics.json``, the journal's error details and ``logs.txt``.

Reading never changes the directory and tolerates a run still in progress: missing projection
files give empty parts, a torn last line is ignored. Symbolic links inside the trial
directories are not followed (the same rule as the run's own projections).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launcher.errors import NotFoundError
from launcher.reporting.calls import attach_calls
from launcher.reporting.invocations import Invocation, parse_invocations
from launcher.reporting.model import ItemError, ReportItem, RunData, TranscriptStep
from launcher.rubric.store import read_rubric_scores
from launcher.rundir.metrics import USAGE_KEYS as SUMMED_USAGE
from launcher.rundir.projections import load_valid_trajectory

__all__ = ["LOG_MAX_CHARS", "MESSAGE_MAX_CHARS", "load_run", "transcript_steps"]

# A page holds every transcript inline; one runaway message must not make it unopenable.
MESSAGE_MAX_CHARS = 20_000
LOG_MAX_CHARS = 1_000_000
_DIAGNOSTICS = "diagnostics.json"


#: Index keys an item keeps beside its tokens (ours: docs/calls.md).
USAGE_KEYS = (*SUMMED_USAGE, "metrics")


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file; unreadable lines (a torn tail while a run writes
    them) are skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for raw in data.splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            yield obj


def _json_object(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _read_nofollow(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _cut(text: str) -> str:
    if len(text) <= MESSAGE_MAX_CHARS:
        return text
    return f"{text[:MESSAGE_MAX_CHARS]}\n… ({len(text) - MESSAGE_MAX_CHARS} more characters)"


def _error(obj: dict[str, Any]) -> ItemError | None:
    """The record's ``error_type`` with its ``error`` object (phase/type/message) if any."""
    detail = obj.get("error")
    error_type = _str(obj.get("error_type"))
    if isinstance(detail, dict):
        return ItemError(
            category=error_type,
            type=_str(detail.get("type")),
            message=_str(detail.get("message")),
            phase=_str(detail.get("phase")),
        )
    if isinstance(detail, str):
        return ItemError(category=error_type, message=detail)
    return ItemError(category=error_type) if error_type is not None else None


def transcript_steps(trajectory: dict[str, Any]) -> list[TranscriptStep]:
    """The steps of an ATIF trajectory as roles, text, tool calls and tool results."""
    steps: list[TranscriptStep] = []
    raw_steps = trajectory.get("steps")
    for step in raw_steps if isinstance(raw_steps, list) else []:
        if not isinstance(step, dict):
            continue
        message = step.get("message")
        text = message if isinstance(message, str) else json.dumps(message, default=str)
        calls = [
            {
                "id": _str(c.get("tool_call_id")),
                "name": _str(c.get("function_name")),
                "arguments": _cut(json.dumps(c.get("arguments"), ensure_ascii=False, default=str)),
            }
            for c in step.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        observation = step.get("observation")
        results = observation.get("results") if isinstance(observation, dict) else None
        observations = [
            {"call_id": _str(r.get("source_call_id")), "content": _cut(str(r.get("content", "")))}
            for r in results or []
            if isinstance(r, dict)
        ]
        steps.append(
            TranscriptStep(
                source=str(step.get("source", "user")),
                message=_cut(text if message is not None else ""),
                tool_calls=calls,
                observations=observations,
            )
        )
    return steps


def _diagnostics(trial: Path) -> dict[str, Any] | None:
    if trial.is_symlink():
        return None
    raw = _read_nofollow(trial / _DIAGNOSTICS)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _log(run_dir: Path) -> tuple[str, bool]:
    """``logs.txt`` (already redacted by the run), its tail when it is very long."""
    raw = _read_nofollow(run_dir / "logs.txt")
    if raw is None:
        return "", False
    text = raw.decode("utf-8", "replace")
    if len(text) <= LOG_MAX_CHARS:
        return text, False
    return text[-LOG_MAX_CHARS:], True


def load_run(run_dir: Path, *, transcripts: bool = True) -> RunData:
    """Read ``run_dir``. Raises :class:`NotFoundError` when it holds no run (no manifest and no
    index). ``transcripts=False`` skips the per-item trial files (the diff's numbers)."""
    run_dir = Path(run_dir)
    manifest = _json_object(run_dir / "manifest.json")
    if not manifest and not (run_dir / "index.jsonl").is_file():
        raise NotFoundError(
            f"{run_dir} is not a run directory (no manifest.json or index.jsonl); pass a run "
            "directory or the name of a run under <workspace>/.osmosis/evals"
        )
    metrics = _json_object(run_dir / "metrics.json")
    eval_run = metrics.get("eval_run")
    if isinstance(eval_run, dict) and eval_run.get("status") == "running":
        from launcher.rundir.lock import run_is_live

        if not run_is_live(run_dir):
            # Its supervisor died (kill -9, a lost machine) or this is a copy: it is not
            # running, and a `--watch` on it must not wait for ever.
            metrics = {**metrics, "eval_run": {**eval_run, "status": "incomplete"}}
    dataset = {
        source_row: obj
        for obj in _jsonl(run_dir / "dataset_rows.jsonl")
        if (source_row := _int(obj.get("row_index"))) is not None
    }
    journal_errors: dict[tuple[int, int], dict[str, Any]] = {}
    for record in _jsonl(run_dir / "events.jsonl"):
        key = (record.get("row_index"), record.get("run_index"))
        if isinstance(key[0], int) and isinstance(key[1], int):
            journal_errors[(key[0], key[1])] = record
    trials = run_dir / "rollout_trials"
    index_rows: list[dict[str, Any]] = []
    items: list[ReportItem] = []
    for row in _jsonl(run_dir / "index.jsonl"):
        row_index, run_index = _int(row.get("row_index")), _int(row.get("run_index"))
        rollout_id, status = _str(row.get("rollout_id")), _str(row.get("status"))
        if row_index is None or run_index is None or rollout_id is None or status is None:
            continue
        index_rows.append(row)
        error = _error(row)
        if error is None or error.message is None:
            # The index may predate the error object; the journal line of the same attempt
            # can still carry it.
            record = journal_errors.get((row_index, run_index), {})
            if record.get("rollout_id") == rollout_id:
                error = _error(record) or error
        source = dataset.get(row_index, {})
        item = ReportItem(
            row_index=row_index,
            run_index=run_index,
            rollout_id=rollout_id,
            status=status,
            reward=_float(row.get("reward")),
            tokens=_int(row.get("tokens")),
            max_context_tokens=_int(row.get("max_context_tokens")),
            duration_ms=_float(row.get("duration_ms")),
            error=error,
            resumed=row.get("resumed") is True,
            prompt=_str(source.get("prompt")),
            label=_str(source.get("label")),
            usage={k: row[k] for k in USAGE_KEYS if row.get(k) is not None},
        )
        if transcripts:
            trajectory = load_valid_trajectory(trials, rollout_id)
            item.transcript = transcript_steps(trajectory) if trajectory is not None else None
            item.diagnostics = _diagnostics(trials / rollout_id)
        items.append(item)
    if transcripts:
        attach_calls(run_dir, items)
    rubrics = _attach_rubric_scores(run_dir, items)
    log_text, truncated = _log(run_dir) if transcripts else ("", False)
    eval_run = metrics.get("eval_run")
    invocations = _invocations(run_dir, eval_run if isinstance(eval_run, dict) else {})
    name = manifest.get("run_name") or metrics.get("eval_run", {}).get("name") or run_dir.name
    from launcher.runs import planned_total

    inputs = manifest.get("inputs")
    return RunData(
        path=run_dir,
        name=str(name),
        manifest=manifest,
        metrics=metrics,
        index_rows=index_rows,
        items=items,
        log_text=log_text,
        log_truncated=truncated,
        rubrics=rubrics,
        invocations=invocations,
        total=planned_total(run_dir, inputs if isinstance(inputs, dict) else {}),
    )


def _invocations(run_dir: Path, eval_run: dict[str, Any]) -> list[Invocation]:
    """The run's invocations from the whole ``logs.txt`` (read line by line, not kept)."""
    path = run_dir / "logs.txt"
    if path.is_symlink():
        return []
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return parse_invocations(fh, eval_run)
    except OSError:
        return []


def _attach_rubric_scores(run_dir: Path, items: list[ReportItem]) -> list[str]:
    """Put each rubric verdict file's scores on the items it judged; returns the labels."""
    labels: list[str] = []
    by_rollout = {item.rollout_id: item for item in items}
    for entry in read_rubric_scores(run_dir):
        label = str(entry.get("model") or "judge")
        if label in labels:  # the same judge with another rubric or range
            label = f"{label} ({str(entry.get('digest', ''))[:8]})"
        labels.append(label)
        for rollout_id, score in entry.get("scores", {}).items():
            item = by_rollout.get(rollout_id)
            if item is not None:
                item.rubric[label] = score
    return labels
