"""The run directory: everything under ``<output>/<run name>/``.

``directory`` holds :class:`RunDirectory` (open, gate, record, finalize); the journal, manifest,
projections, metrics, run names, ``logs.txt`` and the durable-write helpers each have a module
of their own beside it. See ``docs/spec/supervisor.md`` §3 for the files and their contracts.
"""

from launcher.rundir.directory import (
    FailedRow,
    FinalizeResult,
    RunDirectory,
    RunLock,
    RunMeta,
    compute_pending,
    lock_path,
)

__all__ = [
    "FailedRow",
    "FinalizeResult",
    "RunDirectory",
    "RunLock",
    "RunMeta",
    "compute_pending",
    "lock_path",
]
