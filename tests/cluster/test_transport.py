"""RayTransport and the requeue of a lost replica's items, without Ray: a node agent is faked by
an object whose ``run_item.remote`` returns a ref with a ``concurrent.futures.Future``, as
Ray's ``ObjectRef.future()`` does. Virtual time."""

from __future__ import annotations

import io
import os
import tarfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from launcher.cluster.agent import _loopback
from launcher.cluster.batch import RIDE_S
from launcher.cluster.refs import ray_cause
from launcher.cluster.transport import RayTransport, Replica
from launcher.cluster.trial import Packed
from launcher.dispatch import Dispatcher, ItemLimits, RolloutRefused
from launcher.requeue import RolloutLost
from rollout_server.protocol import RolloutInitRequest, RolloutResultResponse, RolloutSample
from tests.launcher.test_dispatch import (
    FixedEndpoint,
    ListSink,
    ScriptedTransport,
    _interrupts,
    _item,
    _success,
)


class _Ref:
    def __init__(self) -> None:
        self.fut: Future[Any] = Future()

    def future(self) -> Future[Any]:
        return self.fut


class _Method:
    def __init__(self, call: Any) -> None:
        self.remote = call


def _entries() -> Packed:
    """A one-file trial as an agent packs it (entries: unpacked on the trio thread)."""
    return [("trajectory.json", 0o644, b'{"remote": true}')]


def _tar() -> Packed:
    """The same trial as a tar (unpacked on a worker thread)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b'{"remote": true}'
        info = tarfile.TarInfo("trajectory.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class FakeAgent:
    """A node agent, called one item per call (``run_item``) or in batches (``submit``, the
    ``collect`` long-poll, and ``exchange``: both in one call). Each item is answered after ``delay`` with a success and a one-file
    trial (``pack()``), or at once with ``refuse(request)``'s refusal when that is not None; ``cancel``
    ends an item's wait (answered as cancelled). Once ``die()`` was called, every call in flight
    and every later one fails (an ActorDiedError); ``hang()`` leaves every call unanswered (a cut
    link)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        delay: float = 1.0,
        refuse: Any = None,
        pack: Callable[[], Packed] = _entries,
    ) -> None:
        self.nursery = nursery
        self.pack = pack
        self.delay = delay
        self.refuse = refuse
        self.dead = self.hung = False
        self.calls: Counter[str] = Counter()
        self.pending: list[_Ref] = []  # unanswered calls
        self.answers: list[tuple[str, tuple[Any, ...]]] = []
        self.collector: _Ref | None = None
        self.scopes: dict[str, trio.CancelScope] = {}
        self.seen: list[str] = []
        self.cancelled: list[str] = []
        self.in_flight = self.peak = 0
        self.run_item = _Method(self._run_item)
        self.submit = _Method(self._submit)
        self.collect = _Method(self._collect)
        self.exchange = _Method(self._exchange)
        self.cancel = _Method(self._cancel)

    def _call(self, name: str) -> _Ref:
        self.calls[name] += 1
        ref = _Ref()
        if self.dead:
            ref.fut.set_exception(RuntimeError("ActorDiedError: the actor died"))
        return ref

    def _run_item(self, request_json: bytes, _timeout: float) -> _Ref:
        ref = self._call("run_item")
        if not ref.fut.done():
            self.pending.append(ref)
            self._start(request_json, lambda _rid, answer: ref.fut.set_result(answer))
        return ref

    def _submit(self, batch: list[tuple[bytes, float]]) -> _Ref:
        ref = self._call("submit")
        if not ref.fut.done():
            for request_json, _timeout in batch:
                self._start(request_json, self._deliver)
            ref.fut.set_result(None)
        return ref

    def _collect(self, max_items: int, _max_bytes: int, _linger_s: float) -> _Ref:
        return self._long_poll(self._call("collect"))

    def _exchange(
        self, batch: list[tuple[bytes, float]], _max_items: int, _max_bytes: int, _linger: float
    ) -> _Ref:
        ref = self._call("exchange")
        if not ref.fut.done():
            for request_json, _timeout in batch:
                self._start(request_json, self._deliver)
        return self._long_poll(ref)

    def _long_poll(self, ref: _Ref) -> _Ref:
        if not ref.fut.done():
            assert self.collector is None, "one collect at a time"
            self.pending.append(ref)
            self.collector = ref
            self._deliver(None, None)
        return ref

    def _deliver(self, rollout_id: str | None, answer: tuple[Any, ...] | None) -> None:
        if rollout_id is not None and answer is not None:
            self.answers.append((rollout_id, answer))
        if self.collector is not None and self.answers and not self.hung:
            batch, self.answers = self.answers, []
            self.collector.fut.set_result(batch)
            self.collector = None

    def _cancel(self, rollout_id: str) -> _Ref:
        ref = self._call("cancel")
        if not ref.fut.done():
            self.cancelled.append(rollout_id)
            if rollout_id in self.scopes:
                self.scopes[rollout_id].cancel()
            ref.fut.set_result(None)
        return ref

    def _start(self, request_json: bytes, deliver: Any) -> None:
        request = msgspec.json.decode(request_json, type=RolloutInitRequest)
        self.seen.append(request.rollout_id)
        refusal = self.refuse(request) if self.refuse else None
        if refusal is not None:
            deliver(request.rollout_id, refusal)
            return
        self.nursery.start_soon(self._answer, request, deliver)

    async def _answer(self, request: RolloutInitRequest, deliver: Any) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        with trio.CancelScope() as scope:
            self.scopes[request.rollout_id] = scope
            await trio.sleep(self.delay)
        self.in_flight -= 1
        if self.dead or self.hung:
            return
        status = "cancelled" if scope.cancelled_caught else "success"
        result = RolloutResultResponse(
            rollout_id=request.rollout_id,
            status=status,  # type: ignore[arg-type]
            sample=RolloutSample(reward=1.0) if status == "success" else None,
        )
        deliver(request.rollout_id, ("result", msgspec.json.encode(result), self.pack()))

    def die(self) -> None:
        self.dead = True
        self.collector = None
        for ref in self.pending:
            if not ref.fut.done():
                # As Ray words it: several lines, a task's name in ANSI colours.
                died = "ActorDiedError: \x1b[36mray::Agent.run()\x1b[39m died\n\tactor_id: a1"
                ref.fut.set_exception(RuntimeError(died))

    def hang(self) -> None:
        self.hung = True


