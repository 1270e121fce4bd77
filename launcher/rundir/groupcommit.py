"""Group commit: one blocking write-and-fsync on a worker thread for every item queued by then.

The first caller while no commit is in progress commits, on a worker thread, every item queued
so far; callers arriving meanwhile queue up, and the next of them commits the whole queue
with one call of ``commit``. Waiting is shielded and the thread is never abandoned, so a
caller never returns before the commit covering its item, and never leaves one half-counted.
Used by the journal (:mod:`launcher.rundir.journal`) and the call log
(:mod:`launcher.rundir.calls`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

__all__ = ["GroupCommit"]

T = TypeVar("T")


@dataclass
class _Waiter(Generic[T]):
    item: T
    turn: trio.Event = field(default_factory=trio.Event)
    done: bool = False
    error: BaseException | None = None


class GroupCommit(Generic[T]):
    """Queues items and commits them in groups with ``commit`` (blocking, on a worker thread)."""

    def __init__(self, commit: Callable[[list[T]], None]) -> None:
        self._commit = commit
        self._queue: list[_Waiter[T]] = []
        self._committing = False

    async def submit(self, item: T) -> None:
        """Returns once a commit covering ``item`` has returned; raises what that commit raised
        (every caller of the group learns that its item did not count)."""
        waiter = _Waiter(item)
        self._queue.append(waiter)
        with trio.CancelScope(shield=True):
            if self._committing:
                await waiter.turn.wait()
            if not waiter.done:
                await self._commit_queue()
        if waiter.error is not None:
            raise waiter.error

    async def _commit_queue(self) -> None:
        self._committing = True
        group, self._queue = self._queue, []
        error: BaseException | None = None
        try:
            await trio.to_thread.run_sync(self._commit, [w.item for w in group])
        except BaseException as exc:
            error = exc
        finally:
            for waiter in group:
                waiter.done = True
                waiter.error = error
                waiter.turn.set()
            self._committing = False
            if self._queue:
                # The next caller in line commits everything queued during this commit.
                self._queue[0].turn.set()
                self._committing = True
