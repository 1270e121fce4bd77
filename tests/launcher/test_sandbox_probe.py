"""The supervisor's side of the sandbox probe (launcher/sandbox_probe.py), against a real
rollout server on port 0 whose backend plays the probe from a script."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from bridge.probe import ProbeKey
from launcher.dispatch_io import BridgeEndpoint
from launcher.errors import LocalEvalError
from launcher.sandbox_probe import SandboxRouting, route_sandbox
from rollout_server.backend import ExecutionBackend, ExecutionOutcome, ExecutionRequest
from rollout_server.harbor.probe import ladder
from rollout_server.harbor.route import Candidate, ProbeAttempt, ProbeReport, SandboxRoute
from rollout_server.probe_route import PROBE_ROUTE
from rollout_server.protocol import HealthReport
from rollout_server.server import RunningServer, serve_async
from tunnel.plan import TunnelDecision

BRIDGE_PORT = 4711
TUNNEL_URL = "https://amber-basin-cedar.trycloudflare.com"


class FakeBridge:
    """The part of a BridgeHandle the probe uses, with a real probe key."""

    def __init__(self) -> None:
        self.base_url = f"http://127.0.0.1:{BRIDGE_PORT}"
        self.port = BRIDGE_PORT
        self.keepalive = False
        self.key = ProbeKey()

    def probe_answer(self, nonce: str) -> str:
        return self.key.answer(nonce)

    def rollout_url(self, rollout_id: str, base: str | None = None) -> str:
        return f"{base or self.base_url}/v1/rollouts/{rollout_id}"


class ScriptedProbe(ExecutionBackend):
    """Plays the ladder of rollout_server.harbor.probe: each candidate's outcome comes from
    ``outcomes`` (kind -> outcome, "reached" needs the right ``expect``)."""

    def __init__(self, bridge: FakeBridge, outcomes: dict[str, str]) -> None:
        self.bridge = bridge
        self.outcomes = outcomes
        self.asked: list[dict[str, Any]] = []
        self.admitted = 0

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        self.admitted += 1
        raise AssertionError("nothing may be dispatched in these tests")

    def health(self) -> dict[str, Any]:
        endpoint = {"environment": "podman", "requires_public_url": False, "probe": PROBE_ROUTE}
        return {"status": "ok", "chat_endpoint": endpoint}

    async def probe_chat_endpoint(self, request: dict[str, Any]) -> dict[str, Any] | None:
        self.asked.append(request)
        proven = request["expect"] == self.bridge.probe_answer(request["nonce"])
        given = [Candidate(c["kind"], c["url"]) for c in request["candidates"]]
        tried = ladder(
            given, network="auto", bridge_port=BRIDGE_PORT, exclusive=request["exclusive"]
        )
        attempts: list[ProbeAttempt] = []
        route = None
        for candidate in tried:
            outcome: Any = self.outcomes.get(candidate.kind, "refused")
            if outcome == "reached" and not proven:
                outcome = "wrong_server"
            detail = "relay not available" if outcome == "error" else "x"
            attempts.append(ProbeAttempt(candidate, outcome, detail, 400.0))
            if outcome == "reached":
                route = SandboxRoute(candidate.kind, candidate.url)
                break
        return ProbeReport(tuple(attempts), route).to_json()


class FakeTunnel:
    def __init__(self, url: str = TUNNEL_URL) -> None:
        self.public_url = url
        self.generation = 1
        self.changed = trio.Event()

    async def wait_available(self) -> str:
        return self.public_url

    async def wait_url_change(self, generation: int) -> str:
        while self.generation <= generation:
            await self.changed.wait()
            self.changed = trio.Event()
        return self.public_url

    def restart(self, url: str) -> None:
        self.public_url = url
        self.generation += 1
        self.changed.set()


class Recorder:
    def __init__(self) -> None:
        self.logs: list[tuple[str, str, str]] = []
        self.stages: list[str] = []
        self.tunnels_started = 0

    def log(self, level: str, step: str, message: str, details: Any) -> None:
        self.logs.append((level, step, message))

    def stage(self, message: str, **_: Any) -> None:
        self.stages.append(message)


async def _server(nursery: trio.Nursery, backend: ExecutionBackend, tmp: Path) -> RunningServer:
    running: RunningServer = await nursery.start(
        lambda task_status: serve_async(
            backend, port=0, artifact_root=tmp / "trials", task_status=task_status
        )
    )
    return running


async def _route(
    running: RunningServer,
    backend: ExecutionBackend,
    bridge: FakeBridge,
    tmp: Path,
    rec: Recorder,
    *,
    decision: TunnelDecision | None = None,
    tunnel_allowed: bool = True,
    tunnel: Any = None,
    start_tunnel: Callable[[], Any] | None = None,
) -> SandboxRouting | None:
    async def default_start() -> Any:
        rec.tunnels_started += 1
        return FakeTunnel()

    return await route_sandbox(
        server_url=running.url,
        health=HealthReport.parse(backend.health()) or HealthReport(),
        bridge=bridge,
        decision=decision or TunnelDecision("none"),
        tunnel_allowed=tunnel_allowed,
        tunnel=tunnel,
        start_tunnel=start_tunnel or default_start,
        stage=rec.stage,
        log=rec.log,
        run_dir=tmp,
    )


async def test_route_found_on_the_ladder(nursery: trio.Nursery, tmp_path: Path) -> None:
    bridge, rec = FakeBridge(), Recorder()
    backend = ScriptedProbe(bridge, {"slirp": "reached"})
    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        routing = await _route(running, backend, bridge, tmp_path, rec)
    assert routing is not None and routing.kind == "slirp"
    assert routing.route["url"] == f"http://10.0.2.2:{BRIDGE_PORT}"
    assert rec.tunnels_started == 0 and not bridge.keepalive
    (asked,) = backend.asked
    assert asked["candidates"] == [{"kind": "loopback", "url": bridge.base_url}]
    assert asked["exclusive"] is False
    assert rec.stages[0] == "probing how the sandbox reaches the bridge"
    attempts = [m for _, step, m in rec.logs if step == "sandbox-probe"]
    assert attempts == [
        f"sandbox probe: loopback {bridge.base_url} refused (0.4 s)",
        f"sandbox probe: slirp http://10.0.2.2:{BRIDGE_PORT} reached (0.4 s)",
    ]
    diagnostics = json.loads((tmp_path / "diagnostics.json").read_text())["sandbox_probe"]
    assert diagnostics["route"]["kind"] == "slirp"
    assert [a["outcome"] for a in diagnostics["rounds"][0]["report"]["evidence"]] == [
        "refused",
        "reached",
    ]
    assert backend.admitted == 0


async def test_no_route_starts_the_tunnel_and_probes_it_alone(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    bridge, rec = FakeBridge(), Recorder()
    backend = ScriptedProbe(bridge, {"slirp": "timeout", "relay": "error", "tunnel": "reached"})
    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        routing = await _route(running, backend, bridge, tmp_path, rec)
    assert routing is not None and routing.kind == "tunnel"
    assert rec.tunnels_started == 1 and routing.tunnel is not None
    assert bridge.keepalive, "a public URL turns the bridge's keepalive on"
    second = backend.asked[1]
    assert second["exclusive"] is True
    assert second["candidates"][1] == {"kind": "tunnel", "url": TUNNEL_URL}
    rounds = json.loads((tmp_path / "diagnostics.json").read_text())["sandbox_probe"]["rounds"]
    assert len(rounds) == 2


async def test_no_route_is_one_line_naming_every_candidate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    bridge, rec = FakeBridge(), Recorder()
    backend = ScriptedProbe(bridge, {"slirp": "timeout", "relay": "error", "tunnel": "dns"})
    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        with pytest.raises(LocalEvalError) as info:
            await _route(running, backend, bridge, tmp_path, rec)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        f"the sandbox cannot reach the bridge: loopback {bridge.base_url} refused (0.4 s); "
        f"slirp http://10.0.2.2:{BRIDGE_PORT} timeout (0.4 s); "
        "relay http://127.0.0.1:13131 error (relay not available; 0.4 s); "
        f"tunnel {TUNNEL_URL} dns (0.4 s) — give --advertise-url <URL the sandbox can reach> "
        "or see docs/harbor.md#placement"
    )
    assert backend.admitted == 0
    assert json.loads((tmp_path / "diagnostics.json").read_text())["sandbox_probe"]["route"] is None


async def test_tunnel_not_allowed_or_not_startable(nursery: trio.Nursery, tmp_path: Path) -> None:
    bridge, rec = FakeBridge(), Recorder()
    backend = ScriptedProbe(bridge, {})

    async def broken() -> Any:
        raise LocalEvalError("the cloudflared binary is not on PATH")

    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        with pytest.raises(LocalEvalError) as refused:
            await _route(running, backend, bridge, tmp_path, rec, tunnel_allowed=False)
        with pytest.raises(LocalEvalError) as unstartable:
            await _route(running, backend, bridge, tmp_path, rec, start_tunnel=broken)
    assert rec.tunnels_started == 0
    assert "tunnel" not in str(refused.value).split(" — ")[0]
    assert "; tunnel not started: the cloudflared binary is not on PATH — " in str(
        unstartable.value
    )


async def test_advertise_url_is_exclusive(nursery: trio.Nursery, tmp_path: Path) -> None:
    bridge, rec = FakeBridge(), Recorder()
    url = "http://10.0.2.2:4711"
    backend = ScriptedProbe(bridge, {"loopback": "reached", "slirp": "reached"})
    decision = TunnelDecision("advertise", advertise_url=url)
    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        with pytest.raises(LocalEvalError) as info:
            await _route(running, backend, bridge, tmp_path, rec, decision=decision)
    assert str(info.value) == (
        f"--advertise-url {url} is not reachable from the sandbox: refused (0.4 s) — check that "
        f"it forwards to 127.0.0.1:{BRIDGE_PORT} from where the sandbox runs, or drop "
        "--advertise-url to let rollbridge find a way (see docs/harbor.md#placement)"
    )
    (asked,) = backend.asked
    assert asked["exclusive"] is True and asked["candidates"][1] == {
        "kind": "advertise",
        "url": url,
    }
    assert rec.tunnels_started == 0


async def test_reached_advertise_url(nursery: trio.Nursery, tmp_path: Path) -> None:
    bridge, rec = FakeBridge(), Recorder()
    backend = ScriptedProbe(bridge, {"advertise": "reached"})
    decision = TunnelDecision("advertise", advertise_url="https://proxy.example/llm")
    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        routing = await _route(running, backend, bridge, tmp_path, rec, decision=decision)
    assert routing is not None and routing.kind == "advertise" and bridge.keepalive


async def test_a_server_without_probe_is_left_alone(nursery: trio.Nursery, tmp_path: Path) -> None:
    bridge, rec = FakeBridge(), Recorder()
    backend = ScriptedProbe(bridge, {})
    backend.health = lambda: {"status": "ok"}  # type: ignore[method-assign]
    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        assert await _route(running, backend, bridge, tmp_path, rec) is None
    assert backend.asked == [] and rec.stages == []
    assert not (tmp_path / "diagnostics.json").exists()


async def test_tunnel_restart_probes_again(nursery: trio.Nursery, tmp_path: Path) -> None:
    bridge, rec = FakeBridge(), Recorder()
    backend = ScriptedProbe(bridge, {"tunnel": "reached"})
    tunnel = FakeTunnel()
    halted: list[str] = []
    with trio.fail_after(30):
        running = await _server(nursery, backend, tmp_path)
        routing = await _route(
            running,
            backend,
            bridge,
            tmp_path,
            rec,
            decision=TunnelDecision("managed"),
            tunnel=tunnel,
        )
        assert routing is not None and routing.kind == "tunnel"
        assert backend.asked[0]["exclusive"] is True
        async with trio.open_nursery() as watching:
            watching.start_soon(routing.watch_tunnel, halted.append)
            await trio.testing.wait_all_tasks_blocked()
            tunnel.restart("https://delta-fjord-grove.trycloudflare.com")
            while len(backend.asked) < 2:
                await trio.sleep(0.01)
            await trio.sleep(0.1)
            assert routing.route["url"] == "https://delta-fjord-grove.trycloudflare.com"
            backend.outcomes["tunnel"] = "dns"
            tunnel.restart("https://gone-gone-gone.trycloudflare.com")
            while not halted:
                await trio.sleep(0.01)
    assert halted == [
        "the sandbox cannot reach the bridge: tunnel https://gone-gone-gone.trycloudflare.com "
        "dns (0.4 s) — give --advertise-url <URL the sandbox can reach> or see "
        "docs/harbor.md#placement"
    ]


def test_chat_urls_stay_loopback_for_a_probing_server() -> None:
    bridge = FakeBridge()
    tunnel: Any = FakeTunnel()
    plain = BridgeEndpoint(bridge, "b", tunnel, None)  # type: ignore[arg-type]
    routed = BridgeEndpoint(bridge, "b", tunnel, None, sandbox_routed=True)  # type: ignore[arg-type]
    assert plain.chat_url("r1") == f"{TUNNEL_URL}/v1/rollouts/r1"
    assert routed.chat_url("r1") == f"{bridge.base_url}/v1/rollouts/r1"
