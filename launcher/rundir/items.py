"""The run's work items as plain values: what an invocation expects (:class:`RunMeta`,
:class:`ItemGrid`), what is still pending (:func:`compute_pending`) and what finalize reports
(:class:`FailedRow`, :class:`FinalizeResult`). No I/O: :mod:`launcher.rundir.directory` owns
the files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.dataset import SelectedRow, WorkItem
from launcher.rundir.atomic import WriteFailure
from launcher.rundir.journal import TerminalRecord, WorkKey

__all__ = ["FailedRow", "FinalizeResult", "ItemGrid", "RunMeta", "compute_pending"]


@dataclass(frozen=True)
class RunMeta:
    """Facts about this invocation that projections and metrics need (not all are locked)."""

    n: int
    pass_threshold: float
    sampled_rows: int
    total_dataset_rows: int
    dataset_name: str
    model_name: str
    rollout_name: str
    rows: range | None = None
    """The ``row_index`` values of this run (a ``--shard``); None: ``range(sampled_rows)``."""

    @property
    def total_work_items(self) -> int:
        """``sampled_rows × n``."""
        return self.sampled_rows * self.n

    @property
    def row_range(self) -> range:
        """The ``row_index`` values this run expects."""
        return self.rows if self.rows is not None else range(self.sampled_rows)


@dataclass(frozen=True)
class FailedRow:
    """A work item whose latest record is not ``success`` (failed or skipped), for docs/spec/supervisor.md §10.4."""

    row_index: int
    source_row_index: int | None
    run_index: int
    rollout_id: str
    status: str
    error_type: str | None
    rollout_dir: Path


@dataclass
class FinalizeResult:
    """What :meth:`RunDirectory.finalize` wrote, for the results table and the envelope."""

    metrics: dict[str, Any]
    complete: bool
    total_work_items: int
    recorded: int
    succeeded: int
    failed: int
    skipped: int
    resumed: int
    duration_ms: float
    failed_rows: list[FailedRow] = field(default_factory=list)
    write_failure: WriteFailure | None = None
    """The first file of the run that could not be written, if any (the run then exits 1)."""

    @property
    def summary(self) -> dict[str, Any]:
        """``metrics.json.summary``."""
        summary: dict[str, Any] = self.metrics["summary"]
        return summary


def compute_pending(
    latest: Mapping[WorkKey, TerminalRecord],
    selected_rows: Sequence[SelectedRow],
    n: int,
    retry_failed: bool,
) -> list[WorkItem]:
    """Items without a terminal record (plus failed/skipped ones with ``retry_failed``), in
    selection order, row-major then run_index (docs/spec/supervisor.md §4.6)."""
    pending: list[WorkItem] = []
    for row in selected_rows:
        for run_index in range(n):
            record = latest.get((row.row_index, run_index))
            if record is None or (retry_failed and record.status in ("failed", "skipped")):
                pending.append(WorkItem(row, run_index))
    return pending


class ItemGrid:
    """The expected work keys ``(row, run)`` for ``row in rows`` (a range: every row, or a
    shard's every N-th), ``0 <= run < n``, as bounds: a set of them held a tuple, its ints and
    a table slot per item (~13 MB at 100,000 rows)."""

    __slots__ = ("_rows", "_runs")

    def __init__(self, rows: range, n: int) -> None:
        self._rows = rows
        self._runs = range(n)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        row, run = key
        return row in self._rows and run in self._runs

    def __len__(self) -> int:
        return len(self._rows) * len(self._runs)

    def slot(self, key: WorkKey) -> int:
        """The position of an expected key in row-major ``(row, run)`` order."""
        row, run = key
        return self._rows.index(row) * len(self._runs) + run
