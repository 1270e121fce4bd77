"""``eval run --ray local``: a one-node Ray cluster started (and stopped) by the run itself. The
supervisor's node has the local replica, so every row runs there; no root needed."""

from __future__ import annotations

import importlib.util
import secrets
from pathlib import Path

import psutil
import pytest

from tests.cluster.conftest import slow_workspace
from tests.launcher.e2e.helpers import base_env, count_log, journal, metrics, run_cli, run_dir

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
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/echo.toml", "--yes", "--plain", "--name", "loc",
         "--ray", "local"],
        cwd=tmp_path,
        env=env,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    run = run_dir(ws, "loc")
    keys = [(r["row_index"], r["run_index"]) for r in journal(run)]
    assert len(keys) == 21 == len(set(keys))
    assert metrics(run)["summary"]["passed"] == 16
    assert count_log(run, "joining Ray cluster (local)") == 1
    assert count_log(run, "no other node besides the supervisor's") == 1
    # The cluster the run started is gone with it.
    assert _raylets() <= before
