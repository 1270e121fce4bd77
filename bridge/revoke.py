"""Revoked rollout ids: the bridge refuses every model call of a rollout its supervisor gave up.

Why: when a cluster replica is lost (docs/scale-out.md, "Node loss"), the supervisor runs the
item again under a new rollout id; the old attempt may still be alive on a partitioned node and
would keep spending tokens under the old id. The supervisor revokes that id
(:meth:`bridge.server.BridgeHandle.revoke`, or ``["r", id, n]`` over the process socket), and
from then on every call for it, on every route, is refused before its body is read and before
any upstream call (:class:`bridge.app.BufferedBody`), with status :data:`REVOKED_STATUS`. Calls
of the id already in flight are cancelled, as if their client had gone away.

A revocation lasts as long as the bridge: the ids are a set, a few dozen bytes each, and a node
loss revokes only the rollouts that were in flight on it.

Ended rollouts are refused too. Once the supervisor has taken a rollout's usage for its record
(or given the attempt up: cancelled, requeued, interrupted), it tells the bridge to forget the
rollout (``["x", id]``, batched: within :data:`bridge.channel._FORGET_DELAY_S`), and from then
on the bridge refuses that id's calls as it refuses a revoked one's (:meth:`Revocations.finish`),
cancelling any still running: a workflow that leaves a task calling the model after its result
was sent spends nothing more, and no usage lands after the record that should have counted it.
The newest :data:`FINISHED_KEEP` ended ids are kept (a run's ids are one per attempt, so this
bounds the bridge's memory on long runs); an id older than that is served again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

import trio

__all__ = [
    "FINISHED_KEEP",
    "REVOKED_STATUS",
    "SETTLE_S",
    "Revocations",
    "finished_message",
    "revoked_message",
]

#: 410 Gone rather than 403: the caller holds the run's bearer and is allowed in; what is gone,
#: for good, is the rollout its URL names (403 would read as a credential or permission problem
#: to fix). No SDK retries a 410.
REVOKED_STATUS: Final = 410
#: How long a revocation waits for the calls it cancelled to unwind (seconds).
SETTLE_S: Final = 5.0
#: How many ended rollouts' ids are refused at once (the newest; about 100 bytes each).
FINISHED_KEEP: Final = 65536


def revoked_message(rollout_id: str) -> str:
    """The error message of a refused call."""
    return (
        f"rollout {rollout_id} was revoked by its supervisor (its attempt was abandoned, e.g. "
        "its replica was lost, and the item runs again under a new rollout id): this bridge "
        "refuses every model call for it"
    )


def finished_message(rollout_id: str) -> str:
    """The error message of a refused call of an ended rollout."""
    return (
        f"rollout {rollout_id} has ended (its supervisor recorded its result or gave the attempt "
        "up): this bridge refuses every model call for it"
    )


class Revocations:
    """The revoked and ended ids, and the calls running now per rollout id (to cancel them)."""

    def __init__(self, log: Callable[[str, str], None], keep: int = FINISHED_KEEP) -> None:
        self._log = log
        # Revoked id -> whether its first refusal was logged (once per id, not per call).
        self._revoked: dict[str, bool] = {}
        # Ended id -> the same; insertion order is age (the oldest go past ``keep``).
        self._finished: dict[str, bool] = {}
        self._keep = keep
        self._running: dict[str, set[trio.CancelScope]] = {}
        self._idle: dict[str, trio.Event] = {}

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._revoked or rollout_id in self._finished

    def __len__(self) -> int:
        return len(self._revoked) + len(self._finished)

    def message(self, rollout_id: str) -> str:
        """Why ``rollout_id``'s calls are refused."""
        if rollout_id in self._revoked:
            return revoked_message(rollout_id)
        return finished_message(rollout_id)

    def finish(self, rollout_id: str) -> int:
        """``rollout_id`` has ended: refuse its calls from now on and cancel those running;
        how many were. Only the newest :data:`FINISHED_KEEP` ended ids are kept."""
        if rollout_id in self._revoked or rollout_id in self._finished:
            return 0
        self._finished[rollout_id] = False
        if len(self._finished) > self._keep:
            del self._finished[next(iter(self._finished))]
        running = self._running.get(rollout_id, ())
        for scope in running:
            scope.cancel()
        if running:
            # Info, not a warning: a call whose answer was all sent may still be leaving its
            # handler as the forget comes; a stray call's refusals are the warning.
            self._log(
                "info",
                f"rollout {rollout_id} ended: cancelled {len(running)} model call(s) in flight",
            )
        return len(running)

    def revoke(self, rollout_id: str) -> int:
        """Refuse ``rollout_id``'s calls from now on and cancel those running; how many were."""
        self._revoked.setdefault(rollout_id, False)
        running = self._running.get(rollout_id, ())
        for scope in running:
            scope.cancel()
        if running:
            self._log(
                "warning",
                f"revoked rollout {rollout_id}: cancelled {len(running)} model call(s) in flight",
            )
        return len(running)

    async def settled(self, rollout_id: str) -> None:
        """Return once no call of ``rollout_id`` runs (at most :data:`SETTLE_S`)."""
        if not self._running.get(rollout_id):
            await trio.lowlevel.checkpoint()
            return
        idle = self._idle.setdefault(rollout_id, trio.Event())
        with trio.move_on_after(SETTLE_S):
            await idle.wait()

    def refused(self, rollout_id: str) -> None:
        """Note one refused call of a revoked or ended id: the first one is logged."""
        for ids in (self._revoked, self._finished):
            if ids.get(rollout_id) is False:
                ids[rollout_id] = True
                self._log("warning", f"refusing model calls: {self.message(rollout_id)}")
                return

    @contextmanager
    def running(self, rollout_id: str) -> Iterator[trio.CancelScope]:
        """Run one call of ``rollout_id`` inside the yielded scope, which :meth:`revoke`
        cancels; check its ``cancelled_caught`` afterwards."""
        scope = trio.CancelScope()
        calls = self._running.get(rollout_id)
        if calls is None:
            calls = self._running[rollout_id] = set()
        calls.add(scope)
        try:
            with scope:
                yield scope
        finally:
            calls.discard(scope)
            if not calls:
                del self._running[rollout_id]
                idle = self._idle.pop(rollout_id, None)
                if idle is not None:
                    idle.set()
