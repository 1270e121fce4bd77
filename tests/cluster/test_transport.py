"""RayTransport and the requeue of a lost replica's items, without Ray: a node agent is faked by
an object whose ``run_item.remote`` returns a ref with a ``concurrent.futures.Future``, as
Ray's ``ObjectRef.future()`` does. Virtual time."""

from __future__ import annotations

import io
import tarfile
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from launcher.cluster.agent import _loopback, trial_tar
from launcher.cluster.transport import RayTransport, Replica, unpack_trial
from launcher.dispatch import Dispatcher, ItemLimits
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


class FakeAgent:
    """Answers each item after ``delay`` with a success and a one-file trial tar; or, once
    ``die()`` was called, fails every call in flight and every later one (an ActorDiedError)."""

    def __init__(self, nursery: trio.Nursery, delay: float = 1.0) -> None:
        self.nursery = nursery
        self.delay = delay
        self.dead = False
        self.pending: list[_Ref] = []
        self.seen: list[str] = []
        self.in_flight = self.peak = 0
        self.run_item = self
        self.cancel = self

    def remote(self, request_json: bytes, _timeout: float = 0.0) -> _Ref:
        ref = _Ref()
        if isinstance(request_json, str):  # cancel.remote(rollout_id)
            ref.fut.set_result(None)
            return ref
        request = msgspec.json.decode(request_json, type=RolloutInitRequest)
        self.seen.append(request.rollout_id)
        if self.dead:
            ref.fut.set_exception(RuntimeError("ActorDiedError: the actor died"))
            return ref
        self.pending.append(ref)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.nursery.start_soon(self._answer, ref, request)
        return ref

    async def _answer(self, ref: _Ref, request: RolloutInitRequest) -> None:
        await trio.sleep(self.delay)
        self.in_flight -= 1
        if ref.fut.done():
            return
        result = RolloutResultResponse(
            rollout_id=request.rollout_id,
            status="success",  # type: ignore[arg-type]
            sample=RolloutSample(reward=1.0),
        )
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            data = b'{"remote": true}'
            info = tarfile.TarInfo("trajectory.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        ref.fut.set_result(("result", msgspec.json.encode(result), buffer.getvalue()))

    def die(self) -> None:
        self.dead = True
        for ref in self.pending:
            if not ref.fut.done():
                ref.fut.set_exception(RuntimeError("ActorDiedError: the node died"))


def _transport(
    local: ScriptedTransport, local_capacity: int, trials: Path, killed: list[str]
) -> RayTransport:
    return RayTransport(
        local,
        Replica("head (supervisor)", "n1", local_capacity),
        trials,
        lambda *a: None,
        lambda replica: killed.append(replica.name),
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


async def test_items_go_where_most_capacity_is_free_and_trials_come_back(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    local = ScriptedTransport(_success)
    killed: list[str] = []
    transport = _transport(local, 1, tmp_path, killed)
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


async def test_a_lost_replica_s_items_are_requeued_under_new_ids(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    local = ScriptedTransport(_success, delay=1.0)
    killed: list[str] = []
    transport = _transport(local, 2, tmp_path, killed)
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


def test_unpack_trial_round_trips_and_refuses_escapes(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "artifacts").mkdir(parents=True)
    (source / "trajectory.json").write_text("{}")
    (source / "artifacts" / "a.txt").write_text("a")
    unpack_trial(trial_tar(source), tmp_path / "out")
    assert (tmp_path / "out" / "artifacts" / "a.txt").read_text() == "a"
    assert trial_tar(tmp_path / "missing") == b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        unpack_trial(buffer.getvalue(), tmp_path / "bad")
    assert not (tmp_path / "escape").exists()


def test_chat_url_is_rewritten_to_the_node_s_loopback_relay() -> None:
    url = "http://10.203.0.1:4321/v1/rollouts/abc/chat/completions"
    assert _loopback(url, 5555) == "http://127.0.0.1:5555/v1/rollouts/abc/chat/completions"
