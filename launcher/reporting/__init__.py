"""Reports of finished (or running) evaluations: ``rollbridge eval report`` renders one run
directory as a self-contained HTML page, ``rollbridge eval diff`` pairs the items of two runs
of the same dataset and rows and tests the difference.

Read-only over run directories; stdlib statistics only.
"""

from launcher.reporting.diff import DiffResult, RowsMismatch, diff_runs
from launcher.reporting.load import load_run
from launcher.reporting.model import ItemError, ReportItem, RunData
from launcher.reporting.report_page import render_report
from launcher.reporting.resolve import resolve_run_dir

__all__ = [
    "DiffResult",
    "ItemError",
    "ReportItem",
    "RowsMismatch",
    "RunData",
    "diff_runs",
    "load_run",
    "render_report",
    "resolve_run_dir",
]
