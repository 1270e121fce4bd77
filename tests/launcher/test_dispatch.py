"""Dispatch logic in virtual time, with a scripted rollout transport: concurrency, outcome
classification, halting on faults, the per-item deadline and the two-stage interrupt."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from launcher.dataset import SelectedRow, WorkItem
from launcher.dispatch import (
    Dispatcher,
    ItemLimits,
    RolloutRefused,
    classify,
    resolve_concurrency,
)
from launcher.report import format_duration_ms
from launcher.requeue import RolloutLost
from launcher.rundir.journal import TerminalRecord
from launcher.signals import Interrupts
from rollout_server.protocol import (
    RolloutErrorCategory,
    RolloutInitRequest,
    RolloutResultResponse,
    RolloutSample,
    RolloutStatus,
)


def _item(row: int, run: int = 0) -> WorkItem:
    return WorkItem(
        SelectedRow(
            row_index=row,
            source_row_index=row + 10,
            system_prompt=None,
            user_prompt=f"q{row}",
            label=f"a{row}",
            metadata=None,
        ),
        run,
    )


def _result(rid: str, status: str, **kw: Any) -> RolloutResultResponse:
    return RolloutResultResponse(rollout_id=rid, status=RolloutStatus(status), **kw)


class ScriptedTransport:
    """Each admitted rollout sleeps ``delay`` then answers ``outcome(request)``."""

    def __init__(self, outcome: Any, delay: float = 1.0) -> None:
        self.outcome = outcome
        self.delay = delay
        self.requests: list[RolloutInitRequest] = []
        self.cancelled: list[str] = []
        self.in_flight = 0
        self.peak = 0

    async def admit(self, request: RolloutInitRequest, admission_timeout_s: float) -> Any:
        self.requests.append(request)
        answer = self.outcome(request)
        if isinstance(answer, Exception) and not isinstance(answer, TimeoutError):
            raise answer
        transport = self

        class Handle:
            async def wait(self) -> RolloutResultResponse:
                if request.rollout_id in transport.cancelled:
                    return _result(request.rollout_id, "cancelled", err_message="cancelled")
                transport.in_flight += 1
                transport.peak = max(transport.peak, transport.in_flight)
                try:
                    if isinstance(answer, TimeoutError):
                        await trio.sleep_forever()
                    await trio.sleep(transport.delay)
                finally:
                    transport.in_flight -= 1
                return answer

        return Handle()

    async def cancel(self, rollout_id: str) -> None:
        self.cancelled.append(rollout_id)

    async def explain(self, exc: BaseException) -> str | None:
        return None


class FixedEndpoint:
    """A model endpoint at a fixed base URL that reports 7 tokens, context 5, per rollout;
    ``events`` lists its revokes and forgets, ``("revoke", rollout_id)``, in order."""

    def __init__(self, events: list[tuple[str, str]] | None = None) -> None:
        self.events: list[tuple[str, str]] = [] if events is None else events

    def bearer_for(self, rollout_id: str) -> str:
        return "tok"

    def chat_url(self, rollout_id: str) -> str:
        return f"http://127.0.0.1:9/v1/rollouts/{rollout_id}"

    async def ready(self) -> None:
        return None

    def take_usage(self, rollout_id: str) -> tuple[int | None, int | None]:
        return 7, 5

    def forget(self, rollout_id: str) -> None:
        self.events.append(("forget", rollout_id))

    async def revoke(self, rollout_id: str) -> None:
        await trio.sleep(0.5)  # the bridge's answer takes a while: dispatch waits for it
        self.events.append(("revoke", rollout_id))


class ListSink:
    def __init__(self) -> None:
        self.records: list[TerminalRecord] = []
        self.halts: list[str] = []

    async def record(self, record: TerminalRecord, *, has_sample: bool) -> None:
        self.records.append(record)

    def halted(self, reason: str) -> None:
        self.halts.append(reason)


def _success(request: RolloutInitRequest) -> RolloutResultResponse:
    return _result(
        request.rollout_id, "success", sample=RolloutSample(reward=1.0, label=request.label)
    )


def _dispatcher(
    items: list[WorkItem], transport: ScriptedTransport, interrupts: Interrupts, **kw: Any
) -> tuple[Dispatcher, list[TerminalRecord], list[str]]:
    sink = ListSink()
    dispatcher = Dispatcher(
        items,
        concurrency=kw.pop("concurrency", 2),
        transport=transport,
        endpoint=kw.pop("endpoint", None) or FixedEndpoint(),
        sink=sink,
        limits=ItemLimits(
            item_deadline_s=kw.pop("deadline", 70.0), agent_timeout_sec=5.0, grader_timeout_sec=5.0
        ),
        interrupts=interrupts,
        log=lambda *a: None,
    )
    records, halts = sink.records, sink.halts
    return dispatcher, records, halts


def _interrupts() -> Interrupts:
    return Interrupts(trio.CancelScope(), lambda message: None)


@pytest.mark.parametrize(
    ("flag", "batch", "cap", "expected"),
    [
        (None, None, None, 1),
        (None, None, 4, 4),
        (8, None, 4, 4),
        (None, 8, None, 8),
        (3, 8, 16, 3),
        (0, -2, None, 1),
        (None, 0, 5, 5),
    ],
)
def test_resolve_concurrency(flag: Any, batch: Any, cap: Any, expected: int) -> None:
    assert resolve_concurrency(flag, batch, cap) == expected


def test_classify() -> None:
    item = _item(3)
    ok = classify(item, "r", _result("r", "success", sample=RolloutSample(reward=0.5)), 1.0)
    assert ok is not None and (ok.status, ok.reward, ok.source_row_index) == ("success", 0.5, 13)
    skipped = classify(
        item, "r", _result("r", "success", sample=RolloutSample(remove_sample=True)), 1
    )
    assert skipped is not None and (skipped.status, skipped.reward) == ("skipped", None)
    failed = classify(
        item, "r", _result("r", "failure", err_category=RolloutErrorCategory.TIMEOUT), 1
    )
    assert failed is not None and (failed.status, failed.error_type) == ("failed", "timeout")
    bare = classify(item, "r", _result("r", "failure", err_message="boom"), 1)
    assert bare is not None and bare.error_type == "boom"
    assert classify(item, "r", _result("r", "failure"), 1).error_type == "rollout_failed"  # type: ignore[union-attr]
    assert classify(item, "r", _result("r", "cancelled"), 1) is None


async def test_runs_every_item_within_the_concurrency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = ScriptedTransport(_success)
    items = [_item(r, k) for r in range(5) for k in range(2)]
    dispatcher, records, halts = _dispatcher(items, transport, _interrupts(), concurrency=3)
    report = await dispatcher.run()
    assert report.dispatched == report.recorded == 10 and report.halted is None and not halts
    assert transport.peak == 3
    assert sorted(r.key for r in records) == sorted(i.key for i in items)
    assert all(r.tokens == 7 and r.max_context_tokens == 5 for r in records)
    request = next(
        r for r in transport.requests if r.extra_fields == {"row_index": 0, "run_index": 0}
    )
    assert request.chat_completions_url == f"http://127.0.0.1:9/v1/rollouts/{request.rollout_id}"
    assert request.llm_api_key == "tok" and request.label == "a0"
    assert len({r.rollout_id for r in transport.requests}) == 10


async def test_admission_refusal_is_a_failed_record(autojump_clock: trio.testing.MockClock) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        if request.extra_fields == {"row_index": 1, "run_index": 0}:
            return RolloutRefused(409, "POST /rollout returned 409")
        return _success(request)

    dispatcher, records, _ = _dispatcher(
        [_item(r) for r in range(3)], ScriptedTransport(outcome), _interrupts()
    )
    await dispatcher.run()
    by_row = {r.row_index: r for r in records}
    assert by_row[1].status == "failed" and by_row[1].error_type == "rollout_protocol_error"
    assert by_row[0].status == by_row[2].status == "success"


async def test_a_server_side_cancel_leaves_the_item_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        if request.extra_fields == {"row_index": 0, "run_index": 0}:
            return _result(request.rollout_id, "cancelled", err_message="cancelled")
        return _success(request)

    dispatcher, records, _ = _dispatcher(
        [_item(r) for r in range(3)], ScriptedTransport(outcome), _interrupts()
    )
    report = await dispatcher.run()
    assert sorted(r.row_index for r in records) == [1, 2] and report.halted is None


async def test_an_unexpected_error_halts_and_the_rest_stays_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        if request.extra_fields == {"row_index": 2, "run_index": 0}:
            return RuntimeError("transport broke")
        return _success(request)

    items = [_item(r) for r in range(10)]
    dispatcher, records, halts = _dispatcher(items, ScriptedTransport(outcome), _interrupts())
    report = await dispatcher.run()
    assert halts == ["RuntimeError: transport broke"] and report.halted == halts[0]
    assert 2 <= len(records) <= 3  # the items already running finish
    assert all(r.row_index < 4 for r in records)


async def test_the_item_deadline_cancels_and_halts(autojump_clock: trio.testing.MockClock) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        if request.extra_fields == {"row_index": 0, "run_index": 0}:
            return TimeoutError()
        return _success(request)

    transport = ScriptedTransport(outcome)
    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(6)], transport, _interrupts(), concurrency=1, deadline=30.0
    )
    await dispatcher.run()
    assert records == [] and transport.cancelled == [transport.requests[0].rollout_id]
    assert halts and "had no result within its 30s deadline" in halts[0]


async def test_first_interrupt_cancels_in_flight_rollouts_on_the_server(
    autojump_clock: trio.testing.MockClock,
) -> None:
    interrupts = _interrupts()
    transport = ScriptedTransport(_success, delay=100.0)
    dispatcher, records, _ = _dispatcher(
        [_item(r) for r in range(6)], transport, interrupts, concurrency=3
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dispatcher.run)
        await trio.sleep(10)
        interrupts.signal()
    assert records == []
    assert sorted(transport.cancelled) == sorted(r.rollout_id for r in transport.requests)
    assert len(transport.requests) == 3


async def test_a_lost_rollout_is_revoked_before_its_item_runs_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[tuple[str, str]] = []
    attempts: dict[int, int] = {}

    def outcome(request: RolloutInitRequest) -> Any:
        row = (request.extra_fields or {})["row_index"]
        events.append(("admit", request.rollout_id))
        attempts[row] = attempts.get(row, 0) + 1
        if row == 0 and attempts[row] == 1:
            return RolloutLost("its node left the cluster")
        return _success(request)

    transport = ScriptedTransport(outcome)
    dispatcher, records, halts = _dispatcher(
        [_item(0), _item(1)], transport, _interrupts(), endpoint=FixedEndpoint(events)
    )
    report = await dispatcher.run()
    assert report.recorded == 2 and not halts and all(r.status == "success" for r in records)
    first, second = [rid for kind, rid in events if kind == "admit" and rid in _ids(transport, 0)]
    assert first != second and {r.rollout_id for r in records if r.row_index == 0} == {second}
    # The old id is revoked, then forgotten, both before the item is admitted again; the
    # recorded attempt is never revoked.
    old = [event for event in events if event[1] == first]
    assert old == [("admit", first), ("revoke", first), ("forget", first)]
    assert events.index(("forget", first)) < events.index(("admit", second))
    assert [rid for kind, rid in events if kind == "revoke"] == [first]


def _ids(transport: ScriptedTransport, row: int) -> list[str]:
    return [r.rollout_id for r in transport.requests if (r.extra_fields or {})["row_index"] == row]


def test_format_duration() -> None:
    assert format_duration_ms(12_345) == "12.3s"
    assert format_duration_ms(45_000) == "45s"
    assert format_duration_ms(191_000) == "3m 11s"
    assert format_duration_ms(120_000) == "2m"
    assert format_duration_ms((2 * 3600 + 5 * 60) * 1000) == "2h 5m"
    assert format_duration_ms((27 * 3600) * 1000) == "1d 3h"
