"""``rollbridge eval run --upload`` end to end on the example workspace (real uv, real
processes): a complete run is published under its lock, a rerun of the finished run publishes
nothing new, and the real run directory is one osmosis-ai 0.3.8's uploader sends identically."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from tests.rollout_server.interop_env import NoPython312, interop_python
from tests.upload.helpers import TOKEN, client_env, ours, run, write_credentials
from tests.upload.standin import StandIn
from tests.upload.test_interop import _sequence

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/echo.toml"


def _git_workspace(ws: Path) -> Path:
    (ws / "configs" / "training").mkdir(parents=True, exist_ok=True)  # the reference wants it
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    subprocess.run(
        ["git", "-C", str(ws), "remote", "add", "origin", "git@github.com:Acme/Rollouts.git"],
        check=True,
    )
    return ws


async def test_eval_run_upload_publishes_a_complete_run(
    workspace: Path, env: dict[str, str], tmp_path: Path, nursery: trio.Nursery
) -> None:
    ws = _git_workspace(workspace)
    stand_in = StandIn(token=TOKEN)
    await nursery.start(stand_in.serve)
    write_credentials(tmp_path / "home", stand_in.url)
    cli_env = {**env, **client_env(tmp_path / "home", stand_in.url)}
    cli_env["UV_PROJECT_ENVIRONMENT"] = env["UV_PROJECT_ENVIRONMENT"]
    argv = ours("eval", "run", CONFIG, "--yes", "--name", "up", "--upload", "--json")
    done = await run(argv, cwd=ws, env=cli_env, limit_s=240)
    assert done.returncode == 0, done.stderr + done.stdout
    resource = done.envelope()["result"]
    assert resource["upload"]["status"] == "finalized"
    assert resource["upload"]["eval_run_id"] == "er_1"
    assert resource["platform_url"] == "https://platform.example/evals/er_1"
    start = next(r for r in stand_in.requests if r.route == "/api/cli/eval-runs/imports")
    assert start.body["provenance"]["config_path"] == CONFIG
    assert start.body["reimport"] is False
    assert start.headers["x-osmosis-git"] == "acme/rollouts"
    run_dir = ws / ".osmosis" / "evals" / "up"
    paths = {f["path"] for f in start.body["files"]}
    assert {"index.jsonl", "progress.json", "logs.txt"} <= paths
    assert any(p.endswith("/trajectory.json") for p in paths)
    assert stand_in.stored == {p: (run_dir / p).read_bytes() for p in paths}
    assert TOKEN not in done.stdout + done.stderr
    assert TOKEN.encode() not in (run_dir / "logs.txt").read_bytes()

    # The run is complete: a rerun dispatches nothing and the upload sends nothing again.
    puts = sum(r.method == "PUT" for r in stand_in.requests)
    again = await run(argv, cwd=ws, env=cli_env, limit_s=240)
    assert again.returncode == 0, again.stderr + again.stdout
    assert again.envelope()["result"]["upload"]["eval_run_id"] == "er_1"
    assert sum(r.method == "PUT" for r in stand_in.requests) == puts


async def test_a_real_run_directory_uploads_as_the_reference_uploads_it(
    workspace: Path, env: dict[str, str], tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A run directory ``eval run`` really wrote, uploaded by osmosis-ai 0.3.8 and by us."""
    try:
        python = await trio.to_thread.run_sync(interop_python, ("eval",))
    except NoPython312 as exc:
        pytest.skip(f"needs Python 3.12 for osmosis-ai 0.3.8: {exc}")
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        pytest.skip(f"needs osmosis-ai 0.3.8 installed in a Python 3.12 venv: {exc}")
    ws = _git_workspace(workspace)
    made = await run(
        ours("eval", "run", CONFIG, "--yes", "--name", "real"), cwd=ws, env=env, limit_s=240
    )
    assert made.returncode == 0, made.stderr + made.stdout
    stand_ins = []
    for argv in ([python, "-m", "osmosis_ai.cli.main"], ours()):
        stand_in = StandIn(token=TOKEN)
        await nursery.start(stand_in.serve)
        write_credentials(tmp_path / "home", stand_in.url)
        upload_env = client_env(tmp_path / "home", stand_in.url)
        done = await run([*argv, "eval", "upload", "real"], cwd=ws, env=upload_env, limit_s=120)
        assert done.returncode == 0, done.stdout + done.stderr
        stand_ins.append(stand_in)
    reference, mine = stand_ins
    assert _sequence(mine) == _sequence(reference)
    assert mine.stored == reference.stored
    assert any(p.endswith("/trajectory.json") for p in mine.stored)


async def test_eval_run_upload_without_login_fails_before_running(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    ws = _git_workspace(workspace)
    cli_env = {**env, **client_env(tmp_path / "nobody", "http://127.0.0.1:9")}
    cli_env["UV_PROJECT_ENVIRONMENT"] = env["UV_PROJECT_ENVIRONMENT"]
    done = await run(ours("eval", "run", CONFIG, "--yes", "--upload"), cwd=ws, env=cli_env)
    assert done.returncode == 1
    assert done.stderr.endswith(
        "Error: Not logged in to http://127.0.0.1:9. "
        "Run 'osmosis auth login' (the osmosis-ai CLI) or set OSMOSIS_TOKEN.\n"
    )
    assert not (ws / ".osmosis" / "evals").exists()
    misuse = await run(ours("eval", "run", CONFIG, "--workspace", "w"), cwd=ws, env=cli_env)
    assert misuse.returncode == 2 and "--workspace names the platform workspace" in misuse.stderr
