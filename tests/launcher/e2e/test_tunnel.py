"""The bridge's public reachability wired into a run: ``--advertise-url`` with
``--listener-port`` (your own tunnel), a managed tunnel (the fake cloudflared) whose URL reaches
rollouts, and reaping the tunnel a ``kill -9``'d run left behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest
import trio

from tests.fakes.cloudflared_support import install_fake_cloudflared
from tests.helpers import alive, free_port
from tests.launcher.e2e.helpers import count_log, journal, run_cli, run_dir, start_cli, wait_for

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"


async def test_advertise_url_is_what_rollouts_call(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    binary = install_fake_cloudflared(tmp_path / "bin")
    state = tmp_path / "cf-state"
    state.mkdir()

    def maps() -> list[Path]:
        # The fake writes one map file per tunnel (public host -> its local forwarding address).
        return list(state.glob("*.trycloudflare.com.json"))

    own_log = tmp_path / "own-tunnel.log"
    fd = os.open(own_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # "Your own tunnel": started by hand, forwarding to the fixed listener port.
        tunnel = await trio.lowlevel.open_process(
            [
                str(binary),
                "tunnel",
                "--config",
                "/dev/null",
                "--no-autoupdate",
                "--url",
                f"http://127.0.0.1:{port}",
            ],
            env={**env, "FAKE_CLOUDFLARED_STATE": str(state)},
            stdout=subprocess.DEVNULL,
            stderr=fd,
            start_new_session=True,
        )
    finally:
        os.close(fd)
    try:
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
                "--advertise-url",
                advertised,
                "--listener-port",
                str(port),
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
    assert f"→ advertising chat endpoint through {advertised}" in result.stdout
    run = run_dir(workspace, "adv")
    records = journal(run)
    assert len(records) == 21
    # The example dataset's first five rows succeed (later rows fail or skip on purpose).
    status = {r["row_index"]: r["status"] for r in records}
    assert [status[row] for row in range(5)] == ["success"] * 5
    forwarded = [
        line
        for line in own_log.read_text().splitlines()
        if "forwarded POST /v1/rollouts/" in line and line.endswith("-> 200")
    ]
    # Every rollout's model calls went through the advertised base, none around it.
    assert len(forwarded) >= len(records)
    assert not (run / "tunnel.json").exists()
    # Follow-up commands repeat the runtime flags (they are never stored in the manifest).
    manifest = (run / "manifest.json").read_text()
    assert str(port) not in manifest and advertised not in manifest


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


async def test_tunnel_orphaned_by_kill_9_is_reaped_by_the_next_run(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    binary = install_fake_cloudflared(tmp_path / "bin")
    state = tmp_path / "cf-state"
    state.mkdir()
    # The tunnel never becomes ready, so the first run is still waiting for it when killed.
    cli_env = dict(
        env,
        FAKE_CLOUDFLARED_STATE=str(state),
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
            str(binary),
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
