"""Asking a sandbox how it reaches the bridge: the probe ladder of contract 5.

:func:`decide_route` tries each candidate base URL from *inside* a throwaway container of the
task's image and placement (``podman run --rm --network <mode>``), stops at the first one
whose answer proves this run's bridge (the body holds ``expect``, the bridge's HMAC of the
nonce), and returns the evidence as a :class:`~.route.ProbeReport`.

The program run in the sandbox (:data:`PROBE_SOURCE`) is stdlib Python, so it runs on any
``python3`` >= 3.8; when the image has no ``python3`` a ``curl`` invocation stands in. It prints
one JSON line: the transport's outcome (``dns``, ``refused``, ``timeout``, ``unreachable``,
``error``, or ``http`` with the status and the first bytes of the body); :func:`classify` turns
an ``http`` answer into ``reached`` or ``wrong_server`` on the host.

The automatic ladder (``exclusive=False``) is :func:`ladder`: the loopback candidate, the slirp
alias (``10.0.2.2`` under ``slirp4netns:allow_host_loopback=true``; not with ``network="none"``),
the supervisor's other candidates in their order with the exec relay inserted before the first
tunnel (or last). ``exclusive=True`` (the user's ``--advertise-url``, or a tunnel the user
forced) tries only the supervisor's non-loopback candidates.

Every container carries the owner label (:data:`.containers.OWNER_LABEL`), so the start-up
reaper removes one left by a ``kill -9``, and :data:`PROBE_LABEL`; a cancelled attempt removes
its container in a shielded clean-up.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import trio

from . import containers
from .containers import OWNER_LABEL
from .route import (
    RELAY_PORT,
    SLIRP_HOST,
    SLIRP_NETWORK_MODE,
    Candidate,
    ProbeAttempt,
    ProbeOutcome,
    ProbeReport,
    SandboxRoute,
)

__all__ = [
    "AGENT_PATH",
    "PROBE_LABEL",
    "PROBE_PATH",
    "PROBE_SOURCE",
    "classify",
    "decide_route",
    "ladder",
    "parse_probe_output",
    "relay_module_path",
]

#: The bridge's probe route; the nonce is appended as one path segment.
PROBE_PATH = "/v1/rollbridge/probe/"
PROBE_LABEL = "io.rollbridge.harbor.probe"
RELAY_SCRIPT = "rollbridge_relay.py"
#: The harness agent and the relay (stdlib + Harbor only); on the Harbor child's PYTHONPATH.
AGENT_PATH = Path(__file__).with_name("agent_path")

#: Bound on one ``podman run`` of the probe (container start included).
_ATTEMPT_BOUND_S = 60.0
_RELAY_READY_S = 20.0

# Runs in the sandbox as ``python3 -c PROBE_SOURCE <url>``: stdlib only, Python >= 3.8. The
# request runs on a daemon thread so a name lookup that hangs is bounded too.
PROBE_SOURCE = r"""
import errno, json, os, socket, sys, threading, time
from urllib.parse import urlsplit
import http.client
CONNECT, TOTAL = 3.0, 5.0
url = sys.argv[1]
t0 = time.monotonic()
state = {"phase": "lookup", "out": None}
def done(outcome, detail, status=None, body=None):
    state["out"] = {"outcome": outcome, "detail": detail, "status": status, "body": body,
                    "elapsed": round(time.monotonic() - t0, 3)}
def run():
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        state["phase"] = "connect"
        if tls:
            import ssl
            conn = http.client.HTTPSConnection(host, port, timeout=CONNECT,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=CONNECT)
        conn.connect()
        state["phase"] = "answer"
        conn.sock.settimeout(max(0.1, TOTAL - (time.monotonic() - t0)))
        path = parts.path or "/"
        conn.request("GET", path, headers={"Connection": "close", "Accept": "application/json"})
        resp = conn.getresponse()
        body = resp.read(2048).decode("utf-8", "replace")
        done("http", "HTTP %d" % resp.status, resp.status, body)
    except socket.gaierror as exc:
        done("dns", "name lookup failed: %s" % exc)
    except ConnectionRefusedError as exc:
        done("refused", str(exc))
    except socket.timeout:
        done("timeout", "%s timed out" % state["phase"])
    except OSError as exc:
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            done("unreachable", str(exc))
        else:
            done("error", "%s: %s" % (type(exc).__name__, exc))
    except Exception as exc:
        done("error", "%s: %s" % (type(exc).__name__, exc))
