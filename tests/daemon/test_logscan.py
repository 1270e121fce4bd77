"""Reading a run's logs.txt in bounded pieces (launcher.daemon.logfacts, launcher.daemon.logscan):
the run view's facts and an item's log lines are those of a parse of every line, for a log many
blocks long, read with a bounded amount of memory, and, as the log grows, again right."""

from __future__ import annotations

import json
import re
import tracemalloc
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.daemon import logscan
from launcher.daemon.api import ControlApp
from launcher.daemon.listen import bind_tcp, serve
from launcher.daemon.logscan import BLOCK, lines_naming
from launcher.daemon.registry import Registry
from launcher.daemon.status import LogFacts, log_facts
from launcher.rundir.logs import RUN_FAILED, line_details
from tests.launcher.test_runs import make_run, ok

TS = "2026-12-04T20:00:00.000000Z"
URL = "https://calm-otter.trycloudflare.com"


def _reference(text: str) -> dict[str, Any]:
    """The facts as a parse of every line gives them (the daemon's reading before it kept
    its place), lines split at newlines as the log's writer writes them."""
    step_re = re.compile(r"^\S+ (?P<level>[A-Z]+) \[(?P<step>[^\]]+)\] (?P<message>.*)$")
    facts = LogFacts()
    for raw in text.split("\n"):
        match = step_re.match(raw.removesuffix("\r"))
        if match is None:
            continue
        level, step, message = match["level"], match["step"], match["message"]
        if level == "ERROR" and step == "run" and message.startswith(RUN_FAILED):
            facts.error = message[len(RUN_FAILED) :]
        elif level == "ERROR" and step == "dispatch":
            details = line_details(message, "halting dispatch ") or {}
            reason = details.get("reason")
            facts.halted = reason if isinstance(reason, str) and reason else facts.halted
        if level != "INFO":
            continue
        if step == "run":
            facts.error = facts.halted = None
        facts.stage, facts.stage_message = step, message
        facts.dispatching = facts.dispatching or step == "schedule"
        if step == "tunnel":
            url = re.search(r"https://[^\s\"',)]+", message)
            facts.tunnel_url = url.group(0) if url else facts.tunnel_url
    return asdict(facts)


ITEMS = 120_000
ROW = 500  # the item whose log lines are asked for: every 997th item from it failed
ROLLOUT = uuid.uuid4().hex


