"""Opt-in per-trial phase timestamps, for ``scripts/bench/bench_harbor.py``.

When ``ROLLBRIDGE_HARBOR_TIMINGS`` names a file, every trial appends one JSON line to it:
``{"rollout_id", "trial", "marks": {phase: unix time}}``. The marks are the backend's own
steps (slot taken, staged, Harbor spawned and exited, outcome read, archived, retired, done);
Harbor's phases come from the trial's ``result.json``. Nothing is written when it is unset, and
no line holds anything but ids and times.
"""

from __future__ import annotations

import json
import os
import time

__all__ = ["TIMINGS_ENV", "TrialClock"]

TIMINGS_ENV = "ROLLBRIDGE_HARBOR_TIMINGS"


class TrialClock:
    """Wall-clock marks of one trial's steps, written on :meth:`flush` when enabled."""

    def __init__(self, rollout_id: str, trial: str) -> None:
        self.path = os.environ.get(TIMINGS_ENV) or None
        self.rollout_id = rollout_id
        self.trial = trial
        self.marks: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """Record that ``phase`` was reached now (a no-op when timings are off)."""
        if self.path is not None:
            self.marks[phase] = time.time()

    def flush(self) -> None:
        """Append this trial's line (one ``write`` on an ``O_APPEND`` file: lines never mix)."""
        if self.path is None:
            return
        line = json.dumps({"rollout_id": self.rollout_id, "trial": self.trial, "marks": self.marks})
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            return
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
