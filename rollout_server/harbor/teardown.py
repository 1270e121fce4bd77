"""A finished trial's container teardown, run in the background while the next trial starts.

Harbor ends every trial with ``compose down`` (stop, remove, then the project's networks, images
and volumes): a second and more per trial on this machine kind, spent after the trial's result
is already on disk. With the teardown handed over, the compose shim answers that ``down`` at
once (``_compose_shim.py``), Harbor writes ``result.json`` and exits, the backend reads the
outcome, archives and scrubs the trial, answers the rollout and frees its slot; this module then
removes what compose made for the trial, by label and compose project name
(:func:`.containers.sweep_trial`), and the trial's staging dir last.

Guarantees kept:

* **Bounded.** At most ``limit`` teardowns run at once; a trial that ends while all are busy
  holds its own slot until one frees, so a server has at most ``concurrency + limit`` trial
  environments alive.
* **Orphan reaping.** The staging dir (with its owner file) lives until the teardown ended, and
  the containers keep their owner label: a server killed mid-teardown leaves exactly what the
  start-up reaper (:mod:`.reaper`) finds and removes.
* **Stop.** :meth:`Teardowns.aclose` (the backend's shutdown) waits for every teardown.
* **Same trial again.** A rollout id run again waits for its previous teardown first
  (:meth:`Teardowns.wait_for`), so a sweep never removes the new trial's containers.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import trio

from . import containers
from .timings import TrialClock

__all__ = ["DEFER_DOWN_ENV", "Teardowns"]

logger = logging.getLogger("rollout_server.harbor")

#: Set to the rollout server's pid in a trial's Harbor environment: while that process lives
#: the compose shim answers the trial's final ``down`` at once and leaves the work to
#: :class:`Teardowns`.
DEFER_DOWN_ENV = "ROLLBRIDGE_HARBOR_DEFER_DOWN"


class Teardowns:
    """Background teardowns of finished trials on ``engine``, at most ``limit`` at a time."""

    def __init__(self, engine: str, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.engine = engine
        self.limit = limit
        self._slots = trio.Semaphore(limit)
        self._pending: dict[str, trio.Event] = {}
        self._idle = trio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Teardowns started and not yet ended."""
        return len(self._pending)

    async def wait_for(self, trial_name: str) -> None:
        """Return once no teardown of ``trial_name`` is in flight."""
        while (done := self._pending.get(trial_name)) is not None:
            await done.wait()

    async def hand_off(self, trial_name: str, staging: Path, clock: TrialClock) -> None:
        """Start tearing ``trial_name`` down in the background (waiting for a free teardown
        slot first); its staging dir goes last. Returns once the teardown is under way."""
        await self.wait_for(trial_name)
        await self._slots.acquire()
        done = self._pending[trial_name] = trio.Event()
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        # A system task: the rollout's own task ends (its result is answered) meanwhile.
        trio.lowlevel.spawn_system_task(self._tear_down, trial_name, staging, clock, done)

    async def _tear_down(
        self, trial_name: str, staging: Path, clock: TrialClock, done: trio.Event
    ) -> None:
        try:
            clock.mark("down_started")
            removed = await containers.sweep_trial(self.engine, trial_name, volumes=True)
            if not removed:
                logger.debug("harbor: %s had no container left at teardown", trial_name)
            await trio.to_thread.run_sync(shutil.rmtree, staging, True)
            clock.mark("down_done")
            clock.flush()
        except Exception:
            # A system task must not raise; what is left is the start-up reaper's (owner label,
            # staging dir) once this server is gone.
            logger.exception("harbor: background teardown of %s failed", trial_name)
        finally:
            del self._pending[trial_name]
            self._slots.release()
            done.set()
            if not self._pending:
                self._idle.set()

    async def aclose(self) -> None:
        """Wait until every teardown has ended."""
        while self._pending:
            await self._idle.wait()
