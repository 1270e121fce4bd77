"""Start the rollout server: spawn the environment's own interpreter on the entrypoint, record
``server.json`` at once, wait for ``/health`` with the instance-id handshake, read the capacity.

The server runs as ``rollouts/<r>/.venv/bin/python <entrypoint>`` in its own session, never
through ``uv run`` (docs/hazards.md #3), with the environment of docs/spec/supervisor.md §2.5. An ephemeral port gets
one retry on a new port when the first attempt fails its health check (the pick-free-port
probe can race with another program); a fixed ``--rollout-port`` gets one attempt. A server
that dies of its own code (a SyntaxError or an import error in its output) is not retried:
the error names the file, the line and the offending source line.

The server does not inherit the supervisor's secrets or provider settings (keys, tokens, base
URLs, accounts: :func:`is_provider_env_name`); the bridge holds those. It gets a variable of
that kind only when the eval config names it in ``[env]`` or ``[secrets]``.

``/health`` is read through :class:`rollout_server.client.RolloutClient` and its
:class:`~rollout_server.protocol.HealthReport`, the one reader of that body. Each attempt
makes one client, right after the spawn (building it loads the CA bundle and the HTTP pools,
which overlaps the server's own start-up), and a healthy server keeps it for the run: the
health wait, the capacity probe and the whole dispatch share its keep-alive connections, so
nothing of the kind is built between "healthy" and the first dispatch. Each attempt also makes
the server's bearer (``ENV_SERVER_TOKEN``), which that client sends: a sandbox that reaches the
host's loopback cannot drive the server.

Why one module of this size: the child's environment, its spawn, the record for orphan
cleanup, the bearer and the health handshake are one start-up contract, each step depending on
the one before; split, a reader would follow one attempt across files.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from launcher.errors import LocalEvalError
from launcher.process import (
    SERVER_RECORD,
    STOP_GRACE_S,
    Child,
    OutputSink,
    child_environment,
    owner_record,
    spawn_child,
    write_record,
)
from launcher.redact import Redactor
from rollout_server.client import RolloutClient, RolloutClientError
from rollout_server.net.secrets import is_secret_env_name
from rollout_server.protocol import (
    ENV_ARTIFACT_ROOT,
    ENV_INSTANCE_ID,
    ENV_PORT,
    ENV_SERVER_TOKEN,
    ENV_SUPERVISOR_PID,
    HealthReport,
)

__all__ = [
    "HEALTH_DEADLINE_S",
    "LogFn",
    "RolloutServer",
    "ServerLaunch",
    "code_error",
    "is_provider_env_name",
    "rollout_base_env",
    "start_rollout_server",
]

HEALTH_DEADLINE_S = 90.0
# Faster than the reference's 0.2 s: the wait is on the critical path of every start.
HEALTH_POLL_S = 0.05
HEALTH_REQUEST_TIMEOUT_S = 5.0
OUTPUT_DRAIN_S = 0.5
SUPERVISOR_OWNED = (
    ENV_PORT,
    ENV_ARTIFACT_ROOT,
    ENV_INSTANCE_ID,
    ENV_SERVER_TOKEN,
    ENV_SUPERVISOR_PID,
)
#: Provider settings that are not secrets by name but belong to the bridge: where a provider
#: is (base URLs: besides these, every ``*_API_BASE`` LiteLLM reads), which account, project
#: or region it bills, and credential files and profiles.
PROVIDER_ENV_PREFIXES = (
    "OPENAI_",
    "ANTHROPIC_",
    "AZURE_",
    "OPENROUTER_",
    "GEMINI_",
    "VERTEXAI_",
    "VERTEX_",
    "XAI_",
    "MISTRAL_",
    "GROQ_",
    "COHERE_",
    "DEEPSEEK_",
    "TOGETHER_",
    "TOGETHERAI_",
    "FIREWORKS_",
    "CEREBRAS_",
    "HOSTED_VLLM_",
    "HUGGINGFACE_",
    "DATABRICKS_",
    "PERPLEXITY_",
    "BEDROCK_",
    "WATSONX_",
    "LITELLM_PROXY_",
)
PROVIDER_ENV_NAMES = frozenset(
    {
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_REGION_NAME",
        "AWS_BEDROCK_RUNTIME_ENDPOINT",
        "OR_SITE_URL",
        "OR_APP_NAME",
        "PROXY_BASE_URL",
    }
)

#: ``log(level, step, message, details)``: a logs.txt line (redacted by the log).
LogFn = Callable[[str, str, str, "dict[str, Any] | None"], None]


def _free_port() -> int:
    """A port that was free a moment ago: the one guessed port of the run.

    Everything else binds port 0 and reports the port back, but the protocol hands the rollout
    server its port through ``_OSMOSIS_ROLLOUT_PORT`` (reference servers must work), so the
    port is picked here and the start-up retries once on a new port if the pick raced.
    """
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
    health: HealthReport
    """The ``/health`` answer that proved the server ours."""
    record_path: Path
    client: RolloutClient
    """The run's client of this server (health, capacity, dispatch); :meth:`stop` closes it."""
    token: str | None = None
    """The bearer the server requires (an SDK older than this one ignores it)."""
    stopping: bool = False
    batched_wait: bool = False
    """Whether the run waits for this server's results through its batched wait
    (launcher.resultwait; decided once, before dispatch, by the run's services)."""

    @property
    def sdk_version(self) -> str | None:
        """The ``x-osmosis-rollout-sdk-version`` the server reported on ``/health``, if any."""
        return self.health.sdk_version

    @property
    def base_url(self) -> str:
        """Where the supervisor talks to the server (always loopback)."""
        return _loopback_url(self.port)

    async def stop(self, grace: float = STOP_GRACE_S, hurry: trio.Event | None = None) -> bool:
        """Stop the server's process group, remove ``server.json`` and close the client
        (whatever happens)."""
        self.stopping = True
        try:
            return await self.child.stop(grace, hurry)
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.record_path.unlink()
            with trio.CancelScope(shield=True):
                await self.client.aclose()

    async def probe_capacity(self) -> int | None:
        """A second ``/health`` probe after start-up, read only for the capacity (a failed
        probe counts as no cap)."""
        try:
            health = await self.client.health()
        except RolloutClientError:
            return None
        return health.capacity


