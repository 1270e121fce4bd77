"""The bridge's public reachability wired into a run: ``--advertise-url`` with
``--listener-port``, and a managed tunnel (the fake cloudflared) whose URL reaches rollouts."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from tests.fakes.cloudflared_support import install_fake_cloudflared
from tests.launcher.e2e.conftest import journal, run_cli, run_dir

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_advertise_url_is_what_rollouts_call(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    port = _free_port()
    url = f"http://localhost:{port}/"
    result = await run_cli(
        [
            "eval",
            "run",
            CONFIG,
            "--yes",
            "--name",
            "adv",
            "--rows",
            "0-4",
            "--advertise-url",
            url,
            "--listener-port",
            str(port),
        ],
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert f"→ advertising chat endpoint through {url}" in result.stdout
    records = journal(run_dir(workspace, "adv"))
    assert [r["status"] for r in records] == ["success"] * 5
    # Follow-up commands repeat the runtime flags (they are never stored in the manifest).
    manifest = (run_dir(workspace, "adv") / "manifest.json").read_text()
    assert str(port) not in manifest


async def test_managed_tunnel_url_replaces_the_loopback_base(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    binary = install_fake_cloudflared(tmp_path / "bin")
    state = tmp_path / "cf-state"
    state.mkdir()
    result = await run_cli(
        [
            "eval",
            "run",
            CONFIG,
            "--yes",
            "--name",
            "tun",
            "--rows",
            "0-1",
            "--tunnel",
            "cloudflared",
            "--cloudflared",
            str(binary),
        ],
        cwd=tmp_path,
        env={**env, "FAKE_CLOUDFLARED_STATE": str(state)},
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "→ starting cloudflared quick tunnel" in result.stdout
    assert ".trycloudflare.com" in result.stdout
    run = run_dir(workspace, "tun")
    # The fake's public hostname resolves nowhere, so rollouts that really used it fail to
    # reach the model: proof that the tunnel URL replaced the loopback bridge URL.
    records = journal(run)
    assert [r["status"] for r in records] == ["failed", "failed"]
    assert "--tunnel cloudflared" in result.stdout.split("Evaluation run finished")[1]
    assert not (run / "tunnel.json").exists()
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(binary) in " ".join(p.info["cmdline"])
    ]
    assert leftovers == []


SLEEPY = """
import trio
from rollout_server import AgentWorkflow, AgentWorkflowOutput, LocalBackend, serve


class Sleepy(AgentWorkflow):
    async def run(self, ctx):
        await trio.sleep(120)
        return AgentWorkflowOutput(messages=[])


if __name__ == "__main__":
    serve(LocalBackend(workflow=Sleepy))
"""


async def test_a_tunnel_that_fails_for_good_halts_dispatch(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    (workspace / "rollouts" / "echo" / "sleepy.py").write_text(SLEEPY)
    config = (workspace / "configs" / "eval" / "echo.toml").read_text()
    (workspace / "configs" / "eval" / "sleepy.toml").write_text(
        config.replace('"main.py"', '"sleepy.py"')
    )
    binary = install_fake_cloudflared(tmp_path / "bin")
    state = tmp_path / "cf-state"
    state.mkdir()
    result = await run_cli(
        [
            "eval",
            "run",
            "ws/configs/eval/sleepy.toml",
            "--yes",
            "--name",
            "cfdown",
            "--tunnel",
            "cloudflared",
            "--cloudflared",
            str(binary),
        ],
        cwd=tmp_path,
        env={
            **env,
            "FAKE_CLOUDFLARED_STATE": str(state),
            "FAKE_CLOUDFLARED_CRASH_AFTER_SECONDS": "1",
        },
        timeout=90,
    )
    assert result.returncode == 1, result.stderr + result.stdout
    halt = [line for line in result.stdout.splitlines() if "stopping dispatch: " in line]
    assert len(halt) == 1 and "sandboxes can no longer reach the model bridge" in halt[0]
    assert "Results (incomplete)" in result.stdout
    run = run_dir(workspace, "cfdown")
    assert journal(run) == []
    assert not (run / "tunnel.json").exists()
