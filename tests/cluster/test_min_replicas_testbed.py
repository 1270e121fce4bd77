"""``--ray-min-replicas 2`` on the two-node test bed: node 2 leaving halts the run with the
cause (terminal and logs.txt, exit 1, nothing failed because of it), and a resume without
``--ray`` finishes every row exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.cluster.conftest import ClusterBed, slow_workspace
from tests.cluster.test_ray_testbed import (
    CONFIG,
    _check_once,
    _env,
    _no_leftovers,
    _restore_node2,
)
from tests.launcher.e2e.helpers import count_log, journal, run_cli, run_dir, start_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.netns]

CAUSE = "only 1 of the 2 replicas the run needs are healthy"


async def test_too_few_replicas_halt_then_resume_without_ray_finishes(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    ws = slow_workspace(tmp_path / "ws", 3.0)
    run = run_dir(ws, "minimum")
    env = _env(testbed, slow_env)
    args = ["eval", "run", CONFIG, "--yes", "--name", "minimum", "--max-in-flight", "8"]
    ray = ["--ray", testbed.address, "--ray-min-replicas", "2"]
    cli = await start_cli([*args, *ray], cwd=tmp_path, env=env, logdir=tmp_path / "cli")
    try:
        try:
            await wait_for(
                lambda: (
                    count_log(run, "replica ready") >= 1
                    and count_log(run, "dispatching rollout") >= 8
                ),
                timeout=180,
            )
            await trio.to_thread.run_sync(testbed.script, "stop-n2")
            result = await cli.wait(timeout=300)
        finally:
            if cli.process.returncode is None:
                cli.kill9()
        assert result.returncode == 1, result.stderr + result.stdout
        assert CAUSE in result.stdout, result.stdout  # the terminal's "stopping dispatch" note
        assert count_log(run, "halting dispatch") == 1 and count_log(run, CAUSE) == 1
        records = journal(run)
        assert len(records) < 21
        assert len({(r["row_index"], r["run_index"]) for r in records}) == len(records)
        again = await run_cli([*args, "--plain"], cwd=tmp_path, env=env, timeout=300)
        assert again.returncode == 0, again.stderr + again.stdout
        _check_once(run)  # one failure in all: the example's own, none from the halt
        await _no_leftovers(ws, testbed)
    finally:
        await _restore_node2(testbed)
