"""Before the first dispatch: ask a probing rollout server how its sandboxes reach the bridge.

A rollout server whose ``/health`` carries ``chat_endpoint.probe`` (an in-sandbox agent; see
docs/harbor.md, section "Placement") runs the probe ladder from inside a sandbox when asked
(``POST /v1/rollbridge/probe-chat-endpoint``). This module asks it:

1. nonce = 32 random hex characters; ``expect`` = the bridge's answer to it
   (:meth:`bridge.server.BridgeService.probe_answer`), so "reached" means this run's bridge;
2. candidates: the loopback bridge, plus ``--advertise-url`` (then *exclusive*: only the user's
   URL is tried) or a tunnel already running (forced with ``--tunnel``: exclusive too);
3. no route, not exclusive, and no tunnel flag given: start the managed tunnel and probe again
   with it alone;
4. still none: :class:`~launcher.errors.LocalEvalError`, one line naming every candidate and
   its outcome, and nothing is dispatched.

Every attempt is one ``logs.txt`` line (step ``sandbox-probe``), every round's report goes to
``<run>/diagnostics.json`` under ``sandbox_probe``. Chat URLs handed to a probing server stay
loopback (:class:`launcher.dispatch_io.BridgeEndpoint`): the server maps them to the route
it found. :meth:`SandboxRouting.watch_tunnel` probes again whenever a tunnel that is the route
publishes a new URL.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from launcher.errors import LocalEvalError
from launcher.rundir.atomic import atomic_write_json
from launcher.rundir.logs import utc_now_iso
from rollout_server.client import RolloutClient, RolloutClientError
from rollout_server.protocol import HealthReport

if TYPE_CHECKING:
    from tunnel.cloudflared import TunnelHandle
    from tunnel.plan import TunnelDecision

__all__ = [
    "DIAGNOSTICS_KEY",
    "PROBE_TIMEOUT_S",
    "ProbeBridge",
    "SandboxRouting",
    "describe_failure",
    "route_sandbox",
]

#: The first probe may build the sandbox image (the bundle), hence the long bound.
PROBE_TIMEOUT_S = 900.0
DIAGNOSTICS_KEY = "sandbox_probe"
STEP = "sandbox-probe"
HINT = "see docs/harbor.md#placement"

LogFn = Callable[[str, str, str, "dict[str, Any] | None"], None]
StageFn = Callable[..., None]


class ProbeBridge(Protocol):
    """What the probe needs of the bridge (a :class:`bridge.server.BridgeService`)."""

    @property
    def base_url(self) -> str: ...

    @property
    def port(self) -> int: ...

    keepalive: bool

    def probe_answer(self, nonce: str) -> str: ...


def _seconds(attempt: dict[str, Any]) -> float:
    elapsed = attempt.get("elapsed_ms")
    return float(elapsed) / 1000.0 if isinstance(elapsed, int | float) else 0.0


def _one(attempt: dict[str, Any], *, with_url: bool = True) -> str:
    outcome = str(attempt.get("outcome", "error"))
    why = f"{attempt.get('detail')}; " if outcome in ("error", "wrong_server") else ""
    head = f"{attempt.get('kind')} {attempt.get('url')} " if with_url else ""
    return f"{head}{outcome} ({why}{_seconds(attempt):.1f} s)"


def describe_failure(
    attempts: Sequence[dict[str, Any]],
    *,
    advertise_url: str | None = None,
    bridge_port: int | None = None,
    tunnel_problem: str | None = None,
) -> str:
    """The one line that refuses dispatch: every candidate tried, its outcome, what to do."""
    if advertise_url is not None:
        tried = "; ".join(_one(a, with_url=False) for a in attempts) or "not tried"
        target = f"127.0.0.1:{bridge_port}" if bridge_port is not None else "the bridge port"
        return (
            f"--advertise-url {advertise_url} is not reachable from the sandbox: {tried} "
            f"— check that it forwards to {target} from where the sandbox runs, or drop "
            f"--advertise-url to let rollbridge find a way ({HINT})"
        )
    parts = [_one(a) for a in attempts]
    if tunnel_problem is not None:
        parts.append(f"tunnel not started: {tunnel_problem}")
    return (
        f"the sandbox cannot reach the bridge: {'; '.join(parts) or 'no candidate tried'} "
        f"— give --advertise-url <URL the sandbox can reach> or {HINT}"
    )


@dataclass
class SandboxRouting:
    """How the sandboxes reach the bridge, as the probing server found it."""

    server_url: str
    probe_path: str
    bridge: ProbeBridge
    route: dict[str, Any]
    tunnel: TunnelHandle | None
    log: LogFn
    run_dir: Path
    rounds: list[dict[str, Any]] = field(default_factory=list)
    server_token: str | None = None
    """The bearer the rollout server requires (launcher.rollout_child)."""

    @property
    def kind(self) -> str:
        """The chosen candidate's kind (``loopback``, ``slirp``, ``relay``, ``tunnel`` ...)."""
        return str(self.route.get("kind"))

    async def watch_tunnel(self, halt: Callable[[str], None]) -> None:
        """While the tunnel is the route: probe again after each restart (new URL); a new URL
        the sandbox cannot reach calls ``halt(one line)``. Runs until cancelled."""
        tunnel = self.tunnel
        if tunnel is None or self.kind != "tunnel":
            await trio.sleep_forever()
            return
        generation = tunnel.generation
        while True:
            url = await tunnel.wait_url_change(generation)
            generation = tunnel.generation
            try:
                report = await _probe_round(self, [_tunnel(url)], exclusive=True)
            except LocalEvalError as exc:
                halt(str(exc))
                return
            if report.get("route") is None:
                halt(describe_failure(_evidence(report)))
                return
            self.route = report["route"]


