"""Batched actor calls to one node agent (docs/scale-out.md "Cost of the replica path").

A Ray actor call costs the driver about 0.3 ms of CPU whatever it carries (about a quarter on
the trio thread, the rest on Ray's), so a replica's items do not make a call each. While the
replica has items, one ``collect`` call is outstanding: the agent answers it once an answer is
in and :data:`WINDOW_S` has passed, with every answer finished by then (bounded by count and
bytes). New items wait in an outgoing batch. When no collect is outstanding, the batch goes
:data:`WINDOW_S` after its first item, in one ``exchange`` call (the items, then a collect).
While one is, the batch rides on the call that follows the collect's answer (an ``exchange``
sent as soon as the answer is in), or, when no answer comes within :data:`RIDE_S` of its
first item, goes in a ``submit`` call of its own: most items then cost no call of their own
(they are admitted when answers free their slots, right before that next call), and none
waits more than :data:`RIDE_S` (a rollout runs tens of ms at least, and a latency-bound one
seconds). Items finish in bursts (a collect's answers free their slots together), so the
windows gather several items per call exactly when calls are many. A failed ``submit``,
``exchange`` or ``collect`` (the actor died, its node left) fails every item waiting on the
replica; the item's handle then loses the replica, as a failed per-item call did before.

Ray completes the calls on its own threads; their done-callbacks only hand the outcome to the
trio thread (``run_sync_soon``), where everything here runs. Nothing here raises out of a
callback: an exception there would crash the trio run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import trio

from launcher.cluster.refs import ray_cause

__all__ = ["AgentLink", "CallFailed", "Pending"]

#: Items per ``submit`` call (requests are small; this bounds a pickle, not a delay).
MAX_SUBMIT = 64
#: Answers per ``collect`` call, and their trial tars' bytes (at least one answer is returned).
MAX_COLLECT = 256
MAX_COLLECT_BYTES = 16 * 1024 * 1024
#: How long a batch stays open for more items, or a collect for more answers.
WINDOW_S = 0.005
#: How long a batch waits for an outstanding collect's answer to ride on, at most.
RIDE_S = 0.02


class CallFailed(Exception):
    """The agent's ``submit`` or ``collect`` failed (its text: the Ray error's type and text)."""


class Pending:
    """One item's answer, set once: the agent's tuple or the failure of the replica's calls."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._answer: tuple[Any, ...] | None = None
        self._error: str | None = None

    def resolve(self, answer: tuple[Any, ...]) -> None:
        if not self._done.is_set():
            self._answer = answer
            self._done.set()

    def fail(self, cause: str) -> None:
        if not self._done.is_set():
            self._error = cause
            self._done.set()

    async def wait(self) -> tuple[Any, ...]:
        """The agent's answer; raises :class:`CallFailed` when the replica's calls failed."""
        await self._done.wait()
        if self._answer is None:
            raise CallFailed(self._error)
        return self._answer


class AgentLink:
    """The batched ``submit``/``collect`` calls to one agent (see the module docstring)."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self._outgoing: list[tuple[bytes, float]] = []
        self._pending: dict[str, Pending] = {}
        self._refs: set[Any] = set()  # held until their callback ran
        self._collecting = False
        self._sent = trio.Event()  # set when the outgoing batch went (a new one for the next)
        self._failed: str | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    async def submit(
        self, rollout_id: str, request_json: bytes, admission_timeout_s: float
    ) -> Pending:
        """Send one item with the others admitted within the window."""
        pending = Pending()
        if self._failed is not None:
            pending.fail(self._failed)
            return pending
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        self._pending[rollout_id] = pending
        self._outgoing.append((request_json, admission_timeout_s))
        if len(self._outgoing) >= MAX_SUBMIT:
            self._flush()
        elif len(self._outgoing) == 1:
            sent = self._sent
            with trio.CancelScope(shield=True):  # the batch is sent whatever befalls this item
                await trio.sleep(WINDOW_S)
                if self._collecting and not sent.is_set():
                    with trio.move_on_after(RIDE_S - WINDOW_S):  # a collect's answer to ride on
                        await sent.wait()
            if not sent.is_set():
                self._flush()
        return pending

    def fail(self, cause: str) -> None:
        """Fail every item waiting on this agent, and every later one (the replica is lost)."""
        if self._failed is None:
            self._failed = cause
        self._outgoing.clear()
        waiting, self._pending = self._pending, {}
        for pending in waiting.values():
            pending.fail(cause)

    def _flush(self) -> None:
        """Send the outgoing batch (if any): in a ``submit`` while a collect is outstanding,
        else in an ``exchange``; with no batch, the next collect while items wait."""
        batch, self._outgoing = self._outgoing, []
        if batch:
            self._sent.set()
            self._sent = trio.Event()
        if self._failed is not None:
            return
        if self._collecting:
            if batch:
                self._call(self._submitted, "submit", batch)
        elif self._pending:
            self._collect(batch)

    def _collect(self, batch: list[tuple[bytes, float]] | None = None) -> None:
        """The next collect; with ``batch``, an ``exchange`` that submits it first."""
        self._collecting = True
        limits = (MAX_COLLECT, MAX_COLLECT_BYTES, WINDOW_S)
        if batch:
            self._call(self._collected, "exchange", batch, *limits)
        else:
            self._call(self._collected, "collect", *limits)

    def _call(self, then: Callable[[Any, Future[Any]], None], method: str, *args: Any) -> None:
        try:
            ref = getattr(self._actor, method).remote(*args)
            future = ref.future()
        except Exception as exc:
            self.fail(ray_cause(exc))
            return
        self._refs.add(ref)
        token = self._token
        assert token is not None

        def done(result: Future[Any]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(then, ref, result)

        future.add_done_callback(done)

    def _submitted(self, ref: Any, result: Future[Any]) -> None:
        self._refs.discard(ref)
        try:
            result.result()
        except Exception as exc:  # RayActorError, a task error, a cancelled future ...
            self.fail(ray_cause(exc))

    def _collected(self, ref: Any, result: Future[Any]) -> None:
        self._refs.discard(ref)
        self._collecting = False
        try:
            for rollout_id, answer in result.result():
                pending = self._pending.pop(rollout_id, None)
                if pending is not None:
                    pending.resolve(tuple(answer))
        except Exception as exc:
            self.fail(ray_cause(exc))
            return
        if self._pending and self._failed is None:
            self._flush()  # the next collect, with the items waiting to go (an exchange)