class _StartupFailure(LocalEvalError):
    """A failed start-up attempt (may be retried on a new port)."""


def _after_attempts(message: str, attempts: int) -> str:
    """``message``, its first line saying there were ``attempts`` (90 s missed twice is 180)."""
    if attempts < 2:
        return message
    first, newline, rest = message.partition("\n")
    return f"{first} (each of {attempts} attempts, on a new port each){newline}{rest}"


def _child_line(redact: Callable[[str], str], line: str) -> str:
    """A line of the child's output as an error message may show it: its edges are a line's
    edges, so a piece of a secret a line break cut off there (the rest of a key an exception
    printed over two lines) goes too (:meth:`Redactor.redact_fragments`, when ``redact`` is
    the run's :class:`Redactor`), as the line itself does in ``logs.txt``."""
    if isinstance(redact, Redactor):
        line = redact.redact_fragments(line)
    return redact(line)


class _CodeFailure(LocalEvalError):
    """The server died of its own code (a SyntaxError, an import error): a new port cannot
    help, so it is never retried."""


#: Exceptions whose traceback means the rollout's code cannot load, whatever the port.
CODE_ERRORS = frozenset(
    {"SyntaxError", "IndentationError", "TabError", "ModuleNotFoundError", "ImportError"}
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): ?(?P<message>.*)$")