@pytest.fixture(scope="module")
def big_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace of two runs alike but for their logs.txt: ``big``'s is many blocks long,
    ``small``'s has its first and last lines only. Each ends as an invocation that halted, then
    stopped with an error (its last line still being written)."""
    ws = tmp_path_factory.mktemp("big") / "ws"
    for sub in ("configs/eval", "rollouts", "data"):
        (ws / sub).mkdir(parents=True)
    head = (
        f"{TS} INFO [run] big: {ITEMS} of {ITEMS} work items pending\n"
        f"{TS} INFO [tunnel] tunnel ready at {URL}\n"
        f"{TS} INFO [schedule] running {ITEMS} work items, up to 8 in flight\n"
    )
    end = (
        f"{TS} ERROR [dispatch] halting dispatch {json.dumps({'reason': 'no descriptors'})}\n"
        f"{TS} ERROR [run] {RUN_FAILED}the rollout server died\n"
        f"{TS} INFO [finalize] invocation ended {{}}"
    )
    for name, body in (("big", _item_lines(ROLLOUT, ITEMS)), ("small", _item_lines(ROLLOUT, 1))):
        run = make_run(ws / ".osmosis" / "evals", name, records=[ok(0)])
        (run / "progress.json").write_text(json.dumps({"total_runs": ITEMS}))
        index = {"row_index": ROW, "run_index": 0, "rollout_id": ROLLOUT, "status": "failed"}
        (run / "index.jsonl").write_text(json.dumps(index) + "\n")
        (run / "logs.txt").write_text(head + body + end)
    assert (ws / ".osmosis" / "evals" / "big" / "logs.txt").stat().st_size > 32 * BLOCK
    return ws


def _item_lines(rollout_id: str, count: int) -> str:
    lines = []
    for i in range(count):
        rid = rollout_id if i % 997 == ROW % 997 else uuid.uuid4().hex
        key = json.dumps({"rollout_id": rid, "row_index": i, "run_index": 0})
        lines.append(f"{TS} INFO [dispatch] dispatching rollout {key}\n")
        lines.append(f"{TS} INFO [rollout-server] rollout {rid}: a step of the agent, logged\n")
        lines.append(f"{TS} INFO [result] work item finished {key}\n")
        if rid == rollout_id:
            lines.append(f"{TS} WARNING [result] work item failed {key}\n")
    return "".join(lines)


async def _shutdown(cancel: bool) -> None:
    raise AssertionError("not asked for")


async def test_the_views_of_a_large_log_are_right_in_bounded_memory(
    nursery: trio.Nursery, big_workspace: Path
) -> None:
    app = ControlApp(Registry(big_workspace, nursery), lambda: {}, _shutdown)
    sock = bind_tcp("127.0.0.1", 0)
    await nursery.start(serve, [(sock, app)])
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    answers: dict[str, Any] = {}
    peaks: dict[str, int] = {}
    with trio.fail_after(60):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            tracemalloc.start()
            try:
                for name in ("small", "big"):
                    tracemalloc.reset_peak()
                    run = await client.get(f"/v1/runs/{name}")
                    item = await client.get(f"/v1/runs/{name}/items/{ROW}/0")
                    answers[name] = (run.json(), item.json())
                    peaks[name] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    run_doc, item_doc = answers["big"]
    # The error that ended the latest invocation, found at the end of the log.
    assert (run_doc["state"], run_doc["cause"]) == ("failed", "the rollout server died")
    lines = item_doc["log_lines"]
    assert len(lines) == len(range(ROW, ITEMS, 997))  # its one WARNING line per attempt
    assert all(f'"rollout_id": "{ROLLOUT}"' in line and " WARNING " in line for line in lines)
    assert answers["small"][0]["cause"] == run_doc["cause"]
    # What the big log costs beyond a small one is a block or two, never the file.
    size = (big_workspace / ".osmosis" / "evals" / "big" / "logs.txt").stat().st_size
    assert peaks["big"] - peaks["small"] < 3 * BLOCK < size / 10, peaks


def test_the_facts_of_a_large_log_are_every_lines(big_workspace: Path) -> None:
    logs = big_workspace / ".osmosis" / "evals" / "big" / "logs.txt"
    facts = asdict(log_facts(logs, 0))
    assert facts == {
        "stage": "finalize",
        "stage_message": "invocation ended {}",  # the line being written counts
        "dispatching": True,
        "tunnel_url": URL,
        "error": "the rollout server died",
        "halted": "no descriptors",
    }
    assert facts == _reference(logs.read_text())


def test_a_log_that_grows_is_read_right_each_time(tmp_path: Path) -> None:
    logs = tmp_path / "logs.txt"
    logs.write_text(f"{TS} INFO [run] r: 3 of 3 work items pending\n{TS} INFO [schedule] running")
    facts = log_facts(logs, 0)  # the line being written counts, as far as it goes
    assert (facts.stage_message, facts.dispatching) == ("running", True)
    with logs.open("a") as fh:
        fh.write(f" 3 work items\n{TS} ERROR [run] {RUN_FAILED}boom\n")
    facts = log_facts(logs, 0)
    assert (facts.stage_message, facts.dispatching, facts.error) == (
        "running 3 work items",
        True,
        "boom",
    )
    with logs.open("a") as fh:
        fh.write(f"{TS} INFO [run] r: 1 of 3 work items pending\n")  # a later invocation
    facts = log_facts(logs, 0)
    assert (facts.stage, facts.dispatching, facts.error) == ("run", True, None)


def test_a_log_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    logs = tmp_path / "logs.txt"
    logs.write_text(f"{TS} ERROR [run] {RUN_FAILED}first\n")
    assert log_facts(logs, 0).error == "first"
    inode = logs.stat().st_ino
    logs.write_text(f"{TS} ERROR [run] {RUN_FAILED}other\n{TS} INFO [deps] syncing\n")
    assert logs.stat().st_ino == inode  # the same file, other bytes where the fold stopped
    facts = log_facts(logs, 0)
    assert (facts.error, facts.stage) == ("other", "deps")


_LINES = st.sampled_from(
    [
        f"{TS} INFO [run] r: 2 of 2 work items pending",
        f"{TS} INFO [deps] syncing rollout dependencies",
        f"{TS} INFO [tunnel] tunnel ready at {URL}",
        f"{TS} INFO [tunnel] tunnel lost, reconnecting",
        f"{TS} INFO [schedule] running 2 work items",
        f"{TS} INFO [dispatch] dispatching rollout " + '{"rollout_id":"abc"}',
        f"{TS} WARNING [result] work item failed " + '{"rollout_id":"abc"}',
        f"{TS} ERROR [run] {RUN_FAILED}it broke",
        f"{TS} ERROR [run] something else",
        f"{TS} ERROR [dispatch] halting dispatch " + '{"reason": "again and again"}',
        f"{TS} ERROR [dispatch] halting dispatch not json",
        f"{TS} WARNING [cancel] a message naming INFO [run] and ERROR [run] {RUN_FAILED}x",
        f"{TS} INFO [result] a line ending in a carriage return\r",
        "a line of a child's own output, no step at all",
        "",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(_LINES, max_size=40),
    cut=st.integers(min_value=0, max_value=4000),
    offset=st.integers(min_value=0, max_value=300),
    block=st.integers(min_value=1, max_value=200),
)
def test_the_facts_are_those_of_a_parse_of_every_line(
    tmp_path_factory: Any, lines: list[str], cut: int, offset: int, block: int
) -> None:
    text = "\n".join(lines)
    data = text.encode()
    cut, offset = min(cut, len(data)), min(offset, len(data))
    logs = tmp_path_factory.mktemp("log") / "logs.txt"
    with mock.patch.object(logscan, "BLOCK", block):  # many block edges in a small file
        logs.write_bytes(data[:cut])
        early = log_facts(logs, offset)
        assert asdict(early) == _reference(data[offset:cut].decode("utf-8", "replace"))
        with logs.open("ab") as fh:
            fh.write(data[cut:])
        facts = log_facts(logs, offset)
        assert asdict(facts) == _reference(data[offset:].decode("utf-8", "replace"))
        assert lines_naming(logs, "abc", unless=" INFO ") == [
            line.removesuffix("\r")
            for line in text.split("\n")
            if "abc" in line and " INFO " not in line
        ]
