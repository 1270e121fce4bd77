"""Adaptive concurrency in virtual time: the AIMD limit on its own, and the dispatcher under a
provider that answers every call with 429 for the first 3 s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from launcher.concurrency import InFlightLimit
from launcher.dispatch import Dispatcher, ItemLimits
from launcher.signals import Interrupts
from rollout_server.protocol import RolloutInitRequest, RolloutResultResponse, RolloutSample
from tests.launcher.test_dispatch import ListSink, ScriptedTransport, _item, _result


def _limit(ceiling: int) -> tuple[InFlightLimit, list[str], list[str]]:
    milestones: list[str] = []
    logs: list[str] = []
    return InFlightLimit(ceiling, milestone=milestones.append, log=logs.append), milestones, logs


async def test_a_storm_halves_the_limit_once_per_cooldown(autojump_clock: Any) -> None:
    limit, milestones, _ = _limit(16)
    limit.observe(rate_limited=10, answered=0)
    assert limit.limit == 8
    limit.observe(rate_limited=10, answered=0)  # still cooling down: a lower limit needs time
    assert limit.limit == 8
    await trio.sleep(2.0)
    limit.observe(rate_limited=10, answered=2)
    assert limit.limit == 4
    assert milestones == [
        "in flight lowered to 8 (upstream rate limits)",
        "in flight lowered to 4 (upstream rate limits)",
    ]


async def test_a_few_429s_among_many_answers_change_nothing(autojump_clock: Any) -> None:
    limit, milestones, _ = _limit(16)
    for _ in range(5):
        limit.observe(rate_limited=3, answered=100)
        await trio.sleep(1.0)
    assert limit.limit == 16 and milestones == []


async def test_windows_of_successes_raise_it_back_to_the_ceiling(autojump_clock: Any) -> None:
    limit, milestones, logs = _limit(16)
    limit.observe(rate_limited=5, answered=0)
    limit.observe(rate_limited=0, answered=0)  # an idle second proves nothing
    assert limit.limit == 8
    limit.observe(rate_limited=0, answered=7)  # not yet a window of 8 answers
    assert limit.limit == 8
    limit.observe(rate_limited=0, answered=1)
    assert limit.limit == 10
    limit.observe(rate_limited=0, answered=22)  # two windows (10, then 12) in one sample
    assert limit.limit == 14
    for _ in range(2):
        limit.observe(rate_limited=0, answered=20)
    assert limit.limit == 16
    assert logs == ["in flight raised to 10", "in flight raised to 14"]
    assert milestones[-1] == "in flight back to 16"
    limit.observe(rate_limited=0, answered=20)
    assert limit.limit == 16 and len(milestones) == 2


async def test_it_recovers_while_half_the_calls_get_a_429(autojump_clock: Any) -> None:
    """Issue 27 item 12: a provider that rate-limits half the calls at any load held the limit
    at 1 for good. Each slot answers 4 calls a second (and is refused 4 times)."""
    limit, milestones, logs = _limit(32)
    seen: list[int] = []
    for _ in range(60):
        answered = 4 * limit.limit
        limit.observe(rate_limited=answered, answered=answered)
        seen.append(limit.limit)
        await trio.sleep(1.0)
    assert limit.lowest < 32
    last = seen[20:]
    assert min(last) >= 8 and max(last) >= 16
    # The saw-tooth is logged; the terminal gets one line per new low, not one per tooth.
    assert len(milestones) <= 8 < len(logs)


async def test_never_below_one(autojump_clock: Any) -> None:
    limit, milestones, _ = _limit(2)
    for _ in range(4):
        limit.observe(rate_limited=1, answered=0)
        await trio.sleep(2.0)
    assert limit.limit == 1 and limit.lowest == 1
    assert milestones == ["in flight lowered to 1 (upstream rate limits)"]


async def test_slots_follow_the_current_limit(autojump_clock: Any) -> None:
    limit, _, _ = _limit(4)
    limit.observe(rate_limited=4, answered=0)  # down to 2 before anyone starts
    peak = 0

    async def holder() -> None:
        nonlocal peak
        async with limit.slot():
            peak = max(peak, limit.in_flight)
            await trio.sleep(1.0)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(holder)
            await trio.sleep(1.5)
            assert peak == 2
            limit.observe(rate_limited=0, answered=2)  # a window: 3, a waiter is let in at once
            await trio.sleep(0.1)
            assert limit.in_flight == 3
    assert limit.in_flight == 0


@dataclass
class _Totals:
    rate_limited: int = 0
    answered: int = 0


class _RateLimitedProvider:
    """Each rollout makes one model call per 0.1 s for ``delay`` seconds; before
    ``storm_until`` every call is a 429 (and, as the bridge would, retried until it passes)."""

    def __init__(self, storm_until: float) -> None:
        self.storm_until = storm_until
        self.totals = _Totals()

    def read(self) -> _Totals:
        return _Totals(self.totals.rate_limited, self.totals.answered)

    async def call_until_answered(self) -> None:
        while trio.current_time() < self.storm_until:
            self.totals.rate_limited += 1
            await trio.sleep(0.1)
        self.totals.answered += 1


class _CallingTransport(ScriptedTransport):
    def __init__(self, provider: _RateLimitedProvider) -> None:
        super().__init__(self._success, delay=0.5)
        self.provider = provider

    @staticmethod
    def _success(request: RolloutInitRequest) -> RolloutResultResponse:
        return _result(request.rollout_id, "success", sample=RolloutSample(reward=1.0))

    async def admit(self, request: RolloutInitRequest, admission_timeout_s: float) -> Any:
        handle = await super().admit(request, admission_timeout_s)
        provider = self.provider

        class Calling:
            async def wait(self) -> RolloutResultResponse:
                await provider.call_until_answered()
                result: RolloutResultResponse = await handle.wait()
                return result

        return Calling()


class _Endpoint:
    def bearer_for(self, rollout_id: str) -> str:
        return "tok"

    def chat_url(self, rollout_id: str) -> str:
        return f"http://127.0.0.1:9/v1/rollouts/{rollout_id}"

    async def ready(self) -> None:
        return None

    def take_usage(self, rollout_id: str) -> tuple[int | None, int | None, int | None]:
        return 3, 3, 2

    def forget(self, rollout_id: str) -> None:
        return None

    async def revoke(self, rollout_id: str) -> None:
        return None


def _dispatcher(
    rows: int, concurrency: int, transport: ScriptedTransport, limit: InFlightLimit
) -> tuple[Dispatcher, ListSink]:
    sink = ListSink()
    dispatcher = Dispatcher(
        [_item(row) for row in range(rows)],
        concurrency=concurrency,
        transport=transport,
        endpoint=_Endpoint(),
        sink=sink,
        limits=ItemLimits(item_deadline_s=600.0),
        interrupts=Interrupts(trio.CancelScope(), lambda message: None),
        log=lambda *a: None,
        limit=limit,
    )
    return dispatcher, sink


async def test_429_storm_lowers_in_flight_then_recovers(autojump_clock: Any) -> None:
    provider = _RateLimitedProvider(storm_until=trio.current_time() + 3.0)
    transport = _CallingTransport(provider)
    limit, milestones, _ = _limit(16)
    dispatcher, sink = _dispatcher(400, 16, transport, limit)
    samples: list[tuple[float, int, int]] = []

    async def watch_peaks() -> None:
        while True:
            samples.append((trio.current_time() - start, limit.limit, limit.in_flight))
            await trio.sleep(0.05)

    start = trio.current_time()
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(limit.follow, provider.read)
            nursery.start_soon(watch_peaks)
            report = await dispatcher.run()
            nursery.cancel_scope.cancel()
    assert report.halted is None and len(sink.records) == 400
    assert all(r.status == "success" and r.retries == 2 for r in sink.records)
    assert limit.lowest < 16 and limit.limit == 16
    assert milestones[0].startswith("in flight lowered to ")
    assert milestones[-1] == "in flight back to 16"
    # The rollouts holding slots when the limit dropped finish first (the storm ends at 3 s);
    # from then on no more are in flight than the limit allows, and it was below 16 a while.
    later = [(cap, in_flight) for t, cap, in_flight in samples if t >= 4.0]
    assert all(in_flight <= cap for cap, in_flight in later)
    assert any(cap < 16 and in_flight == cap for cap, in_flight in later)


async def test_replicas_that_join_raise_the_dispatch_s_concurrency(autojump_clock: Any) -> None:
    """A ``--ray`` run whose replicas join after dispatch began: ``grow`` adds workers and
    raises the limit's ceiling, so the items in flight rise to the new concurrency (never
    past it), and every item still runs once."""
    transport = ScriptedTransport(
        lambda request: _result(request.rollout_id, "success", sample=RolloutSample(reward=1.0))
    )
    limit, milestones, _ = _limit(4)
    dispatcher, sink = _dispatcher(60, 4, transport, limit)
    peaks: list[int] = []

    async def join_later() -> None:
        await trio.sleep(2.5)
        peaks.append(transport.peak)
        assert dispatcher.grow(3) == 0  # not more than it has: nothing changes
        assert dispatcher.grow(10) == 6
        await trio.sleep(2.5)
        peaks.append(transport.peak)

    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(join_later)
            report = await dispatcher.run()
    assert report.halted is None and len(sink.records) == 60
    assert len({r.row_index for r in sink.records}) == 60
    assert peaks == [4, 10] and transport.peak == 10
    assert limit.ceiling == 10 and milestones == []
