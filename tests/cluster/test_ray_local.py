"""``eval run --ray local``: a one-node Ray cluster started (and stopped) by the run itself. The
supervisor's node has the local replica, so every row runs there; no root needed."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import socket
from pathlib import Path

import psutil
import pytest

from tests.cluster.conftest import slow_workspace
from tests.launcher.e2e.helpers import (
    CLIResult,
    base_env,
    count_log,
    journal,
    metrics,
    run_cli,
    run_dir,
    server_record,
    start_cli,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None, reason="needs Ray (the rollbridge[ray] extra)"
    ),
]


def _raylets() -> set[int]:
    return {
        p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("raylet", "gcs_server")
    }


async def _run_local(tmp_path: Path, ws: Path, name: str, env: dict[str, str]) -> CLIResult:
    """``eval run --ray local`` of the workspace's echo config under ``name``; checks that it
    exited 0 with each of the 21 rows journaled once."""
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/echo.toml", "--yes", "--plain", "--name", name,
         "--ray", "local"],
        cwd=tmp_path,
        env=env,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    keys = [(r["row_index"], r["run_index"]) for r in journal(run_dir(ws, name))]
    assert len(keys) == 21 == len(set(keys))
    return result


async def test_ray_local_runs_every_row_once_and_stops_its_cluster(
    slow_env: Path, tmp_path: Path
) -> None:
    ws = slow_workspace(tmp_path / "ws", 0.0)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    before = _raylets()
    env = base_env(
        UV_PROJECT_ENVIRONMENT=str(slow_env),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
    )
    result = await _run_local(tmp_path, ws, "loc", env)
    run = run_dir(ws, "loc")
    assert metrics(run)["summary"]["passed"] == 16
    assert count_log(run, "joining Ray cluster (local)") == 1
    assert count_log(run, "1 replica (no other node besides the supervisor's)") == 1
    # The next step repeats the run's runtime flags, --ray among them.
    assert (
        "Retry failures under the same name: rollbridge eval run ws/configs/eval/echo.toml "
        "--name loc --retry-failed --ray local"
    ) in result.stdout, result.stdout
    # The cluster the run started is gone with it.
    assert _raylets() <= before


async def test_ray_local_without_any_ray_auth_setting_makes_a_token_for_the_run(
    slow_env: Path, tmp_path: Path
) -> None:
    """``--ray local`` as a first-time user types it: no ``RAY_AUTH_*`` variable and no
    ``~/.ray/auth_token`` (and a ``RAY_ADDRESS`` left in the environment, below). Before the run set the auth mode ahead of importing Ray, its GCS
    exited for want of a token and the run failed after 30 s ("Timed out waiting for file")."""
    ws = slow_workspace(tmp_path / "ws", 0.0)
    home = tmp_path / "home"
    home.mkdir()
    env = base_env(
        UV_PROJECT_ENVIRONMENT=str(slow_env),
        RAY_USAGE_STATS_ENABLED="0",
        HOME=str(home),
        XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
    )
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    # A cluster address in the environment: Ray's ray.init prefers it to starting a cluster,
    # and nothing listens there; --ray local must start its own all the same.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        env["RAY_ADDRESS"] = f"127.0.0.1:{sock.getsockname()[1]}"
    await _run_local(tmp_path, ws, "first", env)
    # The token lived in the cluster's environment only.
    assert not (home / ".ray").exists()


async def test_the_supervisor_s_rollout_server_gets_no_ray_variable(
    slow_env: Path, tmp_path: Path
) -> None:
    """Under ``--ray`` the head's rollout server is started without Ray's variables, as the
    other nodes' replicas are, so a rollout sees the same environment wherever it runs (and
    the cluster's token, a secret, never reaches it)."""
    ws = slow_workspace(tmp_path / "ws", 1.0)
    token = secrets.token_hex(32)
    env = base_env(
        UV_PROJECT_ENVIRONMENT=str(slow_env),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        RAY_USAGE_STATS_ENABLED="0",
        RAY_DEDUP_LOGS="0",
    )
    cli = await start_cli(
        ["eval", "run", "ws/configs/eval/echo.toml", "--yes", "--plain", "--name", "env",
         "--ray", "local"],
        cwd=tmp_path,
        env=env,
        logdir=tmp_path,
    )  # fmt: skip
    run = run_dir(ws, "env")
    seen: dict[str, str] = {}

    def server_environ() -> bool:
        record = server_record(run)
        if record is None:
            return False
        with contextlib.suppress(psutil.Error):
            seen.update(psutil.Process(int(record["pid"])).environ())
        return bool(seen)

    try:
        await wait_for(server_environ, timeout=120)
    finally:
        result = await cli.wait(timeout=240)
    assert result.returncode == 0, result.stderr + result.stdout
    assert seen.get("ECHO_DELAY_S") == "1.0"  # the server's environment was read
    assert not [name for name in seen if name.startswith("RAY_")]
    assert token not in (run / "logs.txt").read_text()


async def test_sigterm_stops_a_ray_run_as_ctrl_c_does(slow_env: Path, tmp_path: Path) -> None:
    """A SIGTERM (a service manager's stop, `kill`) mid-dispatch: the run stops as after a
    Ctrl-C (exit 130, its last record written, a resume line) with no C++ stack dump of Ray's
    printed, and its cluster is gone."""
    ws = slow_workspace(tmp_path / "ws", 2.0)
    env = base_env(UV_PROJECT_ENVIRONMENT=str(slow_env), RAY_USAGE_STATS_ENABLED="0")
    before = _raylets()
    cli = await start_cli(
        ["eval", "run", "ws/configs/eval/echo.toml", "--yes", "--plain", "--name", "term",
         "--ray", "local", "--max-in-flight", "2"],
        cwd=tmp_path,
        env=env,
        logdir=tmp_path,
    )  # fmt: skip
    run = run_dir(ws, "term")
    try:
        await wait_for(lambda: len(journal(run)) >= 2, timeout=180)
    finally:
        cli.signal(signal.SIGTERM)
        result = await cli.wait(timeout=120)
    said = result.stderr + result.stdout
    assert result.returncode == 130, said
    assert "SIGTERM received" not in said and "logging.cc" not in said, said
    assert "Resume: rollbridge eval run" in result.stdout, said
    assert metrics(run)["eval_run"]["status"] != "running"
    assert count_log(run, "invocation ended") == 1
    assert _raylets() <= before
