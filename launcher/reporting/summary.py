"""The numbers of a run's report, computed from a :class:`RunData` (pure, no I/O).

The pass rate and every count come from :func:`launcher.rundir.metrics.aggregate_metrics` over
the ``index.jsonl`` rows, the same function the run used for ``metrics.json``, so the page and
the file cannot disagree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from launcher.reporting.model import ReportItem, RunData
from launcher.reporting.stats import Histogram, histogram, percentile
from launcher.rundir.metrics import aggregate_metrics

__all__ = ["Distribution", "RunSummary", "item_json", "summarize"]


@dataclass(frozen=True)
class Distribution:
    """A per-item quantity: its histogram and p50/p95/max over the items that have it."""

    label: str
    histogram: Histogram
    p50: float | None
    p95: float | None
    max: float | None


@dataclass(frozen=True)
class RunSummary:
    """Everything the report's summary shows."""

    status: str
    metrics: dict[str, Any]
    by_status: dict[str, int]
    by_error: dict[str, int]
    tokens: Distribution
    context: Distribution
    duration: Distribution
    wall_ms: float | None
    total: int | None = None
    """Work items in all (None when unknown); ``metrics["total_samples"]`` have a result."""

    @property
    def pending(self) -> int | None:
        """Work items without a result yet (None when the total is unknown)."""
        if self.total is None:
            return None
        return max(0, self.total - int(self.metrics["total_samples"]))

    @property
    def pass_rate(self) -> float | None:
        """Passed over scored items; None when nothing is scored (``metrics["pass_rate"]``
        keeps the reference's integer 0 then, but a shown ``0.0%`` would claim every item
        failed)."""
        return float(self.metrics["pass_rate"]) if self.metrics["completed_samples"] else None

    @property
    def pass_rate_text(self) -> str:
        """``80.0% (16/20)`` as the terminal shows it; ``-`` when nothing is scored, as
        ``eval list`` shows it."""
        rate = self.pass_rate
        if rate is None:
            return "-"
        return f"{rate:.1%} ({self.metrics['passed']}/{self.metrics['completed_samples']})"

    @property
    def progress(self) -> str:
        """``1,265 of 5,000 (3,735 pending)``, or the count alone when every item is done or
        the total is unknown."""
        done = int(self.metrics["total_samples"])
        if self.total is None or not self.pending:
            return f"{done:,}"
        return f"{done:,} of {self.total:,} ({self.pending:,} pending)"


def _distribution(label: str, values: list[float | None]) -> Distribution:
    present = [v for v in values if v is not None]
    return Distribution(
        label=label,
        histogram=histogram(values),
        p50=percentile(present, 50),
        p95=percentile(present, 95),
        max=max(present) if present else None,
    )


def summarize(run: RunData) -> RunSummary:
    """The summary of ``run``: status, metrics, counts, distributions, wall time."""
    items = run.items
    status = run.eval_run.get("status")
    wall = run.eval_run.get("duration_ms")
    spans = [i.duration_ms for i in run.invocations if i.duration_ms is not None]
    if spans:
        wall = sum(spans)  # the run's total over its invocations, not the latest one's
    return RunSummary(
        status=status if isinstance(status, str) else "unknown",
        metrics=aggregate_metrics(run.index_rows, run.pass_threshold),
        by_status=dict(sorted(Counter(i.status for i in items).items())),
        by_error=dict(
            sorted(Counter(i.error_category or "unknown" for i in items if i.error).items())
        ),
        tokens=_distribution("tokens", [i.tokens for i in items]),
        context=_distribution("max_context_tokens", [i.max_context_tokens for i in items]),
        duration=_distribution("duration_ms", [i.duration_ms for i in items]),
        wall_ms=float(wall) if isinstance(wall, int | float) else None,
        total=run.total,
    )


def item_json(item: ReportItem, *, passed: bool | None) -> dict[str, Any]:
    """One item as the page's table and detail view read it (None fields left out)."""
    out: dict[str, Any] = {
        "row": item.row_index,
        "run": item.run_index,
        "id": item.rollout_id,
        "status": item.status,
        "reward": item.reward,
        "tokens": item.tokens,
        "context": item.max_context_tokens,
        "duration_ms": item.duration_ms,
        "passed": passed,
        "error": item.error.to_json() if item.error is not None else None,
        "prompt": item.prompt,
        "label": item.label,
        "transcript": [s.to_json() for s in item.transcript] if item.transcript else None,
        "diagnostics": item.diagnostics,
        "resumed": True if item.resumed else None,
        "rubric": item.rubric or None,
        "usage": item.usage or None,
        "calls": item.calls,
    }
    return {k: v for k, v in out.items() if v is not None}