def _transport(
    local: ScriptedTransport,
    local_capacity: int,
    trials: Path,
    killed: list[str],
    batch: bool = True,
    logged: list[tuple[Any, ...]] | None = None,
) -> RayTransport:
    return RayTransport(
        local,
        Replica("head (supervisor)", "n1", local_capacity),
        trials,
        (lambda *a: None) if logged is None else (lambda *a: logged.append(a)),
        lambda replica: killed.append(replica.name),
        batch=batch,
    )


def _dispatcher(items: list[Any], transport: RayTransport, concurrency: int) -> Dispatcher:
    return Dispatcher(
        items,
        concurrency=concurrency,
        transport=transport,
        endpoint=FixedEndpoint(),
        sink=ListSink(),
        limits=ItemLimits(item_deadline_s=70.0),
        interrupts=_interrupts(),
        log=lambda *a: None,
    )


def _request(rollout_id: str) -> RolloutInitRequest:
    return RolloutInitRequest(
        rollout_id=rollout_id,
        chat_completions_url="http://127.0.0.1:1/v1",
        initial_messages=[],
    )


BATCHED = pytest.mark.parametrize("batch", [True, False], ids=["batched", "per-item"])


@BATCHED
async def test_items_go_where_most_capacity_is_free_and_trials_come_back(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, batch: bool
) -> None:
    local = ScriptedTransport(_success)
    killed: list[str] = []
    transport = _transport(local, 1, tmp_path, killed, batch)
    async with trio.open_nursery() as nursery:
        agent = FakeAgent(nursery)
        transport.add(Replica("node2", "n2", 3, actor=agent))
        dispatcher = _dispatcher([_item(r) for r in range(8)], transport, concurrency=4)
        report = await dispatcher.run()
    records = dispatcher.sink.records  # type: ignore[attr-defined]
    assert report.recorded == 8 and len({r.key for r in records}) == 8
    # Capacity 3 against 1: most items ran on node 2, neither replica over its capacity.
    assert len(agent.seen) + len(local.requests) == 8
    assert len(agent.seen) >= 5 and local.requests
    assert agent.peak <= 3 and local.peak <= 1
    for rollout_id in agent.seen:
        assert (tmp_path / rollout_id / "trajectory.json").read_bytes() == b'{"remote": true}'
    assert not killed


