"""The services one run needs, started and stopped in one place.

:func:`open_services` is an async context manager. On entry it resolves the run's secrets and
scopes them into the environment, then runs ``uv sync`` with the model preflight and the
bridge's start-up alongside, and starts the rollout server as soon as the sync is done, while
the preflight may still be waiting on a slow model: a rollout server provisions nothing (no
sandbox, no model call) before its first rollout, so starting it early costs nothing if the
model then fails, and saves the server's start-up time when it answers. Nothing is dispatched
before the preflight has passed; a failing preflight stops the run (the server, if it was
started, is stopped with the rest). Then it decides whether the bridge needs a public URL,
sizes the worker pool and starts the tunnel. It yields typed handles
(:class:`Services`), or ``None`` when a Ctrl-C arrived during start-up.

On exit, whatever happened, the stop order is: rollout server (after a run that finished, once
its ``/health`` counts no active rollouts, so a backend's background teardown is not cut short;
then its process group: 5 s grace, or 330 s after an interrupt or halt when it still answers
``/health``, unless a second Ctrl-C hurries it), tunnel, bridge, then the
environment is restored. Foreign errors (bridge, tunnel, preflight) become
:class:`LocalEvalError` with their one-line message here, so the supervisor sees only ours.

Why one module of this size: the start order and the stop order are one contract (what may
overlap with ``uv sync``, what must be stopped before what); kept together, a reader checks
both orders against each other in one place.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import trio

from launcher.daemon.live_usage import publish_live_usage
from launcher.dispatch import RolloutTransport, resolve_concurrency
from launcher.dispatch_io import BridgeEndpoint, RolloutClientTransport
from launcher.early_checks import early_checks
from launcher.errors import LocalEvalError
from launcher.fdbudget import (
    BRIDGE_PER_ROLLOUT,
    BRIDGE_PER_ROLLOUT_H2,
    DescriptorLimit,
    batched_wait_needed,
    choose_http2,
    fit_in_flight,
    per_rollout,
    raise_descriptor_limit,
)
from launcher.prepare import Prepared
from launcher.process import LONG_STOP_GRACE_S, STOP_GRACE_S, TunnelOwner
from launcher.resultwait import batched_wait_wanted
from launcher.rollout_child import (
    LogFn,
    RolloutServer,
    ServerLaunch,
    is_provider_env_name,
    start_rollout_server,
)
from launcher.rollout_env import find_uv, rollout_python, uv_sync
from launcher.rundir import RunDirectory
from launcher.sandbox_probe import SandboxRouting, route_sandbox
from launcher.secrets import (
    provider_values,
    read_secrets_file,
    resolve_secrets,
    scoped_environ,
)
from launcher.signals import Interrupts
from launcher.ui import CLI_VERSION, UI
from rollout_server.client import RolloutClientError
from tunnel.errors import TunnelError
from tunnel.plan import TunnelDecision, choose_tunnel

if TYPE_CHECKING:
    from bridge.apis import ApiOptions
    from bridge.server import BridgeService
    from tunnel.cloudflared import TunnelHandle

__all__ = [
    "RunContext",
    "Services",
    "cap_notice",
    "open_services",
]


@dataclass(frozen=True)
class RunContext:
    """What the services of one run are started for, and how they report."""

    prepared: Prepared
    run_dir: RunDirectory
    ui: UI
    interrupts: Interrupts
    log: LogFn
    stage: Callable[..., None]
    """``stage(message, step=..., details=...)``: a milestone, logged and shown."""
    long_stop: Callable[[], bool]
    """Whether the rollout server gets the long stop grace (after an interrupt or halt)."""

    def sink(self, step: str) -> Callable[[str], None]:
        """A sink that writes a child's output lines to ``logs.txt`` under ``step``."""

        def sink(line: str) -> None:
            self.log("INFO", step, line, None)

        return sink

    @property
    def logs_hint(self) -> str:
        """``logs.txt`` as the user should read its path."""
        return self.prepared.display(self.run_dir.logs_path)


