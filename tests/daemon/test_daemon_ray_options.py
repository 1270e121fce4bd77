"""``POST /v1/runs`` takes ``ray`` and ``ray_min_replicas``: a bad value is a 400 with the
CLI's own line, a good one reaches the child's ``eval run`` as its flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from launcher.daemon.children import run_argv
from launcher.daemon.registry import ApiError, parse_start
from tests.daemon.helpers import running_daemon
from tests.launcher.e2e.helpers import run_cli


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
