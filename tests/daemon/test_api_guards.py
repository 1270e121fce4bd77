"""What a request may not make the daemon do: read or write its own files (or any under the
workspace's ``.osmosis/``), silently replace an existing file, turn ``out/`` into a file named
``out``, act on a body that is not a JSON object, or answer a whole log at once; and a
reconnecting log stream resumes where it was. The API served in this process on port 0, over
a workspace of hand-made run directories."""

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
from launcher.daemon.registry import ApiError, Registry
from launcher.daemon.tools import rubric_args
from tests.launcher.test_runs import make_run, ok

TOKEN = "secret-token-of-the-daemon"
LOG_LINES = [f"2026-01-02T03:04:0{i}Z INFO [run] line {i + 1}" for i in range(5)]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    for sub in ("configs/eval", "rollouts", "data"):
        (ws / sub).mkdir(parents=True)
    (ws / "configs" / "eval" / "echo.toml").write_text("# the user's config\n")
    run = make_run(ws / ".osmosis" / "evals", "good", records=[ok(0), ok(1), ok(2)])
    (run / "progress.json").write_text(json.dumps({"total_runs": 3}))
    (run / "metrics.json").write_text(json.dumps({"eval_run": {"status": "finished"}}))
    (run / "logs.txt").write_text("".join(line + "\n" for line in LOG_LINES))
    osmosis = ws / ".osmosis"
    (osmosis / "daemon.json").write_text(json.dumps({"token": TOKEN}))
    (osmosis / "daemon.lock").write_text("")
    (osmosis / "daemon" / "runs").mkdir(parents=True)
    (osmosis / "daemon" / "runs" / "good.json").write_text("{}")
    (ws / "link").symlink_to(osmosis, target_is_directory=True)
    return ws


class Shutdowns:
    def __init__(self) -> None:
        self.asked: list[bool] = []

    async def __call__(self, cancel: bool) -> None:
        self.asked.append(cancel)


@pytest.fixture
def shutdowns() -> Shutdowns:
    return Shutdowns()


@pytest.fixture
async def client(
    nursery: trio.Nursery, workspace: Path, shutdowns: Shutdowns
) -> AsyncIterator[httpx.AsyncClient]:
    def info() -> dict[str, Any]:
        return {"version": "test", "pid": 1, "runs_active": []}

    app = ControlApp(Registry(workspace, nursery), info, shutdowns)
    sock = bind_tcp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    await nursery.start(serve, [(sock, app)])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        yield http


