"""Adaptive concurrency: fewer rollouts in flight while the provider rate-limits (AIMD).

The dispatcher's workers take a slot of :class:`InFlightLimit` before each admission, so the
limit bounds the rollouts in flight. :meth:`InFlightLimit.follow` samples the bridge's running
totals of 429 answers and answered calls (``bridge.usage.UpstreamPressure``) once a second: a
second in which at least :data:`RATE_LIMITED_SHARE` of the provider's outcomes were 429s halves
the limit (multiplicative decrease, at most once per :data:`DECREASE_COOLDOWN_S`). A window of
successes, as many answered calls as the current limit since the last change (TCP's
congestion window: one round of acknowledgements), raises it by an eighth of the configured
concurrency (additive increase, at most once a sample) until it is back at that ceiling. The
window counts answers whether or not 429s came with them: a provider that rate-limits a
steady share of calls whatever the load would otherwise hold the limit at 1 for good, while
one that limits by load sees the next increase undone by the next decrease, so the limit
oscillates just above what it can take, as TCP does. Occasional 429s among many answers
change nothing: lowering the concurrency would not help them, and the bridge retries them.

A change of direction is a milestone (``in flight lowered to 8 (upstream rate limits)``,
``in flight back to 16``); the steps of a recovery in between go to ``logs.txt`` only.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import trio

__all__ = ["DECREASE_COOLDOWN_S", "RATE_LIMITED_SHARE", "InFlightLimit", "Pressure"]

#: The share of a second's provider outcomes that must be 429s to count as rate limiting.
RATE_LIMITED_SHARE = 0.25
#: Seconds after a decrease before the next one: a lower limit takes a moment to show.
DECREASE_COOLDOWN_S = 2.0
#: Seconds between samples of the bridge's totals.
SAMPLE_INTERVAL_S = 1.0


class Pressure(Protocol):
    """The bridge's running totals (``bridge.usage.UpstreamPressure`` has this shape)."""

    @property
    def rate_limited(self) -> int: ...

    @property
    def answered(self) -> int: ...


class InFlightLimit:
    """A semaphore whose size moves between 1 and ``ceiling`` (see the module docstring)."""

    def __init__(
        self,
        ceiling: int,
        *,
        milestone: Callable[[str], None],
        log: Callable[[str], None],
    ) -> None:
        self.ceiling = max(1, ceiling)
        self.limit = self.ceiling
        self.in_flight = 0
        self.lowest = self.ceiling
        """The lowest limit so far (for reports and tests)."""
        self._step = max(1, math.ceil(self.ceiling / 8))
        self._milestone = milestone
        self._log = log
        self._waiting = trio.lowlevel.ParkingLot()
        self._last_decrease = -math.inf
        self._window = 0
        """Answers since the last change of the limit."""
        self._episode_low = self.ceiling

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot under the current limit (waits for one)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while self.in_flight >= self.limit:
            await self._waiting.park()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._waiting.unpark_all()

    def observe(self, rate_limited: int, answered: int) -> None:
        """One sample: the 429s and answers seen since the previous one."""
        now = trio.current_time()
        outcomes = rate_limited + answered
        pressed = bool(rate_limited) and rate_limited >= RATE_LIMITED_SHARE * outcomes
        if pressed and now - self._last_decrease >= DECREASE_COOLDOWN_S and self.limit > 1:
            self._last_decrease = now
            self._set(max(1, self.limit // 2))
            message = f"in flight lowered to {self.limit} (upstream rate limits)"
            # Under steady pressure the limit saws up and down every few seconds: only a new
            # low since it was last back at the ceiling is worth a line on the terminal.
            if self.limit < self._episode_low:
                self._episode_low = self.limit
                self._milestone(message)
            else:
                self._log(message)
            return
        self._window += answered
        if self._window < self.limit or self.limit >= self.ceiling:
            return
        raised = self.limit
        while self._window >= raised and raised < self.ceiling:
            # One step per window; a fast provider fills several windows in one sample.
            self._window -= raised
            raised = min(self.ceiling, raised + self._step)
        window = self._window
        self._set(raised)
        self._window = window
        if self.limit == self.ceiling:
            self._episode_low = self.ceiling
            self._milestone(f"in flight back to {self.limit}")
        else:
            self._log(f"in flight raised to {self.limit}")

    def raise_ceiling(self, ceiling: int) -> None:
        """Let up to ``ceiling`` in flight from now on (more replicas joined a ``--ray`` run):
        the limit follows when it was at the old ceiling; a lowered one recovers towards the
        new one as it would have towards the old."""
        if ceiling <= self.ceiling:
            return
        at_ceiling = self.limit >= self.ceiling
        self.ceiling = ceiling
        self._step = max(1, math.ceil(ceiling / 8))
        if at_ceiling:
            self.limit = ceiling
            self._episode_low = ceiling
            self._waiting.unpark_all()

    def lowered_limit(self) -> int | None:
        """The limit while it is below the configured concurrency (progress shows it), else
        None."""
        return self.limit if self.limit < self.ceiling else None

    def _set(self, limit: int) -> None:
        self.limit = limit
        self._window = 0
        self.lowest = min(self.lowest, limit)
        # Waiters re-check the new limit; a lower one wakes nobody into a slot.
        self._waiting.unpark_all()

    async def follow(self, read: Callable[[], Pressure]) -> None:
        """Sample ``read()`` every second and adjust the limit (runs until cancelled)."""
        last = read()
        while True:
            await trio.sleep(SAMPLE_INTERVAL_S)
            now = read()
            self.observe(now.rate_limited - last.rate_limited, now.answered - last.answered)
            last = now
