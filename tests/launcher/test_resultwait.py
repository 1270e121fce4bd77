"""The supervisor's batched result wait (launcher.resultwait) against a real rollout server on
port 0: the dispatch holds O(1) connections whatever the rollouts in flight, every result is
delivered once, a caller's cancel and a dying server behave as with the per-id poll, and a
server that does not offer the wait gets the per-id poll."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
import trio

from launcher.dataset import SelectedRow, WorkItem
from launcher.dispatch import MAX_CONCURRENT_ADMISSIONS, Dispatcher, ItemLimits
from launcher.dispatch_io import RolloutClientTransport
from launcher.resultwait import BATCHED_ENV, ResultWaiter, batched_wait_wanted
from launcher.rollout_child import RolloutServer
from rollout_server import RunningServer
from rollout_server.client import RolloutClient, RolloutServerUnreachable
from rollout_server.protocol import HealthReport
from rollout_server.resultwait import ResultWaits
from tests.launcher.test_dispatch import FixedEndpoint, ListSink, _interrupts
from tests.rollout_server.helpers import backend, gate, request, start

IN_FLIGHT = 120


@dataclass
class _Child:
    returncode: int | None = None


@dataclass
class _Server:
    """What RolloutClientTransport reads of a launcher.rollout_child.RolloutServer."""

    health: HealthReport
    base_url: str
    child: _Child
    batched_wait: bool
    token: str | None = None


def _connections_to(port: int) -> int:
    """This process's open TCP connections whose far end is ``port`` (the client ends)."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def _waits(running: RunningServer) -> ResultWaits:
    return cast(ResultWaits, running.service.result_listener)


async def _served(nursery: trio.Nursery, tmp_path: Path) -> tuple[RunningServer, RolloutClient]:
    return await start(
        nursery,
        tmp_path,
        backend(max_concurrent=IN_FLIGHT * 2),
        result_wait_timeout_sec=5.0,
        polling_lease_timeout_sec=30.0,
    )


def _items(name: str, count: int) -> list[WorkItem]:
    row = SelectedRow(0, 0, None, "q", "L", {"gate": name})
    return [WorkItem(row, run) for run in range(count)]


async def _dispatch_while_gated(
    nursery: trio.Nursery, tmp_path: Path, *, batched: bool
) -> tuple[int, RunningServer, ListSink, RolloutClientTransport]:
    """Dispatch IN_FLIGHT gated items; count the connections once all are waiting; open the
    gate; return the count once every item is recorded."""
    running, client = await _served(nursery, tmp_path)
    health = await client.health()
    if not batched:
        body = {k: v for k, v in health.body.items() if k != "rollbridge_capabilities"}
        health = cast(Any, HealthReport.parse(body))
    server = _Server(health, running.url, _Child(), batched_wait_wanted(health))
    transport = RolloutClientTransport(client, cast(RolloutServer, server))
    assert (transport.results is not None) is batched
    sink = ListSink()
    name = f"batch-{batched}"
    dispatcher = Dispatcher(
        _items(name, IN_FLIGHT),
        concurrency=IN_FLIGHT,
        transport=transport,
        endpoint=FixedEndpoint(),
        sink=sink,
        limits=ItemLimits(item_deadline_s=60.0, agent_timeout_sec=None, grader_timeout_sec=None),
        interrupts=_interrupts(),
        log=lambda *args: None,
    )
    done = trio.Event()

    async def run() -> None:
        await dispatcher.run()
        done.set()

    nursery.start_soon(run)
    service = running.service
    while service.active < IN_FLIGHT or (service.waiting_polls + _waits(running).waiting) == 0:
        await trio.sleep(0.01)
    if not batched:
        while service.waiting_polls < IN_FLIGHT:
            await trio.sleep(0.01)
    connections = _connections_to(running.port)
    gate(name).set()
    await done.wait()
    await client.aclose()
    return connections, running, sink, transport


