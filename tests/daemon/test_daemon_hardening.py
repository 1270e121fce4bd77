"""Bad input and damaged run directories get a plain answer from the daemon, never a 500: the
API served in this process on port 0, over a workspace of hand-made run directories."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from launcher.daemon.api import ControlApp
from launcher.daemon.listen import bind_tcp, serve
from launcher.daemon.registry import Registry
from launcher.daemon.status import run_view
from tests.launcher.test_runs import make_run, ok


async def _shutdown(cancel: bool) -> None:
    raise AssertionError("not asked for")


def _info() -> dict[str, Any]:
    return {"version": "test", "pid": 1, "runs_active": []}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    for sub in ("configs/eval", "rollouts", "data"):
        (ws / sub).mkdir(parents=True)
    evals = ws / ".osmosis" / "evals"
    for name in ("good", "broken"):
        run = make_run(evals, name, records=[ok(0), ok(1), ok(2)])
        (run / "progress.json").write_text(json.dumps({"total_runs": 3}))
        (run / "metrics.json").write_text(json.dumps({"eval_run": {"status": "finished"}}))
    journal = evals / "broken" / "events.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join([lines[0], "{not json\n", *lines[1:]]))
    return ws


@pytest.fixture
async def client(nursery: trio.Nursery, workspace: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = ControlApp(Registry(workspace, nursery), _info, _shutdown)
    sock = bind_tcp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    await nursery.start(serve, [(sock, app)])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        yield http


async def test_a_corrupt_journal_fails_its_own_run_only(client: httpx.AsyncClient) -> None:
    with trio.fail_after(30):
        answer = await client.get("/v1/runs")
        assert answer.status_code == 200, answer.text
        runs = {doc["name"]: doc for doc in answer.json()["runs"]}
        assert runs["good"]["state"] == "finished"
        broken = runs["broken"]
        assert broken["state"] == "failed" and "corrupt at line 2: invalid JSON" in broken["cause"]
        assert broken["error"]["code"] == "JOURNAL_CORRUPT" and broken["done"] == 3
        one = await client.get("/v1/runs/broken")
        assert one.status_code == 200 and one.json()["cause"] == broken["cause"]
        async with client.stream("GET", "/v1/events") as stream:
            assert stream.status_code == 200
            lines = stream.aiter_lines()
            assert await anext(lines) == "event: runs"
            first = json.loads((await anext(lines)).removeprefix("data: "))
        states = {brief["name"]: brief["state"] for brief in first["runs"]}
        assert states == {"good": "finished", "broken": "failed"}


BAD_REQUESTS: list[tuple[str, str, Any, str]] = [
    ("GET", "/v1/runs?state=bogus", None, "state must be one of: starting, running"),
    ("POST", "/v1/runs", {"config": "configs/eval/echo.toml\u0000x"}, "NUL"),
    ("POST", "/v1/runs", {"config": "c.toml", "secrets": {"K": "a\u0000"}}, "NUL"),
    ("POST", "/v1/runs", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    # A request's secrets are credentials only: an address or a file would send the daemon's
    # keys (or the run's code) where the request says.
    *[
        ("POST", path, {**body, "secrets": {name: "x"}}, name)
        for path, body in (
            ("/v1/runs", {"config": "configs/eval/echo.toml"}),
            ("/v1/runs/good/rubric", {"rubric": "be kind", "model": "openai/x"}),
        )
        for name in ("OPENAI_BASE_URL", "HTTPS_PROXY", "UV_INDEX_URL", "OSMOSIS_TOKEN_PLATFORM_URL")
    ],
    ("POST", "/v1/runs/good/export", {"output": "/etc/x"}, "outside the workspace"),
    ("POST", "/v1/runs/good/export", {"output": "../elsewhere.jsonl"}, "outside the"),
    (
        "POST",
        "/v1/runs/good/rubric",
        {"rubric": "@/etc/passwd", "model": "openai/x"},
        "rubric @path /etc/passwd is outside the workspace",
    ),
    (
        "POST",
        "/v1/runs/good/rubric",
        {"rubric": "@../../secret.txt", "model": "openai/x"},
        "is outside the workspace",
    ),
    (
        "POST",
        "/v1/runs/good/rubric",
        {"rubric": "be kind", "model": "openai/x", "output": "/tmp/r.json"},
        "output /tmp/r.json is outside the workspace",
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "says"), BAD_REQUESTS)
async def test_bad_requests_are_400_with_one_line(
    client: httpx.AsyncClient, method: str, path: str, body: Any, says: str
) -> None:
    content = body if isinstance(body, str) else json.dumps(body) if body else None
    with trio.fail_after(30):
        answer = await client.request(method, path, content=content)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "VALIDATION" and says in error["message"], error
    assert "\n" not in error["message"]


async def test_directories_that_are_not_runs_are_not_runs(
    client: httpx.AsyncClient, workspace: Path
) -> None:
    evals = workspace / ".osmosis" / "evals"
    (evals / "x").mkdir()
    (evals / "notes").mkdir()
    (evals / "notes" / "README.md").write_text("mine")
    with trio.fail_after(30):
        listed = {doc["name"] for doc in (await client.get("/v1/runs")).json()["runs"]}
        assert listed == {"good", "broken"}
        for name in ("x", "notes"):
            for path in (f"/v1/runs/{name}", f"/v1/runs/{name}/report"):
                answer = await client.get(path)
                assert answer.status_code == 404, answer.text
                assert answer.json()["error"]["message"] == f"'{name}' is not a run directory"


def test_a_done_run_with_unreadable_metrics_is_finished(tmp_path: Path) -> None:
    run = make_run(tmp_path, "done", records=[ok(0), ok(1), ok(2)])
    (run / "progress.json").write_text(json.dumps({"total_runs": 3}))
    (run / "metrics.json").write_text("{torn")
    view = run_view(run, record=None, alive=False, child_envelope=None)
    assert (view.state, view.doc["pending"]) == ("finished", 0)
    assert view.doc["cause"] == "every work item has a result"


async def test_export_through_the_api_never_overwrites_a_journal(
    client: httpx.AsyncClient, workspace: Path
) -> None:
    journal = workspace / ".osmosis" / "evals" / "broken" / "events.jsonl"
    before = journal.read_bytes()
    with trio.fail_after(120):
        answer = await client.post(
            "/v1/runs/good/export", json={"output": ".osmosis/evals/broken/events.jsonl"}
        )
    assert answer.status_code == 400, answer.text
    assert "is under the workspace's .osmosis/" in answer.json()["error"]["message"]
    assert journal.read_bytes() == before
