"""Dispatch of work items to the rollout server (docs/spec/supervisor.md §6.1, §7).

A fixed pool of workers pulls pending items in selection order. Each item gets a fresh rollout
id, is admitted (``POST /rollout``, retrying 429 within the admission timeout), then awaited by
long-poll within the per-item deadline. Its terminal result becomes one journal record
(success / failed / skipped); a ``cancelled`` result writes nothing, so the item stays pending.

Process-wide faults (the server died, the tunnel failed, a transport or protocol failure, the
item deadline) *halt* dispatch: the first reason is kept, no new item starts, and the items
that never ran stay pending for a resume. So do :data:`RUN_WIDE_FAILURES` different rows in a
row failing the same way (a bad key, an unreachable advertised URL): a run-wide fault seen
only in the results. A cancelled worker (Ctrl-C, or a halt that cancels
everyone) first asks the server to cancel its rollout and waits for the rollout's cleanup in a
shielded settle scope, which the second Ctrl-C cuts short.

The :class:`Dispatcher` sees the world through three seams, so it can run alone against
scripted fakes in virtual time: a :class:`RolloutTransport` (the rollout server), a
:class:`ModelEndpoint` (where rollouts call the model, and what they used) and a
:class:`ResultSink` (the run directory and the progress display).

Why one module of this size: an item's life (admission, long-poll, deadline, settle) and the
ways dispatch halts (a worker's exception, a run-wide streak, descriptors running out) act on
the same worker pool and queue; split, each half would reach into the other's state.
"""

from __future__ import annotations

import re
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from launcher.concurrency import InFlightLimit
from launcher.dataset import WorkItem
from launcher.fdbudget import exhaustion_in_exception, exhaustion_in_text, exhaustion_reason
from launcher.requeue import RolloutLost
from launcher.rundir.journal import ErrorInfo, TerminalRecord
from launcher.rundir.records import graded_reward, scalar_metrics
from launcher.signals import Interrupts
from rollout_server.protocol import RolloutInitRequest, RolloutResultResponse, RolloutStatus

__all__ = [
    "CANCEL_SETTLE_S",
    "RUN_WIDE_FAILURES",
    "DispatchReport",
    "Dispatcher",
    "ItemLimits",
    "ModelEndpoint",
    "ResultSink",
    "RolloutHandle",
    "RolloutRefused",
    "RolloutTransport",
    "classify",
    "failure_reason",
    "resolve_concurrency",
]

CANCEL_SETTLE_S = 120.0
#: Admissions (``POST /rollout``) in flight at once. Admission is quick, so this costs nothing,
#: and it keeps a burst of hundreds of new connections from overflowing the server's listen
#: backlog when the pool is very wide.
MAX_CONCURRENT_ADMISSIONS = 64
#: Consecutive failures of different rows with the same reason that make a run-wide fault
#: (small: the rows in flight when it trips stay pending, and waiting longer only burns rows).
RUN_WIDE_FAILURES = 5
# Ids that differ from row to row but say nothing about the cause (uuids, long hex runs, and
# the names Python's tempfile gives, ``tmp`` and 8 random characters: a trial's compose file).
_IDS = re.compile(
    r"[0-9a-fA-F]{8}(?:-?[0-9a-fA-F]{4}){3}-?[0-9a-fA-F]{12}|[0-9a-fA-F]{16,}"
    r"|\btmp[a-z0-9_]{8}\b"
)

#: ``log(level, step, message, details)``.
LogFn = Callable[[str, str, str, "dict[str, Any] | None"], None]


