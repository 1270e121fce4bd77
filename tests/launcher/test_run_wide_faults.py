"""Failure reasons and run-wide fault detection in the dispatcher, in virtual time with the
scripted transport of ``test_dispatch``: every failed record says why, an unsendable row fails
alone, and a streak of identical failures across rows halts dispatch with its cause."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from launcher.dispatch import RUN_WIDE_FAILURES, RolloutRefused, classify
from launcher.rundir.journal import ErrorInfo, TerminalRecord
from rollout_server.protocol import RolloutErrorCategory, RolloutInitRequest
from tests.launcher.test_dispatch import (
    ScriptedTransport,
    _dispatcher,
    _interrupts,
    _item,
    _result,
    _success,
)


def _row(request: RolloutInitRequest) -> int:
    assert request.extra_fields is not None
    row: int = request.extra_fields["row_index"]
    return row


def _failure(request: RolloutInitRequest, message: str, category: str = "agent_error") -> Any:
    return _result(
        request.rollout_id,
        "failure",
        err_message=message,
        err_category=RolloutErrorCategory(category),
    )


def test_classify_keeps_the_message_and_guesses_the_phase() -> None:
    item = _item(3)
    failed = classify(item, "r", _failure_for("r", "boom", "agent_error"), 1.0)
    assert failed is not None and failed.error == ErrorInfo(phase="rollout", message="boom")
    lease = classify(item, "r", _failure_for("r", "polling lease expired", "lease_expired"), 1)
    assert lease is not None and lease.error is not None and lease.error.phase == "transport"
    crash = classify(item, "r", _failure_for("r", "rollout task crashed", "internal_error"), 1)
    assert crash is not None and crash.error is not None and crash.error.phase == "server"
    ok = classify(item, "r", _result("r", "success"), 1.0)
    assert ok is not None and ok.error is None


def _failure_for(rid: str, message: str, category: str) -> Any:
    return _result(rid, "failure", err_message=message, err_category=RolloutErrorCategory(category))


def test_error_info_describes_redacts_then_bounds() -> None:
    secret = "sk-" + "s" * 40
    error = ErrorInfo(phase="bridge", type="ChatError", status=502, message="x" * 3000 + secret)
    redacted = error.redacted(lambda text: text.replace(secret, "[REDACTED]"))
    assert secret[:12] not in redacted.message and len(redacted.message.encode()) <= 2048
    assert redacted.describe(limit=20).startswith("bridge: ChatError: HTTP 502: xxxxxxxx")
    assert ErrorInfo(phase="agent", message="a\n  b").describe() == "agent: a b"
    # A message that names its own type first (Harbor's) shows the type once.
    timed_out = ErrorInfo(phase="agent", type="AgentTimeoutError", message="AgentTimeoutError: 9s")
    assert timed_out.describe() == "agent: AgentTimeoutError: 9s"
    # A secret straddling the cut would have survived if bounding came first.
    straddle = ErrorInfo(phase="agent", message="x" * 2030 + secret)
    assert "sss" not in straddle.redacted(lambda t: t.replace(secret, "[R]")).message


async def test_an_unsendable_row_fails_alone_with_its_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        if _row(request) == 1:
            return RolloutRefused(None, "initial_messages[0].content holds…", kind="Unsendable")
        return _success(request)

    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(4)], ScriptedTransport(outcome), _interrupts()
    )
    report = await dispatcher.run()
    assert report.halted is None and not halts and len(records) == 4
    bad = next(r for r in records if r.row_index == 1)
    assert bad.status == "failed" and bad.error_type == "rollout_protocol_error"
    assert bad.error == ErrorInfo(
        phase="admission", message="initial_messages[0].content holds…", type="Unsendable"
    )


async def test_identical_failures_across_rows_halt_with_the_cause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        # The rollout id in the message differs per row; the cause does not.
        return _failure(request, f"cannot reach http://h/v1/rollouts/{request.rollout_id}")

    transport = ScriptedTransport(outcome)
    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(40)], transport, _interrupts(), concurrency=3
    )
    report = await dispatcher.run()
    assert len(halts) == 1 and report.halted == halts[0]
    assert halts[0].startswith(
        "all recent rows failed the same way: rollout: cannot reach http://h/v1/rollouts/"
    )
    # It stopped right at the streak; the rows in flight then were cancelled (still pending).
    assert len(records) == RUN_WIDE_FAILURES
    assert len(transport.requests) <= RUN_WIDE_FAILURES + 3
    assert len(transport.cancelled) == len(transport.requests) - len(records)


async def test_failures_that_differ_only_by_a_temporary_file_name_halt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A sandbox build that fails for every row names each trial's own compose file in
    /tmp (tempfile's ``tmp`` + 8 characters): still the same reason."""
    import secrets

    def outcome(request: RolloutInitRequest) -> Any:
        name = "tmp" + secrets.token_hex(4)
        return _failure(request, f"compose build failed. Command: podman-compose -f /tmp/{name}")

    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(20)], ScriptedTransport(outcome), _interrupts(), concurrency=1
    )
    report = await dispatcher.run()
    assert report.halted is not None and len(records) == RUN_WIDE_FAILURES
    assert halts == [report.halted]


async def test_no_halt_for_different_reasons_successes_timeouts_or_one_row(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        row = _row(request)
        if row % 5 == 4:
            return _success(request)  # every fifth row succeeds: the streak never reaches 5
        return _failure(request, "same")

    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(20)], ScriptedTransport(outcome), _interrupts(), concurrency=1
    )
    assert (await dispatcher.run()).halted is None and len(records) == 20 and not halts

    def varied(request: RolloutInitRequest) -> Any:
        return _failure(request, f"KeyError: 'q{_row(request)}'")  # per-row text

    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(10)], ScriptedTransport(varied), _interrupts(), concurrency=1
    )
    assert (await dispatcher.run()).halted is None and len(records) == 10

    def slow(request: RolloutInitRequest) -> Any:
        return _failure(request, "workflow exceeded its 0.3s deadline", "timeout")

    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(10)], ScriptedTransport(slow), _interrupts(), concurrency=2
    )
    assert (await dispatcher.run()).halted is None and len(records) == 10

    # Ten runs of two rows: the same reason, but only two different rows.
    dispatcher, records, halts = _dispatcher(
        [_item(r, k) for r in range(2) for k in range(10)],
        ScriptedTransport(lambda request: _failure(request, "same")),
        _interrupts(),
        concurrency=1,
    )
    assert (await dispatcher.run()).halted is None and len(records) == 20


async def test_the_sink_can_complete_the_reason_the_streak_reads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The streak compares reasons as the sink completed them (type and phase from the
    server's diagnostics), after the record is durable."""

    class Completing:
        def __init__(self) -> None:
            self.records: list[TerminalRecord] = []
            self.halts: list[str] = []

        async def record(self, record: TerminalRecord, *, has_sample: bool) -> None:
            if record.error is not None:
                record.error = record.error.with_detail({"phase": "agent", "type": "ValueError"})
            self.records.append(record)

        def halted(self, reason: str) -> None:
            self.halts.append(reason)

    dispatcher, _, _ = _dispatcher(
        [_item(r) for r in range(9)],
        ScriptedTransport(lambda request: _failure(request, "bad", "validation_error")),
        _interrupts(),
        concurrency=1,
    )
    sink = Completing()
    dispatcher.sink = sink
    await dispatcher.run()
    assert sink.halts == ["all recent rows failed the same way: agent: ValueError: bad"]
    assert len(sink.records) == RUN_WIDE_FAILURES
