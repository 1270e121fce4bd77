"""``rollbridge eval run``: the one trio program that runs a local evaluation (runner.md §0).

Synchronous preparation (flags, workspace, config, dataset, plan table) happens before
``trio.run``; everything with a lifetime (lock, log, children, bridge, tunnel, dispatch) lives
inside it, in this order: reap orphans, choose the name, take the lock, reap this run's own
leftovers, pass the manifest gate, replay the journal, compute pending work, confirm, resolve
secrets, then ``uv sync`` with the model preflight and the bridge start-up alongside, start the
rollout server once the preflight has passed, decide the tunnel, size the worker pool, start the tunnel, dispatch,
shut down, finalize.

Shutdown is always: rollout server (its process group, 5 s grace, or 330 s after an
interrupt or halt unless a second Ctrl-C hurries it), tunnel, bridge, environment restored.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from launcher.config import EvalConfig, RunSpec, advanced_keys_warning, load_eval_config
from launcher.config import resolve_run_spec as _resolve_run_spec
from launcher.dataset import DatasetSelection, SelectedRow, select_rows
from launcher.digest import source_digest
from launcher.dispatch import (
    AdmissionRefused,
    Dispatcher,
    DispatchReport,
    WorkItem,
    resolve_concurrency,
)
from launcher.errors import (
    CLIError,
    InteractiveRequiredError,
    LocalEvalError,
    ValidationError,
)
from launcher.process import (
    LONG_STOP_GRACE_S,
    STOP_GRACE_S,
    find_uv,
    reap_orphans,
    reap_run_dir,
    uv_sync,
)
from launcher.redact import Redactor
from launcher.rollout_child import RolloutServer, ServerLaunch, rollout_python, start_rollout_server
from launcher.rundir import FinalizeResult, RunDirectory, RunLock, RunMeta, compute_pending
from launcher.rundir.journal import TerminalRecord, replay_journal
from launcher.rundir.manifest import build_inputs, build_provenance, changed_groups, read_manifest
from launcher.rundir.metrics import aggregate_metrics
from launcher.rundir.names import generate_run_name, validate_run_name
from launcher.secrets import read_secrets_file, resolve_secrets, scoped_environ
from launcher.signals import EXIT_INTERRUPTED, Interrupts, watch_signals
from launcher.ui import CLI_VERSION, UI
from launcher.workspace import (
    DatasetSource,
    GitState,
    RolloutPaths,
    Workspace,
    check_rollout_paths,
    provenance_warnings,
    read_git_state,
    resolve_dataset_source,
    resolve_output_root,
    resolve_workspace,
)
from rollout_server.client import (
    Admission,
    AdmissionRejected,
    RolloutClient,
    RolloutServerUnreachable,
)
from rollout_server.protocol import RolloutInitRequest, RolloutResultResponse
from tunnel.errors import TunnelError
from tunnel.plan import TunnelDecision, TunnelPlan, choose_tunnel, validate_tunnel_flags

__all__ = ["EXIT_INTERRUPTED", "EvalOptions", "run_eval"]

COMMAND = "rollbridge eval run"


@dataclass
class EvalOptions:
    """The flags of ``rollbridge eval run`` (see ``docs/eval-run.md``)."""

    config: str
    name: str | None = None
    output: str | None = None
    dataset_file: str | None = None
    secrets_file: str | None = None
    rows: str | None = None
    limit: int | None = None
    fresh: bool = False
    retry_failed: bool = False
    max_in_flight: int | None = None
    yes: bool = False
    tunnel: str | None = None
    cloudflared: str | None = None
    download_cloudflared: bool = False
    rollout_port: int | None = None
    listener_port: int | None = None
    advertise_url: str | None = None
    verbose: bool = False


@dataclass
class Prepared:
    """Everything resolved before the trio program starts."""

    options: EvalOptions
    cwd: Path
    workspace: Workspace
    config: EvalConfig
    spec: RunSpec
    paths: RolloutPaths
    output_root: Path
    dataset: DatasetSource
    selection: DatasetSelection
    git: GitState | None
    tunnel_plan: TunnelPlan
    redactor: Redactor
    rows_by_index: dict[int, SelectedRow] = field(default_factory=dict)

    @property
    def meta(self) -> RunMeta:
        """Facts for projections and metrics."""
        return RunMeta(
            n=self.spec.n,
            pass_threshold=self.spec.pass_threshold,
            sampled_rows=len(self.selection.rows),
            total_dataset_rows=self.selection.total_dataset_rows,
            dataset_name=self.dataset.name,
            model_name=self.config.experiment.model_path,
            rollout_name=self.config.experiment.rollout,
        )

    def display(self, path: Path) -> str:
        """``path`` relative to the CWD when it lies under it, else absolute."""
        try:
            return str(path.relative_to(self.cwd)) or "."
        except ValueError:
            return str(path)

    def command(self, *extra: str) -> str:
        """A re-run command line: the config, the flags that pin the same inputs, ``extra``,
        then the runtime tunnel flags (never part of the manifest)."""
        parts = [COMMAND, shlex.quote(self.display(self.workspace.config_path))]
        opts = self.options
        if opts.output is not None:
            parts += ["-o", shlex.quote(self.display(self.output_root))]
        if opts.dataset_file is not None:
            parts += ["--dataset-file", shlex.quote(self.display(self.dataset.path))]
        if opts.rows is not None:
            parts += ["--rows", shlex.quote(opts.rows)]
        if opts.limit is not None:
            parts += ["--limit", str(opts.limit)]
        parts += list(extra)
        parts += [shlex.quote(f) for f in self.tunnel_plan.resume_flags()]
        if opts.cloudflared is not None:
            parts += ["--cloudflared", shlex.quote(opts.cloudflared)]
        return " ".join(parts)


# -- preparation (synchronous) --------------------------------------------------------------


def prepare(options: EvalOptions, ui: UI, cwd: Path | None = None) -> Prepared:
    """Steps 1-11 of runner.md §0: validate flags, resolve the workspace, config, dataset and
    selection, and print the warnings and the plan table. Raises :class:`CLIError`."""
    cwd = cwd or Path.cwd()
    redactor = Redactor()
    redactor.add_known_env(os.environ)
    ui.set_redactor(redactor)
    try:
        plan = validate_tunnel_flags(options.tunnel, options.advertise_url, options.listener_port)
    except TunnelError as exc:
        raise ValidationError(str(exc)) from None
    if options.max_in_flight is not None and options.max_in_flight <= 0:
        raise ValidationError(
            f"--max-in-flight must be a positive integer, got {options.max_in_flight}"
        )
    if options.rollout_port is not None and not 1 <= options.rollout_port <= 65535:
        raise ValidationError(
            f"--rollout-port must be between 1 and 65535, got {options.rollout_port}"
        )
    if options.name is not None:
        validate_run_name(options.name)
    if options.fresh and options.retry_failed:
        raise ValidationError(
            "--fresh and --retry-failed cannot be combined: --fresh starts over, "
            "--retry-failed keeps the successes of the existing run"
        )
    for warning in plan.warnings:
        ui.warning(warning.message, warning.code)

    workspace = resolve_workspace(Path(options.config), cwd)
    config = load_eval_config(workspace.config_path)
    paths = check_rollout_paths(workspace, config.experiment.rollout, config.experiment.entrypoint)
    spec = _resolve_run_spec(config, limit_override=options.limit)
    advanced = advanced_keys_warning(config, COMMAND)
    if advanced:
        ui.warning(advanced, "ADVANCED_KEYS_IGNORED")
    output_root = resolve_output_root(workspace, options.output, cwd)
    if output_root.resolve() == paths.rollout_dir.resolve():
        raise ValidationError(
            f"--output must not be the rollout source directory {paths.rollout_dir}: excluding "
            "the output tree would then exclude the whole project, freezing the resume "
            "fingerprint."
        )
    dataset = resolve_dataset_source(
        workspace, config.experiment.dataset, options.dataset_file, cwd
    )
    selection = select_rows(
        dataset.path,
        rows=options.rows,
        limit=spec.limit,
        name=dataset.name,
        extension=dataset.extension,
    )
    git = read_git_state(workspace.root)
    for warning in provenance_warnings(config, git):
        ui.warning(warning, "PROVENANCE_MISMATCH")
    prepared = Prepared(
        options=options,
        cwd=cwd,
        workspace=workspace,
        config=config,
        spec=spec,
        paths=paths,
        output_root=output_root,
        dataset=dataset,
        selection=selection,
        git=git,
        tunnel_plan=plan,
        redactor=redactor,
        rows_by_index={row.row_index: row for row in selection.rows},
    )
    ui.plan_table(plan_rows(prepared))
    return prepared


def plan_rows(p: Prepared) -> list[tuple[str, str]]:
    """The rows of the "Local Evaluation" plan table (§10.1)."""
    exp = p.config.experiment
    rows = [
        ("Rollout", exp.rollout),
        ("Entrypoint", exp.entrypoint),
        ("Model", exp.model_path),
        ("Dataset", f"{p.dataset.name} ({p.dataset.source})"),
    ]
    if exp.branch:
        rows.append(("Branch", exp.branch))
    if exp.commit_sha:
        rows.append(("Commit", exp.commit_sha))
    rows.append(("Rows", f"{len(p.selection.rows)} of {p.selection.total_dataset_rows}"))
    if p.spec.n > 1:
        rows.append(("Runs Per Row", str(p.spec.n)))
    rows.append(("Work Items", str(len(p.selection.rows) * p.spec.n)))
    rows.append(("Output", p.display(p.output_root)))
    return rows


def run_eval(options: EvalOptions, ui: UI) -> int:
    """Run ``rollbridge eval run`` end to end; returns the exit code (0, 1 or 130).

    User errors raise :class:`CLIError` for the CLI to print.
    """
    prepared = prepare(options, ui)
    supervisor = Supervisor(prepared, ui)
    try:
        try:
            return trio.run(supervisor.main)
        except BaseExceptionGroup as group:
            raise _unwrap(group) from None
    except _Declined:
        interrupted = supervisor.interrupts is not None and supervisor.interrupts.interrupted
        return EXIT_INTERRUPTED if interrupted else 0


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _unwrap(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a user should see from a group raised by nested nurseries: a
    :class:`CLIError` first (its message says what to do), then an interrupt, then the first."""
    leaves = list(_leaves(group))
    for kinds in ((_Declined,), (CLIError,), (KeyboardInterrupt,)):
        for leaf in leaves:
            if isinstance(leaf, kinds):
                return leaf
    return leaves[0]