class RolloutRefused(Exception):
    """The rollout server will not take this item: ``POST /rollout`` answered a 4xx other than
    429 (``status_code``), or the request could not be sent at all (``status_code`` None,
    ``kind`` the reason's exception type). The item is recorded as failed."""

    def __init__(self, status_code: int | None, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.kind = kind


class RolloutHandle(Protocol):
    """An admitted rollout being polled."""

    async def wait(self) -> RolloutResultResponse:
        """The final result (keeps long-polling until a terminal status)."""
        ...


class RolloutTransport(Protocol):
    """The calls dispatch makes on the rollout server (the real one is
    :class:`launcher.services.RolloutClientTransport`)."""

    async def admit(self, request: RolloutInitRequest, admission_timeout_s: float) -> RolloutHandle:
        """Admit a rollout; raise :class:`RolloutRefused` for a 4xx refusal."""
        ...

    async def cancel(self, rollout_id: str) -> None:
        """Ask the server to cancel a rollout (best effort, bounded)."""
        ...

    async def explain(self, exc: BaseException) -> str | None:
        """The process-wide cause behind a worker's exception (the server died), if any, so
        the halt reason names the cause rather than its symptom."""
        ...


class ModelEndpoint(Protocol):
    """Where rollouts reach the model, and what each rollout used there."""

    def bearer_for(self, rollout_id: str) -> str:
        """The key ``rollout_id`` presents to the bridge (each rollout its own)."""
        ...

    def chat_url(self, rollout_id: str) -> str:
        """The ``chat_completions_url`` for a rollout, read at each dispatch (a restarted
        tunnel changes it)."""
        ...

    async def ready(self) -> None:
        """Wait until the endpoint can be reached (a restarting tunnel publishes first)."""
        ...

    def take_usage(self, rollout_id: str) -> tuple[int | None, ...]:
        """Pop a finished rollout's ``(tokens, max_context_tokens)``, followed by the model
        calls retried for it when the endpoint counts them (``None`` for none)."""
        ...

    def forget(self, rollout_id: str) -> None:
        """Drop what was counted for a rollout that will not be recorded."""
        ...

    async def revoke(self, rollout_id: str) -> None:
        """Refuse the model calls of a rollout given up on (its replica was lost) from now
        on, cancelling those in flight; return once that holds."""
        ...


class ResultSink(Protocol):
    """Where finished items go."""

    async def record(self, record: TerminalRecord, *, has_sample: bool) -> None:
        """Make ``record`` durable (journal fsync) before returning; it may first complete
        ``record.error`` in place (redacted, bounded), which the dispatcher reads afterwards."""
        ...

    def halted(self, reason: str) -> None:
        """Dispatch stopped for ``reason`` (called once, with the first reason)."""
        ...


@dataclass(frozen=True)
class ItemLimits:
    """Time limits of one work item."""

    item_deadline_s: float
    """From admission to terminal result; past it the item halts dispatch."""
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None


@dataclass
class DispatchReport:
    """What one dispatch pass did."""

    dispatched: int = 0
    recorded: int = 0
    halted: str | None = None


def resolve_concurrency(
    max_in_flight: int | None, batch_size: int | None, capacity: int | None
) -> int:
    """§7.1: the first positive of ``--max-in-flight`` and ``batch_size``, capped by the
    server's capacity; without either, the capacity; else 1."""
    for value in (max_in_flight, batch_size):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, capacity) if capacity else value
    return capacity or 1


#: Where a failure happened when the server did not say (``diagnostics.json`` completes it).
_PHASE_BY_CATEGORY = {"lease_expired": "transport", "internal_error": "server"}


def failure_reason(result: RolloutResultResponse) -> ErrorInfo:
    """Why a failed result failed, as far as the wire says: its ``err_message``, and a phase
    guessed from ``err_category`` (``rollout`` when it tells nothing)."""
    category = str(result.err_category.value) if result.err_category else ""
    return ErrorInfo(
        phase=_PHASE_BY_CATEGORY.get(category, "rollout"), message=result.err_message or ""
    )


