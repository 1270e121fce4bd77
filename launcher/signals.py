"""Two-stage Ctrl-C (and SIGTERM) for the supervisor, owned by one watcher task.

* First signal: every registered *work scope* is cancelled (start-up stages, the dispatch
  workers). Workers then cancel their rollouts on the server inside shielded *settle scopes*
  and wait for the rollouts' cleanup; the rollout server gets the long grace.
* Second signal: every settle scope is cancelled (skip the long cleanup wait) and
  :attr:`Interrupts.hurry` is set, which cuts the rollout server's grace to 5 s.
* Third signal: the root scope is cancelled; cleanup that is still shielded finishes its
  SIGKILL step, everything else is abandoned.

The exit code after any interrupt is 130.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio

from launcher.errors import EXIT_INTERRUPTED

__all__ = ["EXIT_INTERRUPTED", "Interrupts", "watch_signals"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """Interrupt state shared by the supervisor's tasks."""

    def __init__(self, root: trio.CancelScope, notify: Callable[[str], None]) -> None:
        self.count = 0
        self.first = trio.Event()
        self.hurry = trio.Event()
        self._root = root
        self._notify = notify
        self._work: set[trio.CancelScope] = set()
        self._settle: set[trio.CancelScope] = set()

    @property
    def interrupted(self) -> bool:
        """True once the first signal arrived."""
        return self.count > 0

    @contextmanager
    def work_scope(self) -> Iterator[trio.CancelScope]:
        """A cancel scope the first interrupt cancels (cancelled at once if it already came)."""
        scope = trio.CancelScope()
        if self.interrupted:
            scope.cancel()
        self._work.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._work.discard(scope)

    @contextmanager
    def settle_scope(self, timeout: float) -> Iterator[trio.CancelScope]:
        """A shielded scope for cleanup after cancellation, bounded by ``timeout`` and cut short
        by the second interrupt."""
        scope = trio.CancelScope(shield=True, deadline=trio.current_time() + timeout)
        if self.hurry.is_set():
            scope.cancel()
        self._settle.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._settle.discard(scope)

    def signal(self) -> None:
        """React to one SIGINT/SIGTERM."""
        self.count += 1
        if self.count == 1:
            self._notify(
                "interrupted: cancelling in-flight rollouts, press Ctrl-C again to exit now"
            )
            self.first.set()
            for scope in list(self._work):
                scope.cancel()
        elif self.count == 2:
            self._notify("second interrupt: exiting now")
            self.hurry.set()
            for scope in list(self._settle):
                scope.cancel()
        else:
            self._root.cancel()


async def watch_signals(
    interrupts: Interrupts, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Feed SIGINT and SIGTERM to ``interrupts`` until cancelled."""
    with trio.open_signal_receiver(*SIGNALS) as receiver:
        task_status.started()
        async for _ in receiver:
            interrupts.signal()