# -- the trio program -----------------------------------------------------------------------


class _Handle:
    def __init__(
        self, client: RolloutClient, admission: Admission, alive: Callable[[], bool]
    ) -> None:
        self._client = client
        self._admission = admission
        self._alive = alive

    async def wait(self) -> RolloutResultResponse:
        delay = 0.05
        while True:
            try:
                return await self._client.wait_for_result(self._admission)
            except RolloutServerUnreachable as exc:
                # Retry only a poll that never reached a server that is still running, and
                # only while the lease (renewed by every answered poll) has room for it.
                if (
                    not _never_sent(exc)
                    or not self._alive()
                    or trio.current_time() + delay + 1.0 >= self._admission.lease_deadline
                ):
                    raise
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)


def _never_sent(exc: BaseException) -> bool:
    """True when a transport failure happened before the request left (connect phase)."""
    return isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout)


class _Transport:
    """The dispatch transport on top of :class:`rollout_server.client.RolloutClient`."""

    def __init__(self, client: RolloutClient, alive: Callable[[], bool]) -> None:
        self._client = client
        self._alive = alive

    async def admit(self, request: RolloutInitRequest, admission_timeout_s: float) -> _Handle:
        deadline = trio.current_time() + admission_timeout_s
        delay = 0.05
        while True:
            remaining = max(deadline - trio.current_time(), 0.0)
            try:
                admission = await self._client.admit(request, admission_timeout_sec=remaining)
            except AdmissionRejected as exc:
                code = exc.status_code or 0
                if 400 <= code < 500 and code != 429:
                    raise AdmissionRefused(code, str(exc)) from None
                raise
            except RolloutServerUnreachable as exc:
                # A connection that was never established carried no request, so retrying
                # cannot admit twice; a busy server's full listen backlog looks like this.
                if (
                    not _never_sent(exc)
                    or not self._alive()
                    or trio.current_time() + delay >= deadline
                ):
                    raise
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            return _Handle(self._client, admission, self._alive)

    async def cancel(self, rollout_id: str) -> None:
        await self._client.cancel([rollout_id])


