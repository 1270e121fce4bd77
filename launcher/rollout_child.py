"""Start the rollout server: spawn the environment's own interpreter on the entrypoint, record
``server.json`` at once, wait for ``/health`` with the instance-id handshake, read the capacity.

The server runs as ``rollouts/<r>/.venv/bin/python <entrypoint>`` in its own session, never
through ``uv run`` (hazard 3), with the environment of runner.md §2.5. An ephemeral port gets
one retry on a new port when the first attempt fails its health check (the pick-free-port
probe can race with another program); a fixed ``--rollout-port`` gets one attempt.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from launcher.errors import LocalEvalError
from launcher.process import (
    STOP_GRACE_S,
    Child,
    OutputSink,
    child_environment,
    owner_record,
    spawn_child,
    write_record,
)
from rollout_server.protocol import (
    ENV_ARTIFACT_ROOT,
    ENV_INSTANCE_ID,
    ENV_PORT,
    INSTANCE_ID_HEADER,
    SDK_VERSION_HEADER,
)

__all__ = [
    "HEALTH_DEADLINE_S",
    "LogFn",
    "RolloutServer",
    "ServerLaunch",
    "health_capacity",
    "rollout_python",
    "start_rollout_server",
]

HEALTH_DEADLINE_S = 90.0
# Faster than the reference's 0.2 s: the wait is on the critical path of every start.
HEALTH_POLL_S = 0.05
HEALTH_REQUEST_TIMEOUT_S = 5.0
OUTPUT_DRAIN_S = 0.5
SUPERVISOR_OWNED = (ENV_PORT, ENV_ARTIFACT_ROOT, ENV_INSTANCE_ID)

#: ``log(level, step, message, details)``: a logs.txt line (redacted by the log).
LogFn = Callable[[str, str, str, "dict[str, Any] | None"], None]


def rollout_python(rollout_dir: Path, env: Mapping[str, str]) -> Path:
    """The interpreter of the rollout's uv environment: ``rollouts/<r>/.venv`` unless
    ``UV_PROJECT_ENVIRONMENT`` moves it (uv sync honours that variable, so we must too)."""
    venv = rollout_dir / ".venv"
    moved = env.get("UV_PROJECT_ENVIRONMENT")
    if moved:
        venv = Path(moved) if os.path.isabs(moved) else rollout_dir / moved
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def health_capacity(health: Mapping[str, Any] | None) -> int | None:
    """The server's concurrency cap: ``max_queue_depth`` (top level), else
    ``concurrency.max_concurrent``; only a positive int that is not a bool counts."""
    if not isinstance(health, Mapping):
        return None
    candidates = [health.get("max_queue_depth")]
    concurrency = health.get("concurrency")
    if isinstance(concurrency, Mapping):
        candidates.append(concurrency.get("max_concurrent"))
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerLaunch:
    """Everything needed to start the rollout server for one run."""

    python: Path
    entrypoint: Path
    rollout_dir: Path
    run_dir: Path
    base_env: Mapping[str, str]
    config_env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    fixed_port: int | None = None
    logs_hint: str = "logs.txt"


@dataclass
class RolloutServer:
    """A running rollout server owned by this run."""

    child: Child
    port: int
    instance_id: str
    health: dict[str, Any]
    record_path: Path
    sdk_version: str | None = None
    """The ``x-osmosis-rollout-sdk-version`` the server reported on ``/health``, if any."""
    stopping: bool = False

    @property
    def base_url(self) -> str:
        """Where the supervisor talks to the server (always loopback)."""
        return f"http://127.0.0.1:{self.port}"

    async def stop(self, grace: float = STOP_GRACE_S, hurry: trio.Event | None = None) -> bool:
        """Stop the server's process group and remove ``server.json`` (whatever happens)."""
        self.stopping = True
        try:
            return await self.child.stop(grace, hurry)
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.record_path.unlink()

    async def probe_capacity(self, client: httpx.AsyncClient) -> int | None:
        """A second ``/health`` probe after start-up, read only for the capacity (a failed
        probe counts as no cap)."""
        try:
            response = await client.get(f"{self.base_url}/health", timeout=HEALTH_REQUEST_TIMEOUT_S)
            body = response.json() if response.status_code < 400 else {}
        except (httpx.HTTPError, ValueError):
            body = {}
        return health_capacity(body if isinstance(body, dict) else {})


class _StartupFailure(LocalEvalError):
    """A failed start-up attempt (may be retried on a new port)."""


def _child_env(launch: ServerLaunch, port: int, instance_id: str) -> dict[str, str]:
    clash = sorted(set(SUPERVISOR_OWNED) & (set(launch.config_env) | set(launch.secrets)))
    if clash:
        raise LocalEvalError(
            f"[env]/[secrets] must not set supervisor-owned variables: {', '.join(clash)}"
        )
    return child_environment(
        launch.base_env,
        launch.config_env,
        launch.secrets,
        {
            ENV_PORT: str(port),
            ENV_ARTIFACT_ROOT: str(launch.run_dir / "rollout_trials"),
            ENV_INSTANCE_ID: instance_id,
            "PYTHONUNBUFFERED": "1",
        },
    )


