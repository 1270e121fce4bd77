"""rollout_server stays light: the wire types import alone, nothing pulls in the CLI stack, and
installing the project without extras gives a rollout environment only the light base."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import httpx
import pytest
import trio

from rollout_server.protocol import ENV_ARTIFACT_ROOT, ENV_PORT

REPO = Path(__file__).resolve().parents[2]

# h2: hypercorn's own dependency, declared for the bridge's HTTP/2 to the provider (no weight added).
BASE_DEPENDENCIES = {"trio", "hypercorn", "httpx", "msgspec", "httptools", "h11", "h2"}
# Never in a rollout environment: the CLI stack and a web framework.
NOT_INSTALLED = ("quart", "flask", "werkzeug", "litellm", "rich", "click")

CHECK = """
import sys
import rollout_server.protocol
light = sorted(m for m in ("hypercorn", "quart", "quart_trio", "trio", "httpx") if m in sys.modules)
import rollout_server, rollout_server.client
for name in rollout_server.__all__:
    getattr(rollout_server, name)
heavy = sorted(m for m in ("litellm", "psutil", "quart", "pydantic") if m in sys.modules)
print(light, heavy)
"""


def test_protocol_imports_alone_and_sdk_has_no_heavy_dependencies() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[] []"


# What a rollout's main.py imports, then a started server answering /health: none of it needs
# httpx (made only when a rollout reads its context's http_client), hypercorn's worker and
# HTTP/2 stack, or importlib.metadata (the SDK version is read from the dist-info directly).
STARTUP = """
import sys
from functools import partial

import trio

from rollout_server import AgentWorkflow, Grader, LocalBackend, chat, reply_text, serve
from rollout_server import serve_async

LATE = ("httpx", "hypercorn.trio", "hypercorn.typing", "h2", "wsproto", "importlib.metadata")
print(sorted(m for m in LATE if m in sys.modules))


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        raise AssertionError("not run")


async def main():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            backend = LocalBackend(workflow=Workflow)
            running = await nursery.start(partial(serve_async, backend, port=0))
            stream = await trio.open_tcp_stream("127.0.0.1", running.port)
            await stream.send_all(b"GET /health HTTP/1.1\\r\\nhost: x\\r\\n\\r\\n")
            print((await stream.receive_some()).split(b"\\r\\n")[0].decode())
            await stream.aclose()
            running.request_shutdown()


trio.run(main)
print(sorted(m for m in LATE if m in sys.modules))
"""


def test_sdk_names_and_a_started_server_import_no_http_client_or_hypercorn_worker() -> None:
    result = subprocess.run(
        [sys.executable, "-c", STARTUP], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split("\n")[:3] == ["[]", "HTTP/1.1 200 ", "[]"], result.stderr


# A server whose rollouts call chat() over the loopback path never imports httpx (nor builds
# the shared client, which loads the CA bundle); a rollout that reads ctx.http_client still
# gets the server's one shared httpx client.
CHAT_ROLLOUTS = """
import json
import sys
from functools import partial

import msgspec
import trio

from rollout_server import AgentWorkflow, LocalBackend, chat, get_rollout_context, reply_text
from rollout_server import serve_async
from rollout_server.protocol import RolloutInitRequest

REPLY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "pong"}}]}).encode()
seen = []


async def fake_provider(stream):
    buffer = b""
    while True:
        while b"\\r\\n\\r\\n" not in buffer:
            chunk = await stream.receive_some()
            if not chunk:
                return
            buffer += chunk
        head, _, buffer = buffer.partition(b"\\r\\n\\r\\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\\r\\n")[0])
        while len(buffer) < length:
            buffer += await stream.receive_some()
        buffer = buffer[length:]
        await stream.send_all(
            b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n"
            + b"content-length: %d\\r\\n\\r\\n" % len(REPLY) + REPLY
        )


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        reply = await chat(list(ctx.prompt))
        if ctx.metadata:
            seen.append(get_rollout_context().http_client)
        return [*ctx.prompt, {"role": "assistant", "content": reply_text(reply)}]