worker = threading.Thread(target=run, daemon=True)
worker.start()
worker.join(TOTAL + 0.5)
if state["out"] is None:
    if state["phase"] == "lookup":
        done("dns", "name lookup did not finish within %.0f s" % TOTAL)
    else:
        done("timeout", "no answer within %.0f s (%s)" % (TOTAL, state["phase"]))
sys.stdout.write(json.dumps(state["out"]) + "\n")
sys.stdout.flush()
os._exit(0)
"""

# ``sh -c _LAUNCH sh <python source> <url>``: python3 when the image has it, else curl.
_LAUNCH = (
    'if command -v python3 >/dev/null 2>&1; then exec python3 -c "$1" "$2"; fi\n'
    "if command -v curl >/dev/null 2>&1; then\n"
    "  code=$(curl -sS -o /tmp/.rb-probe -w '%{http_code}' --connect-timeout 3 --max-time 5 "
    '"$2" 2>/tmp/.rb-probe-err); rc=$?\n'
    "  printf 'curl %s %s %s\\n' \"$rc\" \"$code\" \"$(head -c 300 /tmp/.rb-probe-err | tr '\\n' ' ')\"\n"
    "  head -c 2048 /tmp/.rb-probe 2>/dev/null\n"
    "  exit 0\n"
    "fi\n"
    "echo 'noprobe'\n"
)

_CURL_OUTCOMES: dict[int, ProbeOutcome] = {6: "dns", 7: "refused", 28: "timeout"}


def _probe_argv(url: str) -> list[str]:
    return ["sh", "-c", _LAUNCH, "sh", PROBE_SOURCE, url]


def parse_probe_output(stdout: str) -> dict[str, Any]:
    """The probe's answer from its stdout: ``{outcome, detail, status, body, elapsed}``.

    Reads the JSON line of :data:`PROBE_SOURCE` or the ``curl <rc> <code> <stderr>`` line of
    the fallback; anything else is ``error``.
    """
    lines = stdout.strip().splitlines()
    for index, line in enumerate(lines):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("outcome"), str):
                return doc
        if line.startswith("curl "):
            fields = line.split(" ", 3)
            rc = int(fields[1]) if fields[1:2] and fields[1].isdigit() else -1
            detail = fields[3].strip() if len(fields) > 3 else ""
            if rc == 0:
                status = int(fields[2]) if fields[2:3] and fields[2].isdigit() else None
                body = "\n".join(lines[index + 1 :])
                return {
                    "outcome": "http",
                    "detail": f"HTTP {status}",
                    "status": status,
                    "body": body,
                }
            if rc == 7 and "no route" in detail.lower():
                return {"outcome": "unreachable", "detail": detail}
            return {
                "outcome": _CURL_OUTCOMES.get(rc, "error"),
                "detail": detail or f"curl exit {rc}",
            }
        if line == "noprobe":
            return {"outcome": "error", "detail": "the sandbox has neither python3 nor curl"}
    tail = stdout.strip()[-200:]
    return {
        "outcome": "error",
        "detail": f"the probe printed no answer{': ' + tail if tail else ''}",
    }


def classify(answer: dict[str, Any], expect: str | None) -> tuple[ProbeOutcome, str]:
    """The outcome and detail of one probe answer (:func:`parse_probe_output`).

    An HTTP answer is ``reached`` only when its body is ``{"rollbridge_probe": expect}``; with
    ``expect`` None any HTTP answer from the probe path counts (detail ``unverified``).
    """
    outcome = answer.get("outcome")
    detail = str(answer.get("detail") or "")
    if outcome != "http":
        known = ("dns", "refused", "timeout", "unreachable", "error")
        return (outcome if outcome in known else "error"), detail
    status = answer.get("status")
    if expect is None:
        return "reached", f"unverified (HTTP {status})"
    try:
        body = json.loads(answer.get("body") or "")
    except ValueError:
        body = None
    if status == 200 and isinstance(body, dict) and body.get("rollbridge_probe") == expect:
        return "reached", "HTTP 200, nonce answered"
    return "wrong_server", f"HTTP {status} without this run's probe answer"


def ladder(
    candidates: Sequence[Candidate], *, network: str, bridge_port: int, exclusive: bool
) -> list[Candidate]:
    """The candidates to try, in order (module docstring)."""
    if exclusive:
        chosen = [c for c in candidates if c.kind != "loopback"]
        return chosen or list(candidates)
    loopback = [c for c in candidates if c.kind == "loopback"]
    others = [c for c in candidates if c.kind not in ("loopback", "slirp", "relay")]
    order = list(loopback)
    if network != "none":
        order.append(Candidate("slirp", f"http://{SLIRP_HOST}:{bridge_port}"))
    relay = Candidate("relay", f"http://127.0.0.1:{RELAY_PORT}")
    tunnels = [i for i, c in enumerate(others) if c.kind == "tunnel"]
    at = tunnels[0] if tunnels else len(others)
    return order + others[:at] + [relay] + others[at:]


def _network_mode(network: str) -> str:
    return "bridge" if network == "auto" else network


def _route(candidate: Candidate, bridge_port: int) -> SandboxRoute:
    if candidate.kind == "slirp":
        return SandboxRoute("slirp", candidate.url, network_mode=SLIRP_NETWORK_MODE)
    if candidate.kind == "relay":
        return SandboxRoute("relay", candidate.url, relay_target=("127.0.0.1", bridge_port))
    return SandboxRoute(candidate.kind, candidate.url)


def relay_module_path() -> Path:
    """Where the exec relay (contract 4) lives: ``agent_path/rollbridge_relay.py``."""
    return AGENT_PATH / RELAY_SCRIPT


def _load_relay() -> ModuleType | None:
    path = relay_module_path()
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("rollbridge_relay", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Prober:
    """One :func:`decide_route` call's settings, and the container runs it makes."""

    def __init__(self, engine: str, image: str, network: str, bridge_port: int, owner: str) -> None:
        self.engine = engine
        self.image = image
        self.network = network
        self.bridge_port = bridge_port
        self.owner = owner
        self.tag = secrets.token_hex(4)
        self.serial = 0

    def _name(self) -> str:
        self.serial += 1
        return f"rollbridge-probe-{self.tag}-{self.serial}"

    def _labels(self) -> list[str]:
        return ["--label", f"{OWNER_LABEL}={self.owner}", "--label", f"{PROBE_LABEL}=1"]

    async def _remove(self, name: str) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await containers.remove(self.engine, [name])

    async def run_probe(self, candidate: Candidate, nonce: str) -> dict[str, Any]:
        """Probe ``candidate`` from a fresh container; the parsed answer."""
        if candidate.kind == "relay":
            return await self._relay_probe(candidate, nonce)
        mode = SLIRP_NETWORK_MODE if candidate.kind == "slirp" else _network_mode(self.network)
        name = self._name()
        argv = [self.engine, "run", "--rm", "--name", name, "--network", mode, *self._labels()]
        argv += [self.image, *_probe_argv(_probe_url(candidate, nonce))]
        finished = False
        try:
            with trio.move_on_after(_ATTEMPT_BOUND_S):
                done = await trio.run_process(
                    argv, capture_stdout=True, capture_stderr=True, check=False
                )
                finished = True
                answer = parse_probe_output(done.stdout.decode("utf-8", "replace"))
                if answer["outcome"] == "error" and done.returncode != 0:
                    err = done.stderr.decode("utf-8", "replace").strip().splitlines()
                    reason = err[-1][:300] if err else f"exit {done.returncode}"
                    answer = {"outcome": "error", "detail": f"{self.engine} run failed: {reason}"}
                return answer
            return {
                "outcome": "error",
                "detail": f"the probe container did not finish within {_ATTEMPT_BOUND_S:.0f} s",
            }
        finally:
            if not finished:
                await self._remove(name)

    async def _relay_probe(self, candidate: Candidate, nonce: str) -> dict[str, Any]:
        relay = _load_relay()
        if relay is None:
            return {"outcome": "error", "detail": "relay not available"}
        name = self._name()
        mode = _network_mode(self.network)
        start = [self.engine, "run", "-d", "--rm", "--name", name, "--network", mode]
        start += [*self._labels(), self.image, "sleep", "120"]
        try:
            with trio.move_on_after(_ATTEMPT_BOUND_S):
                started = await trio.run_process(
                    start, capture_stdout=True, capture_stderr=True, check=False
                )
                if started.returncode != 0:
                    err = started.stderr.decode("utf-8", "replace").strip()[-300:]
                    return {"outcome": "error", "detail": f"{self.engine} run failed: {err}"}
                return await self._through_relay(relay, name, candidate, nonce)
            return {"outcome": "error", "detail": "the relay probe did not finish in time"}
        finally:
            await self._remove(name)

    async def _through_relay(
        self, relay: ModuleType, name: str, candidate: Candidate, nonce: str
    ) -> dict[str, Any]:
        exec_argv = relay.exec_argv(self.engine, name, RELAY_PORT)
        host = [sys.executable, str(relay_module_path()), "host"]
        host += ["--target", f"127.0.0.1:{self.bridge_port}", "--", *exec_argv]
        process = await trio.lowlevel.open_process(
            host, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            ready = False
            with trio.move_on_after(_RELAY_READY_S):
                ready = await _wait_ready(process)
            if not ready:
                return {"outcome": "error", "detail": "the relay did not report READY"}
            probe = [self.engine, "exec", name, *_probe_argv(_probe_url(candidate, nonce))]
            done = await trio.run_process(
                probe, capture_stdout=True, capture_stderr=True, check=False
            )
            return parse_probe_output(done.stdout.decode("utf-8", "replace"))
        finally:
            with trio.CancelScope(shield=True):
                await _stop(process)


async def _wait_ready(process: trio.Process) -> bool:
    assert process.stdout is not None
    buffered = b""
    while True:
        chunk = await process.stdout.receive_some(4096)
        if not chunk:
            return False
        buffered += chunk
        lines = buffered.split(b"\n")
        if any(line.strip().split(b" ")[0] == b"READY" for line in lines[:-1]):
            return True
        buffered = lines[-1]


async def _stop(process: trio.Process) -> None:
    if process.stdin is not None:
        await process.stdin.aclose()
    with trio.move_on_after(5):
        await process.wait()
        return
    process.terminate()
    with trio.move_on_after(3):
        await process.wait()
        return
    process.kill()
    await process.wait()


def _probe_url(candidate: Candidate, nonce: str) -> str:
    return candidate.url.rstrip("/") + PROBE_PATH + nonce


async def decide_route(
    *,
    engine: str,
    image: str,
    network: str,
    bridge_port: int,
    candidates: Sequence[Candidate],
    exclusive: bool,
    nonce: str,
    expect: str | None,
    owner: str,
    log: Callable[[str], None] | None = None,
) -> ProbeReport:
    """Try the candidates from inside sandboxes of ``image`` and pick the first that reaches
    this run's bridge (module docstring). ``network`` is ``"auto"`` (the engine's default
    bridge network) or ``"none"``; ``owner`` is the rollout server's owner token."""
    prober = _Prober(engine, image, network, bridge_port, owner)
    attempts: list[ProbeAttempt] = []
    route: SandboxRoute | None = None
    for candidate in ladder(
        candidates, network=network, bridge_port=bridge_port, exclusive=exclusive
    ):
        began = time.monotonic()
        answer = await prober.run_probe(candidate, nonce)
        wall = time.monotonic() - began
        outcome, detail = classify(answer, expect)
        inside = answer.get("elapsed")
        seconds = float(inside) if isinstance(inside, int | float) else wall
        attempt = ProbeAttempt(candidate, outcome, detail, seconds * 1000.0)
        attempts.append(attempt)
        if log is not None:
            log(
                f"sandbox probe {candidate.kind} {candidate.url}: {outcome} in {seconds:.1f} s "
                f"({detail}; attempt {wall:.1f} s with the container)"
            )
        if outcome == "reached":
            route = _route(candidate, bridge_port)
            break
    placement = {"engine": engine, "image": image, "network": network, "exclusive": exclusive}
    return ProbeReport(tuple(attempts), route, placement)