def code_error(tail: Sequence[str], rollout_dir: Path) -> str | None:
    """``SyntaxError: invalid syntax (main.py, line 3: x = = 1)`` when a child's last output
    lines end with a Python error of :data:`CODE_ERRORS`, else None.

    The frame named is the last one inside the rollout (its own ``.venv`` excluded), else the
    last frame: for a SyntaxError that is the file being compiled, for an import the line that
    imported. Python prints the offending source line right below its frame line.
    """
    lines = [line.rstrip() for line in tail]
    found = None
    for index in range(len(lines) - 1, -1, -1):
        match = _EXCEPTION.match(lines[index])
        if match is not None and match["type"].rsplit(".", 1)[-1] in CODE_ERRORS:
            found = index, match
            break
    if found is None:
        return None
    end, match = found
    frames = [(i, m) for i in range(end) if (m := _FRAME.match(lines[i])) is not None]
    error = f"{match['type'].rsplit('.', 1)[-1]}: {match['message']}".rstrip(": ")
    if not frames:
        return error

    def own(path: str) -> bool:
        resolved = Path(path).resolve()
        return resolved.is_relative_to(rollout_dir.resolve()) and ".venv" not in resolved.parts

    index, frame = next(((i, m) for i, m in reversed(frames) if own(m["file"])), frames[-1])
    path = Path(frame["file"])
    shown = (
        str(path.resolve().relative_to(rollout_dir.resolve())) if own(frame["file"]) else path.name
    )
    source = lines[index + 1].strip() if index + 1 < end else ""
    if _FRAME.match(source) or set(source) <= {"^", "~", " "}:
        source = ""
    where = f"{shown}, line {frame['line']}" + (f": {source}" if source else "")
    return f"{error} ({where})"


def is_provider_env_name(name: str) -> bool:
    """True for a variable the rollout server must not inherit: a secret by the one secret
    policy (:func:`bridge.is_secret_env_name`), or a provider setting the bridge reads."""
    return (
        is_secret_env_name(name)
        or name in PROVIDER_ENV_NAMES
        or name.startswith(PROVIDER_ENV_PREFIXES)
        or name.endswith("_API_BASE")
    )


