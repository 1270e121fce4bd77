"""The real ``rollbridge eval run`` with tunnel flags: your own tunnel, and orphan reaping.

The ``workspace`` and ``env`` fixtures come from the launcher's end-to-end suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import trio

from tests.launcher.e2e import conftest as launcher_e2e
from tests.launcher.e2e.conftest import (
    count_log,
    journal,
    run_cli,
    run_dir,
    start_cli,
    wait_for,
)
from tests.tunnel.conftest import FakeCloudflared, alive

pytestmark = pytest.mark.slow

# The launcher's e2e fixtures, registered here by name (a copied workspace, the synced rollout env).
shared_env = launcher_e2e.shared_env
workspace = launcher_e2e.workspace
env = launcher_e2e.env

CONFIG = "ws/configs/eval/echo.toml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_advertise_url_carries_every_model_call(
    fake_cloudflared: FakeCloudflared, workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    port = _free_port()
    own_log = tmp_path / "own-tunnel.log"
    fd = os.open(own_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # "Your own tunnel": started by hand, forwarding to the fixed listener port.
        tunnel = await trio.lowlevel.open_process(
            [
                str(fake_cloudflared.binary),
                "tunnel",
                "--config",
                "/dev/null",
                "--no-autoupdate",
                "--url",
                f"http://127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=fd,
            start_new_session=True,
        )
    finally:
        os.close(fd)
    try:
        maps = lambda: list(fake_cloudflared.state.glob("*.trycloudflare.com.json"))  # noqa: E731
        await wait_for(lambda: bool(maps()), timeout=30)
        advertised = json.loads(maps()[0].read_text())["local"]
        result = await run_cli(
            [
                "eval",
                "run",
                CONFIG,
                "--yes",
                "--name",
                "adv",
                "--listener-port",
                str(port),
                "--advertise-url",
                advertised,
            ],
            cwd=tmp_path,
            env=env,
            timeout=180,
        )
    finally:
        tunnel.kill()
        with trio.fail_after(10):
            await tunnel.wait()
    assert result.returncode == 0, result.stderr + result.stdout
    assert f"advertising chat endpoint through {advertised}" in result.stdout + result.stderr
    records = journal(run_dir(workspace, "adv"))
    assert len(records) == 21
    forwarded = [
        line
        for line in own_log.read_text().splitlines()
        if "forwarded POST /v1/rollouts/" in line and line.endswith("-> 200")
    ]
    # Every rollout's model calls went through the advertised base, none around it.
    assert len(forwarded) >= len(records)
    assert not (run_dir(workspace, "adv") / "tunnel.json").exists()


async def test_tunnel_orphaned_by_kill_9_is_reaped_by_the_next_run(
    fake_cloudflared: FakeCloudflared, workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    # The tunnel never becomes ready, so the first run is still waiting for it when killed.
    cli_env = dict(
        env,
        FAKE_CLOUDFLARED_STATE=str(fake_cloudflared.state),
        FAKE_CLOUDFLARED_REGISTER="0",
        FAKE_CLOUDFLARED_EDGE_READY="0",
    )
    live = await start_cli(
        [
            "eval",
            "run",
            CONFIG,
            "--yes",
            "--name",
            "orphan",
            "--tunnel",
            "cloudflared",
            "--cloudflared",
            str(fake_cloudflared.binary),
        ],
        cwd=tmp_path,
        env=cli_env,
        logdir=tmp_path / "first",
    )
    run = run_dir(workspace, "orphan")
    try:
        # Wait until cloudflared has printed all it will print: an orphan whose stderr reader
        # died would otherwise be killed by its next write to the broken pipe.
        await wait_for(
            lambda: (
                (run / "tunnel.json").exists() and count_log(run, "Starting metrics server") > 0
            ),
            timeout=120,
        )
        record = json.loads((run / "tunnel.json").read_text())
    finally:
        live.kill9()
        await live.wait(timeout=30)
    assert alive(record["pid"]), "cloudflared must outlive a killed supervisor (own session)"

    result = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "orphan"], cwd=tmp_path, env=env, timeout=180
    )
    output = result.stdout + result.stderr
    assert (
        "terminated an orphaned cloudflared tunnel from a previous invocation "
        f"(pid {record['pid']}, port {record['port']})"
    ) in output
    assert not alive(record["pid"])
    assert not (run / "tunnel.json").exists()
    assert result.returncode == 0, output
