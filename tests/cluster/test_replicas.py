"""The replica set of a ``--ray`` run without Ray (launcher.cluster.replicas): the minimum of
healthy replicas halts dispatch, pings make a replica suspect then lost, and the progress
view's replica line. Node agents are the fakes of test_transport; virtual time."""

from __future__ import annotations

import io
import json
import re
from functools import partial
from pathlib import Path

import trio
import trio.testing

from launcher.cluster.replicas import (
    CHANGED,
    announcer,
    hold_minimum,
    ping_replicas,
    replica_line,
)
from launcher.cluster.transport import Replica
from launcher.daemon.stream import journal_events
from launcher.redact import Redactor
from launcher.rundir.logs import RunLog
from launcher.ui import UI
from tests.cluster.test_transport import FakeAgent, _dispatcher, _Ref, _transport
from tests.launcher.test_dispatch import ScriptedTransport, _item, _success
from tests.launcher.test_progress import ANSI, TTY, FakeCounters


class _Health:
    """``agent.health.remote()``: True, or no answer while ``wedged``, or the actor's death."""

    def __init__(self, agent: PingedAgent) -> None:
        self.agent = agent

    def remote(self) -> _Ref:
        ref = _Ref()
        if self.agent.dead:
            ref.fut.set_exception(RuntimeError("ActorDiedError: the actor died"))
        elif not self.agent.wedged:
            ref.fut.set_result(True)
        return ref  # wedged: never answers


class PingedAgent(FakeAgent):
    def __init__(self, nursery: trio.Nursery, delay: float = 1.0) -> None:
        super().__init__(nursery, delay)
        self.wedged = False
        self.health = _Health(self)


