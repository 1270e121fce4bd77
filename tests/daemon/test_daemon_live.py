"""What the daemon shows of a run while it is in flight (real child runs of the paced example
workspace): live usage from the bridge (``in_flight``, ``GET …/usage``, ``event: usage``),
``logs?tail=N&follow=1``, the report page, and a stage-2 cancel of rollouts stuck in cleanup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from launcher.process import STOP_GRACE_S
from tests.daemon.helpers import pace, running_daemon, sse_frames, wait_state
from tests.launcher.e2e.helpers import journal, run_dir

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/echo.toml"


async def _follow_logs(
    client: httpx.AsyncClient, name: str, tail: int, out: list[tuple[int, str]]
) -> None:
    url = f"/v1/runs/{name}/logs?tail={tail}&follow=1"
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        event, event_id = "", None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: ") and event == "log":
                assert event_id is not None
                out.append((event_id, json.loads(line[6:])["line"]))
            elif line.startswith("data: ") and event == "end":
                return


async def _wait_live_usage(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """Until two rollouts are in flight and the bridge has counted a call for each."""
    with trio.fail_after(60):
        while True:
            doc = (await client.get(f"/v1/runs/{name}")).json()
            usage = (await client.get(f"/v1/runs/{name}/usage")).json()
            calls = [r["calls"] for r in usage["rollouts"]]
            totals = usage["totals"] or {}
            same = doc["tokens_in_flight"] == totals.get("total_tokens")  # one sample, two reads
            if doc["in_flight"] == 2 and usage["live"] and calls == [1, 1] and same:
                return {"run": doc, "usage": usage}
            await trio.sleep(0.1)


async def test_live_usage_logs_follow_and_report(workspace: Path, env: dict[str, str]) -> None:
    pace(workspace, 1.5)
    name = "live"
    with trio.fail_after(180):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            body = {"config": CONFIG, "name": name, "max_in_flight": 2, "limit": 6}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            await wait_state(client, name, {"running"})
            logs = run_dir(workspace, name) / "logs.txt"
            lines_before = len(logs.read_text().splitlines())
            followed: list[tuple[int, str]] = []
            usage_events: list[dict[str, Any]] = []
            ended: dict[str, Any] | None = None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_follow_logs, client, name, 2, followed)
                seen = await _wait_live_usage(client, name)
                async for event, event_id, data in sse_frames(client, name):
                    if event == "usage":
                        assert event_id is None  # never moves the resume cursor
                        usage_events.append(data)
                    elif event == "end":
                        ended = data
            assert ended is not None and ended["state"] == "finished"

            # In flight: two rollouts, each with the one call the paced rollout makes.
            usage = seen["usage"]
            assert usage["totals"]["total_tokens"] == sum(
                r["total_tokens"] for r in usage["rollouts"]
            )
            assert all(r["total_tokens"] > 0 for r in usage["rollouts"])
            # Each live count equals the tokens the journal recorded for that item later.
            records = {
                (r["row_index"], r["run_index"]): r for r in journal(run_dir(workspace, name))
            }
            live = [r for e in usage_events for r in e["rollouts"]] + usage["rollouts"]
            assert usage_events and all(e["rollouts"] for e in usage_events[:1])
            for rollout in live:
                record = records[(rollout["row_index"], rollout["run_index"])]
                assert record["rollout_id"] == rollout["rollout_id"]
                assert record["tokens"] == rollout["total_tokens"]

            # Finished: nothing in flight any more; the recorded totals are the journal's.
            after = (await client.get(f"/v1/runs/{name}/usage")).json()
            assert after["live"] is False and after["rollouts"] == []
            assert after["recorded"] == {
                "done": 6,
                "tokens": sum(r["tokens"] for r in records.values()),
            }
            assert (await client.get(f"/v1/runs/{name}")).json()["in_flight"] is None

            # logs?tail=2&follow=1: the two last lines at the time, then every later one.
            all_lines = logs.read_text().splitlines()
            ids = [i for i, _ in followed]
            assert ids[0] <= lines_before - 1
            assert ids == list(range(ids[0], len(all_lines) + 1))
            assert [text for _, text in followed] == all_lines[ids[0] - 1 :]

            # The report page of the run, as `rollbridge eval report` renders it.
            page = await client.get(f"/v1/runs/{name}/report")
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert f"<h1>{name}</h1>" in page.text
            assert (await client.get("/v1/runs/nobody/report")).status_code == 404


async def test_cancel_stage_two_ends_within_the_grace(workspace: Path, env: dict[str, str]) -> None:
    # Rollouts that ignore cancellation: the first Ctrl-C waits for their cleanup (up to the
    # long stop grace); the second gives the rollout server STOP_GRACE_S, then kills it.
    pace(workspace, 600.0, shielded=True)
    name = "stuck"
    with trio.fail_after(180):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            body = {"config": CONFIG, "name": name, "max_in_flight": 2}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            await _wait_live_usage(client, name)
            assert (await client.post(f"/v1/runs/{name}/cancel", json={"stage": 1})).is_success
            await trio.sleep(2.0)
            doc = (await client.get(f"/v1/runs/{name}")).json()
            assert doc["state"] == "cancelling" and doc["cancel_stage"] == 1
            second = await client.post(f"/v1/runs/{name}/cancel", json={"stage": 2})
            assert second.json() == {"name": name, "cancel_stage": 2}
            with trio.fail_after(STOP_GRACE_S + 20):
                final = await wait_state(client, name, {"cancelled", "failed", "finished"})
            assert final["state"] == "cancelled"
            assert final["returncode"] == 130
            assert final["pending"] == 21