async def rollout(service, url, rollout_id, metadata=None):
    request = RolloutInitRequest(
        initial_messages=[{"role": "user", "content": "ping"}],
        rollout_id=rollout_id,
        chat_completions_url=url,
        grade=False,
        metadata=metadata,
    )
    token = service.admit(request)["polling_lease_token"]
    while True:
        body = msgspec.json.decode(await service.poll(rollout_id, token))
        if body["status"] != "queued" and body["status"] != "running":
            return body["status"], body["sample"]["messages"][-1]["content"]


async def main():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, fake_provider, 0, host="127.0.0.1"))
            url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/r1/v1"
            running = await nursery.start(partial(serve_async, LocalBackend(Workflow), port=0))
            print(await rollout(running.service, url, "a"), "httpx" in sys.modules)
            print(await rollout(running.service, url, "b", {"read": 1}))
            print(await rollout(running.service, url, "c", {"read": 1}))
            print(type(seen[0]).__name__, seen[0] is seen[1] is running.service.http_client)
            running.request_shutdown()
            await running.service.wait_idle()
            nursery.cancel_scope.cancel()


trio.run(main)
"""


def test_loopback_chat_rollouts_import_no_httpx_and_a_read_client_is_shared(
    tmp_path: Path,
) -> None:
    env = {**os.environ, ENV_ARTIFACT_ROOT: str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", CHAT_ROLLOUTS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.stdout.split("\n")[:4] == [
        "('success', 'pong') False",
        "('success', 'pong')",
        "('success', 'pong')",
        "AsyncClient True",
    ], result.stderr


def test_sources_import_only_the_base_dependencies() -> None:
    # (httpx itself imports click and rich when they happen to be installed; we never do.)
    pattern = re.compile(
        r"^\s*(?:from|import)\s+(litellm|click|rich|psutil|quart\w*|pydantic)\b", re.M
    )
    offenders = [
        f"{path.name}: {match.group(1)}"
        for path in (REPO / "rollout_server").rglob("*.py")
        for match in pattern.finditer(path.read_text())
    ]
    assert offenders == []


def test_declared_base_dependencies_are_the_light_set() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0] for spec in project["dependencies"]}
    assert names == BASE_DEPENDENCIES


ROLLOUT = textwrap.dedent(
    """
    from rollout_server import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, serve


    class Workflow(AgentWorkflow):
        async def run(self, ctx):
            return AgentWorkflowOutput(messages=list(ctx.prompt))


    class Judge(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)


    if __name__ == "__main__":
        serve(LocalBackend(workflow=Workflow, grader=Judge))
    """
)


def _uv() -> str:
    beside = Path(sys.executable).with_name("uv")
    found = str(beside) if beside.exists() else shutil.which("uv")
    if found is None:
        pytest.skip("no uv binary next to the test interpreter or on PATH")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_healthy(url: str, process: trio.Process) -> httpx.Response:
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            assert process.poll() is None, "the rollout server exited before answering /health"
            try:
                return await client.get(url)
            except httpx.TransportError:
                await trio.sleep(0.1)


@pytest.mark.slow
async def test_install_without_extras_serves_a_rollout(tmp_path: Path) -> None:
    uv = _uv()
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    with trio.fail_after(300):
        # The default uv cache keeps reruns fast; only the project itself is rebuilt.
        await trio.run_process([uv, "venv", "-q", "--python", sys.executable, str(venv)])
        await trio.run_process([uv, "pip", "install", "-q", "--python", str(python), str(REPO)])
    check = (
        "import importlib.util as u, rollout_server; "
        f"print(rollout_server.__file__); print([m for m in {NOT_INSTALLED!r} if u.find_spec(m)])"
    )
    found = await trio.run_process([str(python), "-c", check], capture_stdout=True, cwd=tmp_path)
    location, installed = found.stdout.decode().split()
    assert Path(location).is_relative_to(venv), "rollout_server came from outside the venv"
    assert installed == "[]"

    main = tmp_path / "rollout" / "main.py"
    main.parent.mkdir()
    main.write_text(ROLLOUT)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[ENV_PORT] = str(port)
    env[ENV_ARTIFACT_ROOT] = str(tmp_path / "artifacts")
    log = tmp_path / "server.log"
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [str(python), str(main)], cwd=main.parent, env=env, stderr=stderr
        )
    try:
        with trio.fail_after(60):
            response = await _wait_healthy(f"http://127.0.0.1:{port}/health", process)
            assert response.status_code == 200, log.read_text()
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            await process.wait()
