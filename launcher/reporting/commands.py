"""``rollbridge eval report`` and ``rollbridge eval diff``: resolve the runs, load them, write
the page, print the summary (rich, plain or one JSON envelope).

Every user error is a :class:`launcher.errors.CLIError` (one ``Error: …`` line, exit 1).
"""

from __future__ import annotations

import time
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.table import Table

from launcher.outputs import output_path, refuse_run_files, write_output
from launcher.reporting.diff import diff_runs
from launcher.reporting.diff_page import diff_rows, render_diff
from launcher.reporting.load import load_run
from launcher.reporting.report_page import REFRESH_SECONDS, render_report
from launcher.reporting.resolve import resolve_run_dir
from launcher.reporting.summary import summarize
from launcher.ui import UI

__all__ = ["RunLocator", "diff_command", "report_command", "write_page"]


@dataclass(frozen=True)
class RunLocator:
    """Where run names are looked up (``--workspace``, ``--output-root``) and the cwd."""

    cwd: Path
    workspace: str | None = None
    output_root: str | None = None

    def resolve(self, arg: str) -> Path:
        """The run directory ``arg`` names."""
        return resolve_run_dir(
            arg, cwd=self.cwd, workspace=self.workspace, output_root=self.output_root
        )


def write_page(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a reader never sees half a page) and return
    where it went (:func:`launcher.outputs.write_output`)."""
    return write_output(path, text.encode("utf-8"))


def _open(path: Path) -> None:
    webbrowser.open(path.resolve().as_uri())


def report_command(
    ui: UI,
    locator: RunLocator,
    run: str,
    *,
    output: str | None,
    open_browser: bool,
    watch: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write the report page of ``run``; with ``watch``, rewrite it until the run finishes."""
    run_dir = locator.resolve(run)
    default = run_dir / "report.html"
    target = output_path(output, locator.cwd) if output else default
    refuse_run_files(
        target, cwd=locator.cwd, runs=[run_dir], allowed=[default], what="page", default=default
    )
    data = load_run(run_dir)
    target = write_page(target, render_report(data, refresh=watch))
    if open_browser:
        _open(target)
    while watch and data.eval_run.get("status") == "running":
        sleep(REFRESH_SECONDS)
        data = load_run(run_dir)
        write_page(target, render_report(data, refresh=True))
    summary = summarize(data)
    m = summary.metrics
    message = f"Report written: {target}"
    if ui.mode == "json":
        ui.envelope(
            "eval.report",
            message,
            {
                "path": str(target),
                "run_dir": str(run_dir),
                "status": summary.status,
                "done": m["total_samples"],
                "total": summary.total,
                "pending": summary.pending,
                "progress": summary.progress,
                "summary": m,
            },
        )
        return 0
    if ui.mode == "plain":
        # docs/report.md: --plain prints only the page's path (for scripts).
        ui.console.print(str(target), markup=False, highlight=False, soft_wrap=True)
        return 0
    if ui.rich:
        ui.results_table(
            f"Report: {data.name}",
            [
                ("status", summary.status),
                ("pass rate", summary.pass_rate_text),  # "-" while nothing is scored
                (
                    "items",
                    f"{summary.progress} ({m['failed']} failed, {m['skipped']} skipped)",
                ),
                ("tokens", f"{m['tokens_used']:,}"),
            ],
        )
    ui.console.print(message, markup=False, highlight=False)
    return 0


def diff_command(ui: UI, locator: RunLocator, run_a: str, run_b: str, *, output: str | None) -> int:
    """Compare two runs: print the paired table (or JSON) and write the diff page."""
    dir_a, dir_b = locator.resolve(run_a), locator.resolve(run_b)
    default = (locator.cwd / f"diff-{dir_a.name}-vs-{dir_b.name}.html").resolve()
    target = output_path(output, locator.cwd) if output else default
    refuse_run_files(target, cwd=locator.cwd, runs=[dir_a, dir_b], allowed=[default], what="page")
    a = load_run(dir_a)
    b = load_run(dir_b)
    result = diff_runs(a, b)
    target = write_page(target, render_diff(result))
    message = f"Diff written: {target}"
    if ui.mode == "json":
        ui.envelope("eval.diff", message, {"path": str(target), **result.to_json()})
        return 0
    rows = diff_rows(result)
    if ui.rich:
        table = Table(title=f"{a.name} → {b.name}", title_justify="left", box=box.ROUNDED)
        for header in ("", f"A: {a.name}", f"B: {b.name}", "B − A"):
            table.add_column(header)
        for row in rows:
            table.add_row(*row)
        ui.console.print(table)
        if result.other_changes:
            ui.console.print(f"Inputs that differ: {', '.join(result.other_changes)}", markup=False)
    else:
        for what, va, vb, delta in rows:
            shown = " | ".join(v for v in (va, vb, delta) if v)
            ui.console.print(f"{what}: {shown}", markup=False, highlight=False)
    ui.console.print(message, markup=False, highlight=False)
    return 0