def _cause(record: TerminalRecord) -> tuple[Any, ...] | None:
    """What makes two failures "the same way" (phase, type, status, category and the message
    without ids); None for a record that cannot be part of a run-wide streak (a deadline is
    a per-row verdict the user asked for)."""
    error = record.error
    if record.status != "failed" or error is None or record.error_type == "timeout":
        return None
    message = _IDS.sub("<id>", error.message.replace(record.rollout_id, "<id>"))
    return (error.phase, error.type, error.status, record.error_type, message)


def classify(
    item: WorkItem, rollout_id: str, result: RolloutResultResponse, duration_ms: float
) -> TerminalRecord | None:
    """The journal record for a terminal result, or None for ``cancelled`` (stays pending)."""
    base: dict[str, Any] = {
        "row_index": item.row_index,
        "run_index": item.run_index,
        "source_row_index": item.source_row_index,
        "rollout_id": rollout_id,
        "duration_ms": duration_ms,
    }
    sample = result.sample
    if sample is not None:
        base["metrics"] = scalar_metrics(sample.metrics)
    reward = graded_reward(sample.reward) if sample is not None else None
    if result.status == RolloutStatus.CANCELLED:
        return None
    if result.status != RolloutStatus.SUCCESS:
        error_type = (
            (str(result.err_category) if result.err_category else None)
            or result.err_message
            or "rollout_failed"
        )
        reason = failure_reason(result)
        return TerminalRecord(
            status="failed", reward=reward, error_type=error_type, error=reason, **base
        )
    if sample is not None and sample.remove_sample:
        return TerminalRecord(status="skipped", **base)
    return TerminalRecord(status="success", reward=reward, **base)


@dataclass
class _Slot:
    rollout_id: str
    admitted: RolloutHandle | None = None