def _loopback(bridge: ProbeBridge) -> dict[str, str]:
    return {"kind": "loopback", "url": bridge.base_url}


def _tunnel(url: str) -> dict[str, str]:
    return {"kind": "tunnel", "url": url}


def _evidence(report: dict[str, Any]) -> list[dict[str, Any]]:
    evidence = report.get("evidence")
    return [a for a in evidence if isinstance(a, dict)] if isinstance(evidence, list) else []


async def _probe_round(
    routing: SandboxRouting, extra: list[dict[str, str]], *, exclusive: bool
) -> dict[str, Any]:
    """One ``POST`` of the probe; logs each attempt and records the round in diagnostics."""
    nonce = secrets.token_hex(16)
    candidates = [_loopback(routing.bridge), *extra]
    began = utc_now_iso()
    try:
        async with RolloutClient(routing.server_url, api_key=routing.server_token) as client:
            report = await client.probe_chat_endpoint(
                nonce=nonce,
                expect=routing.bridge.probe_answer(nonce),
                candidates=candidates,
                exclusive=exclusive,
                path=routing.probe_path,
                timeout_sec=PROBE_TIMEOUT_S,
            )
    except RolloutClientError as exc:
        raise LocalEvalError(f"the rollout server could not probe the sandbox: {exc}") from None
    if report is None:
        raise LocalEvalError(
            "the rollout server reports a sandbox probe in /health but answers 404 at "
            f"{routing.probe_path}"
        )
    for attempt in _evidence(report):
        level = "INFO" if attempt.get("outcome") == "reached" else "WARNING"
        routing.log(level, STEP, f"sandbox probe: {_one(attempt)}", attempt)
    routing.rounds.append(
        {"started_at": began, "candidates": candidates, "exclusive": exclusive, "report": report}
    )
    await _write_diagnostics(routing)
    return report


async def _write_diagnostics(routing: SandboxRouting) -> None:
    path = routing.run_dir / "diagnostics.json"

    def write() -> None:
        import json

        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        last = routing.rounds[-1]["report"] if routing.rounds else {}
        doc[DIAGNOSTICS_KEY] = {"route": last.get("route"), "rounds": routing.rounds}
        atomic_write_json(path, doc)

    await trio.to_thread.run_sync(write)


async def route_sandbox(
    *,
    server_url: str,
    server_token: str | None = None,
    health: HealthReport,
    bridge: ProbeBridge,
    decision: TunnelDecision,
    tunnel_allowed: bool,
    tunnel: TunnelHandle | None,
    start_tunnel: Callable[[], Awaitable[TunnelHandle]],
    stage: StageFn,
    log: LogFn,
    run_dir: Path,
) -> SandboxRouting | None:
    """Find the route (module docstring); None when the server does not probe.

    ``tunnel_allowed``: neither ``--tunnel`` nor ``--advertise-url`` was given, so a managed
    tunnel may be started when nothing else works. Raises :class:`LocalEvalError` (one line)
    when no candidate reaches the bridge.
    """
    probe_path = health.chat_probe
    if probe_path is None:
        return None
    stage("probing how the sandbox reaches the bridge", step=STEP)
    routing = SandboxRouting(
        server_url, probe_path, bridge, {}, tunnel, log, run_dir, server_token=server_token
    )
    advertise = decision.advertise_url if decision.mode == "advertise" else None
    if advertise is not None:
        first = await _probe_round(
            routing, [{"kind": "advertise", "url": advertise}], exclusive=True
        )
    elif tunnel is not None:
        url = await tunnel.wait_available()
        first = await _probe_round(routing, [_tunnel(url)], exclusive=True)
    else:
        first = await _probe_round(routing, [], exclusive=False)
    report, attempts = first, _evidence(first)
    tunnel_problem = None
    if report.get("route") is None and advertise is None and tunnel is None and tunnel_allowed:
        log("INFO", STEP, "no direct route to the bridge; starting the managed tunnel", None)
        try:
            routing.tunnel = await start_tunnel()
        except LocalEvalError as exc:
            tunnel_problem = str(exc)
        else:
            url = await routing.tunnel.wait_available()
            report = await _probe_round(routing, [_tunnel(url)], exclusive=True)
            attempts += _evidence(report)
    route = report.get("route")
    if not isinstance(route, dict):
        raise LocalEvalError(
            describe_failure(
                attempts,
                advertise_url=advertise,
                bridge_port=bridge.port,
                tunnel_problem=tunnel_problem,
            )
        )
    routing.route = route
    if routing.kind in ("tunnel", "advertise"):
        # A public URL: quick tunnels cut silent responses (docs/tunnel.md).
        bridge.keepalive = True
    stage(f"sandboxes reach the bridge through {routing.kind} {route.get('url')}", step=STEP)
    return routing