@dataclass
class _Services:
    server: RolloutServer | None = None
    bridge: Any = None
    tunnel: Any = None
    decision: TunnelDecision | None = None


class Supervisor:
    """One invocation of ``rollbridge eval run`` inside ``trio.run``."""

    def __init__(self, prepared: Prepared, ui: UI) -> None:
        self.p = prepared
        self.ui = ui
        self.interrupts: Interrupts | None = None
        self.rd: RunDirectory | None = None
        self.halted: str | None = None
        self.report = DispatchReport()

    # -- logging helpers -----------------------------------------------------------------

    def log(
        self, level: str, step: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        """A logs.txt line (or a terminal note before the log is open)."""
        if self.rd is not None:
            self.rd.log.log(level, step, message, details)
        elif level != "INFO":
            self.ui.note(message)

    def stage(self, message: str, step: str = "run", details: dict[str, Any] | None = None) -> None:
        """A milestone: logged and shown as ``→ <message>``."""
        self.log("INFO", step, message, details)
        self.ui.stage(message)

    def _interrupt_note(self, message: str) -> None:
        if self.interrupts is not None and self.interrupts.count == 1:
            self.log("WARNING", "cancel", "supervisor cancellation requested")
        self.log("WARNING", "cancel", message)
        self.ui.note(message)

    # -- entry -------------------------------------------------------------------------

    async def main(self) -> int:
        """The trio entry point: owns the signal watcher and the root cancel scope."""
        with trio.CancelScope() as root:
            self.interrupts = Interrupts(root, self._interrupt_note)
            async with trio.open_nursery() as nursery:
                await nursery.start(watch_signals, self.interrupts)
                try:
                    code = await self._run_with_retry_name()
                finally:
                    nursery.cancel_scope.cancel()
        if root.cancelled_caught or self.interrupts.interrupted:
            return EXIT_INTERRUPTED
        return code

    async def _run_with_retry_name(self) -> int:
        name = self.p.options.name
        while True:
            outcome = await self._run_named(name)
            if isinstance(outcome, int):
                return outcome
            name = outcome.new_name

    # -- one named run -------------------------------------------------------------------

    async def _run_named(self, requested: str | None) -> int | _Restart:
        p = self.p
        assert self.interrupts is not None
        # A Ctrl-C while an orphan refuses to stop cuts its grace to 5 s, then SIGKILL.
        hurry = self.interrupts.first
        for reaped in await reap_orphans(p.output_root, skip=requested, hurry=hurry):
            self.ui.note(reaped.note())
        name = requested or generate_run_name(p.output_root)
        lock = RunLock.acquire(p.output_root, name, command=COMMAND)
        try:
            run_dir = p.output_root / name
            if run_dir.is_dir() and not run_dir.is_symlink():
                for reaped in await reap_run_dir(run_dir, hurry=hurry):
                    self.ui.note(reaped.note())
            digest = await trio.to_thread.run_sync(
                source_digest, p.paths.rollout_dir, p.output_root
            )
            inputs = build_inputs(p.config, p.spec, p.selection, digest)
            done = self._already_complete(run_dir, inputs)
            if done is not None:
                return await self._complete_branch(name, run_dir, done)
            return await self._run_open(name, inputs)
        finally:
            lock.release()

    def _already_complete(
        self, run_dir: Path, inputs: dict[str, Any]
    ) -> dict[tuple[int, int], TerminalRecord] | None:
        """The journal's latest records when the run exists, matches and has nothing pending
        (read-only: a complete run is left untouched)."""
        p = self.p
        manifest_path = run_dir / "manifest.json"
        if p.options.fresh or not manifest_path.is_file():
            return None
        manifest = read_manifest(manifest_path)
        groups = changed_groups(manifest.inputs, inputs)
        if groups:
            return None  # the gate raises the exact "Changed: ..." refusal
        latest = replay_journal(run_dir / "events.jsonl").latest
        if compute_pending(latest, p.selection.rows, p.spec.n, p.options.retry_failed):
            return None
        if _read_status(run_dir) != "finished":
            return None  # killed before finalize: finalize now (nothing is dispatched)
        return latest

    async def _complete_branch(
        self, name: str, run_dir: Path, latest: dict[tuple[int, int], TerminalRecord]
    ) -> int | _Restart:
        p = self.p
        total = len(p.selection.rows) * p.spec.n
        if (
            self.ui.interactive
            and not p.options.yes
            and await self._ask(
                f"run '{name}' already has all {total} results — start a new run?", default=True
            )
        ):
            new_name = generate_run_name(p.output_root)
            self.ui.note(f"{name} is complete and stays untouched; starting new run '{new_name}'")
            p.options.fresh = False
            p.options.retry_failed = False
            return _Restart(new_name)
        self.ui.stage(f"{name}: all {total} work items already have results")
        summary = _read_summary(run_dir) or aggregate_metrics(
            [r.to_dict() for r in latest.values()], p.spec.pass_threshold
        )
        failed = sum(1 for r in latest.values() if r.status == "failed")
        self._print_failed_rows(run_dir, [r for r in latest.values() if r.status != "success"])
        self._results_table(
            name,
            run_dir,
            summary,
            title="Results",
            total=total,
            recorded=len(latest),
            counts=_counts(latest.values()),
            duration_ms=0.0,
        )
        steps = [
            f"Start a new run alongside it: {p.command()}",
            "Re-run this name from scratch (archives its results): "
            + p.command("--name", shlex.quote(name), "--fresh"),
        ]
        if failed:
            steps.append(
                "Retry failures under the same name: "
                + p.command("--name", shlex.quote(name), "--retry-failed")
            )
        self.ui.result(
            status="success",
            message=f"Run '{name}' was already complete; nothing ran: {p.display(run_dir)}",
            next_steps=steps,
            resource=self._resource(
                name,
                run_dir,
                summary,
                counts=_counts(latest.values()),
                failed_rows=[r for r in latest.values() if r.status != "success"],
                dispatched=0,
                cancelled=False,
                resumed=len(latest),
            ),
        )
        return 0

    async def _run_open(self, name: str, inputs: dict[str, Any]) -> int:
        p = self.p
        provenance = build_provenance(p.config, p.workspace, p.git, CLI_VERSION)
        echo = self.ui.log_line if self.ui.verbose else None
        rd = await trio.to_thread.run_sync(
            partial(
                RunDirectory.open,
                output_root=p.output_root,
                name=name,
                inputs=inputs,
                provenance=provenance,
                fresh=p.options.fresh,
                meta=p.meta,
                selected_rows=p.selection.rows,
                redactor=p.redactor,
                echo=echo,
            )
        )
        self.rd = rd
        try:
            if rd.gate.archived_to is not None:
                self.ui.note(f"archived previous results to {rd.gate.archived_to}")
            return await self._execute(rd)
        finally:
            rd.close()
            self.rd = None

    async def _execute(self, rd: RunDirectory) -> int:
        p = self.p
        assert self.interrupts is not None
        total = p.meta.total_work_items
        pending = rd.pending_items(p.selection.rows, p.spec.n, p.options.retry_failed)
        recorded = rd.recorded_count
        suffix = f", {recorded} already recorded" if recorded else ""
        if pending:
            self.stage(f"{rd.name}: {len(pending)} of {total} work items pending{suffix}")
            await self._confirm(len(pending))
        else:
            self.stage(f"{rd.name}: all {total} work items already have results", step="resume")
        result: FinalizeResult | None = None
        try:
            if pending:
                with ExitStack() as env_scope:
                    await self._start_and_dispatch(rd, pending, env_scope)
        finally:
            cancelled = self.interrupts.interrupted or self.halted is not None
            with trio.CancelScope(shield=True):
                result = await trio.to_thread.run_sync(partial(rd.finalize, cancelled=cancelled))
        assert result is not None
        return self._report(rd, result)

    async def _ask(self, prompt: str, *, default: bool) -> bool:
        """A yes/no question, answered in a thread so Ctrl-C still works (it answers "no")."""
        assert self.interrupts is not None
        with self.interrupts.work_scope():
            return await trio.to_thread.run_sync(
                partial(self.ui.confirm, prompt, default=default), abandon_on_cancel=True
            )
        return False

    async def _confirm(self, pending: int) -> None:
        p = self.p
        if p.options.yes:
            return
        prompt = f"{pending} rollouts x model {p.config.experiment.model_path} — continue?"
        if not self.ui.interactive:
            if self.ui.mode == "plain":
                self.ui.warning(f"Confirmation required: {prompt}", "INTERACTIVE_REQUIRED")
            raise InteractiveRequiredError("Use --yes to confirm in non-interactive mode.")
        if not await self._ask(prompt, default=False):
            self.ui.note("Cancelled.")
            raise _Declined()

    # -- start-up and dispatch -----------------------------------------------------------

    async def _start_and_dispatch(
        self, rd: RunDirectory, pending: Sequence[Any], env_scope: ExitStack
    ) -> None:
        p = self.p
        assert self.interrupts is not None
        services = _Services()
        async with trio.open_nursery() as nursery:
            try:
                with self.interrupts.work_scope():
                    secrets = await trio.to_thread.run_sync(
                        self._resolve_secrets, abandon_on_cancel=True
                    )
                    env_scope.enter_context(scoped_environ(secrets))
                    p.redactor.add_known_env(os.environ)
                    token = uuid.uuid4().hex
                    p.redactor.add(token)
                    # The model probe and the bridge's start-up overlap `uv sync`, but the
                    # rollout server (which may provision sandboxes) starts only once the model
                    # is known to answer; a fatal probe cancels the sync.
                    async with trio.open_nursery() as startup:
                        model_checked = trio.Event()
                        startup.start_soon(self._preflight, model_checked)
                        startup.start_soon(self._start_bridge, nursery, token, services)
                        await self._sync()
                        await model_checked.wait()
                        services.server = await self._start_server(nursery, rd, secrets)
                    services.decision = choose_tunnel(p.tunnel_plan, services.server.health)
                    if services.decision.environment is not None:
                        self.stage(
                            services.decision.milestone or "",
                            step="tunnel",
                            details={"environment": services.decision.environment},
                        )
                    services.bridge.set_keepalive(services.decision.keepalive)
                    async with httpx.AsyncClient(trust_env=False) as probe:
                        capacity = await services.server.probe_capacity(probe)
                    concurrency = resolve_concurrency(
                        p.options.max_in_flight, p.spec.batch_size, capacity
                    )
                    if services.decision.mode == "managed":
                        services.tunnel = await self._start_tunnel(nursery, services.bridge.port)
                    elif services.decision.mode == "advertise":
                        self.stage(services.decision.milestone or "", step="tunnel")
                if not self.interrupts.interrupted:
                    await self._dispatch(rd, pending, services, token, concurrency, nursery)
            finally:
                with trio.CancelScope(shield=True):
                    await self._shutdown(services)
                nursery.cancel_scope.cancel()

    def _resolve_secrets(self) -> dict[str, str]:
        p = self.p
        names = list(p.config.secrets_required)
        if not names:
            return {}
        file_values = (
            read_secrets_file(p.options.secrets_file, cwd=p.cwd)
            if p.options.secrets_file is not None
            else None
        )
        values = resolve_secrets(
            names,
            file_values=file_values,
            environ=os.environ,
            interactive=self.ui.interactive,
        )
        for value in values.values():
            p.redactor.add(value)
        return values

    async def _preflight(self, done: trio.Event) -> None:
        from bridge.errors import PreflightError
        from bridge.preflight import preflight

        model = self.p.config.experiment.model_path
        self.stage(f"checking model {model}", step="preflight")
        try:
            warning = await preflight(model, redact=self.p.redactor)
        except PreflightError as exc:
            raise LocalEvalError(str(exc)) from None
        if warning:
            self.log("WARNING", "preflight", warning)
        else:
            self.log("INFO", "preflight", "model preflight passed")
        done.set()

    def _sink(self, step: str) -> Callable[[str], None]:
        def sink(line: str) -> None:
            self.log("INFO", step, line)

        return sink

    def _logs_hint(self) -> str:
        assert self.rd is not None
        return self.p.display(self.rd.logs_path)

    async def _sync(self) -> None:
        p = self.p
        rollout = p.config.experiment.rollout
        uv = find_uv(rollout)
        self.stage(f"syncing rollout dependencies ({rollout})", step="deps")
        await uv_sync(
            uv,
            p.paths.rollout_dir,
            rollout,
            env=os.environ,
            sink=self._sink("deps"),
            logs_hint=self._logs_hint(),
            redact=p.redactor,
        )

    async def _start_server(
        self, nursery: trio.Nursery, rd: RunDirectory, secrets: dict[str, str]
    ) -> RolloutServer:
        p = self.p
        launch = ServerLaunch(
            python=rollout_python(p.paths.rollout_dir, os.environ),
            entrypoint=p.paths.entrypoint,
            rollout_dir=p.paths.rollout_dir,
            run_dir=rd.path,
            base_env=dict(os.environ),
            config_env=p.config.env,
            secrets=secrets,
            fixed_port=p.options.rollout_port,
            logs_hint=self._logs_hint(),
        )
        server = await start_rollout_server(
            nursery,
            launch,
            sink=self._sink("rollout-server"),
            log=self.log,
            stage=self.ui.stage,
            redact=p.redactor,
        )
        version = server.sdk_version
        if version and version != "unknown" and version != CLI_VERSION:
            rollout = p.config.experiment.rollout
            message = (
                f"rollout server uses rollbridge {version}, but this CLI uses {CLI_VERSION}; "
                f"update rollouts/{rollout}/pyproject.toml and run uv sync --project "
                f"rollouts/{rollout} if the run misbehaves"
            )
            self.log(
                "WARNING",
                "server",
                message,
                {"cli_sdk_version": CLI_VERSION, "server_sdk_version": version},
            )
            if not self.ui.verbose:
                self.ui.warning(message, "ROLLOUT_SDK_VERSION_MISMATCH")
        return server

    async def _start_bridge(self, nursery: trio.Nursery, token: str, services: _Services) -> None:
        """Start the bridge as a service of ``nursery``; its handle goes to ``services``.

        Keepalive starts on when the flags already force a public URL; the health report may
        switch it on later (automatic tunnel)."""
        from bridge.errors import BridgeBindError
        from bridge.server import BridgeConfig, run_bridge

        p = self.p

        def bridge_log(level: str, message: str) -> None:
            self.log(level.upper(), "listener", message)

        config = BridgeConfig(
            model=p.config.experiment.model_path,
            token=token,
            port=p.tunnel_plan.listener_port or 0,
            keepalive=not p.tunnel_plan.auto_detect,
            redact=p.redactor,
            log=bridge_log,
        )
        # The bridge's web stack takes ~0.3 s to import; doing it on a worker thread keeps the
        # event loop free to notice uv finishing and to spawn the rollout server meanwhile.
        await trio.to_thread.run_sync(_import_bridge_stack)
        try:
            handle = await nursery.start(run_bridge, config)
        except BridgeBindError as exc:
            raise LocalEvalError(str(exc)) from None
        self.log("INFO", "listener", "LLM bridge started", {"port": handle.port})
        services.bridge = handle

    async def _start_tunnel(self, nursery: trio.Nursery, port: int) -> Any:
        from tunnel.cloudflared import TunnelOptions, run_cloudflared_tunnel
        from tunnel.locate import locate_cloudflared

        p = self.p
        assert self.rd is not None
        explicit = Path(p.options.cloudflared) if p.options.cloudflared else None
        try:
            if p.options.download_cloudflared and explicit is None:
                binary = await trio.to_thread.run_sync(
                    partial(locate_cloudflared, None, allow_download=True)
                )
            else:
                binary = locate_cloudflared(explicit)
            options = TunnelOptions(
                binary=binary,
                local_port=port,
                run_dir=self.rd.path,
                log=lambda level, step, message, details=None: self.log(
                    level.upper(), step, message, dict(details) if details else None
                ),
                milestone=self.ui.stage,
                redact=p.redactor,
            )
            return await nursery.start(run_cloudflared_tunnel, options)
        except TunnelError as exc:
            raise LocalEvalError(str(exc)) from None

    async def _dispatch(
        self,
        rd: RunDirectory,
        pending: Sequence[Any],
        services: _Services,
        token: str,
        concurrency: int,
        nursery: trio.Nursery,
    ) -> None:
        p = self.p
        assert self.interrupts is not None and services.server is not None
        server = services.server
        bridge = services.bridge
        tunnel = services.tunnel
        decision = services.decision
        items = [WorkItem(p.rows_by_index[w.row_index], w.run_index) for w in pending]

        def chat_base() -> str:
            if tunnel is not None and tunnel.public_url:
                return str(tunnel.public_url)
            if decision is not None and decision.advertise_url:
                return decision.advertise_url
            return str(bridge.base_url)

        async def record(rec: TerminalRecord, has_sample: bool) -> None:
            await rd.record_result(rec, wait_for_trajectory=has_sample)
            self.ui.progress_update(_describe(rec))

        def usage(rollout_id: str) -> tuple[int | None, int | None]:
            found = bridge.ledger.pop(rollout_id)
            if found is None:
                return None, None
            return found.total_tokens, found.max_context_tokens

        def on_halt(reason: str) -> None:
            self.halted = reason
            self.ui.note(f"stopping dispatch: {reason}")

        deadline = p.spec.item_deadline_s
        async with RolloutClient(
            server.base_url, admission_timeout_sec=deadline * max(1, concurrency)
        ) as client:
            dispatcher = Dispatcher(
                items=items,
                concurrency=concurrency,
                transport=_Transport(client, lambda: server.child.returncode is None),
                chat_base=chat_base,
                bearer=token,
                agent_timeout_sec=p.spec.agent_timeout_sec,
                grader_timeout_sec=p.spec.grader_timeout_sec,
                item_deadline_s=deadline,
                record=record,
                usage=usage,
                forget=bridge.ledger.discard,
                interrupts=self.interrupts,
                log=self.log,
                on_halt=on_halt,
                explain=partial(self._explain, server),
                ready=tunnel.wait_available if tunnel is not None else None,
            )
            workers = max(1, min(concurrency, len(items)))
            self.stage(
                f"running {len(items)} work items, up to {workers} in flight", step="schedule"
            )
            watch_scopes = [trio.CancelScope(), trio.CancelScope()]
            nursery.start_soon(self._watch_server, server, dispatcher, watch_scopes[0])
            if tunnel is not None:
                nursery.start_soon(self._watch_tunnel, tunnel, dispatcher, watch_scopes[1])
            self.ui.open_progress(p.meta.total_work_items, rd.counters)
            try:
                self.report = await dispatcher.run()
            finally:
                for scope in watch_scopes:
                    scope.cancel()
                self.ui.close_progress()

    async def _explain(self, server: RolloutServer, exc: BaseException) -> str | None:
        """The server's exit as the cause of a transport failure (it may take a moment for the
        exit to be observable after its sockets closed)."""
        if not isinstance(exc, RolloutServerUnreachable):
            return None
        with trio.move_on_after(1.0):
            code = await server.child.process.wait()
            return f"the rollout server exited with code {code}; see logs.txt"
        return None

    async def _watch_server(
        self, server: RolloutServer, dispatcher: Dispatcher, scope: trio.CancelScope
    ) -> None:
        with scope:
            code = await server.child.process.wait()
            if not server.stopping:
                dispatcher.halt(
                    f"the rollout server exited with code {code}; see logs.txt", cancel_all=True
                )

    async def _watch_tunnel(
        self, tunnel: Any, dispatcher: Dispatcher, scope: trio.CancelScope
    ) -> None:
        with scope:
            reason = await tunnel.wait_failed()
            dispatcher.halt(reason, cancel_all=True)

    async def _shutdown(self, services: _Services) -> None:
        """Stop the rollout server, then the tunnel (the bridge stops with the nursery)."""
        assert self.interrupts is not None
        if services.server is not None:
            long = self.interrupts.interrupted or self.halted is not None
            grace = LONG_STOP_GRACE_S if long else STOP_GRACE_S
            await services.server.stop(grace, hurry=self.interrupts.hurry)
        if services.tunnel is not None:
            services.tunnel.stop()
            # The tunnel package itself logs when it cannot confirm the stop.
            with trio.move_on_after(10.0):
                await services.tunnel.wait_closed()

    # -- reporting -----------------------------------------------------------------------

    def _report(self, rd: RunDirectory, result: FinalizeResult) -> int:
        p = self.p
        assert self.interrupts is not None
        name = rd.name
        cancelled = self.interrupts.interrupted or self.halted is not None
        self._print_failed_rows(rd.path, result.failed_rows)
        self._results_table(
            name,
            rd.path,
            result.summary,
            title="Results (incomplete)" if cancelled else "Results",
            total=result.total_work_items,
            recorded=result.recorded,
            counts=(result.succeeded, result.failed, result.skipped),
            duration_ms=result.duration_ms,
        )
        steps: list[str] = []
        if not result.complete:
            steps.append("Resume: " + p.command("--name", shlex.quote(name)))
        if result.failed:
            steps.append(
                "Retry failures under the same name: "
                + p.command("--name", shlex.quote(name), "--retry-failed")
            )
        display = p.display(rd.path)
        message = (
            f"Evaluation run finished: {display}"
            if result.complete
            else f"Evaluation run interrupted: {display}"
        )
        self.ui.result(
            status="success" if result.complete else "partial",
            message=message,
            next_steps=steps,
            resource=self._resource(
                name,
                rd.path,
                result.summary,
                counts=(result.succeeded, result.failed, result.skipped),
                failed_rows=result.failed_rows,
                dispatched=self.report.dispatched,
                cancelled=cancelled,
                duration_ms=result.duration_ms,
                resumed=result.resumed,
                local_run_id=rd.manifest.local_run_id,
            ),
        )
        if self.interrupts.interrupted:
            return EXIT_INTERRUPTED
        return 0 if result.complete else 1

    def _print_failed_rows(self, run_dir: Path, records: Iterable[Any]) -> None:
        lines = []
        for r in sorted(records, key=lambda rec: (rec.row_index, rec.run_index)):
            source = (
                f" (source {r.source_row_index})"
                if r.source_row_index is not None and r.source_row_index != r.row_index
                else ""
            )
            where = self.p.display(run_dir / "rollout_trials" / r.rollout_id)
            kind = r.error_type or "unknown"
            lines.append(
                f"row {r.row_index}{source} run {r.run_index}: error_type={kind} -> {where}"
            )
        self.ui.failed_rows(lines)

    def _results_table(
        self,
        name: str,
        run_dir: Path,
        summary: dict[str, Any],
        *,
        title: str,
        total: int,
        recorded: int,
        counts: tuple[int, int, int],
        duration_ms: float,
    ) -> None:
        ok, failed, skipped = counts
        items = f"{recorded}/{total} complete · {ok} ok · {failed} failed"
        if skipped:
            items += f" · {skipped} skipped"
        rows = [
            ("Run", name),
            ("Work Items", items),
            (
                "Pass Rate",
                f"{float(summary.get('pass_rate', 0)):.1%} ({summary.get('passed', 0)}/"
                f"{summary.get('completed_samples', 0)} scored, threshold "
                f"{float(summary.get('pass_threshold', 1.0)):g})",
            ),
        ]
        stats = summary.get("reward_stats")
        if isinstance(stats, dict):
            rows.append(
                (
                    "Reward",
                    f"mean {stats['mean']:.3f} · median {stats['median']:.3f} · "
                    f"min {stats['min']:.3f} · max {stats['max']:.3f}",
                )
            )
        points = summary.get("pass_at_k")
        if isinstance(points, list) and points:
            rows.append(("pass@k", " · ".join(f"k={pt['k']} {pt['value']:.2f}" for pt in points)))
        rows.append(("Tokens Used", f"{int(summary.get('tokens_used', 0)):,}"))
        rows.append(("Duration", format_duration_ms(duration_ms)))
        rows.append(("Output", self.p.display(run_dir)))
        self.ui.results_table(title, rows)

    def _resource(
        self,
        name: str,
        run_dir: Path,
        summary: dict[str, Any],
        *,
        counts: tuple[int, int, int],
        failed_rows: Iterable[Any],
        dispatched: int,
        cancelled: bool,
        resumed: int,
        duration_ms: float = 0.0,
        local_run_id: str | None = None,
    ) -> dict[str, Any]:
        """The ``resource`` object of the JSON result envelope (§10.6)."""
        p = self.p
        if local_run_id is None:
            try:
                local_run_id = read_manifest(run_dir / "manifest.json").local_run_id
            except CLIError:
                local_run_id = None
        ok, failed, skipped = counts
        return {
            "run_name": name,
            "local_run_id": local_run_id,
            "output_path": str(run_dir),
            "dataset_source": p.dataset.source,
            "total_work_items": p.meta.total_work_items,
            "dispatched": dispatched,
            "succeeded": ok,
            "failed": failed,
            "skipped": skipped,
            "resumed": resumed,
            "cancelled": cancelled,
            "duration_ms": duration_ms,
            "metrics": summary,
            "failed_rows": [
                {
                    "row_index": r.row_index,
                    "source_row_index": r.source_row_index,
                    "run_index": r.run_index,
                    "rollout_id": r.rollout_id,
                    "error_type": r.error_type,
                    "rollout_dir": str(run_dir / "rollout_trials" / r.rollout_id),
                }
                for r in sorted(failed_rows, key=lambda rec: (rec.row_index, rec.run_index))
            ],
            "workspace_directory": str(p.workspace.root),
        }


def _import_bridge_stack() -> None:
    for module in ("hypercorn.trio.run", "bridge.app", "bridge.handler", "bridge.upstreams.direct"):
        importlib.import_module(module)


@dataclass
class _Restart:
    new_name: str


class _Declined(Exception):
    """The user answered No at the confirmation (exit 0, nothing ran)."""


def _counts(records: Any) -> tuple[int, int, int]:
    ok = failed = skipped = 0
    for r in records:
        if r.status == "success":
            ok += 1
        elif r.status == "failed":
            failed += 1
        else:
            skipped += 1
    return ok, failed, skipped


def _read_metrics(run_dir: Path) -> dict[str, Any]:
    try:
        doc = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    summary = _read_metrics(run_dir).get("summary")
    return summary if isinstance(summary, dict) else None


def _read_status(run_dir: Path) -> str | None:
    eval_run = _read_metrics(run_dir).get("eval_run")
    return eval_run.get("status") if isinstance(eval_run, dict) else None


def format_duration_ms(ms: float) -> str:
    """``12.3s`` / ``45s`` under a minute, else ``3m 11s``, ``2h 5m``, ``1d 3h``."""
    seconds = ms / 1000.0
    if seconds < 60:
        rounded = round(seconds, 1)
        return f"{int(rounded)}s" if rounded == int(rounded) else f"{rounded:.1f}s"
    total = int(seconds)
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m {secs}s" if secs else f"{minutes}m"


def _describe(rec: TerminalRecord) -> str:
    """One finished work item, for the line-per-item progress of a non-terminal."""
    text = f"row {rec.row_index} run {rec.run_index}: {rec.status}"
    if rec.reward is not None:
        text += f", reward {rec.reward:g}"
    if rec.error_type:
        text += f" ({rec.error_type})"
    return text