class Dispatcher:
    """Runs the pending items with a bounded worker pool."""

    def __init__(
        self,
        items: Sequence[WorkItem],
        *,
        concurrency: int,
        transport: RolloutTransport,
        endpoint: ModelEndpoint,
        sink: ResultSink,
        limits: ItemLimits,
        interrupts: Interrupts,
        log: LogFn,
        limit: InFlightLimit | None = None,
    ) -> None:
        self.items = items
        self.concurrency = concurrency
        self.limit = limit
        """Lowers the rollouts in flight below ``concurrency`` while the provider rate-limits."""
        self.transport = transport
        self.endpoint = endpoint
        self.sink = sink
        self.limits = limits
        self.interrupts = interrupts
        self.log = log
        self.report = DispatchReport()
        self._queue: deque[WorkItem] = deque()
        self._scope: trio.CancelScope | None = None
        self._workers: trio.Nursery | None = None
        self._alive = 0
        """Workers running now (each takes items until the queue is empty)."""
        self._admissions = trio.Semaphore(MAX_CONCURRENT_ADMISSIONS)
        # The current streak of identical failures: its cause and the rows it covers.
        self._streak_cause: tuple[Any, ...] | None = None
        self._streak_rows: set[int] = set()

    def halt(self, reason: str, *, cancel_all: bool = False, **details: Any) -> None:
        """Stop dispatching (first reason wins); ``cancel_all`` also cancels running items."""
        if self.report.halted is None:
            self.report.halted = reason
            self.log("ERROR", "dispatch", "halting dispatch", {"reason": reason, **details})
            self.sink.halted(reason)
        self._queue.clear()
        if cancel_all and self._scope is not None:
            self._scope.cancel()

    async def run(self) -> DispatchReport:
        """Dispatch every item (or until halted/interrupted); returns the report."""
        self._queue = deque(self.items)
        workers = max(1, min(self.concurrency, len(self._queue)))
        with self.interrupts.work_scope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                self._workers = nursery
                self._alive += workers
                for _ in range(workers):
                    nursery.start_soon(self._counted_worker)
        self._workers = self._scope = None
        return self.report

    async def _counted_worker(self) -> None:
        try:
            await self._worker()
        finally:
            self._alive -= 1

    def grow(self, concurrency: int) -> int:
        """Run up to ``concurrency`` items at once from now on (replicas joined a ``--ray``
        run: their capacity adds to the run's); returns the workers started for it."""
        if concurrency <= self.concurrency:
            return 0
        self.concurrency = concurrency
        if self.limit is not None:
            self.limit.raise_ceiling(concurrency)
        more = min(concurrency - self._alive, len(self._queue))
        if self._workers is None or more <= 0 or self.report.halted is not None:
            return 0
        self._alive += more
        for _ in range(more):
            self._workers.start_soon(self._counted_worker)
        return more

    async def _worker(self) -> None:
        while self._queue and self.report.halted is None:
            # A slot of the adaptive limit first: while it is lowered, workers wait here.
            async with self.limit.slot() if self.limit is not None else nullcontext():
                if not self._queue or self.report.halted is not None:
                    return
                item = self._queue.popleft()
                try:
                    await self._run_item(item)
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    if exhaustion_in_exception(exc):
                        self._halt_exhausted("the supervisor", str(exc), item)
                        return
                    cause = await self.transport.explain(exc)
                    self.halt(
                        cause or f"{type(exc).__name__}: {exc}",
                        cancel_all=cause is not None,
                        row_index=item.row_index,
                        run_index=item.run_index,
                    )
                    return

    def _request(self, item: WorkItem, rollout_id: str) -> RolloutInitRequest:
        return RolloutInitRequest(
            initial_messages=item.row.initial_messages,  # a new list per call
            label=item.row.label,
            metadata=item.row.metadata,
            rollout_id=rollout_id,
            chat_completions_url=self.endpoint.chat_url(rollout_id),
            llm_api_key=self.endpoint.bearer_for(rollout_id),
            grade=True,
            agent_timeout_sec=self.limits.agent_timeout_sec,
            grader_timeout_sec=self.limits.grader_timeout_sec,
            extra_fields={"row_index": item.row_index, "run_index": item.run_index},
        )

    async def _run_item(self, item: WorkItem) -> None:
        slot = _Slot(uuid.uuid4().hex)
        started = trio.current_time()
        self.report.dispatched += 1
        where = {
            "rollout_id": slot.rollout_id,
            "row_index": item.row_index,
            "run_index": item.run_index,
        }
        self.log("INFO", "dispatch", "dispatching rollout", where)
        try:
            result = await self._admit_and_wait(item, slot)
        except RolloutRefused as exc:
            if exhaustion_in_text(str(exc)):
                self.endpoint.forget(slot.rollout_id)
                self._halt_exhausted("the supervisor", str(exc), item)
                return
            record = TerminalRecord(
                row_index=item.row_index,
                run_index=item.run_index,
                source_row_index=item.source_row_index,
                rollout_id=slot.rollout_id,
                status="failed",
                error_type="rollout_protocol_error",
                error=ErrorInfo(
                    phase="admission", message=str(exc), type=exc.kind, status=exc.status_code
                ),
                duration_ms=(trio.current_time() - started) * 1000.0,
            )
            self.log(
                "ERROR",
                "result",
                "work item failed before a terminal result",
                {"error": str(exc), **where},
            )
            await self._record(record, has_sample=False)
            return
        except RolloutLost as exc:  # not a result: it runs again elsewhere, never a streak
            # Before it runs again: a lost attempt still alive on a cut-off node spends nothing.
            await self.endpoint.revoke(slot.rollout_id)
            self.endpoint.forget(slot.rollout_id)
            self.log("WARNING", "dispatch", "replica lost; requeued", {"error": str(exc), **where})
            self._queue.appendleft(item)
            return
        except BaseException:
            self.endpoint.forget(slot.rollout_id)
            raise
        duration_ms = (trio.current_time() - started) * 1000.0
        classified = classify(item, slot.rollout_id, result, duration_ms)
        if classified is None:
            self.endpoint.forget(slot.rollout_id)
            self.log("WARNING", "cancel", "rollout cancelled", {"rollout_id": slot.rollout_id})
            return
        if classified.status == "failed" and exhaustion_in_text(result.err_message):
            # Not this row's fault: every row would fail the same way. It stays pending.
            self.endpoint.forget(slot.rollout_id)
            self._halt_exhausted(
                "the rollout server or the bridge", result.err_message or "", item, slot
            )
            return
        await self._record(classified, has_sample=result.sample is not None)

    async def _record(self, record: TerminalRecord, *, has_sample: bool) -> None:
        tokens, max_context, *retries = self.endpoint.take_usage(record.rollout_id)
        record.tokens, record.max_context_tokens = tokens, max_context
        record.retries = retries[0] if retries else None
        await self.sink.record(record, has_sample=has_sample)
        self.report.recorded += 1
        self._watch_streak(record)

    def _halt_exhausted(
        self, where: str, message: str, item: WorkItem, slot: _Slot | None = None
    ) -> None:
        """Halt, cancelling what is in flight, because a process ran out of descriptors: a
        run-wide fault, so no row is journaled for it (they all stay pending)."""
        details: dict[str, Any] = {"row_index": item.row_index, "run_index": item.run_index}
        if slot is not None:
            details["rollout_id"] = slot.rollout_id
        self.halt(exhaustion_reason(where, message), cancel_all=True, **details)

    def _watch_streak(self, record: TerminalRecord) -> None:
        """Halt (cancelling what is in flight) once :data:`RUN_WIDE_FAILURES` different rows in a
        row failed the same way; anything else recorded ends the streak, and the runs of one row
        count once (a row can fail for its own reasons)."""
        cause = _cause(record)
        if cause is None or cause != self._streak_cause:
            self._streak_cause = cause
            self._streak_rows = set()
        if cause is None:
            return
        self._streak_rows.add(record.row_index)
        if len(self._streak_rows) >= RUN_WIDE_FAILURES and record.error is not None:
            self.halt(
                f"all recent rows failed the same way: {record.error.describe(limit=300)}",
                cancel_all=True,
                rows=sorted(self._streak_rows),
            )

    async def _admit_and_wait(self, item: WorkItem, slot: _Slot) -> RolloutResultResponse:
        await self.endpoint.ready()
        request = self._request(item, slot.rollout_id)
        deadline_s = self.limits.item_deadline_s
        try:
            async with self._admissions:
                slot.admitted = await self.transport.admit(
                    request, deadline_s * max(1, self.concurrency)
                )
            with trio.move_on_after(deadline_s) as deadline:
                return await slot.admitted.wait()
        except trio.Cancelled:
            await self._settle(slot)
            raise
        assert deadline.cancelled_caught
        await self._settle(slot)
        raise TimeoutError(
            f"work item row {item.row_index} run {item.run_index} had no result within "
            f"its {deadline_s:g}s deadline"
        )

    async def _settle(self, slot: _Slot) -> None:
        """Cancel the rollout on the server and wait (bounded) for its cleanup to finish."""
        with self.interrupts.settle_scope(CANCEL_SETTLE_S):
            taken = False
            with trio.move_on_after(5.0):
                try:
                    await self.transport.cancel(slot.rollout_id)
                    taken = True
                except Exception as exc:  # the server may be gone; nothing more to do
                    self.log(
                        "WARNING",
                        "cancel",
                        "cancel request failed",
                        {"rollout_id": slot.rollout_id, "error": str(exc)},
                    )
            if not taken:
                # A server that cannot take a cancel in 5 s (gone, or its loop blocked by a
                # workflow) will not answer the long-poll either: waiting out the settle bound
                # only held the run (the item stays pending whatever comes).
                return
            if slot.admitted is not None:
                try:
                    final = await slot.admitted.wait()
                except Exception:
                    return
                if final.status == RolloutStatus.CANCELLED:
                    self.log(
                        "WARNING", "cancel", "rollout cancelled", {"rollout_id": slot.rollout_id}
                    )