async def _wait_healthy(
    child: Child,
    client: httpx.AsyncClient,
    base_url: str,
    instance_id: str,
    launch: ServerLaunch,
    redact: Callable[[str], str],
) -> tuple[dict[str, Any], str | None]:
    with trio.move_on_after(HEALTH_DEADLINE_S):
        while True:
            if child.returncode is not None:
                assert child.output_done is not None
                with trio.move_on_after(OUTPUT_DRAIN_S):
                    await child.output_done.wait()
                tail = f": {redact(child.last_line)}" if child.last_line else ""
                raise _StartupFailure(
                    f"rollout server exited with code {child.returncode} before becoming "
                    f"healthy{tail}\nLogs: {launch.logs_hint}"
                )
            try:
                response = await client.get(f"{base_url}/health", timeout=HEALTH_REQUEST_TIMEOUT_S)
            except httpx.HTTPError:
                response = None
            body: Any = None
            if response is not None and response.status_code < 400:
                with contextlib.suppress(ValueError):
                    body = response.json()
            if isinstance(body, dict) and response is not None:
                reported = response.headers.get(INSTANCE_ID_HEADER) or body.get("instance_id")
                if reported != instance_id:
                    raise _StartupFailure(
                        f"another process is already listening on {base_url} and its /health "
                        f"reports instance_id={reported!r} instead of this run's; stop it, or "
                        "choose a different --rollout-port"
                    )
                return body, response.headers.get(SDK_VERSION_HEADER)
            await trio.sleep(HEALTH_POLL_S)
    raise _StartupFailure(
        f"rollout server did not become healthy within {HEALTH_DEADLINE_S:g}s\n"
        f"Logs: {launch.logs_hint}"
    )


async def start_rollout_server(
    nursery: trio.Nursery,
    launch: ServerLaunch,
    *,
    sink: OutputSink,
    log: LogFn,
    stage: Callable[[str], None],
    redact: Callable[[str], str],
) -> RolloutServer:
    """Spawn the rollout server and wait until its ``/health`` proves it is ours.

    ``nursery`` hosts the output copier for the server's whole life. ``stage`` announces the
    milestones. Raises :class:`LocalEvalError` with a one-line cause (plus the ``Logs:`` hint)
    when the entrypoint is missing, the server exits or never becomes healthy, or another
    process owns the port. On failure the child is stopped and ``server.json`` removed.
    """
    if not launch.entrypoint.is_file():
        raise LocalEvalError(
            f"rollout entrypoint {launch.entrypoint} does not exist; check experiment.rollout "
            "and experiment.entrypoint"
        )
    if not launch.python.exists():
        raise LocalEvalError(
            f"the rollout environment has no interpreter at {launch.python}; run "
            f"uv sync --project {launch.rollout_dir} and retry"
        )
    attempts = 1 if launch.fixed_port is not None else 2
    record_path = launch.run_dir / "server.json"
    async with httpx.AsyncClient(trust_env=False) as client:
        for attempt in range(1, attempts + 1):
            port = launch.fixed_port if launch.fixed_port is not None else _free_port()
            instance_id = uuid.uuid4().hex
            stage(f"starting rollout server ({launch.entrypoint.name})")
            log(
                "INFO",
                "server",
                f"starting rollout server ({launch.entrypoint.name})",
                {"attempt": attempt, "port": port},
            )
            env = _child_env(launch, port, instance_id)
            try:
                child = await spawn_child(
                    nursery,
                    [launch.python, launch.entrypoint],
                    cwd=launch.rollout_dir,
                    env=env,
                    sink=sink,
                    name="rollout-server",
                )
            except OSError as exc:
                raise LocalEvalError(f"could not start the rollout server: {exc}") from None
            try:
                write_record(record_path, owner_record(child.pid, instance_id, port))
            except OSError as exc:
                await child.stop(STOP_GRACE_S)
                with contextlib.suppress(FileNotFoundError):
                    record_path.unlink()
                raise LocalEvalError(
                    f"could not record the rollout server process for orphan cleanup: {exc}"
                ) from None
            server = RolloutServer(child, port, instance_id, {}, record_path)
            try:
                server.health, server.sdk_version = await _wait_healthy(
                    child, client, server.base_url, instance_id, launch, redact
                )
            except _StartupFailure as exc:
                await server.stop(STOP_GRACE_S)
                if attempt < attempts:
                    log("WARNING", "server", "retrying startup on a new port", {"error": str(exc)})
                    continue
                raise LocalEvalError(str(exc)) from None
            except BaseException:
                # Nothing was dispatched yet, so the ordinary grace is enough.
                await server.stop(STOP_GRACE_S)
                raise
            log("INFO", "server", f"rollout server healthy on port {port}", {"port": port})
            stage(f"rollout server healthy on port {port}")
            return server
    raise AssertionError("unreachable")  # pragma: no cover
