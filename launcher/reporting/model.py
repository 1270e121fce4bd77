"""The typed view of one run directory that the report and the diff are built from.

Everything here is plain data: :mod:`launcher.reporting.load` fills it from the files a run
leaves behind, and no run file is ever changed (the only thing written is the page itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.reporting.invocations import Invocation

__all__ = ["ItemError", "ReportItem", "RunData", "TranscriptStep"]


@dataclass(frozen=True)
class ItemError:
    """Why an item failed. ``category`` is the journal's ``error_type``; ``type``, ``phase``
    and ``message`` come from the record's ``error`` object when it has one (for example the
    exception type, ``agent``/``grader``, and its message)."""

    category: str | None
    message: str | None = None
    phase: str | None = None
    type: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The non-empty fields, for the page."""
        out = {
            "category": self.category,
            "type": self.type,
            "phase": self.phase,
            "message": self.message,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class TranscriptStep:
    """One step of an ATIF trajectory: who spoke, what, which tools were called and what
    they returned."""

    source: str
    message: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The step for the page (empty lists left out)."""
        out: dict[str, Any] = {"source": self.source, "message": self.message}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.observations:
            out["observations"] = self.observations
        return out


@dataclass
class ReportItem:
    """One work item (a row of ``index.jsonl``) joined with its dataset row and trial files."""

    row_index: int
    run_index: int
    rollout_id: str
    status: str
    reward: float | None = None
    tokens: int | None = None
    max_context_tokens: int | None = None
    duration_ms: float | None = None
    error: ItemError | None = None
    resumed: bool = False
    prompt: str | None = None
    label: str | None = None
    transcript: list[TranscriptStep] | None = None
    diagnostics: dict[str, Any] | None = None
    rubric: dict[str, float] = field(default_factory=dict)
    """Judge label -> this rollout's mean rubric score (``rollbridge eval rubric --run``)."""
    usage: dict[str, Any] = field(default_factory=dict)
    """The index row's ``calls``, ``cached_tokens``, ``cache_write_tokens``,
    ``reasoning_tokens``, ``retries`` and ``metrics`` (those it has)."""
    calls: list[dict[str, Any]] | None = None
    """The rollout's model calls as a timeline (launcher.reporting.calls), when loaded."""

    @property
    def call_count(self) -> int | None:
        """Model calls the rollout made (the index row's ``calls``), when recorded."""
        value = self.usage.get("calls")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def key(self) -> tuple[int, int]:
        """``(row_index, run_index)``: what pairs two runs' items."""
        return (self.row_index, self.run_index)

    @property
    def error_category(self) -> str | None:
        """The error's category (the journal's ``error_type``), if any."""
        if self.error is None:
            return None
        return self.error.category or self.error.type

    def passed(self, threshold: float) -> bool | None:
        """Whether the attempt passed, as ``metrics.json`` counts it (a reward meeting the
        threshold, whatever the status); None for a skipped item, which is not scored."""
        if self.status == "skipped":
            return None
        return self.reward is not None and self.reward >= threshold


@dataclass
class RunData:
    """A loaded run directory.

    ``index_rows`` are the raw ``index.jsonl`` objects (the source of every per-item number),
    ``items`` the same rows joined with their dataset row, transcript and diagnostics.
    """

    path: Path
    name: str
    manifest: dict[str, Any]
    metrics: dict[str, Any]
    index_rows: list[dict[str, Any]]
    items: list[ReportItem]
    log_text: str
    log_truncated: bool = False
    rubrics: list[str] = field(default_factory=list)
    """Labels of the rubric verdict files of the run (one column each on the page)."""
    invocations: list[Invocation] = field(default_factory=list)
    """Each ``eval run`` that worked on the run, oldest first (from ``logs.txt``)."""
    total: int | None = None
    """How many work items the run has in all (``progress.json``, else the manifest)."""

    @property
    def inputs(self) -> dict[str, Any]:
        """The manifest's resolved-input lock (``{}`` when there is no manifest)."""
        inputs = self.manifest.get("inputs")
        return inputs if isinstance(inputs, dict) else {}

    @property
    def eval_run(self) -> dict[str, Any]:
        """``metrics.json``'s ``eval_run`` object (status, names, wall time)."""
        doc = self.metrics.get("eval_run")
        return doc if isinstance(doc, dict) else {}

    @property
    def pass_threshold(self) -> float:
        """The threshold the run scored with (``metrics.json``), 1.0 when unknown."""
        summary = self.metrics.get("summary")
        value = summary.get("pass_threshold") if isinstance(summary, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return 1.0
