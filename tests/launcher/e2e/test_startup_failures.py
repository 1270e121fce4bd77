"""Start-up failures: each is one ``Error:`` line that says what to do, exit 1, nothing left
running, and the run directory stays resumable."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.launcher.e2e.helpers import (
    base_env,
    journal,
    metrics,
    processes_in_group,
    run_cli,
    run_dir,
    write_config,
)

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"


def _one_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: ") and "Traceback" not in stderr
    return lines[0]


async def test_missing_entrypoint(workspace: Path, env: dict[str, str], tmp_path: Path) -> None:
    config = (workspace / "configs" / "eval" / "echo.toml").read_text()
    write_config(workspace, "noentry", config.replace('"main.py"', '"missing.py"'))
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/noentry.toml", "--yes", "--name", "ne"],
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1
    line = _one_error(result.stderr)
    assert "rollout entrypoint" in line and "missing.py does not exist" in line
    assert journal(run_dir(workspace, "ne")) == []


async def test_dependencies_that_do_not_resolve(workspace: Path, tmp_path: Path) -> None:
    pyproject = workspace / "rollouts" / "echo" / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            'dependencies = ["rollbridge"]', 'dependencies = ["rollbridge", "nothere-rb-test"]'
        )
    )
    # Offline, so that uv fails at once, and without reaching a package index.
    env = base_env(UV_OFFLINE="1")
    result = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "deps"], cwd=tmp_path, env=env
    )
    assert result.returncode == 1
    line = _one_error(result.stderr)
    assert line.startswith("Error: uv sync failed for rollouts/echo with exit code"), line
    assert "Logs: ws/.osmosis/evals/deps/logs.txt" in line
    logged = (run_dir(workspace, "deps") / "logs.txt").read_text()
    assert "[deps]" in logged
    assert "nothere-rb-test" in logged  # uv's account of why, in full


async def test_a_path_source_that_points_at_nothing(workspace: Path, tmp_path: Path) -> None:
    """Refused before uv runs, naming the package and the entry (launcher.rollout_env)."""
    pyproject = workspace / "rollouts" / "echo" / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text()
        .replace('dependencies = ["rollbridge"]', 'dependencies = ["rollbridge", "nothere"]')
        .replace(
            "[tool.uv.sources]\n",
            '[tool.uv.sources]\nnothere = { path = "/nonexistent/nothere" }\n',
        )
    )
    result = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "deps"], cwd=tmp_path, env=base_env()
    )
    assert result.returncode == 1
    assert _one_error(result.stderr) == (
        "Error: rollouts/echo/pyproject.toml takes nothere from the path '/nonexistent/nothere' "
        "(/nonexistent/nothere) in [tool.uv.sources], where there is no Python project: fix or "
        "remove that entry (run 'deps' kept: resume with --name deps)"
    )
    assert "[deps] Resolved" not in (run_dir(workspace, "deps") / "logs.txt").read_text()


async def test_server_that_exits_at_start_and_a_resume_after_the_fix(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    main = workspace / "rollouts" / "echo" / "main.py"
    original = main.read_text()
    main.write_text("raise SystemExit('boom: cannot start')\n")
    config = (workspace / "configs" / "eval" / "echo.toml").read_text()
    write_config(workspace, "crash", config)
    args = ["eval", "run", "ws/configs/eval/crash.toml", "--yes", "--name", "boom"]
    result = await run_cli(args, cwd=tmp_path, env=env)
    assert result.returncode == 1
    line = _one_error(result.stderr)
    assert (
        "rollout server exited with code 1 before becoming healthy: boom: cannot start "
        "(each of 2 attempts, on a new port each)" in line
    )
    run = run_dir(workspace, "boom")
    assert not (run / "server.json").exists()
    assert metrics(run)["eval_run"]["status"] == "incomplete"
    # Fixing the source changes the rollout digest, so the run asks for --fresh.
    main.write_text(original)
    refused = await run_cli(args, cwd=tmp_path, env=env)
    assert "Changed: rollout" in _one_error(refused.stderr)
    fresh = await run_cli([*args, "--fresh"], cwd=tmp_path, env=env)
    assert fresh.returncode == 0, fresh.stderr


async def test_port_owned_by_another_process(
    workspace: Path, env: dict[str, str], tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A squatter answering /health with another instance id is never mistaken for ours."""

    async def squatter(stream: trio.SocketStream) -> None:
        body = json.dumps({"status": "ok", "instance_id": "someone-else"}).encode()
        try:
            await stream.receive_some(65536)
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, squatter, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    result = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "port", "--rollout-port", str(port)],
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1
    line = _one_error(result.stderr)
    assert (
        f"another process is already listening on http://127.0.0.1:{port}" in line
        and "instance_id='someone-else'" in line
    ) or "rollout server exited with code" in line
    assert not (run_dir(workspace, "port") / "server.json").exists()


async def test_non_interactive_without_yes_and_a_held_lock(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    result = await run_cli(["eval", "run", CONFIG, "--name", "ask"], cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert _one_error(result.stderr) == "Error: Use --yes to confirm in non-interactive mode."
    run = run_dir(workspace, "ask")
    assert journal(run) == [] and not (run / "server.json").exists()

    lock_dir = workspace / ".osmosis" / "evals" / ".locks"
    holder = await trio.lowlevel.open_process(
        [
            "python3",
            "-c",
            "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT, 0o600); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(lock_dir / "ask.lock"),
        ],
        stdout=-1,
    )
    try:
        assert holder.stdout is not None
        with trio.fail_after(10):
            await holder.stdout.receive_some(16)
        busy = await run_cli(
            ["eval", "run", CONFIG, "--name", "ask", "--yes"], cwd=tmp_path, env=env
        )
        assert busy.returncode == 1
        assert (
            "already holds" in _one_error(busy.stderr) and "use a different --name" in busy.stderr
        )
    finally:
        holder.kill()
        await holder.wait()
    assert not processes_in_group(holder.pid)
