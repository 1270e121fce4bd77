"""``rollbridge eval run``: the one trio program that runs a local evaluation (docs/spec/supervisor.md §0).

:func:`run_eval` prepares synchronously (:mod:`launcher.prepare`), then runs the
:class:`Supervisor` inside ``trio.run``. The supervisor tells the story of one run, in order:
reap orphans of earlier runs, choose the name, take the run's lock, reap its own leftovers,
look whether it is already complete, pass the manifest gate and replay the journal, compute
what is pending, confirm, start the services (:mod:`launcher.services`), dispatch
(:mod:`launcher.dispatch`), finalize, and report (:mod:`launcher.report`).

Why one module of this size: it is that story, step by step in the order a run takes them;
each step's work lives in its own module and what stays here is the ordering and the
hand-offs between steps (the lock, the gate, the services, the after-run upload), which read
best in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from launcher.cluster.run import clustered
from launcher.concurrency import InFlightLimit
from launcher.dataset import WorkItem
from launcher.digest import source_digest
from launcher.dispatch import Dispatcher, DispatchReport, ItemLimits
from launcher.dispatch_io import RunSink
from launcher.errors import CLIError, Declined, InteractiveRequiredError, unwrap_group
from launcher.prepare import EvalOptions, Prepared, prepare
from launcher.process import reap_orphans, reap_run_dir
from launcher.report import (
    COMMAND,
    Counts,
    FailedItem,
    RunFacts,
    complete_duration,
    count_statuses,
    next_steps,
    pending_line,
    result_resource,
    results_rows,
    row_sections,
)
from launcher.rundir import FinalizeResult, RunDirectory, RunLock
from launcher.rundir.discard import DiscardIfEmpty
from launcher.rundir.journal import TerminalRecord, WorkKey
from launcher.rundir.logs import RUN_FAILED
from launcher.rundir.manifest import build_inputs, build_provenance, read_manifest
from launcher.rundir.metrics import aggregate_metrics
from launcher.rundir.names import generate_run_name
from launcher.rundir.peek import peek_complete, read_metrics, read_summary
from launcher.services import RunContext, Services, open_services
from launcher.signals import EXIT_INTERRUPTED, Interrupts, watch_signals
from launcher.ui import CLI_VERSION, UI
from launcher.upload.hook import AfterRun

__all__ = ["EXIT_INTERRUPTED", "EvalOptions", "Supervisor", "run_eval"]


def run_eval(options: EvalOptions, ui: UI, after_run: AfterRun | None = None) -> int:
    """Run ``rollbridge eval run`` end to end; returns the exit code (0, 1 or 130).

    User errors raise :class:`CLIError` for the CLI to print.
    """
    supervisor = Supervisor(prepare(options, ui), ui, after_run)
    try:
        try:
            return trio.run(supervisor.main)
        except BaseExceptionGroup as group:
            raise unwrap_group(group) from None
    except Declined as declined:
        return EXIT_INTERRUPTED if declined.interrupted else 0


@dataclass(frozen=True)
class _Request:
    """Which run to open, and how: a restart after "start a new run?" clears the flags."""

    name: str | None
    fresh: bool
    retry_failed: bool


class Supervisor:
    """One invocation of ``rollbridge eval run`` inside ``trio.run``."""

    def __init__(self, prepared: Prepared, ui: UI, after_run: AfterRun | None = None) -> None:
        self.prepared = prepared
        self.after_run = after_run  # eval run --upload (launcher.upload), under the run lock
        self.ui = ui
        self.halted: str | None = None
        self.dispatch_report = DispatchReport()
        self._dispatching = 0  # the work items this invocation dispatches
        self._interrupts: Interrupts | None = None
        self._run_dir: RunDirectory | None = None
        self._facts = RunFacts(
            dataset_source=prepared.dataset.source,
            total_work_items=prepared.meta.total_work_items,
            workspace_root=prepared.workspace.root,
        )

    @property
    def interrupts(self) -> Interrupts:
        """The two-stage Ctrl-C state (exists once :meth:`main` runs)."""
        assert self._interrupts is not None, "Supervisor.main has not started"
        return self._interrupts

    # -- logging -------------------------------------------------------------------------

    def log(
        self, level: str, step: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        """A logs.txt line (or a terminal note before the log is open)."""
        if self._run_dir is not None:
            self._run_dir.log.log(level, step, message, details)
        elif level != "INFO":
            self.ui.note(message)

    def stage(self, message: str, step: str = "run", details: dict[str, Any] | None = None) -> None:
        """A milestone: logged and shown as ``→ <message>``."""
        self.log("INFO", step, message, details)
        self.ui.stage(message)

    def _interrupt_note(self, message: str) -> None:
        if self.interrupts.count == 1:
            self.log("WARNING", "cancel", "supervisor cancellation requested")
        self.log("WARNING", "cancel", message)
        self.ui.note(message)
        self.ui.progress_stopping("cancelling")

    def _halt(self, reason: str) -> None:
        self.halted = reason
        if self.ui.rich:
            self.ui.note(f"stopping dispatch: {reason}")
        else:  # --plain and --json show no notes: the reason must reach them too
            self.ui.warning(f"stopping dispatch: {reason}", "DISPATCH_HALTED")
        self.ui.progress_stopping("stopping")

    @property
    def _stopped_early(self) -> bool:
        return self.interrupts.interrupted or self.halted is not None

    def _cut_short(self, rd: RunDirectory) -> bool:
        """Whether the run ends incomplete because it was stopped: an interrupt always; a halt
        only when it left items of this invocation without a new result (one that fired as
        the last items finished cut nothing short, and the run is complete). Older records do
        not count: a ``--retry-failed`` halted half-way still holds every failure it was asked
        to retry."""
        if self.interrupts.interrupted:
            return True
        if self.halted is None:
            return False
        return not rd.is_complete() or self.dispatch_report.recorded < self._dispatching

    # -- the story of a run --------------------------------------------------------------

    async def main(self) -> int:
        """The trio entry point: owns the signal watcher and the root cancel scope."""
        code = EXIT_INTERRUPTED
        with trio.CancelScope() as root:
            self._interrupts = Interrupts(root, self._interrupt_note)
            async with trio.open_nursery() as nursery:
                await nursery.start(watch_signals, self._interrupts)
                try:
                    options = self.prepared.options
                    request = _Request(options.name, options.fresh, options.retry_failed)
                    while True:
                        outcome = await self._run_named(request)
                        if isinstance(outcome, int):
                            code = outcome
                            break
                        request = outcome
                finally:
                    nursery.cancel_scope.cancel()
        if root.cancelled_caught or self.interrupts.interrupted:
            return EXIT_INTERRUPTED
        return code

    async def _run_named(self, request: _Request) -> int | _Request:
        """Reap, name, lock, then either report a complete run or open it."""
        p = self.prepared
        # A Ctrl-C while an orphan refuses to stop cuts its grace to 5 s, then SIGKILL.
        hurry = self.interrupts.first
        for reaped in await reap_orphans(p.output_root, skip=request.name, hurry=hurry):
            self.ui.note(reaped.note())
        name = request.name or generate_run_name(p.output_root)
        lock = RunLock.acquire(p.output_root, name, command=COMMAND)
        # A run that fails before its first record leaves no directory and no lock behind.
        with lock, DiscardIfEmpty(p.output_root / name, lock, request.name is None, p.display):
            run_dir = p.output_root / name
            if run_dir.is_dir() and not run_dir.is_symlink():
                for reaped in await reap_run_dir(run_dir, hurry=hurry):
                    self.ui.note(reaped.note())
            digest = await trio.to_thread.run_sync(
                source_digest, p.paths.rollout_dir, p.output_root
            )
            inputs = p.with_shard(build_inputs(p.config, p.spec, p.selection, digest))
            done = None
            if not request.fresh:
                done = peek_complete(
                    run_dir,
                    inputs,
                    p.rows,
                    p.spec.n,
                    retry_failed=request.retry_failed,
                )
            if done is not None:
                return await self._already_complete(name, run_dir, done)
            return await self._run_open(name, inputs, request)

    async def _run_open(self, name: str, inputs: dict[str, Any], request: _Request) -> int:
        p = self.prepared
        provenance = build_provenance(p.config, p.workspace, p.git, CLI_VERSION)
        rd = await trio.to_thread.run_sync(
            partial(
                RunDirectory.open,
                output_root=p.output_root,
                name=name,
                inputs=inputs,
                provenance=provenance,
                fresh=request.fresh,
                meta=p.meta,
                selected_rows=p.rows,
                redactor=p.redactor,
                echo=self.ui.log_line if self.ui.verbose else None,
            )
        )
        self._run_dir = rd
        rd.keep_logprobs = p.spec.keep_logprobs
        try:
            if rd.gate.archived_to is not None:
                self.ui.note(f"archived previous results to {rd.gate.archived_to}")
            return await self._execute(rd, request)
        finally:
            rd.close()
            self._run_dir = None

    async def _execute(self, rd: RunDirectory, request: _Request) -> int:
        p = self.prepared
        total = p.meta.total_work_items
        pending = rd.pending_items(p.rows, p.spec.n, request.retry_failed)
        if pending:
            self.stage(pending_line(rd.name, len(pending), total, rd.recorded_count))
            await self._confirm(len(pending))
        else:
            self.stage(f"{rd.name}: all {total} work items already have results", step="resume")
        result: FinalizeResult | None = None
        self._dispatching = len(pending)
        try:
            if pending:
                await self._start_and_dispatch(rd, pending)
        except BaseException as exc:  # why it stopped, for readers without our stderr
            error = unwrap_group(exc) if isinstance(exc, BaseExceptionGroup) else exc
            if isinstance(error, CLIError):
                self.log("ERROR", "run", RUN_FAILED + " ".join(error.message.split("\n")))
            raise
        finally:
            with trio.CancelScope(shield=True):
                result = await trio.to_thread.run_sync(
                    partial(rd.finalize, cancelled=self._cut_short(rd))
                )
        assert result is not None
        cancelled = self._cut_short(rd)  # a Ctrl-C during the upload leaves the run complete
        if self.after_run is not None:
            complete = result.complete and not cancelled
            if complete:
                # logs.txt is uploaded: sealed before it is hashed, so nothing (a Ctrl-C's
                # warnings) is appended to the bytes the platform holds.
                rd.log.close()
            try:
                await self._after_run(rd.path, complete)
            except CLIError:
                # The run's results stand whatever the upload did: show them, then its error.
                self._show_results(rd, result, cancelled)
                raise
        return self._report(rd, result, cancelled)

    async def _after_run(self, run_dir: Path, complete: bool) -> None:
        """The after-run step (``--upload``), which the first Ctrl-C cancels like any work."""
        assert self.after_run is not None
        with self.interrupts.work_scope():
            await self.after_run(run_dir, complete, self.prepared.workspace.config_relpath)

    async def _ask(self, prompt: str, *, default: bool) -> bool:
        """A yes/no question, answered in a thread so Ctrl-C still works (it answers "no")."""
        with self.interrupts.work_scope():
            return await trio.to_thread.run_sync(
                partial(self.ui.confirm, prompt, default=default), abandon_on_cancel=True
            )
        return False

    async def _confirm(self, pending: int) -> None:
        p = self.prepared
        if p.options.yes:
            return
        prompt = f"{pending} rollouts x model {p.config.experiment.model_path} — continue?"
        if not self.ui.interactive:
            if self.ui.mode == "plain":
                self.ui.warning(f"Confirmation required: {prompt}", "INTERACTIVE_REQUIRED")
            raise InteractiveRequiredError("Use --yes to confirm in non-interactive mode.")
        if not await self._ask(prompt, default=False):
            self.ui.note("Cancelled.")
            raise Declined(interrupted=self.interrupts.interrupted)

    async def _start_and_dispatch(self, rd: RunDirectory, pending: list[WorkItem]) -> None:
        ctx = RunContext(
            prepared=self.prepared,
            run_dir=rd,
            ui=self.ui,
            interrupts=self.interrupts,
            log=self.log,
            stage=self.stage,
            long_stop=lambda: self._stopped_early,
        )
        async with open_services(ctx) as services:
            if services is not None:
                async with clustered(ctx, services) as everywhere:  # --ray: launcher.cluster
                    if everywhere is not None:
                        await self._dispatch(rd, pending, everywhere)

    async def _dispatch(
        self, rd: RunDirectory, pending: list[WorkItem], services: Services
    ) -> None:
        spec = self.prepared.spec
        limits = ItemLimits(
            item_deadline_s=spec.item_deadline_s,
            agent_timeout_sec=spec.agent_timeout_sec,
            grader_timeout_sec=spec.grader_timeout_sec,
        )
        concurrency = services.concurrency
        halt, calls = self._halt, services.bridge.calls
        workers = max(1, min(concurrency, len(pending)))
        limit = InFlightLimit(
            workers,
            milestone=partial(self.stage, step="schedule"),
            log=lambda message: self.log("INFO", "schedule", message),
        )
        dispatcher = Dispatcher(
            pending,
            concurrency=concurrency,
            transport=services.rollout_transport(),
            endpoint=services.endpoint,
            sink=RunSink(
                rd, self.prepared.redactor, self.log, self.ui.progress_update, halt, calls
            ),
            limits=limits,
            interrupts=self.interrupts,
            log=self.log,
            limit=limit,
        )
        self.stage(f"running {len(pending)} work items, up to {workers} in flight", step="schedule")
        if services.grow_with is not None:

            def grow(concurrency: int) -> None:
                if dispatcher.grow(concurrency):
                    self.stage(f"up to {concurrency} in flight (replicas joined)", step="schedule")

            services.grow_with(grow)
        total = self.prepared.meta.total_work_items
        in_flight = (lambda: limit.in_flight), limit.lowered_limit
        self.ui.open_progress(total, rd.counters, len(pending), *in_flight)
        try:
            async with trio.open_nursery() as watchers:
                watchers.start_soon(
                    services.watch_faults, partial(dispatcher.halt, cancel_all=True)
                )
                watchers.start_soon(limit.follow, services.bridge.ledger.pressure)
                watchers.start_soon(services.live_usage, rd.path, lambda: limit.in_flight)
                self.dispatch_report = await dispatcher.run()
                watchers.cancel_scope.cancel()
        finally:
            self.ui.close_progress()

    # -- reporting -----------------------------------------------------------------------

    def _show(
        self,
        name: str,
        run_dir: Path,
        summary: dict[str, Any],
        failed: list[FailedItem],
        *,
        title: str,
        recorded: int,
        duration_ms: float | str,
        counts: Counts,
    ) -> None:
        p = self.prepared
        for heading, lines in row_sections(failed, run_dir, p.display):
            self.ui.failed_rows(lines, title=heading)
        rows = results_rows(
            name,
            p.display(run_dir),
            summary,
            total=p.meta.total_work_items,
            recorded=recorded,
            counts=counts,
            duration_ms=duration_ms,
        )
        self.ui.results_table(title, rows)

    async def _already_complete(
        self, name: str, run_dir: Path, latest: Mapping[WorkKey, TerminalRecord]
    ) -> int | _Request:
        p = self.prepared
        total = p.meta.total_work_items
        if (
            self.ui.interactive
            and not p.options.yes
            and await self._ask(
                f"run '{name}' already has all {total} results — start a new run?", default=True
            )
        ):
            new_name = generate_run_name(p.output_root)
            self.ui.note(f"{name} is complete and stays untouched; starting new run '{new_name}'")
            return _Request(new_name, fresh=False, retry_failed=False)
        self.ui.stage(f"{name}: all {total} work items already have results")
        if self.after_run is not None:
            await self._after_run(run_dir, True)
        records = list(latest.values())
        summary = read_summary(run_dir) or aggregate_metrics(
            [r.to_dict() for r in records], p.spec.pass_threshold
        )
        counts = count_statuses(records)
        failed: list[FailedItem] = [r for r in records if r.status != "success"]
        self._show(
            name,
            run_dir,
            summary,
            failed,
            title="Results",
            recorded=len(latest),
            duration_ms=complete_duration(read_metrics(run_dir)),
            counts=counts,
        )
        try:
            local_run_id: str | None = read_manifest(run_dir / "manifest.json").local_run_id
        except CLIError:
            local_run_id = None
        self.ui.result(
            status="success",
            message=f"Run '{name}' was already complete; nothing ran: {p.display(run_dir)}",
            next_steps=next_steps(
                name, p.command, complete=True, failed=counts.failed, already_complete=True
            ),
            resource=result_resource(
                self._facts,
                name,
                run_dir,
                summary,
                local_run_id=local_run_id,
                counts=counts,
                failed_rows=failed,
                dispatched=0,
                cancelled=False,
                resumed=len(latest),
                duration_ms=0.0,
            ),
        )
        return 0

    def _show_results(
        self, rd: RunDirectory, result: FinalizeResult, cancelled: bool
    ) -> tuple[Counts, list[FailedItem]]:
        counts = Counts(result.succeeded, result.failed, result.skipped)
        latest = rd.journal.latest  # its records (not FailedRow) carry each failure's reason
        failed: list[FailedItem] = [latest[(r.row_index, r.run_index)] for r in result.failed_rows]
        self._show(
            rd.name,
            rd.path,
            result.summary,
            failed,
            title="Results (incomplete)" if cancelled else "Results",
            recorded=result.recorded,
            duration_ms=result.duration_ms,
            counts=counts,
        )
        return counts, failed

    def _report(self, rd: RunDirectory, result: FinalizeResult, cancelled: bool) -> int:
        p = self.prepared
        counts, failed = self._show_results(rd, result, cancelled)
        display = p.display(rd.path)
        failure = result.write_failure  # a full disk, an I/O error: the file and what to do
        self.ui.result(
            status="success" if result.complete and failure is None else "partial",
            message=(
                f"Evaluation run stopped: {failure.cause()}"
                if failure is not None
                else f"Evaluation run finished: {display}"
                if result.complete
                else f"Evaluation run interrupted: {display}"
            ),
            next_steps=next_steps(
                rd.name, p.command, complete=result.complete, failed=result.failed
            ),
            resource=result_resource(
                self._facts,
                rd.name,
                rd.path,
                result.summary,
                local_run_id=rd.manifest.local_run_id,
                counts=counts,
                failed_rows=failed,
                dispatched=self.dispatch_report.dispatched,
                cancelled=cancelled,
                resumed=result.resumed,
                duration_ms=result.duration_ms,
                halted=self.halted,
            ),
        )
        if self.interrupts.interrupted:
            return EXIT_INTERRUPTED
        return 0 if result.complete and failure is None else 1
