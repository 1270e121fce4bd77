"""``rollbridge eval run --upload`` end to end on the example workspace (real uv, real
processes): a complete run is published under its lock, a rerun of the finished run publishes
nothing new, and the real run directory is one osmosis-ai 0.3.8's uploader sends identically;
a Ctrl-C stops the upload and a failed one says how to retry, from wherever it ran."""

from __future__ import annotations

import hashlib
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from tests.rollout_server.interop_env import NoPython312, interop_python
from tests.upload.helpers import TOKEN, client_env, ours, run, write_credentials
from tests.upload.rundir import make_workspace
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


async def test_ctrl_c_stops_the_upload_and_the_log_stays_as_hashed(
    workspace: Path, env: dict[str, str], tmp_path: Path, nursery: trio.Nursery
) -> None:
    ws = _git_workspace(workspace)
    stand_in = StandIn(token=TOKEN, stall_puts=True)
    await nursery.start(stand_in.serve)
    write_credentials(tmp_path / "home", stand_in.url)
    cli_env = {**env, **client_env(tmp_path / "home", stand_in.url)}
    cli_env["UV_PROJECT_ENVIRONMENT"] = env["UV_PROJECT_ENVIRONMENT"]
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    argv = ours("eval", "run", CONFIG, "--yes", "--name", "up", "--upload", "--plain")
    with out.open("wb") as stdout, err.open("wb") as stderr, trio.fail_after(240):
        proc = await trio.lowlevel.open_process(
            argv, cwd=str(ws), env=cli_env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
        )
        try:
            await stand_in.put_stalled.wait()
            proc.send_signal(signal.SIGINT)  # one Ctrl-C: the stalled PUT must not hold it
            with trio.fail_after(30):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    printed = out.read_text() + err.read_text()
    assert code == 130, printed
    assert "Upload interrupted; run `rollbridge eval upload up` to resume." in printed
    assert "View:" not in printed
    run_dir = ws / ".osmosis" / "evals" / "up"
    start = next(r for r in stand_in.requests if r.route == "/api/cli/eval-runs/imports")
    hashed = next(f["sha256"] for f in start.body["files"] if f["path"] == "logs.txt")
    assert hashlib.sha256((run_dir / "logs.txt").read_bytes()).hexdigest() == hashed

    stand_in.stall_puts = False  # the command it printed resumes the same import
    done = await run(ours("eval", "upload", "up", "--json"), cwd=ws, env=cli_env)
    assert done.returncode == 0, done.stderr
    assert done.envelope()["result"]["eval_run_id"] == "er_1"


async def test_a_failed_upload_prints_a_retry_that_works_from_where_it_ran(
    workspace: Path, env: dict[str, str], tmp_path: Path, nursery: trio.Nursery
) -> None:
    ws = _git_workspace(workspace)
    # Another repository: its origin is not the run's, and the run's name means nothing there.
    elsewhere = make_workspace(tmp_path / "elsewhere", "https://github.com/Other/Repo")
    stand_in = StandIn(token=TOKEN)
    await nursery.start(stand_in.serve)
    stand_in.faults["start"] = ["before"]
    write_credentials(tmp_path / "home", stand_in.url)
    cli_env = {**env, **client_env(tmp_path / "home", stand_in.url)}
    cli_env["UV_PROJECT_ENVIRONMENT"] = env["UV_PROJECT_ENVIRONMENT"]
    argv = ours("eval", "run", str(ws / CONFIG), "--yes", "--name", "w1", "--upload")
    failed = await run(argv, cwd=elsewhere, env=cli_env, limit_s=240)
    assert failed.returncode == 1, failed.stderr + failed.stdout
    run_dir = ws / ".osmosis" / "evals" / "w1"
    error = failed.stderr[failed.stderr.index("Error: ") :]
    assert error.startswith(
        f"Error: Local evaluation results are complete at {run_dir}, but the platform upload "
        "failed: injected fault Retry with: rollbridge eval upload "
    )
    assert error.count("\n") == 1 and "kept" not in error and "--name" not in error
    # The run's results are shown before the upload's error: the run itself went well.
    assert "Results" in failed.stdout and "w1" in failed.stdout, failed.stdout
    retry = error.split("Retry with: rollbridge ")[1]
    assert shlex.split(retry) == ["eval", "upload", str(run_dir)]
    done = await run(ours(*shlex.split(retry), "--json"), cwd=elsewhere, env=cli_env)
    assert done.returncode == 0, done.stderr
    assert done.envelope()["result"]["eval_run_id"] == "er_1"
    api = [r for r in stand_in.requests if r.method == "POST"]
    assert {r.headers["x-osmosis-git"] for r in api} == {"acme/rollouts"}