def rollout_base_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without the credentials and provider settings (:func:`is_provider_env_name`):
    the bridge holds those, and the rollout reaches the model only through the bridge."""
    return {name: value for name, value in base.items() if not is_provider_env_name(name)}


def _child_env(launch: ServerLaunch, port: int, instance_id: str, token: str) -> dict[str, str]:
    clash = sorted(set(SUPERVISOR_OWNED) & (set(launch.config_env) | set(launch.secrets)))
    if clash:
        raise LocalEvalError(
            f"[env]/[secrets] must not set supervisor-owned variables: {', '.join(clash)}"
        )
    # [env] and [secrets] come after the filtered base, so a name the config asks for by name
    # reaches the rollout even when the filter would drop it.
    return child_environment(
        rollout_base_env(launch.base_env),
        launch.config_env,
        launch.secrets,
        {
            ENV_PORT: str(port),
            ENV_ARTIFACT_ROOT: str(launch.run_dir / "rollout_trials"),
            ENV_INSTANCE_ID: instance_id,
            # The server's own bearer: a sandbox reaching the host's loopback (slirp) finds
            # the server there, and must not be able to drive it.
            ENV_SERVER_TOKEN: token,
            # It shuts down by itself if this process dies (kill -9) instead of working on.
            ENV_SUPERVISOR_PID: str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
        },
    )


def _announcing(sink: OutputSink, port: int, announced: trio.Event) -> OutputSink:
    """``sink``, which also sets ``announced`` at the first output line naming ``:<port>``
    (ours prints "rollout server listening on http://127.0.0.1:<port>", uvicorn "running on
    http://...:<port>"): the health check asks at once instead of at its next poll."""
    marker = f":{port}"

    def forward(line: str) -> None:
        if marker in line:
            announced.set()
        sink(line)

    return forward


def _loopback_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def _run_client(child: Child, port: int, token: str) -> RolloutClient:
    """The client of a server just spawned on ``port``: it retries a connect-phase failure of
    an admission or a long-poll while ``child`` runs (the server may be slow to accept)."""
    return RolloutClient(
        _loopback_url(port),
        api_key=token,
        health_timeout_sec=HEALTH_REQUEST_TIMEOUT_S,
        server_alive=lambda: child.returncode is None,
    )


async def _wait_healthy(
    child: Child,
    rollout: RolloutClient,
    instance_id: str,
    launch: ServerLaunch,
    redact: Callable[[str], str],
    announced: trio.Event,
) -> HealthReport:
    with trio.move_on_after(HEALTH_DEADLINE_S):
        while True:
            if child.returncode is not None:
                assert child.output_done is not None
                with trio.move_on_after(OUTPUT_DRAIN_S):
                    await child.output_done.wait()
                lines = [_child_line(redact, line) for line in child.tail]
                cause = code_error(lines, launch.rollout_dir)
                if cause is not None:
                    raise _CodeFailure(
                        f"rollout server failed to start: {redact(cause)}\nLogs: {launch.logs_hint}"
                    )
                last = _child_line(redact, child.last_line)
                tail = f": {last}" if last else ""
                raise _StartupFailure(
                    f"rollout server exited with code {child.returncode} before becoming "
                    f"healthy{tail}\nLogs: {launch.logs_hint}"
                )
            try:
                health = await rollout.health()
            except RolloutClientError:
                # Not up yet (refused, an error status, not JSON): ask again after the poll
                # interval, or as soon as the server prints its port (it listens then).
                if announced.is_set():
                    await trio.sleep(HEALTH_POLL_S)
                else:
                    with trio.move_on_after(HEALTH_POLL_S):
                        await announced.wait()
                continue
            if health.instance_id != instance_id:
                raise _StartupFailure(
                    f"another process is already listening on {rollout.url} and its /health "
                    f"reports instance_id={health.instance_id!r} instead of this run's; stop it, "
                    "or choose a different --rollout-port"
                )
            return health
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
    record_path = launch.run_dir / SERVER_RECORD
    for attempt in range(1, attempts + 1):
        port = launch.fixed_port if launch.fixed_port is not None else _free_port()
        instance_id = uuid.uuid4().hex
        token = secrets.token_urlsafe(32)
        stage(f"starting rollout server ({launch.entrypoint.name})")
        log(
            "INFO",
            "server",
            f"starting rollout server ({launch.entrypoint.name})",
            {"attempt": attempt, "port": port},
        )
        env = _child_env(launch, port, instance_id, token)
        announced = trio.Event()
        try:
            child = await spawn_child(
                nursery,
                [launch.python, launch.entrypoint],
                cwd=launch.rollout_dir,
                env=env,
                sink=_announcing(sink, port, announced),
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
        server = RolloutServer(
            child,
            port,
            instance_id,
            HealthReport(),
            record_path,
            _run_client(child, port, token),
            token,
        )
        try:
            server.health = await _wait_healthy(
                child, server.client, instance_id, launch, redact, announced
            )
        except _CodeFailure as exc:
            await server.stop(STOP_GRACE_S)
            raise LocalEvalError(str(exc)) from None
        except _StartupFailure as exc:
            await server.stop(STOP_GRACE_S)
            if attempt < attempts:
                log("WARNING", "server", "retrying startup on a new port", {"error": str(exc)})
                continue
            raise LocalEvalError(_after_attempts(str(exc), attempts)) from None
        except BaseException:
            # Nothing was dispatched yet, so the ordinary grace is enough.
            await server.stop(STOP_GRACE_S)
            raise
        log("INFO", "server", f"rollout server healthy on port {port}", {"port": port})
        stage(f"rollout server healthy on port {port}")
        return server
    raise AssertionError("unreachable")  # pragma: no cover
