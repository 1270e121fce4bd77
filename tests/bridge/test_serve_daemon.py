"""``rollbridge bridge serve`` as a daemon an IDE spawns: the JSON ready line, the port file,
``/health``, ``/v1/models``, live usage at ``/v1/usage``, and the model preflight at start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.bridge.conftest import AUTH, HI, StartBridge


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bridge", "serve", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(60)
def test_json_ready_line_port_file_and_daemon_routes(tmp_path: Path) -> None:
    port_file = tmp_path / "bridge.port"
    proc = _serve("--model", "rollbridge/echo", "--json", "--port-file", str(port_file))
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] is True and ready["model"] == "rollbridge/echo"
        assert ready["pid"] == proc.pid
        url, token = ready["url"], ready["token"]
        assert url == f"http://127.0.0.1:{ready['port']}"
        assert port_file.read_text() == f"{ready['port']}\n"
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, timeout=20) as client:
            assert client.get("/health").json() == {"status": "ok"}
            assert client.get("/v1/models").status_code == 401
            models = client.get("/v1/models", headers=auth).json()
            assert [m["id"] for m in models["data"]] == ["rollbridge/echo"]
            assert client.get("/v1/usage").status_code == 401
            assert client.get("/v1/usage", headers=auth).json()["rollouts"] == {}
            for _ in range(2):
                answer = client.post(
                    "/v1/chat/completions",
                    json={"messages": HI},
                    headers={**auth, "X-Rollbridge-Rollout-Id": "ide"},
                )
                assert answer.status_code == 200
            reported = answer.json()["usage"]["total_tokens"]
            usage = client.get("/v1/usage", headers=auth).json()
        ide = usage["rollouts"]["ide"]
        assert ide["calls"] == 2 and ide["total_tokens"] == 2 * reported
        assert usage["totals"]["total_tokens"] == ide["total_tokens"]
        assert usage["totals"]["max_context_tokens"] == ide["max_context_tokens"] == reported
    finally:
        out, err = _stop(proc)
    assert proc.returncode == 0, err
    assert out == ""  # JSON mode: the ready line only
    assert not port_file.exists()


@pytest.mark.timeout(60)
def test_json_ready_line_never_carries_a_chosen_token() -> None:
    proc = _serve(
        "--model", "rollbridge/echo", "--json", env={"ROLLBRIDGE_BRIDGE_TOKEN": "chosen-secret"}
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert json.loads(line)["token"] is None
    finally:
        out, err = _stop(proc)
    assert "chosen-secret" not in line + out + err


@pytest.mark.timeout(60)
def test_a_model_that_cannot_answer_fails_at_start(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    port_file = tmp_path / "bridge.port"
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1"}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bridge", "serve", "--model", "openai/gpt-4o-mini"),
            *("--json", "--port-file", str(port_file)),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=50,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: model preflight failed for 'openai/gpt-4o-mini': ")
    assert "sk-test" not in result.stderr
    assert not port_file.exists()


async def test_the_run_bridge_serves_no_daemon_routes(start_bridge: StartBridge) -> None:
    handle = await start_bridge(model="rollbridge/echo")
    with trio.fail_after(20):
        async with httpx.AsyncClient(base_url=handle.base_url) as client:
            for path in ("/health", "/v1/models", "/v1/usage"):
                assert (await client.get(path, headers=AUTH)).status_code == 404
