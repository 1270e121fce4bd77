"""The daemon without long runs: single instance, discovery, the HTTP listener's guards and
validation errors that come back as the CLI's messages."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import trio

from tests.daemon.helpers import running_daemon
from tests.launcher.e2e.helpers import run_cli


async def test_second_start_is_refused_and_discovery_is_private(
    workspace: Path, env: dict[str, str]
) -> None:
    with trio.fail_after(60):
        async with running_daemon(workspace, env) as daemon:
            second = await run_cli(["daemon"], cwd=workspace, env=env, timeout=30)
            assert second.returncode == 0
            assert second.stdout.strip() == (
                f"already running (pid {daemon.process.pid}, socket {daemon.info.socket})"
            )
            discovery = workspace / ".osmosis" / "daemon.json"
            sock = daemon.info.socket
            assert stat.S_IMODE(os.stat(discovery).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700
            async with daemon.client() as client:
                doc = (await client.get("/v1/daemon")).json()
            assert doc["pid"] == daemon.process.pid
            assert doc["runs_active"] == []
        assert daemon.process.returncode == 0
        assert not discovery.exists()


async def test_http_listener_checks_token_host_and_origin(
    workspace: Path, env: dict[str, str]
) -> None:
    with trio.fail_after(60):
        async with running_daemon(workspace, env, "--http") as daemon:
            assert daemon.info.url is not None and daemon.info.token
            port = daemon.info.url.rsplit(":", 1)[1]
            good = {"Authorization": f"Bearer {daemon.info.token}"}
            async with httpx.AsyncClient(base_url=daemon.info.url) as client:
                assert (await client.get("/v1/daemon", headers=good)).status_code == 200
                wrong = {"Authorization": "Bearer not-the-token"}
                assert (await client.get("/v1/daemon", headers=wrong)).status_code == 401
                assert (await client.get("/v1/daemon")).status_code == 401
                rebound = {**good, "Host": f"evil.example:{port}"}
                assert (await client.get("/v1/daemon", headers=rebound)).status_code == 421
                cross = {**good, "Origin": "http://evil.example"}
                refused = await client.post("/v1/shutdown", headers=cross, json={})
                assert refused.status_code == 403
                own = {**good, "Origin": f"http://127.0.0.1:{port}"}
                assert (await client.post("/v1/runs", headers=own, json={})).status_code == 400
                # The scheme is case-insensitive (RFC 9110, section 11.1); one space, no more.
                for scheme in ("bearer", "BEARER"):
                    lower = {"Authorization": f"{scheme} {daemon.info.token}"}
                    assert (await client.get("/v1/daemon", headers=lower)).status_code == 200
                for spaced in (f"Bearer  {daemon.info.token}", f"Bearer\t{daemon.info.token}"):
                    bad = {"Authorization": spaced}
                    assert (await client.get("/v1/daemon", headers=bad)).status_code == 401
                # Without --allow-origin a preflight is not answered as allowed.
                preflight = {
                    "Origin": "http://evil.example",
                    "Access-Control-Request-Method": "POST",
                }
                answer = await client.options("/v1/runs", headers=preflight)
                assert "access-control-allow-origin" not in answer.headers
                # cancel_runs is a bool: the string "false" must not cancel anything.
                typed = await client.post(
                    "/v1/shutdown", headers=good, json={"cancel_runs": "false"}
                )
                assert typed.status_code == 400
                assert typed.json()["error"]["message"] == "cancel_runs must be of type bool"
                assert daemon.process.returncode is None
            out = (workspace.parent / "daemon-out.txt").read_text()
            assert daemon.info.token not in out


async def test_a_listener_that_cannot_open_is_one_line_and_leaves_nothing(
    workspace: Path, env: dict[str, str]
) -> None:
    with trio.fail_after(60):
        busy = trio.socket.socket()
        await busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cases = [
            (("--http", "--host", "0.0.0.0"), "--host must be a loopback address, got 0.0.0.0"),
            (("--http", "--port", str(port)), f"could not bind the daemon on 127.0.0.1:{port}"),
            (("--allow-origin", "http://x.example"), "--allow-origin is for the --http listener"),
            (("--http", "--allow-origin", "x.example/path"), "--allow-origin takes an origin"),
        ]
        with busy:
            for args, line in cases:
                for json_flag in ((), ("--json",)):
                    done = await run_cli(
                        ["daemon", *args, *json_flag], cwd=workspace, env=env, timeout=30
                    )
                    out = done.stdout + done.stderr
                    assert done.returncode != 0, out
                    assert line in out, out
                    assert "Traceback" not in out and "ExceptionGroup" not in out, out
                    assert not (workspace / ".osmosis" / "daemon").exists() or not any(
                        (workspace / ".osmosis" / "daemon").iterdir()
                    )
                    assert not (workspace / ".osmosis" / "daemon.json").exists()


async def test_bad_config_gets_the_cli_message_with_a_4xx(
    workspace: Path, env: dict[str, str]
) -> None:
    with trio.fail_after(60):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            missing = await client.post("/v1/runs", json={"config": "configs/eval/nope.toml"})
            assert missing.status_code == 400
            assert missing.json()["error"]["code"] == "VALIDATION"
            message = missing.json()["error"]["message"]
            assert message == f"Config file not found: {workspace / 'configs/eval/nope.toml'}"
            rows = await client.post(
                "/v1/runs", json={"config": "configs/eval/echo.toml", "rows": "5-x"}
            )
            assert rows.status_code == 400
            cli = await run_cli(
                ["eval", "run", "configs/eval/echo.toml", "--rows", "5-x", "--yes"],
                cwd=workspace,
                env=env,
            )
            assert cli.stderr.strip() == "Error: " + rows.json()["error"]["message"]
            both = await client.post(
                "/v1/runs",
                json={"config": "configs/eval/echo.toml", "fresh": True, "retry_failed": True},
            )
            assert both.status_code == 400
            assert (
                "--fresh and --retry-failed cannot be combined" in both.json()["error"]["message"]
            )
            assert (await client.get("/v1/runs/nobody")).status_code == 404
            assert (await client.get("/v1/runs")).json() == {"runs": []}
