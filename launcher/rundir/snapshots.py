"""Whole-run files written at open (and progress at finalize): ``dataset_rows.jsonl``,
``progress.json``, and the temp files an interrupted atomic write left behind. The caller holds
the run lock (:class:`launcher.rundir.directory.RunDirectory`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from launcher.dataset import SelectedRow, dataset_rows_jsonl
from launcher.rundir.atomic import atomic_write_bytes, atomic_write_json
from launcher.rundir.items import RunMeta

__all__ = ["remove_stale_temps", "write_dataset_rows", "write_progress"]


def remove_stale_temps(run_dir: Path) -> None:
    """Delete temp files an interrupted atomic write left behind."""
    for directory in (run_dir, run_dir / "trajectories"):
        for temp in directory.glob(".*.tmp"):
            if temp.is_file() and not temp.is_symlink():
                temp.unlink()


def write_dataset_rows(run_dir: Path, selected_rows: Sequence[SelectedRow]) -> bool:
    """Write ``dataset_rows.jsonl`` unless it already holds the selected rows; True when an
    existing file did not match and was rewritten (the caller says so in the log)."""
    data = dataset_rows_jsonl(selected_rows)
    target = run_dir / "dataset_rows.jsonl"
    try:
        existing = target.read_bytes()
    except FileNotFoundError:
        existing = None
    if existing == data:
        return False
    atomic_write_bytes(target, data)
    return existing is not None


def write_progress(run_dir: Path, meta: RunMeta) -> None:
    """``progress.json``: the run's size, for readers that do not replay the journal."""
    atomic_write_json(
        run_dir / "progress.json",
        {
            "total_runs": meta.total_work_items,
            "sampled_rows": meta.sampled_rows,
            "total_dataset_rows": meta.total_dataset_rows,
        },
    )
