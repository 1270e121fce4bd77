"""The Harbor agent of workflow mode: runs the rollout's workflow inside the trial's container.

Harbor imports it as ``rollbridge_harness:HarnessAgent`` from this directory, which the backend
puts on the Harbor child's ``PYTHONPATH`` (Harbor's venv does not have ``rollout_server``), so it
imports only the standard library, Harbor and its neighbour ``rollbridge_relay``.

``run()``: hands the container its input (``/logs/agent/container_input.json``, with the bearer,
from a 0600 file; the runner deletes it once read), starts the exec relay when the route is the
relay (``ROLLBRIDGE_RELAY_TARGET``), execs ``/opt/rollbridge/venv/bin/python -m
rollout_server.sandbox agent``, and reads ``container_result.json`` back into the context's
metadata. A workflow that failed raises, so Harbor skips the verifier; the backend reports the
workflow's own error from the result file.

Environment (set by the backend): ``OPENAI_API_KEY`` (the bearer, never in argv or kwargs),
``ROLLBRIDGE_SANDBOX_URL`` (the chat URL as the container dials it), ``ROLLBRIDGE_TRIAL``,
``ROLLBRIDGE_ENGINE``, and ``ROLLBRIDGE_RELAY_TARGET`` (``host:port``) for the relay route.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

# Harbor is installed only in Harbor's own venv; the project's mypy runs without it.
from harbor.agents.base import BaseAgent  # type: ignore[import-not-found]
from harbor.environments.base import BaseEnvironment  # type: ignore[import-not-found]
from harbor.models.agent.context import AgentContext  # type: ignore[import-not-found]

__all__ = ["HarnessAgent", "SandboxRunError"]

VENV_PYTHON = "/opt/rollbridge/venv/bin/python"
INPUT_PATH = "/logs/agent/container_input.json"
RESULT_PATH = "/logs/agent/container_result.json"
RUNNER_COMMAND = f"{VENV_PYTHON} -m rollout_server.sandbox agent"
TRIAL_LABEL = "io.rollbridge.harbor.trial"
RELAY_PORT = 13131
#: Beyond the workflow's own deadline (the runner enforces it): imports and the result file.
_EXEC_GRACE_S = 60
_REDACTED = "[REDACTED]"


class SandboxRunError(RuntimeError):
    """The workflow failed in the sandbox, or the runner left no result."""


class HarnessAgent(BaseAgent):  # type: ignore[misc]
    """Run a rollbridge workflow in the container (kwargs: the container input, no secrets)."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        rollout_id: str = "",
        prompt: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
        workflow: str = "",
        grader: str | None = None,
        config: Any = None,
        config_type: str | None = None,
        package_dir_name: str = "",
        timeout_sec: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, model_name, **kwargs)
        self._input: dict[str, Any] = {
            "rollout_id": rollout_id,
            "prompt": list(prompt or []),
            "metadata": metadata,
            "workflow": workflow,
            "grader": grader,
            "config": config,
            "config_type": config_type,
            "package_dir_name": package_dir_name,
            "timeout_sec": timeout_sec,
        }
        self._timeout_sec = timeout_sec
        self._bearer = os.environ.get("OPENAI_API_KEY") or None

    @staticmethod
    def name() -> str:
        return "rollbridge-harness"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        """Nothing to install: the sandbox image already has the bundle."""

    def _scrub(self, text: str) -> str:
        if self._bearer and len(self._bearer) >= 4:
            return text.replace(self._bearer, _REDACTED)
        return text

    async def _give_input(self, environment: BaseEnvironment) -> None:
        url = os.environ.get("ROLLBRIDGE_SANDBOX_URL", "")
        if not url:
            raise SandboxRunError("ROLLBRIDGE_SANDBOX_URL is not set: the backend gave no chat URL")
        document = {**self._input, "chat_completions_url": url, "api_key": self._bearer}
        data = json.dumps(document).encode()
        host_path = self.logs_dir / "container_input.json"
        if environment.is_path_mounted(INPUT_PATH, host_path):
            # /logs/agent is this very directory: no copy through the engine needed.
            _write_private(host_path, data)
            return
        fd, name = tempfile.mkstemp(prefix="rollbridge-input-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            await environment.upload_file(name, INPUT_PATH)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name)

    async def _start_relay(self) -> Any:
        target_text = os.environ.get("ROLLBRIDGE_RELAY_TARGET")
        if not target_text:
            return None
        try:
            import rollbridge_relay  # type: ignore[import-not-found]  # this file's neighbour
        except ImportError:
            self.logger.warning("rollbridge_relay is missing: running without the exec relay")
            return None
        host, _, port = target_text.rpartition(":")
        engine = os.environ.get("ROLLBRIDGE_ENGINE", "podman")
        container = await _main_container(engine, os.environ.get("ROLLBRIDGE_TRIAL", ""))
        argv = rollbridge_relay.exec_argv(engine, container, RELAY_PORT)
        return await rollbridge_relay.start_host_relay(
            argv, (host, int(port)), log=lambda line: self.logger.info("relay: %s", line)
        )

    async def _read_result(self, environment: BaseEnvironment) -> dict[str, Any] | None:
        host_path = self.logs_dir / "container_result.json"
        if not environment.is_path_mounted(RESULT_PATH, host_path):
            try:
                await environment.download_file(RESULT_PATH, host_path)
            except Exception as exc:
                self.logger.warning("could not download %s: %s", RESULT_PATH, exc)
                return None
        try:
            document = json.loads(host_path.read_bytes())
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) else None

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Give the container its input, run the workflow there, read its result back."""
        host_input = self.logs_dir / "container_input.json"
        relay = None
        try:
            await self._give_input(environment)
            relay = await self._start_relay()
            timeout = None if self._timeout_sec is None else int(self._timeout_sec) + _EXEC_GRACE_S
            executed = await environment.exec(RUNNER_COMMAND, timeout_sec=timeout)
        finally:
            if relay is not None:
                await relay.close()
            with contextlib.suppress(OSError):
                host_input.unlink()
        output = "".join(part for part in (executed.stdout, executed.stderr) if part)
        _write_private(self.logs_dir / "runner.txt", self._scrub(output).encode())
        result = await self._read_result(environment)
        context.metadata = {**(context.metadata or {}), "container_result": result}
        if result is None:
            tail = " | ".join(self._scrub(output).strip().splitlines()[-5:])
            raise SandboxRunError(
                f"the sandbox runner wrote no container_result.json "
                f"(exit code {executed.return_code}): {tail or 'no output'}"
            )
        if result.get("status") != "success":
            failure = result.get("failure")
            failure = failure if isinstance(failure, dict) else {}
            raise SandboxRunError(
                self._scrub(
                    f"{failure.get('stage', 'workflow')}: {failure.get('type', 'Error')}: "
                    f"{failure.get('message', '')}"
                )
            )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


async def _main_container(engine: str, trial: str) -> str:
    """The id of the trial's main service container (the relay's inside end runs there)."""
    argv = [
        engine,
        "ps",
        "-q",
        "--filter",
        f"label={TRIAL_LABEL}={trial}",
        "--filter",
        "label=com.docker.compose.service=main",
    ]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    ids = stdout.decode().split()
    if not ids:
        raise SandboxRunError(f"no running main container labelled {TRIAL_LABEL}={trial}")
    return ids[0]