@BATCHED
async def test_tar_trials_come_back_through_a_worker_thread(tmp_path: Path, batch: bool) -> None:
    # Real time: the unpacks run on a worker thread, during which an autojump clock would
    # jump past the items' deadlines.
    transport = _transport(ScriptedTransport(_success), 0, tmp_path, [], batch)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            agent = FakeAgent(nursery, delay=0.01, pack=_tar)
            transport.add(Replica("node2", "n2", 4, actor=agent))
            dispatcher = _dispatcher([_item(r) for r in range(6)], transport, concurrency=4)
            report = await dispatcher.run()
    assert report.recorded == 6 and len(agent.seen) == 6
    for rollout_id in agent.seen:
        assert (tmp_path / rollout_id / "trajectory.json").read_bytes() == b'{"remote": true}'


@BATCHED
async def test_a_lost_replica_s_items_are_requeued_under_new_ids(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, batch: bool
) -> None:
    local = ScriptedTransport(_success, delay=1.0)
    killed: list[str] = []
    logged: list[tuple[Any, ...]] = []
    transport = _transport(local, 2, tmp_path, killed, batch, logged)
    async with trio.open_nursery() as nursery:
        agent = FakeAgent(nursery, delay=10.0)
        replica = Replica("node2", "n2", 2, actor=agent)
        transport.add(replica)
        dispatcher = _dispatcher([_item(r) for r in range(6)], transport, concurrency=4)

        async def node_dies() -> None:
            await trio.sleep(0.5)
            agent.die()

        nursery.start_soon(node_dies)
        report = await dispatcher.run()
    records = dispatcher.sink.records  # type: ignore[attr-defined]
    # Every item journaled once, none failed; the two lost attempts never reached the journal.
    assert report.recorded == 6 and sorted(r.key for r in records) == [(r, 0) for r in range(6)]
    assert all(r.status == "success" for r in records)
    lost = set(agent.seen)
    assert len(lost) == 2 and not lost & {r.rollout_id for r in records}
    events = dispatcher.endpoint.events  # type: ignore[attr-defined]
    assert {rid for kind, rid in events if kind == "revoke"} == lost  # the bridge refuses them
    assert killed == ["node2"] and replica.state == "lost" and replica.in_flight == 0
    assert transport.capacity == 2
    # The cause is one printable line: Ray's colours and line breaks do not reach logs.txt.
    causes = [a[3]["cause"] for a in logged if a[2] == "replica lost"]
    assert len(causes) == 1, causes
    assert causes[0].endswith("RuntimeError: ActorDiedError: ray::Agent.run() died actor_id: a1")


def test_chat_url_is_rewritten_to_the_node_s_loopback_relay() -> None:
    url = "http://10.203.0.1:4321/v1/rollouts/abc/chat/completions"
    assert _loopback(url, 5555) == "http://127.0.0.1:5555/v1/rollouts/abc/chat/completions"


