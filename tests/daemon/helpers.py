"""Helpers for the daemon tests: a live ``rollbridge daemon`` subprocess, an httpx client over
its unix socket, an SSE reader, and a paced version of the example rollout.

The paced rollout replaces ``rollouts/echo/main.py`` in the test's workspace copy: it makes
one model call (so the bridge counts usage while it is in flight), sleeps the number of seconds
written in ``<workspace>/delay.txt`` (outside the rollout directory, so changing the pace
between a run and its resume is not a source change) and echoes the prompt. While
``<workspace>/shield.txt`` exists the sleep ignores cancellation, like a rollout stuck in
cleanup (only the second Ctrl-C's kill ends it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from launcher.daemon.discovery import DaemonInfo, live_daemon
from tests.launcher.e2e.helpers import cli_argv

PACED = """
from pathlib import Path

import trio
from rollout_server import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, chat, serve

DELAY = Path({delay!r})
SHIELD = Path({shield!r})


class Paced(AgentWorkflow):
    async def run(self, ctx):
        await chat(list(ctx.prompt))
        with trio.CancelScope(shield=SHIELD.exists()):
            await trio.sleep(float(DELAY.read_text() or 0))
        messages = list(ctx.prompt)
        return AgentWorkflowOutput(messages=[*messages, {{"role": "assistant", "content": "ok"}}])


class Always(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


if __name__ == "__main__":
    serve(LocalBackend(workflow=Paced, grader=Always))
"""


def pace(workspace: Path, seconds: float, *, shielded: bool = False) -> None:
    """Make the workspace's rollout sleep ``seconds`` per item (takes effect at once), ignoring
    cancellation when ``shielded``."""
    delay = workspace / "delay.txt"
    shield = workspace / "shield.txt"
    main = workspace / "rollouts" / "echo" / "main.py"
    text = PACED.format(delay=str(delay), shield=str(shield))
    if main.read_text() != text:
        main.write_text(text)
    delay.write_text(str(seconds))
    if shielded:
        shield.write_text("1")
    else:
        shield.unlink(missing_ok=True)


class Daemon:
    """A running daemon subprocess."""

    def __init__(self, process: trio.Process, workspace: Path, info: DaemonInfo) -> None:
        self.process = process
        self.workspace = workspace
        self.info = info

    def client(self) -> httpx.AsyncClient:
        """An async client over the unix socket."""
        return httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=self.info.socket),
            base_url="http://daemon",
            timeout=httpx.Timeout(60.0, read=None),
        )


async def start_daemon(
    workspace: Path, env: Mapping[str, str], *extra: str, timeout: float = 30.0
) -> Daemon:
    """Start ``rollbridge daemon`` in ``workspace`` and wait for its ``daemon.json``."""
    log = workspace.parent / "daemon-out.txt"
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = await trio.lowlevel.open_process(
            cli_argv("daemon", *extra),
            cwd=str(workspace),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    finally:
        os.close(out)
    with trio.fail_after(timeout):
        while True:
            info = live_daemon(workspace)
            if info is not None and info.pid == process.pid:
                return Daemon(process, workspace, info)
            assert process.returncode is None, log.read_text()
            await trio.sleep(0.05)


@asynccontextmanager
async def running_daemon(
    workspace: Path, env: Mapping[str, str], *extra: str
) -> AsyncIterator[Daemon]:
    """A daemon for the block; SIGTERM and wait at the end."""
    daemon = await start_daemon(workspace, env, *extra)
    try:
        yield daemon
    finally:
        with trio.fail_after(30):
            if daemon.process.returncode is None:
                daemon.process.terminate()
            await daemon.process.wait()


async def sse_frames(
    client: httpx.AsyncClient, name: str, *, last_id: int | None = None
) -> AsyncIterator[tuple[str, int | None, Any]]:
    """``(event, id, data)`` frames of a run's event stream."""
    headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
    async with client.stream("GET", f"/v1/runs/{name}/events", headers=headers) as response:
        assert response.status_code == 200
        event, event_id, data = "message", None, ""
        async for line in response.aiter_lines():
            if line == "":
                if data:
                    yield event, event_id, json.loads(data)
                event, event_id, data = "message", None, ""
            elif line.startswith("event: "):
                event = line[7:]
            elif line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                data += line[6:]


async def wait_state(
    client: httpx.AsyncClient, name: str, states: set[str], timeout: float = 90.0
) -> dict[str, Any]:
    """Poll ``GET /v1/runs/{name}`` until its state is one of ``states``."""
    with trio.fail_after(timeout):
        while True:
            answer = await client.get(f"/v1/runs/{name}")
            assert answer.status_code == 200, (answer.status_code, answer.text[:500])
            doc: dict[str, Any] = answer.json()
            if doc.get("state") in states:
                return doc
            await trio.sleep(0.1)