@dataclass
class Services:
    """The running services of one run."""

    server: RolloutServer
    bridge: BridgeService
    tunnel: TunnelHandle | None
    decision: TunnelDecision
    concurrency: int
    endpoint: BridgeEndpoint
    routing: SandboxRouting | None = None
    transport: RolloutTransport | None = None
    """A transport in place of the local server's (``--ray``: :mod:`launcher.cluster`)."""
    watch_cluster: Callable[[Callable[[str], None]], Awaitable[None]] | None = None
    """Calls ``halt(reason)`` when too few replicas are left (``--ray``)."""
    grow_with: Callable[[Callable[[int], None]], None] | None = None
    """Registers ``grow(concurrency)``, called when joining replicas raise the run's
    concurrency (``--ray``)."""

    def rollout_transport(self) -> RolloutTransport:
        """The dispatch's transport: the server's own client (built during its start-up)."""
        if self.transport is not None:
            return self.transport
        return RolloutClientTransport(self.server.client, self.server)

    async def live_usage(self, run_dir: Path, in_flight: Callable[[], int]) -> None:
        """Keep ``<run>/usage_live.json`` (the bridge's usage of the rollouts in flight) current
        for the daemon, docs/daemon.md; runs until cancelled."""
        await publish_live_usage(run_dir, self.bridge.ledger.snapshot, in_flight)

    async def watch_faults(self, halt: Callable[[str], None]) -> None:
        """Call ``halt(reason)`` when the rollout server or the bridge's process exits on its
        own, or the tunnel fails for good (runs until cancelled)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_server, halt)
            nursery.start_soon(self._watch_bridge, halt)
            if self.tunnel is not None:
                nursery.start_soon(self._watch_tunnel, self.tunnel, halt)
            if self.routing is not None:
                nursery.start_soon(self.routing.watch_tunnel, halt)
            if self.watch_cluster is not None:
                nursery.start_soon(self.watch_cluster, halt)

    async def _watch_bridge(self, halt: Callable[[str], None]) -> None:
        halt(f"{await self.bridge.wait_failed()}; see logs.txt")

    async def _watch_server(self, halt: Callable[[str], None]) -> None:
        code = await self.server.child.process.wait()
        if not self.server.stopping:
            halt(f"the rollout server exited with code {code}; see logs.txt")

    @staticmethod
    async def _watch_tunnel(tunnel: TunnelHandle, halt: Callable[[str], None]) -> None:
        halt(await tunnel.wait_failed())


@dataclass
class _Started:
    server: RolloutServer | None = None
    bridge: BridgeService | None = None
    tunnel: TunnelHandle | None = None


@asynccontextmanager
async def open_services(ctx: RunContext) -> AsyncIterator[Services | None]:
    """Start the run's services (see the module docstring); stop them all on exit."""
    started = _Started()
    with ExitStack() as env_scope:
        async with trio.open_nursery() as nursery:
            try:
                services: Services | None = None
                with ctx.interrupts.work_scope():
                    services = await _start(ctx, nursery, started, env_scope)
                yield None if ctx.interrupts.interrupted else services
            finally:
                with trio.CancelScope(shield=True):
                    await _shutdown(ctx, started)
                nursery.cancel_scope.cancel()