def _snapshot(workspace: Path) -> dict[str, bytes]:
    """Every regular file of the workspace (symlinks not followed) and its bytes."""
    return {
        str(path.relative_to(workspace)): path.read_bytes()
        for path in sorted(workspace.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def _refusal(answer: httpx.Response, status: int, says: str) -> None:
    assert answer.status_code == status, answer.text[:300]
    message = answer.json()["error"]["message"]
    assert says in message and "\n" not in message, message


OSMOSIS_OUTPUTS = [
    ".osmosis/daemon.json",
    ".osmosis/daemon.lock",
    ".osmosis/daemon/runs/good.json",
    ".osmosis/evals/good/new-export.jsonl",
    ".osmosis/new.jsonl",
    "link/daemon.json",
    "link/elsewhere.jsonl",
    "configs/../.osmosis/daemon.json",
]


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("output", OSMOSIS_OUTPUTS)
@pytest.mark.parametrize("route", ["export", "rubric"])
async def test_no_output_under_osmosis_even_with_overwrite(
    client: httpx.AsyncClient, workspace: Path, route: str, output: str, overwrite: bool
) -> None:
    before = _snapshot(workspace)
    body: dict[str, Any] = {"output": output}
    if overwrite:
        body["overwrite"] = True
    if route == "rubric":
        body |= {"rubric": "be kind", "model": "openai/x"}
    with trio.fail_after(120):
        answer = await client.post(f"/v1/runs/good/{route}", json=body)
    _refusal(answer, 400, f"output {output} is under the workspace's .osmosis/")
    assert _snapshot(workspace) == before


@pytest.mark.parametrize("rubric", ["@.osmosis/daemon.json", "@link/daemon.json"])
async def test_a_rubric_is_never_read_from_the_daemons_files(
    client: httpx.AsyncClient, workspace: Path, rubric: str
) -> None:
    before = _snapshot(workspace)
    body = {"rubric": rubric, "model": "openai/x", "output": "report.json"}
    with trio.fail_after(120):
        answer = await client.post("/v1/runs/good/rubric", json=body)
    _refusal(answer, 400, f"rubric @path {rubric[1:]} is under the workspace's .osmosis/")
    assert TOKEN not in answer.text
    assert _snapshot(workspace) == before


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/configs/validate"])
async def test_a_secrets_file_is_never_one_of_the_daemons_files(
    client: httpx.AsyncClient, path: str
) -> None:
    body = {"config": "configs/eval/echo.toml", "secrets_file": ".osmosis/daemon.json"}
    with trio.fail_after(60):
        answer = await client.post(path, json=body)
    _refusal(answer, 400, "secrets_file .osmosis/daemon.json is under the workspace's .osmosis/")


async def test_an_existing_file_is_replaced_only_with_overwrite(
    client: httpx.AsyncClient, workspace: Path
) -> None:
    config = workspace / "configs" / "eval" / "echo.toml"
    before = config.read_bytes()
    out = workspace / "out" / "rows.jsonl"
    with trio.fail_after(120):
        answer = await client.post(
            "/v1/runs/good/export", json={"output": "configs/eval/echo.toml"}
        )
        _refusal(answer, 409, 'output configs/eval/echo.toml exists; send "overwrite": true')
        assert answer.json()["error"]["code"] == "CONFLICT"
        assert config.read_bytes() == before

        first = await client.post("/v1/runs/good/export", json={"output": "out/rows.jsonl"})
        assert first.status_code == 200, first.text
        assert len(out.read_text().splitlines()) == 3
        out.write_text("mine\n")
        again = await client.post("/v1/runs/good/export", json={"output": "out/rows.jsonl"})
        _refusal(again, 409, "output out/rows.jsonl exists")
        assert out.read_text() == "mine\n"
        forced = await client.post(
            "/v1/runs/good/export", json={"output": "out/rows.jsonl", "overwrite": True}
        )
        assert forced.status_code == 200, forced.text
        assert len(out.read_text().splitlines()) == 3


@pytest.mark.parametrize(("output", "says"), [("out/", "ends with '/'"), ("data", "directory")])
async def test_an_export_output_names_a_file(
    client: httpx.AsyncClient, workspace: Path, output: str, says: str
) -> None:
    with trio.fail_after(120):
        answer = await client.post("/v1/runs/good/export", json={"output": output})
    _refusal(answer, 400, f"output {output} ")
    assert says in answer.json()["error"]["message"]
    assert not (workspace / "out").exists()
    assert (workspace / "data").is_dir()


def test_a_rubric_output_ending_in_slash_is_a_report_inside(workspace: Path) -> None:
    body = {"rubric": "x", "model": "m", "output": "reports/"}
    args = rubric_args(workspace, "good", body)
    assert args[args.index("--output") + 1] == f"{workspace.resolve() / 'reports'}/"
    (workspace / "reports").mkdir()
    (workspace / "reports" / "rubric_eval_result.json").write_text("{}")
    for output in ("reports/", "reports"):
        with pytest.raises(ApiError) as refused:
            rubric_args(workspace, "good", {**body, "output": output})
        assert refused.value.status == 409
        assert "rubric_eval_result.json" in refused.value.message
    args = rubric_args(workspace, "good", {**body, "overwrite": True})
    assert args[args.index("--output") + 1].endswith("/reports/")


@pytest.mark.parametrize("body", ["[1]", "true", '"x"', "2"])
async def test_cancel_and_shutdown_take_only_an_object(
    client: httpx.AsyncClient, shutdowns: Shutdowns, body: str
) -> None:
    with trio.fail_after(30):
        cancel = await client.post("/v1/runs/good/cancel", content=body)
        shutdown = await client.post("/v1/shutdown", content=body)
        runs = await client.post("/v1/runs", content=body)
    for answer in (cancel, shutdown, runs):
        _refusal(answer, 400, "the request body must be a JSON object")
    assert shutdowns.asked == []


@pytest.mark.parametrize("tail", ["10001", "100000000", "-1", "many"])
async def test_a_tail_beyond_the_maximum_is_refused(client: httpx.AsyncClient, tail: str) -> None:
    with trio.fail_after(30):
        for follow in ("", "&follow=1"):
            answer = await client.get(f"/v1/runs/good/logs?tail={tail}{follow}")
            _refusal(answer, 400, "tail must be an integer from 0 to 10000")


async def test_a_tail_up_to_the_maximum_is_answered(client: httpx.AsyncClient) -> None:
    with trio.fail_after(30):
        answer = await client.get("/v1/runs/good/logs?tail=10000")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"first_line": 1, "lines": LOG_LINES}


async def _log_ids(
    client: httpx.AsyncClient, query: str, headers: dict[str, str] | None = None
) -> list[int]:
    ids: list[int] = []
    url = f"/v1/runs/good/logs?follow=1{query}"
    async with client.stream("GET", url, headers=headers or {}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                ids.append(int(line[4:]))
            if line == "event: end":
                break
    return ids


async def test_a_log_stream_resumes_after_the_last_event_id(client: httpx.AsyncClient) -> None:
    with trio.fail_after(30):
        assert await _log_ids(client, "") == [1, 2, 3, 4, 5]
        assert await _log_ids(client, "&tail=2") == [4, 5]
        assert await _log_ids(client, "", {"Last-Event-ID": "3"}) == [4, 5]
        assert await _log_ids(client, "&tail=100", {"Last-Event-ID": "1"}) == [2, 3, 4, 5]
        assert await _log_ids(client, "&after=3") == [4, 5]
        assert await _log_ids(client, "&after=5") == []
        bad = await client.get("/v1/runs/good/logs?follow=1&after=x")
    _refusal(bad, 400, "Last-Event-ID must be an integer")
