"""The run directory (docs/spec/supervisor.md §3, §4): lock, manifest gate, journal, projections.

Typical use by the supervisor::

    lock = RunLock.acquire(output_root, name)          # held for the whole named run
    ... reap orphans of output_root / name ...
    rd = RunDirectory.open(output_root=..., name=..., inputs=..., provenance=..., fresh=...,
                           meta=RunMeta(...), selected_rows=selection.rows, redactor=...)
    items = rd.pending_items(selection.rows, meta.n, retry_failed)
    ... for each finished item: await rd.record_result(record, wait_for_trajectory=...) ...
    result = rd.finalize(cancelled=...)
    rd.close(); lock.release()

The journal is the only authority: ``index.jsonl``/``summary.jsonl`` get one appended line per
finished item (O(1)), ``metrics.json`` is refreshed at most every ``metrics_interval_s`` (less
often in a run so large that the refresh itself gets slow), and
every projection is rebuilt from the journal in one pass at open and at finalize.

A full disk, a directory that turned read-only or an I/O error is a :class:`WriteFailure`:
at open it refuses the run with one line naming the file; later the first one is kept in
:attr:`RunDirectory.write_failure` (a journal failure also halts dispatch through the
exception :meth:`record_result` raises), and :meth:`finalize` never raises for one, so the
run still ends with its results table, its cause and a resume hint.

Why one module of this size: :class:`RunDirectory` is the single writer of the run directory;
open, record and finalize share its in-memory projection state (latest records, counters, the
index already written), which is what keeps per-item work O(1).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import trio

from launcher.dataset import SelectedRow, WorkItem
from launcher.errors import LocalEvalError
from launcher.redact import Redactor
from launcher.rundir.atomic import (
    WriteFailure,
    atomic_write_bytes,
    atomic_write_json,
    pretty_json_bytes,
    rewrite_in_place,
)
from launcher.rundir.calls import CALLS_FILENAME, encode_calls
from launcher.rundir.items import (
    FailedRow,
    FinalizeResult,
    ItemGrid,
    RunMeta,
    compute_pending,
)
from launcher.rundir.journal import Journal, TerminalRecord
from launcher.rundir.lock import RunLock, lock_path
from launcher.rundir.logs import INVOCATION_ENDED, INVOCATION_STEP, RunLog, utc_now_iso
from launcher.rundir.manifest import GateOutcome, Manifest, manifest_gate
from launcher.rundir.metrics import LiveCounters, aggregate_index_values
from launcher.rundir.names import validate_run_name
from launcher.rundir.projections import (
    IndexValues,
    index_values,
    index_values_line,
    load_valid_trajectory,
    project_item,
    read_valid_trajectory,
)
from launcher.rundir.records import graded_reward
from launcher.rundir.snapshots import remove_stale_temps, write_dataset_rows, write_progress

__all__ = [
    "FailedRow",
    "FinalizeResult",
    "RunDirectory",
    "RunLock",
    "RunMeta",
    "compute_pending",
    "lock_path",
]

TRAJECTORY_GRACE_S = 30.0
TRAJECTORY_POLL_S = 0.2
#: After a throttled metrics.json refresh slower than METRICS_SLOW_S (about 10,000 rows), the
#: next one waits at least METRICS_MAX_SHARE times that refresh's duration.
METRICS_SLOW_S = 0.02
METRICS_MAX_SHARE = 50


class RunDirectory:
    """An open run directory. Create it with :meth:`open` while holding the :class:`RunLock`."""

    def __init__(
        self,
        *,
        path: Path,
        name: str,
        gate: GateOutcome,
        log: RunLog,
        journal: Journal,
        meta: RunMeta,
        metrics_interval_s: float,
    ) -> None:
        self.path = path
        self.name = name
        self.gate = gate
        self.log = log
        self.journal = journal
        self.meta = meta
        self.started_at = utc_now_iso()
        self._t0 = time.monotonic()
        self._metrics_interval_s = metrics_interval_s
        self._next_metrics = -float("inf")
        self._expected = ItemGrid(meta.row_range, meta.n)
        # Per expected item, by its grid slot (so in (row_index, run_index) order): no key
        # tuples or table entries (~17 MB more at 100,000 rows as dicts keyed by tuple).
        size = len(self._expected)
        # 1 where this invocation produced the latest record (the others are resumed).
        self._fresh = bytearray(size)
        # The index row of the latest record, as made by this invocation.
        self._rows: list[IndexValues | None] = [None] * size
        # 1 where the projections (copies) of the rollout in _rows were made by this
        # invocation with a valid trajectory and are current: finalize rebuilds only the others.
        self._current = bytearray(size)
        self.counters = LiveCounters(pass_threshold=meta.pass_threshold)
        if journal.latest.within(meta.sampled_rows, meta.n):
            self.counters.add_all(list(journal.latest.values()))  # a resume: all of them at once
        else:
            for key, record in journal.latest.items():
                if key in self._expected:
                    self.counters.apply(record.status, record.reward, tokens=record.tokens)
        # Projections run on worker threads (the journal's committing thread, or a retry's).
        self._projection_lock = threading.Lock()
        # Joined once: each finished item reads its trial and appends to both row files.
        self._trials_root = os.fspath(path / "rollout_trials")
        self._row_files = (os.fspath(path / "index.jsonl"), os.fspath(path / "summary.jsonl"))
        self._journal_failure: WriteFailure | None = None
        self._other_failure: WriteFailure | None = None
        self.keep_logprobs = True
        """Whether call records keep logprobs and token ids (``[evaluation] keep_logprobs``)."""

    @classmethod
    def open(
        cls,
        *,
        output_root: Path,
        name: str,
        inputs: dict[str, Any],
        provenance: dict[str, Any],
        fresh: bool,
        meta: RunMeta,
        selected_rows: Sequence[SelectedRow] | None,
        redactor: Redactor,
        echo: Callable[[str], None] | None = None,
        metrics_interval_s: float = 1.0,
    ) -> RunDirectory:
        """Gate, open the log and journal, write ``dataset_rows.jsonl``, refresh projections.

        Blocking (file I/O); call it before dispatch or via ``trio.to_thread.run_sync``.
        A ``Changed: ...`` refusal or a corrupt journal raises before anything is modified.
        ``self.gate.archived_to`` tells whether ``--fresh`` archived a previous directory.
        Log lines written here (and in :meth:`finalize`) reach ``echo`` on the calling thread.
        A file that cannot be written raises :class:`LocalEvalError` naming it.
        """
        validate_run_name(name)
        run_dir = Path(output_root) / name
        try:
            return cls._open(
                run_dir,
                name,
                inputs,
                provenance,
                fresh,
                meta,
                selected_rows,
                redactor,
                echo,
                metrics_interval_s,
            )
        except OSError as exc:
            failure = WriteFailure(Path(exc.filename or run_dir), exc)
            raise LocalEvalError(failure.cause()) from None

    @classmethod
    def _open(
        cls,
        run_dir: Path,
        name: str,
        inputs: dict[str, Any],
        provenance: dict[str, Any],
        fresh: bool,
        meta: RunMeta,
        selected_rows: Sequence[SelectedRow] | None,
        redactor: Redactor,
        echo: Callable[[str], None] | None,
        metrics_interval_s: float,
    ) -> RunDirectory:
        gate = manifest_gate(run_dir, name, inputs, provenance, fresh=fresh)
        # A corrupt journal must refuse the run before the log or projections are touched.
        journal = Journal.open(run_dir / "events.jsonl")
        try:
            calls = journal.attach_call_log(run_dir / CALLS_FILENAME)
        except BaseException:
            journal.close()
            raise
        redactor.add_known_env(os.environ)
        try:
            log = RunLog(run_dir / "logs.txt", redactor, echo)
        except BaseException:
            journal.close()
            raise
        if calls.dropped_bytes or calls.torn_bytes:
            log.warning(
                "resume",
                "discarded the call records of results that were never acknowledged",
                {"bytes": calls.dropped_bytes + calls.torn_bytes},
            )
        if journal.torn_bytes:
            log.warning(
                "resume",
                "discarded a partial trailing journal record",
                {"bytes": journal.torn_bytes},
            )
        rd = cls(
            path=run_dir,
            name=name,
            gate=gate,
            log=log,
            journal=journal,
            meta=meta,
            metrics_interval_s=metrics_interval_s,
        )
        try:
            remove_stale_temps(rd.path)
            # selected_rows None: the caller wrote the file (eval merge).
            if selected_rows is not None and write_dataset_rows(rd.path, selected_rows):
                rd.log.warning(
                    "resume", "dataset_rows.jsonl did not match the selected rows; rewrote it"
                )
            write_progress(rd.path, rd.meta)
            rd._rebuild(status="running")
        except BaseException:
            rd.close()
            raise
        return rd

    # -- facts -----------------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The manifest in force (created now or read from disk)."""
        return self.gate.manifest

    @property
    def trials_dir(self) -> Path:
        """``<run_dir>/rollout_trials``: the rollout server's artifact root."""
        return self.path / "rollout_trials"

    @property
    def logs_path(self) -> Path:
        """``<run_dir>/logs.txt``."""
        return self.path / "logs.txt"

    def trial_dir(self, rollout_id: str) -> Path:
        """``rollout_trials/<rollout_id>``."""
        return self.trials_dir / rollout_id

    @property
    def write_failure(self) -> WriteFailure | None:
        """The failed write that explains how the run ended: the journal's first (results
        stopped counting there), else the first of projections, finalize or ``logs.txt``."""
        return self._journal_failure or self._other_failure or self.log.write_failure

    def _note_failure(self, exc: OSError, default: Path) -> WriteFailure:
        failure = WriteFailure(Path(exc.filename or default), exc)
        if self._other_failure is None:
            self._other_failure = failure
        return failure

    @property
    def recorded_count(self) -> int:
        """Work items (of this selection) that have any terminal record."""
        return sum(1 for key in self.journal.latest if key in self._expected)

    @property
    def resumed_count(self) -> int:
        """Recorded items whose latest record was not produced by this invocation."""
        expected = self._expected
        return sum(
            1
            for key in self.journal.latest
            if key in expected and not self._fresh[expected.slot(key)]
        )

    def pending_items(
        self, selected_rows: Sequence[SelectedRow], n: int, retry_failed: bool
    ) -> list[WorkItem]:
        """See :func:`compute_pending` (uses the replayed journal)."""
        return compute_pending(self.journal.latest, selected_rows, n, retry_failed)

    def is_complete(self) -> bool:
        """Every expected work item has a terminal record."""
        return self.recorded_count == len(self._expected)

    # -- per item ----------------------------------------------------------------------------

    async def record_result(
        self,
        record: TerminalRecord,
        *,
        wait_for_trajectory: bool = False,
        trajectory_grace_s: float = TRAJECTORY_GRACE_S,
        calls: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Commit one terminal result, then update projections for this item only.

        Order: journal append + fsync (the result counts from here), then on the same worker
        thread this item's index/summary line, projection copies and a throttled
        ``metrics.json`` refresh; the live counters; when the outcome carried a sample but its
        trajectory was not there yet, a wait (up to ``trajectory_grace_s``) for it and a second
        projection; and the ``work item finished`` log line. Only the journal step can raise;
        projection problems are logged, since a rebuild repairs them.
        ``error_type`` and ``metrics`` are redacted and a non-finite reward dropped before it
        is journaled; the rollout's files are redacted as they are projected (projections).
        ``calls`` (the rollout's call records) are made durable before the record
        (launcher.rundir.calls).
        """
        if record.error_type:
            # error_type may carry the rollout's own error text; secrets never reach a file.
            record = msgspec.structs.replace(
                record, error_type=self.log.redactor(record.error_type)
            )
        if record.metrics:
            # So may the workflow's metrics (their strings and names).
            metrics = self.log.redactor.redact_obj(record.metrics)
            if metrics != record.metrics:
                record = msgspec.structs.replace(record, metrics=metrics)
        reward = graded_reward(record.reward)
        if reward != record.reward:
            record = msgspec.structs.replace(record, reward=reward)
        previous = self.journal.latest.get(record.key)
        warnings: list[tuple[str, dict[str, Any]]] = []
        # The rollout server writes the trajectory before it publishes the result, so the
        # first look almost always finds it: that look and the projection run on the thread
        # that commits the journal group, right after its fsync (one thread hand-off for the
        # group, one parse per item); only a missing trajectory falls back to polling.
        projected: list[bool | OSError] = []

        def project() -> None:
            projected.append(self._project_locked(record, warnings, wait_for_trajectory))

        try:
            lines = encode_calls(
                calls or (),
                row_index=record.row_index,
                run_index=record.run_index,
                keep_tokens=self.keep_logprobs,
            )
            if lines and self.journal.call_log is not None:
                # Durable before the record that accounts for them (launcher.rundir.calls).
                await self.journal.call_log.append(lines)
            await self.journal.append(record, then=project)
        except LocalEvalError as exc:
            # The journal cut its partial line off and refuses further appends; the error
            # still halts dispatch, and the run's last line names the journal file.
            if isinstance(exc.__cause__, OSError) and self._journal_failure is None:
                self._journal_failure = WriteFailure(self.journal.path, exc.__cause__)
            raise
        if record.key in self._expected:
            self._fresh[self._expected.slot(record.key)] = 1
            prev = (
                (previous.status, previous.reward, previous.tokens)
                if previous is not None
                else None
            )
            self.counters.apply(record.status, record.reward, prev, tokens=record.tokens)
        outcome = projected[0] if projected else True
        if isinstance(outcome, OSError):
            self._projection_failed(record, outcome)
        elif not outcome:
            await self._wait_for_trajectory(record.rollout_id, trajectory_grace_s)
            await self._project(record, warnings, require_trajectory=False)
        # Logged here rather than in the worker thread, so the --verbose echo stays on trio.
        for message, details in warnings:
            self._warn(message, details)
        self.log.info(
            "result",
            "work item finished",
            {
                "reward": record.reward,
                "rollout_id": record.rollout_id,
                "row_index": record.row_index,
                "run_index": record.run_index,
                "status": record.status,
            },
        )

    async def _project(
        self,
        record: TerminalRecord,
        warnings: list[tuple[str, dict[str, Any]]],
        *,
        require_trajectory: bool,
    ) -> bool:
        """:meth:`_project_one` on a worker thread; False when it was skipped because
        ``require_trajectory`` is set and the trajectory is not there yet."""
        outcome = await trio.to_thread.run_sync(
            self._project_locked, record, warnings, require_trajectory
        )
        if isinstance(outcome, OSError):
            self._projection_failed(record, outcome)
            return True
        return outcome

    def _project_locked(
        self,
        record: TerminalRecord,
        warnings: list[tuple[str, dict[str, Any]]],
        require_trajectory: bool,
    ) -> bool | OSError:
        """:meth:`_project_one` (blocking, one projection at a time), an I/O error returned
        for the trio side to report."""
        with self._projection_lock:
            try:
                return self._project_one(record, warnings, require_trajectory)
            except OSError as exc:
                return exc

    def _projection_failed(self, record: TerminalRecord, exc: OSError) -> None:
        self._note_failure(exc, self.path)
        self.log.error(
            "result",
            "could not update projections; they are rebuilt at finalize",
            {"error": f"{type(exc).__name__}: {exc}", "rollout_id": record.rollout_id},
        )

    async def _wait_for_trajectory(self, rollout_id: str, grace_s: float) -> None:
        """Poll for the trajectory (the caller has just looked once) for up to ``grace_s``."""
        with trio.move_on_after(grace_s):
            while True:
                await trio.sleep(TRAJECTORY_POLL_S)
                found = await trio.to_thread.run_sync(
                    load_valid_trajectory, self.trials_dir, rollout_id
                )
                if found is not None:
                    return
        self.log.warning(
            "trajectory",
            "no parseable trajectory within the archive grace period",
            {"rollout_dir": str(self.trial_dir(rollout_id)), "rollout_id": rollout_id},
        )

    def _project_one(
        self,
        record: TerminalRecord,
        warnings: list[tuple[str, dict[str, Any]]],
        require_trajectory: bool = False,
    ) -> bool:
        trajectory = read_valid_trajectory(
            self._trials_root, record.rollout_id, redactor=self.log.redactor
        )
        if trajectory is None and require_trajectory:
            return False
        key = record.key
        if key not in self._expected:
            return True
        slot = self._expected.slot(key)
        values = index_values(record, trajectory.doc if trajectory else None, resumed=False)
        self._rows[slot] = values
        self._current[slot] = 0
        line = index_values_line(values)
        for row_file in self._row_files:
            fd = os.open(row_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        project_item(
            self.path,
            record,
            trajectory_valid=trajectory is not None,
            warn=lambda message, details: warnings.append((message, details)),
            trajectory=trajectory,
            redactor=self.log.redactor,
        )
        if trajectory is not None:
            self._current[slot] = 1
        now = time.monotonic()
        if now >= self._next_metrics:
            self._write_metrics("running", durable=False)
            self._next_metrics = self._metrics_due(now)
        return True

    def _metrics_due(self, started: float) -> float:
        """When the next throttled ``metrics.json`` refresh may run after one that started at
        ``started``: ``metrics_interval_s`` later, or later still when the refresh itself was
        slow (it aggregates every row: 0.2 s at 100,000 rows), so that slow refreshes take at
        most 1/:data:`METRICS_MAX_SHARE` of the run's time and the per-item cost stays flat."""
        spent = time.monotonic() - started
        backoff = spent * METRICS_MAX_SHARE if spent >= METRICS_SLOW_S else 0.0
        return started + max(self._metrics_interval_s, backoff)

    async def record_call(self, call: dict[str, Any]) -> None:
        """Make a call of no rollout (the model preflight's, ``kind`` "preflight") durable in
        ``calls.jsonl``; a failure to write it is logged, never fatal."""
        log = self.journal.call_log
        if log is None:
            return
        try:
            await log.append(encode_calls([call], keep_tokens=self.keep_logprobs))
        except LocalEvalError as exc:
            self._warn("could not record a call", {"error": str(exc)})

    def _warn(self, message: str, details: dict[str, Any]) -> None:
        self.log.warning("trajectory", message, details)

    # -- whole-run snapshots -------------------------------------------------------------

    def _latest_expected(self) -> list[TerminalRecord]:
        return [self.journal.latest[k] for k in sorted(self.journal.latest) if k in self._expected]

    def _metrics_doc(
        self, status: str, duration_ms: float, completed_at: str | None
    ) -> dict[str, Any]:
        eval_run: dict[str, Any] = {
            "id": self.manifest.local_run_id,
            "status": status,
            "name": self.name,
            "dataset_name": self.meta.dataset_name,
            "model_name": self.meta.model_name,
            "rollout_name": self.meta.rollout_name,
            "duration_ms": duration_ms,
            "started_at": self.started_at,
        }
        if completed_at is not None:
            eval_run["completed_at"] = completed_at
        # The rows in slot order, read in place: no list or per-row dict per refresh.
        rows = (values for values in self._rows if values is not None)
        return {
            "eval_run": eval_run,
            "summary": aggregate_index_values(rows, self.meta.pass_threshold),
        }

    def _write_metrics(
        self,
        status: str,
        *,
        duration_ms: float = 0.0,
        completed_at: str | None = None,
        durable: bool = True,
    ) -> dict[str, Any]:
        doc = self._metrics_doc(status, duration_ms, completed_at)
        atomic_write_json(self.path / "metrics.json", doc, durable=durable)
        return doc

    def _rebuild(
        self,
        *,
        status: str,
        duration_ms: float = 0.0,
        completed_at: str | None = None,
        reuse: bool = False,
    ) -> dict[str, Any]:
        """One pass over the journal: index/summary, every item's projection, metrics.json.

        With ``reuse`` (finalize), an item whose projections this invocation already made for
        its latest record, with a valid trajectory (at open, or when its result came in), keeps
        them: only the other items are read and projected again, so finalize does not redo the
        whole run's file work."""
        previous: list[IndexValues | None] = self._rows
        rows: list[IndexValues | None] = [None] * len(previous)
        for record in self._latest_expected():
            slot = self._expected.slot(record.key)
            kept = previous[slot]
            if reuse and self._current[slot] and kept is not None and kept[2] == record.rollout_id:
                rows[slot] = kept  # kept[2]: the rollout_id the row (and its copies) were made for
                continue
            trajectory = read_valid_trajectory(
                self.trials_dir, record.rollout_id, redactor=self.log.redactor
            )
            doc = trajectory.doc if trajectory is not None else None
            rows[slot] = index_values(record, doc, resumed=not self._fresh[slot])
            project_item(
                self.path,
                record,
                trajectory_valid=trajectory is not None,
                warn=self._warn,
                trajectory=trajectory,
                redactor=self.log.redactor,
            )
            self._current[slot] = trajectory is not None
        self._rows = rows
        # Appended line by line: a list of every line before a join would double this
        # buffer's size at the supervisor's peak (finalize, with every row in memory).
        data = bytearray()
        for values in rows:
            if values is not None:
                data += index_values_line(values)
        atomic_write_bytes(self.path / "index.jsonl", data)
        atomic_write_bytes(self.path / "summary.jsonl", data)
        self._next_metrics = time.monotonic() + self._metrics_interval_s
        return self._write_metrics(status, duration_ms=duration_ms, completed_at=completed_at)

    def _index_rows(self) -> list[IndexValues | None]:
        """The index row of every expected item (reads trajectories, writes nothing)."""
        rows: list[IndexValues | None] = [None] * len(self._expected)
        for record in self._latest_expected():
            slot = self._expected.slot(record.key)
            trajectory = load_valid_trajectory(self.trials_dir, record.rollout_id)
            rows[slot] = index_values(record, trajectory, resumed=not self._fresh[slot])
        return rows

    def failed_rows(self) -> list[FailedRow]:
        """Latest records that are not ``success``, sorted by ``(row_index, run_index)``."""
        return [
            FailedRow(
                row_index=r.row_index,
                source_row_index=r.source_row_index,
                run_index=r.run_index,
                rollout_id=r.rollout_id,
                status=r.status,
                error_type=r.error_type,
                rollout_dir=self.trial_dir(r.rollout_id),
            )
            for r in self._latest_expected()
            if r.status != "success"
        ]

    def finalize(self, *, cancelled: bool) -> FinalizeResult:
        """Rebuild every projection from the journal and write the final ``metrics.json``.

        Status is ``finished`` (with ``completed_at``) when every item has a record and the run
        was not cancelled or halted, else ``incomplete``. Blocking; safe to call more than once.
        """
        duration_ms = (time.monotonic() - self._t0) * 1000.0
        complete = self.is_complete() and not cancelled
        completed_at = utc_now_iso(datetime.now(UTC)) if complete else None
        status = "finished" if complete else "incomplete"
        try:
            write_progress(self.path, self.meta)
            doc = self._rebuild(
                status=status, duration_ms=duration_ms, completed_at=completed_at, reuse=True
            )
        except OSError as exc:
            # Never raise from here: finalize runs in a `finally`, and the results recorded
            # so far (the journal, in memory) still make the table and the resume hint.
            failure = self._note_failure(exc, self.path)
            complete, completed_at, status = False, None, "incomplete"
            self.log.error(
                "finalize",
                "could not write the run's projections",
                {"error": str(exc), "path": str(failure.path)},
            )
            self._rows = self._index_rows()
            doc = self._metrics_doc(status, duration_ms, completed_at)
            rewrite_in_place(self.path / "metrics.json", pretty_json_bytes(doc))
        # One line per invocation, so a report can show the run's wall time as the sum of
        # its invocations (metrics.json keeps the latest one's only).
        self.log.info(
            INVOCATION_STEP,
            INVOCATION_ENDED,
            {"duration_ms": round(duration_ms, 1), "started_at": self.started_at, "status": status},
        )
        latest = self._latest_expected()
        return FinalizeResult(
            metrics=doc,
            complete=complete,
            total_work_items=self.meta.total_work_items,
            recorded=len(latest),
            succeeded=sum(1 for r in latest if r.status == "success"),
            failed=sum(1 for r in latest if r.status == "failed"),
            skipped=sum(1 for r in latest if r.status == "skipped"),
            resumed=sum(1 for r in latest if not self._fresh[self._expected.slot(r.key)]),
            duration_ms=duration_ms,
            failed_rows=self.failed_rows(),
            write_failure=self.write_failure,
        )

    def close(self) -> None:
        """Close the journal and the log (the lock is the caller's)."""
        # Both are fsync'd or unbuffered, so a failing close loses nothing; it runs in a
        # `finally` and must not replace the error that ended the run.
        with contextlib.suppress(OSError):
            self.journal.close()
        self.log.close()
