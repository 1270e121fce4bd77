"""``POST /v1/runs`` takes ``ray`` and ``ray_min_replicas``: a bad value is a 400 with the
CLI's own line, a good one reaches the child's ``eval run`` as its flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from launcher.daemon.children import run_argv
from launcher.daemon.registry import ApiError, parse_start
from tests.daemon.helpers import running_daemon, wait_state
from tests.launcher.e2e.helpers import journal, run_cli, run_dir


def test_the_child_gets_the_flags() -> None:
    request = parse_start({"config": "c.toml", "ray": "local", "ray_min_replicas": 2})
    argv = run_argv(request.config, "n", request.flags)
    assert argv[argv.index("--ray") + 1] == "local"
    assert argv[argv.index("--ray-min-replicas") + 1] == "2"
    for bad in ("2", True, 1.5):
        with pytest.raises(ApiError, match="ray_min_replicas must be of type int"):
            parse_start({"config": "c.toml", "ray": "local", "ray_min_replicas": bad})


async def test_bad_values_are_a_400_with_the_cli_s_line(
    workspace: Path, env: dict[str, str]
) -> None:
    config = "configs/eval/echo.toml"
    with trio.fail_after(60):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            for body, flags in (
                (
                    {"ray": "local", "ray_min_replicas": 0},
                    ["--ray", "local", "--ray-min-replicas", "0"],
                ),
                ({"ray_min_replicas": 2}, ["--ray-min-replicas", "2"]),
                ({"ray": "10.0.0.1"}, ["--ray", "10.0.0.1"]),
            ):
                answer = await client.post("/v1/runs", json={"config": config, **body})
                assert answer.status_code == 400, answer.text
                assert answer.json()["error"]["code"] == "VALIDATION"
                cli = await run_cli(
                    ["eval", "run", config, "--yes", *flags], cwd=workspace, env=env
                )
                assert cli.returncode == 1
                assert cli.stderr.strip() == "Error: " + answer.json()["error"]["message"]
            assert (await client.get("/v1/runs")).json() == {"runs": []}


async def test_ctl_start_passes_shard_and_ray_flags(workspace: Path, env: dict[str, str]) -> None:
    """``rollbridge ctl start`` has the run flags the API takes: two shards started through it
    cover the rows once between them, and a bad ``--ray`` value is the CLI's own line."""
    config = "configs/eval/echo.toml"
    rows: dict[str, list[int]] = {}
    with trio.fail_after(240):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            for shard in ("0/2", "1/2"):
                name = "part-" + shard[0]
                started = await run_cli(
                    ["ctl", "start", config, "--name", name, "--shard", shard],
                    cwd=workspace,
                    env=env,
                )
                assert started.returncode == 0, started.stderr
                await wait_state(client, name, {"finished"})
                records = journal(run_dir(workspace, name))
                rows[name] = sorted(r["row_index"] for r in records)
            for flags in (["--ray", "local", "--ray-min-replicas", "0"], ["--ray", "10.0.0.1"]):
                refused = await run_cli(["ctl", "start", config, *flags], cwd=workspace, env=env)
                cli = await run_cli(
                    ["eval", "run", config, "--yes", *flags], cwd=workspace, env=env
                )
                assert refused.returncode != 0
                assert refused.stderr.strip() == cli.stderr.strip()
                assert "--ray" in refused.stderr
    assert rows["part-0"] and rows["part-1"]
    assert sorted(rows["part-0"] + rows["part-1"]) == list(range(21))
