"""``rollbridge ctl watch`` (issue 27 item 17): one readable line per work item and per
milestone, never raw JSON; ``--json`` prints the stream's events, one JSON object a line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.daemon.helpers import pace, running_daemon, wait_state
from tests.launcher.e2e.helpers import run_cli

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/echo.toml"


async def test_watch_prints_one_readable_line_per_item(
    workspace: Path, env: dict[str, str]
) -> None:
    pace(workspace, 0.4)
    with trio.fail_after(180):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            body = {"config": CONFIG, "name": "seen", "rows": "0-4", "max_in_flight": 1}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            live = await run_cli(["ctl", "watch", "seen"], cwd=workspace, env=env)
            await wait_state(client, "seen", {"finished"})
            replay = await run_cli(["ctl", "watch", "seen"], cwd=workspace, env=env)
            as_json = await run_cli(["ctl", "watch", "seen", "--json"], cwd=workspace, env=env)
    expected = [f"row {row} run 0: success, reward 1" for row in range(5)]
    for watched in (live, replay):
        assert watched.returncode == 0, watched.stderr
        lines = watched.stdout.splitlines()
        assert not any("{" in line for line in lines), watched.stdout
        assert sorted(line for line in lines if line.startswith("row ")) == expected
        assert lines[-1] == "finished 5/5, pass 100%"
    # Live, the milestones are there too, but nothing per item beyond its one line.
    lines = live.stdout.splitlines()
    assert any(line.startswith("→ ") for line in lines), live.stdout
    assert not any("dispatching rollout" in line or "work item finished" in line for line in lines)
    # The children's own output (the rollout server's log lines, uv's) stays in logs.txt.
    milestones = [line for line in lines if line.startswith("→ ")]
    # (Stage events are those from the watch's start on: under load it attaches after the
    # first milestones, so only later ones are certain.)
    assert "→ invocation ended" in milestones, milestones
    assert not any("rollout_server INFO" in line or " + " in line for line in milestones)
    assert as_json.returncode == 0, as_json.stderr
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert sorted(e["data"]["row_index"] for e in events if e["event"] == "record") == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert [e["id"] for e in events if e["event"] == "record"] == [1, 2, 3, 4, 5]
    assert events[-1]["event"] == "end" and events[-1]["data"]["state"] == "finished"


async def test_watch_follows_the_run_across_a_daemon_restart(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """The daemon is stopped mid-run (SIGTERM: runs are not touched) and a new one started;
    ``ctl watch`` waits for it and goes on from its last event: every row once, then the end."""
    from tests.daemon.helpers import start_daemon
    from tests.launcher.e2e.helpers import journal, run_dir, start_cli, wait_for

    pace(workspace, 0.3)
    with trio.fail_after(180):
        daemon = await start_daemon(workspace, env)
        async with daemon.client() as client:
            body = {"config": CONFIG, "name": "across", "rows": "0-5", "max_in_flight": 1}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
        watcher = await start_cli(
            ["ctl", "watch", "across"], cwd=workspace, env=env, logdir=tmp_path / "watch"
        )
        await wait_for(lambda: len(journal(run_dir(workspace, "across"))) >= 1)
        daemon.process.terminate()
        await daemon.process.wait()
        await trio.sleep(1.0)  # the watcher finds no daemon for a while
        async with running_daemon(workspace, env):
            watched = await watcher.wait(timeout=120)
    assert watched.returncode == 0, watched.stderr + watched.stdout
    lines = watched.stdout.splitlines()
    rows = sorted(line for line in lines if line.startswith("row "))
    assert rows == [f"row {row} run 0: success, reward 1" for row in range(6)]
    assert lines[-1] == "finished 6/6, pass 100%"


def test_watch_shows_a_ray_run_s_replica_changes(capsys: pytest.CaptureFixture[str]) -> None:
    """The ``replicas`` event (a replica lost, suspect, added) is a line of its own."""
    from launcher.ctl import _Renderer

    render = _Renderer()
    line = "replicas: head 4 in flight · 10.203.0.2 lost · 1 lost"
    assert render("replicas", 7, {"line": line, "replicas": []}) is False
    assert render("replicas", 8, {"replicas": []}) is False  # no line: nothing to show
    assert capsys.readouterr().out == f"→ {line}\n"