async def test_a_replica_s_items_share_actor_calls(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    local = ScriptedTransport(_success)
    transport = _transport(local, 0, tmp_path, [])
    async with trio.open_nursery() as nursery:
        agent = FakeAgent(nursery)
        transport.add(Replica("node2", "n2", 20, actor=agent))
        dispatcher = _dispatcher([_item(r) for r in range(20)], transport, concurrency=20)
        report = await dispatcher.run()
    assert report.recorded == 20 and len(agent.seen) == 20 and not local.requests
    # Admitted together, finished together: a few calls carry all twenty items.
    assert agent.calls["submit"] + agent.calls["collect"] + agent.calls["exchange"] <= 6
    assert "run_item" not in agent.calls


async def test_items_ride_on_the_call_after_an_answer_or_go_after_the_ride_window(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    transport = _transport(ScriptedTransport(_success), 0, tmp_path, [])
    async with trio.open_nursery() as nursery:
        agent = FakeAgent(nursery, delay=1.0)
        transport.add(Replica("node2", "n2", 5, actor=agent))
        # Nothing outstanding: the first item goes after the window, with a collect.
        a = await transport.admit(_request("a"), 10.0)
        assert dict(agent.calls) == {"exchange": 1}
        await trio.sleep(0.1)
        # The collect is outstanding and no answer comes in time: a submit after RIDE_S.
        started = trio.current_time()
        b = await transport.admit(_request("b"), 10.0)
        b_sent = trio.current_time()
        assert b_sent - started == pytest.approx(RIDE_S)
        assert dict(agent.calls) == {"exchange": 1, "submit": 1}
        await a.wait()  # its answer, at 1.0; b is still running: a plain collect follows
        assert dict(agent.calls) == {"exchange": 1, "submit": 1, "collect": 1}
        # Admitted 15 ms before b's answer: it rides on the exchange sent then.
        await trio.sleep(b_sent + 1.0 - 0.015 - trio.current_time())
        started = trio.current_time()
        c = await transport.admit(_request("c"), 10.0)
        assert trio.current_time() - started == pytest.approx(0.015)
        assert dict(agent.calls) == {"exchange": 2, "submit": 1, "collect": 1}
        for handle in (b, c):
            assert (await handle.wait()).status == "success"
    assert agent.seen == ["a", "b", "c"]
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]


@BATCHED
async def test_a_refusal_comes_back_as_refused_and_frees_the_slot(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, batch: bool
) -> None:
    local = ScriptedTransport(_success)
    transport = _transport(local, 0, tmp_path, [], batch)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            agent = FakeAgent(nursery, refuse=lambda _r: ("refused", 429, "busy", "capacity"))
            replica = Replica("node2", "n2", 2, actor=agent)
            transport.add(replica)
            handle = await transport.admit(_request("r1"), 5.0)
            with pytest.raises(RolloutRefused) as refused:
                await handle.wait()
    assert refused.value.status_code == 429 and refused.value.kind == "capacity"
    assert replica.state == "healthy" and replica.in_flight == 0


@BATCHED
async def test_cancel_reaches_the_agent_and_the_item_settles_as_cancelled(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, batch: bool
) -> None:
    local = ScriptedTransport(_success)
    transport = _transport(local, 0, tmp_path, [], batch)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            agent = FakeAgent(nursery, delay=1000.0)
            replica = Replica("node2", "n2", 2, actor=agent)
            transport.add(replica)
            handle = await transport.admit(_request("r1"), 5.0)
            await trio.sleep(1.0)
            await transport.cancel("r1")
            result = await handle.wait()
    assert agent.cancelled == ["r1"] and result.status == "cancelled"
    assert replica.in_flight == 0 and replica.state == "healthy"


@BATCHED
async def test_a_replica_lost_by_its_pings_fails_its_items_though_its_calls_hang(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, batch: bool
) -> None:
    local = ScriptedTransport(_success)
    killed: list[str] = []
    transport = _transport(local, 0, tmp_path, killed, batch)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            agent = FakeAgent(nursery, delay=1000.0)
            replica = Replica("node2", "n2", 2, actor=agent)
            transport.add(replica)
            handles = [await transport.admit(_request(f"r{i}"), 5.0) for i in range(2)]
            await trio.sleep(1.0)
            agent.hang()  # the link is cut: no call answers, none fails
            transport.lose(replica, "no answer to pings")
            if not batch:  # one call per item: the kill is what fails them
                agent.die()
            for handle in handles:
                with pytest.raises(RolloutLost):
                    await handle.wait()
            nursery.cancel_scope.cancel()
    assert killed == ["node2"] and replica.in_flight == 0 and replica.state == "lost"


def test_a_ray_cause_is_one_printable_line_that_keeps_its_end() -> None:
    assert ray_cause(ValueError("a\x1b[1;31mb\x1b[0m\r\n\tc\x07")) == "ValueError: ab c\\x07"
    long = ray_cause(RuntimeError("start " + "x" * 1000 + " TheRealError: why"), limit=100)
    assert len(long) <= 100 and long.startswith("RuntimeError: start")
    assert long.endswith("TheRealError: why")
