"""What a finished (or already complete) run tells the user: pure functions, no I/O.

The supervisor gathers the facts (finalize's counts, ``metrics.json``'s summary, the failed
records) and these functions turn them into the results-table rows, the failed-row lines, the
next-step commands and the ``resource`` object of the ``--json`` envelope (docs/spec/supervisor.md §10).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launcher.rundir.journal import ErrorInfo, TerminalRecord

__all__ = [
    "COMMAND",
    "Counts",
    "FailedItem",
    "RerunCommand",
    "RunFacts",
    "complete_duration",
    "count_statuses",
    "describe",
    "failed_row_lines",
    "format_duration_ms",
    "next_steps",
    "pending_line",
    "result_resource",
    "results_rows",
    "row_sections",
]

COMMAND = "rollbridge eval run"
#: A failure's reason is cut to this many characters on the terminal (the journal, index.jsonl,
#: logs.txt and ``--json`` keep up to 2 KiB).
REASON_DISPLAY_CHARS = 500


class FailedItem(Protocol):
    """What a report needs of a work item that did not succeed (a journal record fits)."""

    @property
    def row_index(self) -> int: ...
    @property
    def source_row_index(self) -> int | None: ...
    @property
    def run_index(self) -> int: ...
    @property
    def rollout_id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def error(self) -> ErrorInfo | None: ...


@dataclass(frozen=True)
class Counts:
    """Latest outcomes of the selection's work items."""

    succeeded: int
    failed: int
    skipped: int


def count_statuses(records: Iterable[TerminalRecord]) -> Counts:
    """Counts of ``success`` / ``failed`` / anything else (``skipped``)."""
    ok = failed = skipped = 0
    for r in records:
        if r.status == "success":
            ok += 1
        elif r.status == "failed":
            failed += 1
        else:
            skipped += 1
    return Counts(ok, failed, skipped)


def _ordered(records: Iterable[FailedItem]) -> list[FailedItem]:
    return sorted(records, key=lambda rec: (rec.row_index, rec.run_index))


def failed_row_lines(
    records: Iterable[FailedItem],
    run_dir: Path,
    display: Callable[[Path], str],
    *,
    status: str = "failed",
) -> list[str]:
    """The items whose latest status is ``status``, in row order: one line each naming its
    trial directory (§10.4), then, for a failure with a known reason, an indented line saying
    why (``  agent: ValueError: <message>``)."""
    lines = []
    for r in _ordered(records):
        if r.status != status:
            continue
        source = (
            f" (source {r.source_row_index})"
            if r.source_row_index is not None and r.source_row_index != r.row_index
            else ""
        )
        where = display(run_dir / "rollout_trials" / r.rollout_id)
        if status == "skipped" and not r.error_type:
            # The sample asked to be removed from scoring: nothing went wrong.
            lines.append(
                f"row {r.row_index}{source} run {r.run_index}: removed from scoring -> {where}"
            )
        else:
            kind = r.error_type or "unknown"
            lines.append(
                f"row {r.row_index}{source} run {r.run_index}: error_type={kind} -> {where}"
            )
        if r.error is not None:
            lines.append(f"  {r.error.describe(limit=REASON_DISPLAY_CHARS)}")
    return lines


def row_sections(
    records: Iterable[FailedItem], run_dir: Path, display: Callable[[Path], str]
) -> list[tuple[str, list[str]]]:
    """``(title, lines)`` of the "Failed rows" and then the "Skipped rows" sections: a skipped
    row is not a failure, so it is never listed as one."""
    items = list(records)
    return [
        ("Failed rows", failed_row_lines(items, run_dir, display)),
        ("Skipped rows", failed_row_lines(items, run_dir, display, status="skipped")),
    ]


def results_rows(
    name: str,
    output: str,
    summary: dict[str, Any],
    *,
    total: int,
    recorded: int,
    counts: Counts,
    duration_ms: float | str,
) -> list[tuple[str, str]]:
    """The rows of the results table (§10.3); a ``duration_ms`` string is shown as it is (see
    :func:`complete_duration`)."""
    items = f"{recorded}/{total} complete · {counts.succeeded} ok · {counts.failed} failed"
    if counts.skipped:
        items += f" · {counts.skipped} skipped"
    rows = [
        ("Run", name),
        ("Work Items", items),
        (
            "Pass Rate",
            f"{float(summary.get('pass_rate', 0)):.1%} ({summary.get('passed', 0)}/"
            f"{summary.get('completed_samples', 0)} scored, threshold "
            f"{float(summary.get('pass_threshold', 1.0)):g})",
        ),
    ]
    stats = summary.get("reward_stats")
    if isinstance(stats, dict):
        rows.append(
            (
                "Reward",
                f"mean {stats['mean']:.3f} · median {stats['median']:.3f} · "
                f"min {stats['min']:.3f} · max {stats['max']:.3f}",
            )
        )
    points = summary.get("pass_at_k")
    if isinstance(points, list) and points:
        rows.append(("pass@k", " · ".join(f"k={pt['k']} {pt['value']:.2f}" for pt in points)))
    rows.append(("Tokens Used", f"{int(summary.get('tokens_used', 0)):,}"))
    duration = duration_ms if isinstance(duration_ms, str) else format_duration_ms(duration_ms)
    rows.append(("Duration", duration))
    rows.append(("Output", output))
    return rows


