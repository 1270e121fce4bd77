"""Finding Harbor's command line for a rollout environment."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["HarborSetupError", "find_harbor"]

_TESTBED_HARBOR = Path.home() / ".cache" / "rollbridge" / "harbor-venv" / "bin" / "harbor"


class HarborSetupError(RuntimeError):
    """Harbor cannot run here (not installed, bad task directory)."""


def find_harbor(explicit: str | Sequence[str] | None = None) -> list[str]:
    """The command that runs Harbor's CLI.

    In order: ``explicit``; ``$ROLLBRIDGE_HARBOR``; ``harbor`` next to this interpreter (the
    ``rollbridge[harbor]`` extra); the venv ``scripts/sandbox-testbed`` builds; ``harbor`` on PATH.
    """
    if explicit is not None:
        return [explicit] if isinstance(explicit, str) else list(explicit)
    candidates = [
        os.environ.get("ROLLBRIDGE_HARBOR", ""),
        str(Path(sys.executable).parent / "harbor"),
        str(_TESTBED_HARBOR),
        shutil.which("harbor") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return [candidate]
    raise HarborSetupError(
        "Harbor is not installed: run scripts/sandbox-testbed (or install rollbridge[harbor] "
        "on Python >= 3.12, or set ROLLBRIDGE_HARBOR to the harbor executable)"
    )