@pytest.fixture(autouse=True)
def _batched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched wait is opt-in (launcher.resultwait.BATCHED_ENV): these tests ask for it."""
    monkeypatch.setenv(BATCHED_ENV, "1")


async def test_the_dispatch_waits_through_o1_connections(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        connections, running, sink, transport = await _dispatch_while_gated(
            nursery, tmp_path, batched=True
        )
    assert running.service.waiting_polls == 0
    # The admissions' idle keep-alive connections (at most one per concurrent admission) and
    # the batched wait's two: none per rollout in flight.
    assert connections <= MAX_CONCURRENT_ADMISSIONS + 2 < IN_FLIGHT
    assert transport.results is not None and transport.results.connections == 0
    assert len(sink.records) == IN_FLIGHT and sink.halts == []
    assert len({r.rollout_id for r in sink.records}) == IN_FLIGHT
    assert {r.status for r in sink.records} == {"success"}


async def test_without_the_capability_each_rollout_has_its_long_poll(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        connections, _, sink, _ = await _dispatch_while_gated(nursery, tmp_path, batched=False)
    assert connections >= IN_FLIGHT
    assert len(sink.records) == IN_FLIGHT and {r.status for r in sink.records} == {"success"}


async def test_a_cancelled_caller_leaves_the_others_their_results(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        running, client = await _served(nursery, tmp_path)
        waiter = ResultWaiter(running.url)
        admissions = [
            await client.admit(request(f"c{i}", metadata={"gate": "cancelled-caller"}))
            for i in range(5)
        ]
        results: dict[str, str] = {}
        scopes: list[tuple[str, trio.CancelScope]] = []  # in the order the callers started

        async def wait_one(index: int) -> None:
            with trio.CancelScope() as scope:
                scopes.append((admissions[index].rollout_id, scope))
                result = await waiter.wait(admissions[index])
                results[result.rollout_id] = result.status.value

        async with trio.open_nursery() as callers:
            for index in range(5):
                callers.start_soon(wait_one, index)
            while _waits(running).waiting == 0:
                await trio.sleep(0.01)
            for _, scope in scopes[:2]:
                scope.cancel()
            await trio.sleep(0.05)
            gate("cancelled-caller").set()
        # The cancelled callers' rollouts were admitted, so a later wait still gets them.
        cancelled = [rollout_id for rollout_id, _ in scopes[:2]]
        late = await waiter.wait(next(a for a in admissions if a.rollout_id == cancelled[0]))
        await client.aclose()
        # Nobody waits now: the long wait is held until its timeout or the server's stop.
        assert waiter.connections <= 1
        running.request_shutdown()
        while waiter.connections:
            await trio.sleep(0.01)
    assert sorted(results) == sorted({a.rollout_id for a in admissions} - set(cancelled))
    assert set(results.values()) == {"success"} and late.status.value == "success"


async def test_a_server_that_dies_mid_wait_fails_every_caller(tmp_path: Path) -> None:
    alive = True
    errors: list[BaseException] = []
    server_scope = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[tuple[RunningServer, RolloutClient]]) -> None:
        with server_scope:
            async with trio.open_nursery() as server_nursery:
                task_status.started(await _served(server_nursery, tmp_path))
                await trio.sleep_forever()

    async def wait_one(waiter: ResultWaiter, admission: Any) -> None:
        with pytest.raises(RolloutServerUnreachable) as raised:
            await waiter.wait(admission)
        errors.append(raised.value)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            running, client = await nursery.start(serve)
            waiter = ResultWaiter(running.url, server_alive=lambda: alive)
            for i in range(3):
                admission = await client.admit(request(f"d{i}", metadata={"gate": "never"}))
                nursery.start_soon(wait_one, waiter, admission)
            await client.aclose()
            while _waits(running).waiting == 0:
                await trio.sleep(0.01)
            alive = False
            server_scope.cancel()  # the listener and its connections close
    assert len(errors) == 3


def test_the_batched_wait_is_used_when_offered_and_asked_for_or_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offered = cast(Any, HealthReport.parse({"rollbridge_capabilities": ["wait-results"]}))
    absent = cast(Any, HealthReport.parse({"status": "ok"}))
    malformed = cast(Any, HealthReport.parse({"rollbridge_capabilities": 1}))
    monkeypatch.delenv(BATCHED_ENV, raising=False)
    assert not batched_wait_wanted(offered)  # unset: only when the run needs it
    assert batched_wait_wanted(offered, needed=True)
    assert not batched_wait_wanted(absent, needed=True)
    monkeypatch.setenv(BATCHED_ENV, "1")
    assert batched_wait_wanted(offered)
    assert not batched_wait_wanted(absent)
    assert not batched_wait_wanted(malformed)
    monkeypatch.setenv(BATCHED_ENV, "0")
    assert not batched_wait_wanted(offered)
    assert not batched_wait_wanted(offered, needed=True)  # never, even where it would fit