#: ``command(*extra)``: a re-run command line for this invocation with ``extra`` flags.
RerunCommand = Callable[..., str]


def next_steps(
    name: str,
    command: RerunCommand,
    *,
    complete: bool,
    failed: int,
    already_complete: bool = False,
) -> list[str]:
    """The "Next steps" commands: resume an unfinished run, retry failures, or (for a run that
    was already complete) start another one or start this one over."""
    quoted = shlex.quote(name)
    steps: list[str] = []
    if already_complete:
        steps.append(f"Start a new run alongside it: {command()}")
        steps.append(
            "Re-run this name from scratch (archives its results): "
            + command("--name", quoted, "--fresh")
        )
    elif not complete:
        steps.append("Resume: " + command("--name", quoted))
    if failed:
        steps.append(
            "Retry failures under the same name: " + command("--name", quoted, "--retry-failed")
        )
    return steps


@dataclass(frozen=True)
class RunFacts:
    """What every result envelope of one invocation shares."""

    dataset_source: str
    total_work_items: int
    workspace_root: Path


def result_resource(
    facts: RunFacts,
    name: str,
    run_dir: Path,
    summary: dict[str, Any],
    *,
    local_run_id: str | None,
    counts: Counts,
    failed_rows: Sequence[FailedItem],
    dispatched: int,
    cancelled: bool,
    resumed: int,
    duration_ms: float,
    halted: str | None = None,
) -> dict[str, Any]:
    """The ``resource`` object of the JSON result envelope (§10.6); ``halted`` is why dispatch
    stopped on its own (the same failure again and again, the rollout server gone, ...)."""
    return {
        "run_name": name,
        "local_run_id": local_run_id,
        "output_path": str(run_dir),
        "dataset_source": facts.dataset_source,
        "total_work_items": facts.total_work_items,
        "dispatched": dispatched,
        "succeeded": counts.succeeded,
        "failed": counts.failed,
        "skipped": counts.skipped,
        "resumed": resumed,
        "cancelled": cancelled,
        "halted": halted,
        "duration_ms": duration_ms,
        "metrics": summary,
        "failed_rows": [
            {
                "row_index": r.row_index,
                "source_row_index": r.source_row_index,
                "run_index": r.run_index,
                "rollout_id": r.rollout_id,
                "error_type": r.error_type,
                "rollout_dir": str(run_dir / "rollout_trials" / r.rollout_id),
                "status": r.status,
                "error": r.error.to_json() if r.error is not None else None,
            }
            for r in _ordered(failed_rows)
        ],
        "workspace_directory": str(facts.workspace_root),
    }


def pending_line(name: str, pending: int, total: int, recorded: int) -> str:
    """The stage line before dispatch (§4.6); with ``--retry-failed`` it also says how many
    recorded results are kept and how many are re-run (recorded items that are pending)."""
    line = f"{name}: {pending} of {total} work items pending"
    if recorded:
        line += f", {recorded} already recorded"
    rerun = pending - (total - recorded)
    if rerun > 0:
        line += f" ({recorded - rerun} kept, {rerun} to re-run)"
    return line


def complete_duration(metrics: Mapping[str, Any]) -> str:
    """The Duration cell of an already-complete run: nothing ran now, so it names how long the
    invocation that finished the run took (``metrics.json`` ``eval_run.duration_ms``)."""
    eval_run = metrics.get("eval_run")
    ms = eval_run.get("duration_ms") if isinstance(eval_run, Mapping) else None
    if isinstance(ms, int | float) and not isinstance(ms, bool) and ms > 0:
        return f"{format_duration_ms(ms)} when it ran (already complete, nothing ran now)"
    return "already complete, nothing ran now"


def format_duration_ms(ms: float) -> str:
    """``12.3s`` / ``45s`` under a minute, else ``3m 11s``, ``2h 5m``, ``1d 3h``."""
    seconds = ms / 1000.0
    if seconds < 60:
        rounded = round(seconds, 1)
        return f"{int(rounded)}s" if rounded == int(rounded) else f"{rounded:.1f}s"
    total = int(seconds)
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m {secs}s" if secs else f"{minutes}m"


def describe(rec: TerminalRecord) -> str:
    """One finished work item, for the line-per-item progress of a non-terminal."""
    text = f"row {rec.row_index} run {rec.run_index}: {rec.status}"
    if rec.reward is not None:
        text += f", reward {rec.reward:g}"
    if rec.error_type:
        text += f" ({rec.error_type})"
    return text