async def test_fewer_healthy_replicas_than_the_minimum_halt_and_leave_the_rest_pending(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    local = ScriptedTransport(_success, delay=1.0)
    transport = _transport(local, 2, tmp_path, [])
    items = [_item(r) for r in range(80)]
    async with trio.open_nursery() as nursery:
        agent = PingedAgent(nursery, delay=2.0)
        transport.add(Replica("10.203.0.2", "n2", 2, actor=agent))
        dispatcher = _dispatcher(items, transport, concurrency=4)
        halt = partial(dispatcher.halt, cancel_all=True)

        async def node_dies() -> None:
            await trio.sleep(6.5)
            agent.die()

        nursery.start_soon(partial(hold_minimum, transport, 2, lambda: 0, halt, grace_s=5.0))
        # As in a run: the pings find the death even when no item of the node is in flight
        # (a node item's trial is unpacked on a thread, and the virtual clock runs on meanwhile:
        # under load every item of the node could be settled before it died).
        nursery.start_soon(ping_replicas, transport)
        nursery.start_soon(node_dies)
        report = await dispatcher.run()
        nursery.cancel_scope.cancel()
    sink = dispatcher.sink
    records = sink.records  # type: ignore[attr-defined]
    assert report.halted is not None and sink.halts == [report.halted]  # type: ignore[attr-defined]
    assert report.halted.startswith("only 1 of the 2 replicas the run needs are healthy")
    assert re.search(r"\): head \d in flight · 1 lost$", report.halted), report.halted
    # The halt cancelled what was in flight: nothing failed, nothing twice, the rest pending.
    assert all(r.status == "success" for r in records)
    assert len({r.key for r in records}) == len(records) < len(items)
    assert records and local.cancelled


async def test_the_minimum_waits_out_the_grace_and_counts_replicas_starting(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    transport = _transport(ScriptedTransport(_success), 1, tmp_path, [])
    halts: list[tuple[float, str]] = []

    def halt(reason: str) -> None:
        halts.append((trio.current_time(), reason))

    starting = [1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(hold_minimum, transport, 2, lambda: starting[0], halt))
        await trio.sleep(60.0)
        assert not halts  # the head plus one replica starting make two
        start = trio.current_time()
        starting[0] = 0  # it was refused
        await trio.sleep(1.0)
    assert len(halts) == 1 and start <= halts[0][0] <= start + 1.0
    assert halts[0][1].endswith(": head 0 in flight")
    with trio.move_on_after(3600) as scope:
        await hold_minimum(transport, 1, lambda: 0, halt)  # 1: the head is enough, no watch
    assert not scope.cancelled_caught


async def test_a_replica_that_stops_answering_is_suspect_then_lost(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    killed: list[str] = []
    transport = _transport(ScriptedTransport(_success), 1, tmp_path, killed)
    lines: list[str] = []
    transport.on_change = lambda: lines.append(replica_line(transport.replicas))
    async with trio.open_nursery() as nursery:
        agent = PingedAgent(nursery)
        replica = Replica("10.203.0.2", "n2", 2, actor=agent)
        transport.add(replica)
        nursery.start_soon(
            partial(ping_replicas, transport, interval_s=1.0, timeout_s=1.0, lost_after=3)
        )
        await trio.sleep(5.0)
        assert replica.state == "healthy"
        agent.wedged = True
        await trio.sleep(2.5)
        assert replica.state == "suspect" and replica.free == 0  # no new work for it
        agent.wedged = False
        await trio.sleep(2.5)
        assert replica.state == "healthy" and replica.free == 2
        agent.wedged = True
        await trio.sleep(10.0)
        nursery.cancel_scope.cancel()
    assert replica.state == "lost" and killed == ["10.203.0.2"]
    assert lines == [
        "replicas: head 0 in flight · 10.203.0.2 0 in flight",
        "replicas: head 0 in flight · 10.203.0.2 suspect 0 in flight",
        "replicas: head 0 in flight · 10.203.0.2 0 in flight",
        "replicas: head 0 in flight · 10.203.0.2 suspect 0 in flight",
        "replicas: head 0 in flight · 1 lost",
    ]


def _replicas() -> list[Replica]:
    head = Replica("10.203.0.1 (supervisor)", "n1", 16, in_flight=12)
    node2 = Replica("10.203.0.2", "n2", 16, actor=object(), in_flight=11)
    node3 = Replica("10.203.0.3", "n3", 16, actor=object(), state="suspect", in_flight=2)
    gone = Replica("10.203.0.4", "n4", 16, actor=object(), state="lost")
    return [head, node2, node3, gone]


def test_the_replica_line() -> None:
    assert replica_line(_replicas(), starting=1) == (
        "replicas: head 12 in flight · 10.203.0.2 11 in flight · "
        "10.203.0.3 suspect 2 in flight · 1 starting · 1 lost"
    )


def test_a_terminal_shows_the_line_under_the_bar_and_a_pipe_a_line_per_change() -> None:
    replicas = _replicas()
    tty = TTY()
    ui = UI("rich", stdout=tty, stderr=io.StringIO())
    ui.show_replicas(lambda: replica_line(replicas))
    ui.open_progress(10, FakeCounters(), 10, lambda: 25)
    ui.progress_update()
    ui.close_progress()
    screen = ANSI.sub("", tty.getvalue())
    assert "replicas: head 12 in flight · 10.203.0.2 11 in flight" in screen
    ui.replicas_changed()  # a terminal: the live line says it, no extra line
    assert ANSI.sub("", tty.getvalue()) == screen

    piped = io.StringIO()
    ui = UI("rich", stdout=piped, stderr=io.StringIO())
    ui.show_replicas(lambda: replica_line(replicas))
    ui.open_progress(10, FakeCounters(), 10, lambda: 25)
    ui.progress_update("row 0 run 0: success")
    assert "replicas:" not in piped.getvalue()  # not per item
    replicas[1].state = "lost"
    ui.replicas_changed()
    last = piped.getvalue().splitlines()[-1]
    assert last == "replicas: head 12 in flight · 10.203.0.3 suspect 2 in flight · 2 lost"


async def test_a_change_is_a_logs_line_and_the_daemon_s_replicas_event(tmp_path: Path) -> None:
    transport = _transport(ScriptedTransport(_success), 1, tmp_path, [])
    shown: list[str] = []
    frames: list[str] = []
    live = [True]

    async def stream() -> None:
        async for frame in journal_events(
            tmp_path, after=0, live=lambda: live[0], state=lambda: {"state": "running"}
        ):
            frames.append(frame.decode())

    with trio.fail_after(10), RunLog(tmp_path / "logs.txt", Redactor()) as log:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream)
            # The stream sends what is logged once it runs: log until a line comes through.
            while not any("stream is up" in frame for frame in frames):
                log.log("INFO", "cluster", "stream is up", None)
                await trio.sleep(0.02)
            transport.on_change = announcer(
                transport, lambda: 1, log.log, lambda: shown.append("x")
            )
            transport.add(Replica("10.203.0.2", "n2", 4, actor=object()))
            log.log("INFO", "cluster", "bridge relay listening", {"host": "10.203.0.1"})
            # One line per item run on another node: the record events tell it, no stage.
            log.log("INFO", "cluster", "rollout finished on replica", {"replica": "10.203.0.2"})
            live[0] = False  # the stream reads to the end, then stops
    text = "".join(frames)
    events = [
        (block.split("\n")[0].removeprefix("event: "), block.split("data: ", 1)[1])
        for block in text.split("\n\n")
        if block.startswith("event: ")
    ]
    replicas = [json.loads(data) for name, data in events if name == "replicas"]
    assert shown == ["x"] and len(replicas) == 1
    assert replicas[0]["starting"] == 1
    assert [(r["name"], r["head"], r["state"]) for r in replicas[0]["replicas"]] == [
        ("head (supervisor)", True, "healthy"),
        ("10.203.0.2", False, "healthy"),
    ]
    assert replicas[0]["line"] == (
        "replicas: head 0 in flight · 10.203.0.2 0 in flight · 1 starting"
    )
    stages = [json.loads(data)["message"] for name, data in events if name == "stage"]
    assert any(s.startswith("bridge relay listening") for s in stages)
    assert not any(CHANGED in s for s in stages)
    assert not any(s.startswith("rollout finished on replica") for s in stages)
