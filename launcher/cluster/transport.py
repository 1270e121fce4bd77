"""The :class:`~launcher.dispatch.RolloutTransport` over the replicas of a Ray cluster.

Replicas: the supervisor's own rollout server (the local replica, reached as in a local run)
and one node agent per other node. Each item goes to the healthy replica with the most free
capacity (its ``/health`` capacity minus what it has in flight); while none has room,
admission waits. A remote item's result comes back with its trial directory, which is unpacked
(:mod:`launcher.cluster.trial`: a small one inline, others one at a time on a worker thread)
into the run directory before the result is returned (so it is on disk before the journal
record). When a replica is lost (its actor died, its node left), every item it had in flight
raises :class:`~launcher.dispatch.RolloutLost` and goes back to the queue under a new id.

A node agent's items travel in batched actor calls (:mod:`launcher.cluster.batch`);
``ROLLBRIDGE_RAY_BATCH=0`` makes one ``run_item`` call per item instead (the benchmark's
baseline).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio

from launcher.cluster.batch import AgentLink, Pending
from launcher.cluster.refs import await_ref, ray_cause
from launcher.cluster.trial import is_small, unpack_trial
from launcher.dispatch import RolloutHandle, RolloutRefused, RolloutTransport
from launcher.requeue import RolloutLost
from rollout_server.protocol import RolloutInitRequest, RolloutResultResponse

__all__ = ["GONE", "RayTransport", "Replica"]

#: ``log(level, step, message, details)``.
LogFn = Callable[[str, str, str, "dict[str, Any] | None"], None]


#: States of a replica that is gone for good.
GONE = ("lost", "left")


@dataclass(eq=False)
class Replica:
    """One rollout server of the run: local (``actor`` None) or a node agent."""

    name: str
    node_id: str
    capacity: int
    actor: Any = None
    state: str = "healthy"
    """``healthy``, ``suspect`` (its last ping failed: no new work until one answers),
    ``draining`` (its node is leaving: no new work), ``left`` (its node drained) or
    ``lost``."""
    in_flight: int = 0
    finished: int = 0
    rollouts: set[str] = field(default_factory=set)
    link: AgentLink | None = None
    """The batched calls to ``actor`` (None: local, or one call per item)."""

    @property
    def free(self) -> int:
        """Slots left (0 when not healthy)."""
        return self.capacity - self.in_flight if self.state == "healthy" else 0


class _LocalHandle:
    def __init__(self, inner: RolloutHandle, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release = release

    async def wait(self) -> RolloutResultResponse:
        try:
            return await self._inner.wait()
        finally:
            self._release()


class _RemoteHandle:
    """A rollout on a node agent; :meth:`wait` may be called again (the cancel settle)."""

    def __init__(
        self, transport: RayTransport, replica: Replica, rollout_id: str, answer: Pending | Any
    ):
        self._transport = transport
        self._replica = replica
        self._rollout_id = rollout_id
        self._answer = answer  # a batched item's Pending, or the ObjectRef of a run_item call
        self._outcome: RolloutResultResponse | BaseException | None = None

    async def wait(self) -> RolloutResultResponse:
        if self._outcome is None:
            self._outcome = await self._settle()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    async def _settle(self) -> RolloutResultResponse | BaseException:
        try:
            if isinstance(self._answer, Pending):
                answer = await self._answer.wait()
            else:
                answer = await await_ref(self._answer)
            if answer[0] == "error":  # the agent's item failed (a batched item's task error)
                raise RuntimeError(answer[1])
        except Exception as exc:  # RayActorError, ActorUnavailableError, a task error ...
            self._transport.lose(self._replica, ray_cause(exc))
            return RolloutLost(f"replica {self._replica.name} lost: {type(exc).__name__}")
        finally:
            self._transport.release(self._replica, self._rollout_id)
        if answer[0] == "refused":
            _, status, message, kind = answer
            return RolloutRefused(status, message, kind=kind)
        _, payload, packed = answer
        target = self._transport.trials_dir / self._rollout_id
        if is_small(packed):  # a few system calls: less than a worker thread's round trip
            skipped = unpack_trial(packed, target)
        else:
            # One worker thread for every unpack of the run: a collect's answers arrive
            # together, and a thread each would contend for the GIL (docs/scale-out.md).
            skipped = await trio.to_thread.run_sync(
                unpack_trial, packed, target, limiter=self._transport.unpacking
            )
        for path, reason in skipped:
            self._transport.log(
                "WARNING",
                "cluster",
                "skipped an unsafe artifact",
                {"rollout_id": self._rollout_id, "path": path, "reason": reason},
            )
        self._replica.finished += 1
        self._transport.log(
            "INFO",
            "cluster",
            "rollout finished on replica",
            {"rollout_id": self._rollout_id, "replica": self._replica.name},
        )
        return msgspec.json.decode(payload, type=RolloutResultResponse)


class RayTransport:
    """Dispatch across replicas (see the module docstring)."""

    def __init__(
        self,
        local: RolloutTransport,
        local_replica: Replica,
        trials_dir: Path,
        log: LogFn,
        kill: Callable[[Replica], None],
        batch: bool | None = None,
    ) -> None:
        self._local = local
        self._batch = os.environ.get("ROLLBRIDGE_RAY_BATCH") != "0" if batch is None else batch
        self.replicas: list[Replica] = [local_replica]
        self.trials_dir = trials_dir
        self.log = log
        self._kill = kill
        self._changed = trio.Event()
        self._by_rollout: dict[str, Replica] = {}
        self.unpacking = trio.CapacityLimiter(1)
        """The remote items' trial unpacks, one at a time."""
        self.on_change: Callable[[], None] = lambda: None
        """Called when a replica joins or changes state (the progress view's replica line)."""

    def add(self, replica: Replica) -> None:
        """A new healthy replica takes work from now on."""
        if self._batch and replica.actor is not None and replica.link is None:
            replica.link = AgentLink(replica.actor)
        self.replicas.append(replica)
        self.log(
            "INFO",
            "cluster",
            "replica ready",
            {"replica": replica.name, "capacity": replica.capacity},
        )
        self._wake()
        self.on_change()

    def lose(self, replica: Replica, cause: str, *, left: bool = False) -> None:
        """Mark ``replica`` lost (once): no new work; its actor is killed so every call still
        running on it fails and its items are requeued. ``left``: its node drained, every
        item of it finished first (state ``left``, an INFO line: nothing was lost)."""
        if replica.state in GONE or replica.actor is None:
            return
        replica.state = "left" if left else "lost"
        if left:
            self.log("INFO", "cluster", "replica left", {"replica": replica.name, "cause": cause})
        else:
            self.log(
                "WARNING", "cluster", "replica lost", {"replica": replica.name, "cause": cause}
            )
        if replica.link is not None:
            replica.link.fail(f"replica {replica.state}: {cause}")
        self._kill(replica)
        self._wake()
        self.on_change()

    def start_draining(self, replica: Replica) -> None:
        """Send ``replica`` no new work (its node is leaving)."""
        replica.state = "draining"
        self.log("INFO", "cluster", "replica draining", {"replica": replica.name})
        self.on_change()

    def suspect(self, replica: Replica, cause: str) -> None:
        """A healthy ``replica`` failed a ping: no new work until it answers again."""
        if replica.state == "healthy":
            replica.state = "suspect"
            self.log(
                "WARNING", "cluster", "replica suspect", {"replica": replica.name, "cause": cause}
            )
            self.on_change()

    def recover(self, replica: Replica) -> None:
        """A suspect ``replica`` answered again: it takes work."""
        if replica.state == "suspect":
            replica.state = "healthy"
            self.log("INFO", "cluster", "replica answers again", {"replica": replica.name})
            self._wake()
            self.on_change()

    async def drained(self, replica: Replica) -> None:
        """Return once ``replica`` has nothing in flight."""
        while replica.in_flight:
            await self._changed.wait()

    def release(self, replica: Replica, rollout_id: str) -> None:
        """An item left ``replica``."""
        if rollout_id in replica.rollouts:
            replica.rollouts.discard(rollout_id)
            replica.in_flight -= 1
            self._by_rollout.pop(rollout_id, None)
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @property
    def capacity(self) -> int:
        """The healthy replicas' capacity."""
        return sum(r.capacity for r in self.replicas if r.state == "healthy")

    async def _pick(self) -> Replica:
        while True:
            best = max(self.replicas, key=lambda r: r.free)
            if best.free > 0:
                return best
            await self._changed.wait()

    async def admit(self, request: RolloutInitRequest, admission_timeout_s: float) -> RolloutHandle:
        """Send the rollout to the replica with the most free capacity."""
        replica = await self._pick()
        rollout_id = request.rollout_id
        replica.in_flight += 1
        replica.rollouts.add(rollout_id)
        self._by_rollout[rollout_id] = replica
        if replica.actor is None:
            try:
                inner = await self._local.admit(request, admission_timeout_s)
            except BaseException:
                self.release(replica, rollout_id)
                raise
            return _LocalHandle(inner, lambda: self.release(replica, rollout_id))
        request_json = msgspec.json.encode(request)
        if replica.link is not None:
            answer = await replica.link.submit(rollout_id, request_json, admission_timeout_s)
            return _RemoteHandle(self, replica, rollout_id, answer)
        ref = replica.actor.run_item.remote(request_json, admission_timeout_s)
        return _RemoteHandle(self, replica, rollout_id, ref)

    async def cancel(self, rollout_id: str) -> None:
        """Cancel on whichever replica runs the rollout."""
        replica = self._by_rollout.get(rollout_id)
        if replica is None or replica.actor is None:
            await self._local.cancel(rollout_id)
            return
        if replica.state not in GONE:
            await await_ref(replica.actor.cancel.remote(rollout_id))

    async def explain(self, exc: BaseException) -> str | None:
        """The local server's exit, as for a local run."""
        return await self._local.explain(exc)
