"""The shape of the step ``eval run`` runs after finalizing, under the run lock (``--upload``).

Kept apart from :mod:`launcher.upload.command` so that the supervisor names the type without
importing httpx or the upload machinery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

__all__ = ["AfterRun"]


class AfterRun(Protocol):
    """Called once the run is finalized: ``complete`` is False for an incomplete or cancelled
    run; ``config_path`` is the workspace-relative config that actually ran."""

    async def __call__(self, run_dir: Path, complete: bool, config_path: str | None) -> None:
        """Act on the finalized run (raise :class:`~launcher.errors.CLIError` to fail it)."""
        ...
