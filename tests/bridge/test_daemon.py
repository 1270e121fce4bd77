"""The bridge as a daemon: ``bridge serve`` and the plain ``/v1/chat/completions`` route."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest
import trio
from click.testing import CliRunner

from bridge.cli import bridge as bridge_cli
from tests.bridge.conftest import AUTH, HI, StartBridge


async def test_plain_route_attributes_usage_by_header(start_bridge: StartBridge) -> None:
    handle = await start_bridge(model="rollbridge/echo", plain_chat_route=True)
    with trio.fail_after(20):
        async with httpx.AsyncClient() as client:
            plain = handle.base_url + "/v1/chat/completions"
            response = await client.post(plain, json={"messages": HI}, headers=AUTH)
            assert response.status_code == 200
            assert response.json()["choices"][0]["message"]["content"] == "hi"
            headers = {**AUTH, "X-Rollbridge-Rollout-Id": "ide"}
            assert (
                await client.post(plain, json={"messages": HI}, headers=headers)
            ).status_code == 200
            bad = {**AUTH, "X-Rollbridge-Rollout-Id": ".."}
            assert (await client.post(plain, json={"messages": HI}, headers=bad)).status_code == 422
            assert (await client.post(plain, json={"messages": HI})).status_code == 401
    for rid in ("default", "ide"):
        usage = handle.ledger.pop(rid)
        assert usage is not None and usage.calls == 1


def test_serve_help_lists_options() -> None:
    result = CliRunner().invoke(bridge_cli, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--model", "--host", "--port", "--token"):
        assert option in result.output


def test_serve_requires_model() -> None:
    result = CliRunner().invoke(bridge_cli, ["serve"])
    assert result.exit_code != 0
    assert "--model" in result.output


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bridge", "serve", "--model", "rollbridge/echo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def _read_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            break
    return lines


@pytest.mark.timeout(60)
def test_serve_prints_url_and_generated_token_then_stops_cleanly() -> None:
    proc = _serve()
    try:
        lines = _read_until(proc, "Ctrl-C")
        url = next(
            line.split("listening on ")[1].strip() for line in lines if "listening on" in line
        )
        token = next(line.split()[1] for line in lines if line.strip().startswith("token:"))
        response = httpx.post(
            url + "/v1/rollouts/r/chat/completions",
            json={"messages": HI},
            headers={"Authorization": f"Bearer {token}"},
            timeout=20,
        )
        assert response.status_code == 200
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0
    assert "Bridge stopped." in out
    assert "usage r: 1 calls" in out
    assert "Traceback" not in err


@pytest.mark.timeout(60)
def test_given_token_is_never_printed() -> None:
    proc = _serve(env={"ROLLBRIDGE_BRIDGE_TOKEN": "my-own-secret-token"})
    try:
        lines = _read_until(proc, "Ctrl-C")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "my-own-secret-token" not in "".join(lines) + out + err
    assert proc.returncode == 0


@pytest.mark.timeout(60)
def test_port_in_use_is_a_one_line_error() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bridge",
                "serve",
                "--model",
                "rollbridge/echo",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode != 0
    assert result.stderr.startswith(f"Error: could not bind the LLM bridge on 127.0.0.1:{port}: ")
    assert "Traceback" not in result.stderr
