"""What an editor extension needs from the daemon (issue 27 item 16), against a live daemon and
real runs of the example workspace: health, the workspace's configs, rollouts and datasets, a
config validated without starting a run, one event stream for the whole workspace, diff,
export and rubric through the API, the OpenAPI description (every path it names is answered)
and the eval config's JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from launcher.config_schema import eval_config_schema
from tests.daemon.helpers import pace, running_daemon, wait_state
from tests.launcher.e2e.helpers import run_cli

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/echo.toml"


async def _workspace_frames(
    client: httpx.AsyncClient,
    frames: list[tuple[str, dict[str, Any]]],
    until: Any,
    started: trio.Event,
) -> None:
    """Append ``(event, data)`` of ``GET /v1/events`` to ``frames`` until ``until(frames)``;
    ``started`` is set once the first frame (the snapshot) is in."""
    async with client.stream("GET", "/v1/events") as response:
        assert response.status_code == 200
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                frames.append((event, json.loads(line[6:])))
                started.set()
                if until(frames):
                    return


async def test_listings_health_validation_and_schema(workspace: Path, env: dict[str, str]) -> None:
    (workspace / "configs" / "eval" / "broken.toml").write_text("[experiment]\nrollout = 1\n")
    with trio.fail_after(60):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            health = (await client.get("/v1/health")).json()
            assert health["status"] == "ok" and health["pid"] == daemon.process.pid
            configs = (await client.get("/v1/configs")).json()["configs"]
            by_name = {c["name"]: c for c in configs}
            assert by_name["echo"]["loads"] and by_name["echo"]["model"] == "rollbridge/echo"
            assert by_name["echo"]["path"] == CONFIG
            assert not by_name["broken"]["loads"]
            assert by_name["broken"]["error"].startswith("Missing 'entrypoint'")
            rollouts = (await client.get("/v1/rollouts")).json()["rollouts"]
            assert [r["name"] for r in rollouts] == ["echo"] and rollouts[0]["has_pyproject"]
            datasets = (await client.get("/v1/datasets")).json()["datasets"]
            assert [(d["name"], d["format"]) for d in datasets] == [("echo.jsonl", "jsonl")]

            ok = await client.post("/v1/configs/validate", json={"config": CONFIG, "rows": "0-4"})
            assert ok.status_code == 200, ok.text
            assert ok.json()["valid"] and ok.json()["work_items"] == 5
            bad = await client.post("/v1/configs/validate", json={"config": CONFIG, "rows": "5-x"})
            assert bad.status_code == 400
            cli = await run_cli(
                ["eval", "run", CONFIG, "--rows", "5-x", "--yes"], cwd=workspace, env=env
            )
            assert cli.stderr.strip() == "Error: " + bad.json()["error"]["message"]
            assert not (workspace / ".osmosis" / "evals").exists() or not list(
                (workspace / ".osmosis" / "evals").iterdir()
            )

            schema = (await client.get("/v1/schema/eval-config.json")).json()
            assert schema == eval_config_schema()
            api = (await client.get("/v1/openapi.json")).json()
            assert api["openapi"].startswith("3.1")


async def test_workspace_events_diff_export_rubric_and_every_described_path(
    workspace: Path, env: dict[str, str]
) -> None:
    pace(workspace, 0.0)
    with trio.fail_after(240):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            async with trio.open_nursery() as nursery:
                seen: list[tuple[str, dict[str, Any]]] = []

                def a_finished(frames: list[tuple[str, dict[str, Any]]]) -> bool:
                    return any(e == "run" and d["state"] == "finished" for e, d in frames)

                snapshot = trio.Event()
                nursery.start_soon(_workspace_frames, client, seen, a_finished, snapshot)
                await snapshot.wait()
                body = {"config": CONFIG, "name": "one"}
                assert (await client.post("/v1/runs", json=body)).status_code == 202
            assert seen[0] == ("runs", {"runs": []})
            one = [d for e, d in seen if e == "run"]
            assert one[0]["name"] == "one" and one[0]["previous_state"] is None
            assert one[-1]["state"] == "finished" and one[-1]["previous_state"] != "finished"
            assert one[-1]["done"] == 21

            body = {"config": CONFIG, "name": "two"}
            assert (await client.post("/v1/runs", json=body)).status_code == 202
            await wait_state(client, "two", {"finished"})
            diff = await client.get("/v1/diff", params={"a": "one", "b": "two"})
            assert diff.status_code == 200, diff.text
            assert isinstance(diff.json(), dict)
            page = await client.get("/v1/diff", params={"a": "one", "b": "two", "page": "1"})
            assert page.headers["content-type"].startswith("text/html")
            missing = await client.get("/v1/diff", params={"a": "one", "b": "nobody"})
            assert missing.status_code == 404

            export = await client.post("/v1/runs/one/export", json={})
            assert export.status_code == 200, export.text
            exported = workspace / ".osmosis" / "evals" / "one" / "export.jsonl"
            assert len(exported.read_text().splitlines()) == 21
            assert str(exported) in json.dumps(export.json())
            wrong = await client.post("/v1/runs/one/export", json={"format": "xml"})
            assert wrong.status_code == 400
            no_rubric = await client.post("/v1/runs/one/rubric", json={"model": "openai/x"})
            assert no_rubric.status_code == 400
            cli = await run_cli(
                ["eval", "rubric", "--run", "one", "-r", "x", "--model", "nomodel"],
                cwd=workspace,
                env=env,
            )
            rubric = await client.post(
                "/v1/runs/one/rubric", json={"rubric": "x", "model": "nomodel"}
            )
            assert rubric.status_code >= 400
            assert cli.stderr.strip() == "Error: " + rubric.json()["error"]["message"]

            # Every path the OpenAPI description names is a route the daemon answers.
            api = (await client.get("/v1/openapi.json")).json()
            for template, methods in api["paths"].items():
                path = template.format(name="one", row=0, run=0)
                for method in methods:
                    if method == "get" and path.endswith("events"):
                        continue  # streams; answered above and in the other tests
                    if path == "/v1/shutdown":
                        continue
                    answer = await client.request(method.upper(), path, content=b"[]")
                    if answer.status_code == 404:
                        assert answer.json()["error"]["message"] != "no such route", path


async def test_validate_refuses_what_the_start_would(workspace: Path, env: dict[str, str]) -> None:
    """A resume with other inputs (409), a required secret nowhere to be found (400) and an
    empty name (400) are refused by validate exactly as by the start, before anything runs."""
    config = (workspace / CONFIG).read_text()
    secret_config = "configs/eval/secret.toml"
    (workspace / secret_config).write_text(
        config.replace("required = []", 'required = ["MY_SECRET_TOKEN"]')
    )
    done = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "done1", "--limit", "4"], cwd=workspace, env=env
    )
    assert done.returncode == 0, done.stderr
    with trio.fail_after(90):
        async with running_daemon(workspace, env) as daemon, daemon.client() as client:
            same = {"config": CONFIG, "name": "done1", "limit": 4}
            assert (await client.post("/v1/configs/validate", json=same)).status_code == 200
            other = {**same, "limit": 2}
            checked = await client.post("/v1/configs/validate", json=other)
            assert checked.status_code == 409, checked.text
            assert "Changed: dataset" in checked.json()["error"]["message"]
            started = await client.post("/v1/runs", json=other)
            assert started.status_code == 409
            assert started.json()["error"] == checked.json()["error"]

            lacking = {"config": secret_config}
            checked = await client.post("/v1/configs/validate", json=lacking)
            assert checked.status_code == 400, checked.text
            assert checked.json()["error"]["code"] == "INTERACTIVE_REQUIRED"
            assert "MY_SECRET_TOKEN" in checked.json()["error"]["message"]
            given = {**lacking, "secrets": {"MY_SECRET_TOKEN": "s3cr3t-value"}}
            assert (await client.post("/v1/configs/validate", json=given)).status_code == 200

            for path in ("/v1/configs/validate", "/v1/runs"):
                empty = await client.post(path, json={"config": CONFIG, "name": ""})
                assert empty.status_code == 400, empty.text
                assert empty.json()["error"]["message"] == "run name must not be empty"
            runs = (await client.get("/v1/runs")).json()["runs"]
            assert [r["name"] for r in runs] == ["done1"]