async def _start(
    ctx: RunContext, nursery: trio.Nursery, started: _Started, env_scope: ExitStack
) -> Services:
    p = ctx.prepared
    # Before the children start: they inherit it (the CLI raised it already, before the
    # bridge's spare process; a daemon's run gets it here).
    descriptors = raise_descriptor_limit()
    asked = resolve_concurrency(p.options.max_in_flight, p.spec.batch_size, None)
    secrets, providers = await trio.to_thread.run_sync(
        partial(_resolve_secrets, ctx), abandon_on_cancel=True
    )
    # The bridge and the preflight read the environment; the rollout server's filters provider
    # names out of it, so only `secrets` (passed to it by name) reach the rollout.
    env_scope.enter_context(scoped_environ({**providers, **secrets}))
    p.redactor.add_known_env(os.environ)
    await early_checks(p)  # before the slow steps
    http2 = await _choose_http2(ctx, asked, descriptors)
    token = uuid.uuid4().hex
    p.redactor.add(token)
    # The model probe and the bridge's start-up overlap `uv sync` and the rollout server's
    # start-up (a server provisions nothing before its first rollout); a fatal probe cancels
    # whichever is still going, and nothing goes on past this block until the probe passed.
    async with trio.open_nursery() as startup:
        model_checked = trio.Event()
        startup.start_soon(_preflight, ctx, model_checked)
        startup.start_soon(_start_bridge, ctx, nursery, token, started, http2)
        wheelhouse = await _sync(ctx)
        started.server = await _start_server(ctx, nursery, secrets, wheelhouse)
        await model_checked.wait()
    server, bridge = started.server, started.bridge
    assert bridge is not None
    decision = choose_tunnel(
        p.tunnel_plan,
        requires_public_url=server.health.requires_public_url,
        environment=server.health.chat_environment,
    )
    if decision.environment is not None:
        ctx.stage(
            decision.milestone or "", step="tunnel", details={"environment": decision.environment}
        )
    bridge.keepalive = decision.keepalive
    capacity = await server.probe_capacity()
    concurrency = resolve_concurrency(p.options.max_in_flight, p.spec.batch_size, capacity)
    # With --ray the cap is the capacity of all replicas (launcher.cluster.run).
    capped = None if p.ray else cap_notice(p.options.max_in_flight, p.spec.batch_size, capacity)
    if capped is not None:
        ctx.log("WARNING", "dispatch", capped, None)
        ctx.ui.warning(capped, "CONCURRENCY_CAPPED")
    from bridge.spare import in_process_requested

    in_process = in_process_requested()
    bridge_count = BRIDGE_PER_ROLLOUT_H2 if http2 else BRIDGE_PER_ROLLOUT
    # One long-poll per rollout, unless that does not fit the open-file limit and the server's
    # batched wait (where it offers it) fits more (or the batched wait is asked for).
    needed = batched_wait_needed(
        concurrency, descriptors, bridge_in_process=in_process, bridge=bridge_count
    )
    server.batched_wait = batched_wait_wanted(server.health, needed=needed)
    if server.batched_wait and needed:
        ctx.log(
            "INFO",
            "dispatch",
            f"{concurrency} rollouts in flight: waiting for results through the rollout "
            f"server's batched wait (one long-poll per rollout would need more than the "
            f"open-file limit of {descriptors.soft})",
            {"open_file_limit": descriptors.soft},
        )
    needs = per_rollout(
        batched_wait=server.batched_wait, bridge_in_process=in_process, bridge=bridge_count
    )
    concurrency, fd_capped = fit_in_flight(concurrency, descriptors, needs=needs)
    if fd_capped is not None:
        ctx.log("WARNING", "dispatch", fd_capped, {"open_file_limit": descriptors.soft})
        ctx.ui.warning(fd_capped, "CONCURRENCY_CAPPED")
    if decision.mode == "managed":
        started.tunnel = await _start_tunnel(ctx, nursery, bridge.port)
    elif decision.mode == "advertise":
        ctx.stage(decision.milestone or "", step="tunnel")

    async def start_tunnel() -> TunnelHandle:  # the probe's fallback (launcher.sandbox_probe)
        started.tunnel = await _start_tunnel(ctx, nursery, bridge.port)
        return started.tunnel

    routing = await route_sandbox(
        server_url=server.base_url,
        server_token=server.token,
        health=server.health,
        bridge=bridge,
        decision=decision,
        tunnel_allowed=ctx.prepared.tunnel_plan.auto_detect,
        tunnel=started.tunnel,
        start_tunnel=start_tunnel,
        stage=ctx.stage,
        log=ctx.log,
        run_dir=ctx.run_dir.path,
    )
    endpoint = BridgeEndpoint(
        bridge, token, started.tunnel, decision.advertise_url, sandbox_routed=routing is not None
    )
    await bridge.settled()  # its keepalive mode is in force before the first dispatch
    return Services(server, bridge, started.tunnel, decision, concurrency, endpoint, routing)


