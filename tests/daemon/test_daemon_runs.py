"""Real child runs of the example workspace (with a paced rollout) driven through the daemon:
the event stream's exact resume, cancel stage 1, a ``kill -9`` of the daemon mid-run, and
several concurrent runs."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import trio

from tests.daemon.helpers import pace, running_daemon, sse_frames, start_daemon, wait_state
from tests.launcher.e2e.helpers import journal, run_cli, run_dir

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/echo.toml"


def _journal_lines(run: Path) -> list[bytes]:
    return (run / "events.jsonl").read_bytes().splitlines()


async def test_events_resume_exactly_after_a_disconnect(
    workspace: Path, env: dict[str, str]
) -> None:
    pace(workspace, 0.1)
    with trio.fail_after(120):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            started = await client.post(
                "/v1/runs", json={"config": CONFIG, "name": "sse", "max_in_flight": 2}
            )
            assert started.status_code == 202, started.text
            first: list[tuple[int, dict[str, object]]] = []
            async for event, event_id, data in sse_frames(client, "sse"):
                if event == "record":
                    assert event_id is not None
                    first.append((event_id, data))
                if len(first) == 5:
                    break
            rest: list[tuple[int, dict[str, object]]] = []
            ended = None
            async for event, event_id, data in sse_frames(client, "sse", last_id=first[-1][0]):
                if event == "record":
                    assert event_id is not None
                    rest.append((event_id, data))
                elif event == "end":
                    ended = data
            assert ended is not None and ended["state"] == "finished"
            ids = [i for i, _ in first + rest]
            assert ids == list(range(1, 22))
            lines = _journal_lines(run_dir(workspace, "sse"))
            assert [json.loads(line) for line in lines] == [d for _, d in first + rest]
            # A finished run replays from any cursor and ends.
            replay = [
                event_id
                async for event, event_id, _ in sse_frames(client, "sse", last_id=19)
                if event == "record"
            ]
            assert replay == [20, 21]


async def test_cancel_stage_one_then_resume_by_name(workspace: Path, env: dict[str, str]) -> None:
    pace(workspace, 3.0)
    with trio.fail_after(180):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            body = {"config": CONFIG, "name": "stop", "max_in_flight": 2}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            await wait_state(client, "stop", {"running"})
            cancel = await client.post("/v1/runs/stop/cancel", json={"stage": 1})
            assert cancel.status_code == 202
            doc = (await client.get("/v1/runs/stop")).json()
            assert doc["state"] == "cancelling" and doc["cancel_stage"] == 1
            final = await wait_state(client, "stop", {"cancelled", "finished", "failed"})
            assert final["state"] == "cancelled"
            assert final["pending"] > 0
            assert final["returncode"] == 130
            pace(workspace, 0.0)
            resumed = await client.post("/v1/runs", json=body)
            assert resumed.status_code == 202, resumed.text
            done = await wait_state(client, "stop", {"finished", "failed", "interrupted"})
            assert done["state"] == "finished"
            assert done["done"] == done["total"] == 21 and done["succeeded"] == 21


async def test_kill9_daemon_then_restart_finds_the_live_run(
    workspace: Path, env: dict[str, str]
) -> None:
    pace(workspace, 0.4)
    with trio.fail_after(180):
        daemon = await start_daemon(workspace, env)
        async with daemon.client() as client:
            body = {"config": CONFIG, "name": "survivor", "max_in_flight": 2}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            await wait_state(client, "survivor", {"running"})
        with trio.fail_after(10):
            while not journal(run_dir(workspace, "survivor")):
                await trio.sleep(0.05)
        daemon.process.send_signal(signal.SIGKILL)
        await daemon.process.wait()
        async with running_daemon(workspace, env) as again, again.client() as client:
            doc = (await client.get("/v1/runs/survivor")).json()
            assert doc["state"] == "running", doc
            assert (await client.get("/v1/daemon")).json()["runs_active"] == ["survivor"]
            ended = None
            ids = []
            async for event, event_id, data in sse_frames(client, "survivor", last_id=0):
                if event == "record":
                    ids.append(event_id)
                elif event == "end":
                    ended = data
            assert ended is not None and ended["state"] == "finished"
            assert ids == list(range(1, 22))
            # Not this daemon's child, so it saw no exit code: the one its end implies.
            final = (await client.get("/v1/runs/survivor")).json()
            assert final["returncode"] == 0, final
            assert final["returncode_source"] == "inferred"


RUNS = 8


async def test_concurrent_runs_all_finish_with_correct_totals(
    workspace: Path, env: dict[str, str]
) -> None:
    pace(workspace, 0.05)
    names = [f"c{i}" for i in range(RUNS)]
    with trio.fail_after(240):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:

            async def start(name: str) -> None:
                body = {"config": CONFIG, "name": name, "limit": 6}
                response = await client.post("/v1/runs", json=body)
                assert response.status_code == 202, response.text

            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(start, name)
            for name in names:
                doc = await wait_state(client, name, {"finished", "failed", "interrupted"}, 180)
                assert doc["state"] == "finished", doc
                assert (doc["total"], doc["done"], doc["succeeded"]) == (6, 6, 6)
            listed = (await client.get("/v1/runs?state=finished")).json()["runs"]
            assert sorted(r["name"] for r in listed) == names


async def test_a_run_started_in_a_terminal_is_followed_as_running(
    workspace: Path, env: dict[str, str]
) -> None:
    """A run `eval run` drives in a terminal (no child of this daemon) holds its run lock: the
    daemon shows it running, not interrupted, follows its events to the end, and refuses to
    cancel what it cannot stop, saying where to."""
    pace(workspace, 0.2)
    args = ["eval", "run", CONFIG, "--name", "term", "--yes", "--max-in-flight", "2"]
    with trio.fail_after(150):
        async with (
            running_daemon(workspace, env) as daemon,
            daemon.client() as client,
            trio.open_nursery() as nursery,
        ):
            done = trio.Event()

            async def terminal() -> None:
                result = await run_cli(args, cwd=workspace, env=env, timeout=120)
                assert result.returncode == 0, result.stderr
                done.set()

            nursery.start_soon(terminal)
            while (await client.get("/v1/runs/term")).status_code == 404:
                await trio.sleep(0.1)  # its directory is not made yet
            doc = await wait_state(client, "term", {"running"})
            assert doc.get("pid") is None and doc["cause"] is None and not done.is_set()
            refused = await client.post("/v1/runs/term/cancel", json={})
            assert refused.status_code == 409
            assert "Ctrl-C in its terminal" in refused.json()["error"]["message"]
            records, ended = 0, None
            async for event, _, data in sse_frames(client, "term"):
                records += event == "record"
                if event == "end":
                    ended = data
            assert ended is not None and ended["state"] == "finished" and records == 21
