"""What ``eval rubric`` prints in rich mode, and its progress bar (spec Part D.5).

Every line goes through the UI, which redacts it. The progress bar is drawn on stderr only
outside ``--json``, for more than one call, and when stderr is a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.text import Text

from launcher.ui import UI

__all__ = ["JudgeProgress", "print_report"]


def _line(ui: UI, text: str, style: str = "") -> None:
    ui.console.print(Text(ui.redact(text), style=style))


def _summary(stats: dict[str, float]) -> str:
    return (
        f"avg={stats['average']:.4f} stdev={stats['stdev']:.4f} "
        f"min={stats['min']:.4f} max={stats['max']:.4f}"
    )


def _runs(ui: UI, runs: dict[str, Any], prefix: str = "") -> None:
    for number, (score, explanation) in enumerate(
        zip(runs["scores"], runs["explanations"], strict=True), start=1
    ):
        _line(ui, f"  {prefix}Run {number:02d}: score={score:.4f}")
        _line(ui, f"    explanation: {explanation}", "dim")
    for error in runs["errors"]:
        _line(ui, f"  {prefix}ERROR: {error}", "red")
    if len(runs["scores"]) > 1:
        _line(ui, f"  {prefix}Summary: {_summary(runs['statistics'])}")


def print_report(ui: UI, report: dict[str, Any], *, notes: Sequence[str] = ()) -> None:
    """The header, each record's runs, the overall statistics, usage and combination."""
    if not ui.rich:
        return
    _line(ui, f"Model: {report['model']}", "bold")
    _line(ui, f"Evaluated {len(report['records'])} record(s) from {report['data_path']}")
    _line(ui, f"Runs per record: {report['number']}")
    for note in notes:
        _line(ui, note, "dim")
    for record in report["records"]:
        _line(ui, f"[{record['label']}]", "bold")
        if "judges" in record:
            for model, runs in record["judges"].items():
                _runs(ui, runs, prefix=f"{model} ")
            mean, majority = record["mean"], record["majority"]
            shown = "none" if majority is None else f"{majority:.4f}"
            if mean is not None:
                _line(ui, f"  Combined: mean={mean:.4f} majority={shown}")
        else:
            _runs(ui, record)
    stats = report["overall_statistics"]
    _line(ui, "Overall Statistics:", "bold")
    _line(ui, f"  Average: {stats['average']:.4f}")
    _line(ui, f"  Stdev: {stats['stdev']:.4f}")
    _line(ui, f"  Min/Max: {stats['min']:.4f} / {stats['max']:.4f}")
    for judge in report["judges"]:
        usage = judge["usage"]
        retries = f", {judge['retries']} retried call(s)" if judge["retries"] else ""
        _line(
            ui,
            f"Judge usage ({judge['model']}): {usage['prompt_tokens']} prompt + "
            f"{usage['completion_tokens']} completion = {usage['total_tokens']} tokens{retries}",
            "dim",
        )
    combined = report.get("combined")
    if combined is not None:
        agreement = combined["agreement"]
        _line(ui, "Combined over judges:", "bold")
        _line(ui, f"  Mean: {_summary(combined['mean'])}")
        _line(
            ui,
            f"  Majority: {_summary(combined['majority'])} "
            f"({combined['majority_records']} of {len(report['records'])} records have one)",
        )
        _line(
            ui,
            f"  Agreement over {agreement['records']} record(s): unanimous "
            f"{agreement['unanimous']:.1%}, pairwise {agreement['pairwise']:.1%}, "
            f"mean |difference| {agreement['mean_abs_diff']:.4f}",
        )


class JudgeProgress:
    """``Evaluating M/N`` on stderr, when the rules above allow it; a context manager."""

    def __init__(self, ui: UI, total: int) -> None:
        self._progress: Progress | None = None
        self._task: Any = None
        if ui.mode != "json" and total > 1 and ui.err_console.is_terminal:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("Evaluating"),
                MofNCompleteColumn(),
                console=ui.err_console,
                transient=True,
            )
            self._task = self._progress.add_task("Evaluating", total=total)

    def advance(self) -> None:
        """One call finished."""
        if self._progress is not None:
            self._progress.advance(self._task)

    def __enter__(self) -> JudgeProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