def cap_notice(
    max_in_flight: int | None,
    batch_size: int | None,
    capacity: int | None,
    whose: str = "the rollout server's",
) -> str | None:
    """The line announcing that the asked concurrency is above ``whose`` capacity, if it is."""
    for flag, value in (("--max-in-flight", max_in_flight), ("evaluation.batch_size", batch_size)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            if capacity and value > capacity:
                return (
                    f"{flag} {value} is above {whose} capacity; "
                    f"running {capacity} rollouts at a time"
                )
            return None
    return None


def _resolve_secrets(ctx: RunContext) -> tuple[dict[str, str], dict[str, str]]:
    """``[secrets]`` for the rollout, and the secrets file's provider keys for the bridge."""
    p = ctx.prepared
    names = list(p.config.secrets_required)
    file_values = (
        read_secrets_file(p.options.secrets_file, cwd=p.cwd)
        if p.options.secrets_file is not None
        else None
    )
    values = (
        resolve_secrets(
            names, file_values=file_values, environ=os.environ, interactive=ctx.ui.interactive
        )
        if names
        else {}
    )
    providers = provider_values(file_values or {}, is_provider_env_name)
    for value in (*values.values(), *providers.values()):
        p.redactor.add(value)
    return values, providers


def _http2_applies(model: str, apis: ApiOptions | None) -> bool:
    """Whether every provider call of ``model`` goes over HTTP/2 with ``upstream_http2`` on:
    the direct path's, but for a Responses-only model's and the native Responses pass-through's
    (HTTP/1.1, docs/bridge.md); LiteLLM's and the echo model's never."""
    from bridge.apis.native import native_api
    from bridge.upstreams.responses_only import responses_only
    from bridge.upstreams.routing import path_kind

    if path_kind(model) != "direct" or responses_only(model):
        return False
    return not native_api(model, "responses", apis.responses if apis is not None else "auto")


async def _choose_http2(ctx: RunContext, asked: int | None, limit: DescriptorLimit) -> bool:
    """Whether the bridge calls the provider over HTTP/2 (:func:`choose_http2`), saying so
    when ``"auto"`` turned it on; ``"auto"`` only where every provider call goes over it, and
    never to an ``http://`` provider that does not speak h2c, asked here before descriptors are
    budgeted (the bridge would fall back to HTTP/1.1, two open files per call)."""
    from bridge.upstreams.direct import h2c_refused

    p = ctx.prepared
    model, mode = p.config.experiment.model_path, p.config.upstream_http2
    applies = mode == "auto" and _http2_applies(model, p.config.bridge)
    http2, notice = choose_http2(mode, asked, limit, applies=applies)
    if not http2:
        return False
    refused = await h2c_refused(model, connect_timeout=5.0)
    if refused is None:
        if notice is not None:
            ctx.log("INFO", "listener", notice, {"open_file_limit": limit.soft})
            ctx.ui.warning(notice, "UPSTREAM_HTTP2")
        return True
    message = (
        f"{refused} does not speak HTTP/2 without TLS (h2c): the bridge calls it over "
        "HTTP/1.1, one connection per call ([bridge] upstream_http2)"
    )
    ctx.log("WARNING", "listener", message, None)
    ctx.ui.warning(message, "UPSTREAM_HTTP2")
    return False


async def _preflight(ctx: RunContext, done: trio.Event) -> None:
    from bridge.errors import PreflightError
    from bridge.preflight import preflight

    model = ctx.prepared.config.experiment.model_path
    ctx.stage(f"checking model {model}", step="preflight")
    calls: list[dict[str, Any]] = []
    try:
        warning = await preflight(
            model,
            redact=ctx.prepared.redactor,
            on_retry=lambda message: ctx.log("WARNING", "preflight", message, None),
            on_call=calls.append,
        )
    except PreflightError as exc:
        raise LocalEvalError(str(exc)) from None
    finally:
        for call in calls:
            await ctx.run_dir.record_call(call)
    if warning:
        ctx.log("WARNING", "preflight", warning, None)
    else:
        ctx.log("INFO", "preflight", "model preflight passed", None)
    done.set()


async def _sync(ctx: RunContext) -> Path | None:
    """``uv sync`` of the rollout; returns the directory of rollbridge's own wheel, if any."""
    p = ctx.prepared
    rollout = p.config.experiment.rollout
    uv = find_uv(rollout)
    ctx.stage(f"syncing rollout dependencies ({rollout})", step="deps")
    no_wheel: list[str] = []
    wheelhouse = await _self_wheel(ctx, uv, no_wheel)
    await uv_sync(
        uv,
        p.paths.rollout_dir,
        rollout,
        env=os.environ,
        sink=ctx.sink("deps"),
        logs_hint=ctx.logs_hint,
        redact=p.redactor,
        find_links=wheelhouse,
        no_wheel=no_wheel[0] if no_wheel else None,
    )
    return wheelhouse


async def _self_wheel(ctx: RunContext, uv: Path, why_not: list[str]) -> Path | None:
    """This rollbridge's wheel's directory (launcher.selfwheel), or None with a warning (and
    its cause in ``why_not``, for the error of a sync that then fails)."""
    from launcher.selfwheel import SelfWheelError, self_wheel

    try:
        return await trio.to_thread.run_sync(self_wheel, uv)
    except SelfWheelError as exc:  # a rollout whose pyproject names a source needs none
        ctx.log("WARNING", "deps", str(exc), None)
        why_not.append(str(exc))
        return None


def _server_environ(p: Prepared) -> dict[str, str]:
    """The supervisor's environment for its rollout server; under ``--ray`` without Ray's
    variables (``RAY_ADDRESS``, ``RAY_AUTH_MODE``, ...), as the other nodes' replicas get theirs
    (:mod:`launcher.cluster.agent`), so a rollout sees the same environment on every node.
    (Secrets, the cluster's token among them, are kept from it either way:
    :mod:`launcher.rollout_child`.)"""
    if p.ray is None:
        return dict(os.environ)
    from launcher.cluster.flags import without_ray_vars

    return without_ray_vars(os.environ)


async def _start_server(
    ctx: RunContext, nursery: trio.Nursery, secrets: dict[str, str], wheelhouse: Path | None
) -> RolloutServer:
    p = ctx.prepared
    launch = ServerLaunch(
        python=rollout_python(p.paths.rollout_dir, os.environ),
        entrypoint=p.paths.entrypoint,
        rollout_dir=p.paths.rollout_dir,
        run_dir=ctx.run_dir.path,
        # The Harbor backend builds its sandbox bundle with uv (the rollout venv has none),
        # with this rollbridge's own wheel when there is one (bundle.WHEELHOUSE_ENV).
        base_env={"UV": str(find_uv(p.config.experiment.rollout)), **_server_environ(p)}
        | ({"ROLLBRIDGE_WHEELHOUSE": str(wheelhouse)} if wheelhouse else {}),
        config_env=p.config.env,
        secrets=secrets,
        fixed_port=p.options.rollout_port,
        logs_hint=ctx.logs_hint,
    )
    server = await start_rollout_server(
        nursery,
        launch,
        sink=ctx.sink("rollout-server"),
        log=ctx.log,
        stage=ctx.ui.stage,
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
        ctx.log(
            "WARNING",
            "server",
            message,
            {"cli_sdk_version": CLI_VERSION, "server_sdk_version": version},
        )
        if not ctx.ui.verbose:
            ctx.ui.warning(message, "ROLLOUT_SDK_VERSION_MISMATCH")
    return server


async def _start_bridge(
    ctx: RunContext, nursery: trio.Nursery, token: str, started: _Started, http2: bool
) -> None:
    """Start the bridge as a service of ``nursery`` (``http2``: calling the provider over
    HTTP/2, ``launcher.fdbudget.choose_http2``).

    Keepalive starts on when the flags already force a public URL; the health report may
    switch it on later (automatic tunnel)."""
    from bridge.errors import BridgeBindError, BridgeProcessError
    from bridge.process import run_bridge_process
    from bridge.server import BridgeConfig, run_bridge
    from bridge.spare import in_process_requested

    p = ctx.prepared

    def bridge_log(level: str, message: str) -> None:
        ctx.log(level.upper(), "listener", message, None)

    config = BridgeConfig(
        model=p.config.experiment.model_path,
        token=token,
        port=p.tunnel_plan.listener_port or 0,
        keepalive=not p.tunnel_plan.auto_detect,
        redact=p.redactor,
        log=bridge_log,
        keep_calls=True,  # the in-process bridge's records go to calls.jsonl with the results
        per_rollout_bearers=True,  # no rollout id can be made up (bridge.bearers)
        apis=p.config.bridge,
        upstream_http2=http2,
    )
    try:
        if in_process_requested():
            # The bridge's web stack takes ~0.3 s to import; doing it on a worker thread keeps
            # the event loop free to notice uv finishing and to spawn the rollout server.
            await trio.to_thread.run_sync(_import_bridge_stack)
            handle: BridgeService = await nursery.start(run_bridge, config)
        else:
            # Its own process: its HTTP work gets the second core instead of this one's GIL.
            handle = await nursery.start(
                partial(run_bridge_process, config, redact_values=p.redactor.patterns)
            )
    except (BridgeBindError, BridgeProcessError) as exc:
        raise LocalEvalError(str(exc)) from None
    ctx.log("INFO", "listener", "LLM bridge started", {"port": handle.port})
    started.bridge = handle


def _import_bridge_stack() -> None:
    from bridge.server import WEB_STACK

    for module in WEB_STACK:
        importlib.import_module(module)


async def _start_tunnel(ctx: RunContext, nursery: trio.Nursery, port: int) -> TunnelHandle:
    from tunnel.cloudflared import TunnelOptions, run_cloudflared_tunnel
    from tunnel.locate import locate_cloudflared

    p = ctx.prepared

    def tunnel_log(level: str, step: str, message: str, details: Any = None) -> None:
        ctx.log(level.upper(), step, message, dict(details) if details else None)

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
            owner=TunnelOwner(ctx.run_dir.path),
            log=tunnel_log,
            milestone=ctx.ui.stage,
            redact=p.redactor,
        )
        handle: TunnelHandle = await nursery.start(run_cloudflared_tunnel, options)
    except TunnelError as exc:
        raise LocalEvalError(str(exc)) from None
    return handle


#: How long a finished run lets its rollout server end the work it does after the last answer.
_SETTLE_S = 120.0


async def _settle(server: RolloutServer, hurry: trio.Event) -> None:
    """Return once the server's ``/health`` counts no active rollouts (a sandbox backend counts
    its teardowns of answered rollouts there), it does not answer, or ``hurry`` is set."""
    with trio.move_on_after(_SETTLE_S):
        while not hurry.is_set():
            try:
                health = await server.client.health()
            except (RolloutClientError, httpx.HTTPError):
                return
            if not health.active_rollouts:
                return
            await trio.sleep(0.1)


async def _answers(server: RolloutServer) -> bool:
    """Whether the server answers ``/health`` within 5 s."""
    with trio.move_on_after(5.0):
        try:
            await server.client.health()
        except (RolloutClientError, httpx.HTTPError):
            return False
        return True
    return False


async def _shutdown(ctx: RunContext, started: _Started) -> None:
    """Stop the rollout server, then the tunnel (the bridge stops with the nursery)."""
    if started.server is not None:
        grace = STOP_GRACE_S
        if ctx.long_stop():
            # The long grace lets a server drain its rollouts (sandbox teardowns): only one
            # that still answers can. A blocked or dead one would hold the run 330 s for nothing.
            grace = LONG_STOP_GRACE_S if await _answers(started.server) else STOP_GRACE_S
        elif not started.server.stopping:
            await _settle(started.server, ctx.interrupts.hurry)
        await started.server.stop(grace, hurry=ctx.interrupts.hurry)
    if started.tunnel is not None:
        started.tunnel.stop()
        # The tunnel package itself logs when it cannot confirm the stop.
        with trio.move_on_after(10.0):
            await started.tunnel.wait_closed()
