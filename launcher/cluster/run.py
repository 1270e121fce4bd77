"""Opening the Ray cluster for one run: driver, the bridge's door, replicas (docs/scale-out.md).

:func:`open_cluster` wraps the dispatch of a run whose services (bridge, local rollout server)
are already up. It joins the cluster as its driver (``--ray ADDRESS``) or starts a local one
(``--ray local``), opens the bridge's door on the head's cluster address (connections from
the cluster's nodes, handed to the bridge, which serves them over TLS: bridge.tls), starts a node
agent on every other alive node (those with a ``rollbridge_host`` resource when any node has
one; each builds the rollout's environment from the bundle of
:class:`~launcher.cluster.ship.Shipment`), and yields the services with a
:class:`~launcher.cluster.transport.RayTransport` and the concurrency of all replicas. A
replica manager keeps polling the node list: a node that leaves loses its replica (its items
are requeued), a node that joins gets one. On exit every agent is
asked to stop its server, then killed, and the driver disconnects.

Ray's blocking calls (``ray.init``, ``ray.nodes``, ``ray.kill``) run on worker threads; results
are awaited through :func:`~launcher.cluster.refs.await_ref`. Secrets reach agents as actor
arguments, never in a ``runtime_env`` (whose ``env_vars`` other clients read in plain text).

Dispatch begins once the agents started at the open have tried, or after :data:`FIRST_WAIT_S`;
an agent that comes up later (and a node that joins) adds its capacity to the run's
concurrency (``Services.grow_with``).

Why one module of this size: opening the cluster is one sequence (join, the bridge's door,
the agents, the replica manager, the stop) over one state (:class:`_Cluster`), and each step
undoes what the ones before it opened when it fails; split, each part would need the others'
private state.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from bridge.errors import BridgeProcessError
from launcher.cluster.agent import AgentSpec, NodeAgent
from launcher.cluster.flags import deadman_seconds
from launcher.cluster.join import import_ray, join, local_auth
from launcher.cluster.refs import await_ref
from launcher.cluster.relay import AllowedPeers, serve_relay
from launcher.cluster.replicas import (
    MAX_LOSSES,
    announcer,
    hold_minimum,
    nodes_to_start,
    ping_replicas,
    replica_line,
)
from launcher.cluster.ship import Shipment
from launcher.cluster.transport import GONE, RayTransport, Replica
from launcher.dispatch import resolve_concurrency
from launcher.dispatch_io import RolloutClientTransport
from launcher.errors import LocalEvalError
from launcher.process import STOP_GRACE_S
from launcher.rollout_env import find_uv, rollout_python
from launcher.services import cap_notice

if TYPE_CHECKING:
    from launcher.services import RunContext, Services

__all__ = ["HOST_RESOURCE", "clustered", "open_cluster"]

#: A custom resource a cluster may give the nodes meant for replicas (one agent per unit).
HOST_RESOURCE = "rollbridge_host"
POLL_S = 1.0
AGENT_START_S = 180.0
#: How long dispatch waits for the agents started at the open before it begins without those
#: still starting (a first build of a node's environment; a node whose host unit another run's
#: agent holds): they join when they are up, adding their capacity.
FIRST_WAIT_S = 60.0


def _draining_nodes() -> set[str]:
    """Nodes being drained (a ``ray start --block`` that got SIGTERM): Ray lists them only
    through its private state API, so any failure there means none."""
    try:
        from ray._private.state import state

        return set(state.get_draining_nodes())
    except Exception:
        return set()


def _alive_nodes(nodes: list[dict[str, Any]], resource: str) -> dict[str, str]:
    """Of Ray's node list, the alive nodes meant for replicas: node id -> address."""
    alive = [n for n in nodes if n.get("Alive")]
    tagged = [n for n in alive if n.get("Resources", {}).get(resource)]
    return {n["NodeID"]: n["NodeManagerAddress"] for n in (tagged or alive)}


def _node_list(ray: Any) -> tuple[list[dict[str, Any]], set[str]]:
    """Ray's node list and the nodes being drained: one worker-thread trip per poll."""
    return ray.nodes(), _draining_nodes()


def _freeze_startup_heap() -> None:
    """Leave what start-up allocated (Ray's modules above all: they about double the objects a
    full collection walks) out of the collections during dispatch: one full collection now,
    then ``gc.freeze``. Without it the first full collection after Ray's import falls in
    dispatch (25 to 60 ms of the main thread, docs/scale-out.md); the bridge's process and the
    rollout server do the same after their start-up."""
    gc.collect()
    gc.freeze()


def _one_line(exc: BaseException) -> str:
    """``exc`` in one line: the agent's own exception rather than Ray's wrapper and traceback."""
    cause = getattr(exc, "cause", None)
    shown = cause if isinstance(cause, BaseException) else exc
    return " ".join(f"{type(shown).__name__}: {shown}".split())[:500]


class _Cluster:
    def __init__(
        self,
        ray: Any,
        ctx: RunContext,
        transport: RayTransport,
        spec: AgentSpec,
        shipment: Shipment,
        default: int,
        peers: AllowedPeers,
        cut: Callable[[str], Awaitable[int]],
    ) -> None:
        self.ray = ray
        self.peers = peers
        self.cut = cut  # closes the bridge's connections from a peer (bridge.tls)
        self.resource = ctx.prepared.ray.resource if ctx.prepared.ray else HOST_RESOURCE
        self.default_capacity = default
        self.ctx = ctx
        self.transport = transport
        self.spec = spec
        self.shipment = shipment
        self.tagged = False
        self.starting: set[str] = set()
        self.refused: set[str] = set()
        self.lost_at: dict[int, float] = {}
        """When each lost replica (by ``id``: a node's replicas share its address as their
        name) was first seen lost."""
        self.actor_class = ray.remote(NodeAgent)
        self.nursery: trio.Nursery | None = None

    def options(self, node_id: str) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {
            "num_cpus": 0,
            "max_restarts": 0,
            "max_task_retries": 0,
            "max_concurrency": 1000,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        }
        if self.tagged:
            options["resources"] = {self.resource: 1}
        return options

    async def start_agent(self, node_id: str, address: str) -> None:
        self.starting.add(node_id)
        actor = None
        try:
            ship, shipped = await self.shipment.get()
            spec = msgspec.json.encode(msgspec.structs.replace(self.spec, ship=ship))
            actor = self.actor_class.options(**self.options(node_id)).remote()
            with trio.fail_after(AGENT_START_S):
                facts = await await_ref(actor.start.remote(spec, shipped))
        except Exception as exc:
            cause = _one_line(exc)
            self.ctx.log(
                "WARNING",
                "cluster",
                "node refused: its replica did not start",
                {"node": address, "error": cause},
            )
            # On the terminal too: the run goes on without that node's slots.
            self.ctx.ui.warning(
                f"node {address} refused: its replica did not start: {cause}", "NODE_REFUSED"
            )
            self.refused.add(node_id)
            if actor is not None:
                await trio.to_thread.run_sync(partial(self.ray.kill, actor, no_restart=True))
            return
        finally:
            self.starting.discard(node_id)
        self.ctx.log(
            "INFO",
            "cluster",
            "replica environment " + ("built" if facts.get("env_built") else "reused"),
            {"node": address, "python": facts.get("python"), "bundle": ship.digest[:12]},
        )
        removed, freed = facts.get("env_pruned") or (0, 0)
        if removed:
            self.ctx.log(
                "INFO",
                "cluster",
                "node cache pruned",
                {"node": address, "environments": removed, "bytes": freed},
            )
        # A server without a capacity (an unbounded backend) takes what a local run would send.
        capacity = int(facts.get("capacity") or self.default_capacity)
        self.transport.add(Replica(address, node_id, capacity, actor=actor))

    def count_starting(self) -> int:
        """Agents being started now."""
        return len(self.starting)

    def wanted(self, alive: dict[str, str]) -> dict[str, str]:
        replicas = self.transport.replicas
        now = trio.current_time()
        for replica in replicas:
            if replica.state == "lost":
                self.lost_at.setdefault(id(replica), now)
        wanted, spent = nodes_to_start(
            alive, replicas, self.starting | self.refused, self.lost_at, now
        )
        for node_id in spent:
            self.refused.add(node_id)
            self.ctx.log(
                "WARNING",
                "cluster",
                "node refused: its replica was lost too often",
                {"node": alive[node_id], "losses": MAX_LOSSES},
            )
        return wanted

    async def poll(self) -> dict[str, str]:
        nodes, draining = await trio.to_thread.run_sync(_node_list, self.ray)
        self.tagged = any(n.get("Resources", {}).get(self.resource) for n in nodes)
        left = self.peers.update(n["NodeManagerAddress"] for n in nodes if n.get("Alive"))
        for address in sorted(left):
            # Refused at the door from now on; what it opened before is closed too.
            cut = await self.cut(address)
            self.ctx.log(
                "INFO",
                "cluster",
                "bridge connections of a node that left closed",
                {"node": address, "connections": cut},
            )
        alive = _alive_nodes(nodes, self.resource)
        for replica in self.transport.replicas:
            if replica.actor is None:
                continue
            if replica.node_id not in alive:
                self.transport.lose(replica, "its node left the cluster")
            elif (
                replica.node_id in draining
                and replica.state == "healthy"
                and self.nursery is not None  # from the first poll on (agents started)
            ):
                self.transport.start_draining(replica)
                self.nursery.start_soon(self.retire, replica)
        return alive

    async def retire(self, replica: Replica) -> None:
        """A leaving node: let its items finish, then stop its agent, so the node's drain
        (which waits for every worker of the node to be released) can end."""
        await self.transport.drained(replica)
        await self._stop_one(replica)
        self.transport.lose(replica, "its node left the cluster (drained)", left=True)

    async def manage(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start agents on the nodes alive now (reported once they all tried, or after
        :data:`FIRST_WAIT_S`: the others go on starting), then follow the node list."""
        async with trio.open_nursery() as nursery:
            first = self.wanted(await self.poll())
            tried = trio.Event()
            left = len(first)

            async def start_first(node_id: str, address: str) -> None:
                nonlocal left
                try:
                    await self.start_agent(node_id, address)
                finally:
                    left -= 1
                    if left == 0:
                        tried.set()

            for node_id, address in first.items():
                nursery.start_soon(start_first, node_id, address)
            if not first:
                tried.set()
            with trio.move_on_after(FIRST_WAIT_S):
                await tried.wait()
            task_status.started()
            self.nursery = nursery
            while True:
                await trio.sleep(POLL_S)
                for node_id, address in self.wanted(await self.poll()).items():
                    nursery.start_soon(self.start_agent, node_id, address)

    async def stop_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for replica in self.transport.replicas:
                if replica.actor is not None and replica.state not in GONE:
                    nursery.start_soon(self._stop_one, replica)

    async def _stop_one(self, replica: Replica) -> None:
        with trio.move_on_after(STOP_GRACE_S + 5.0):
            try:
                await await_ref(replica.actor.stop.remote(STOP_GRACE_S))
            except Exception as exc:
                self.ctx.log("WARNING", "cluster", "agent stop failed", {"error": str(exc)})
        await trio.to_thread.run_sync(partial(self.ray.kill, replica.actor, no_restart=True))


@asynccontextmanager
async def clustered(ctx: RunContext, services: Services) -> AsyncIterator[Services | None]:
    """``services`` as they are without ``--ray``; else with the cluster open (None when an
    interrupt came while it opened)."""
    if ctx.prepared.ray is None:
        yield services
        return
    async with open_cluster(ctx, services) as opened:
        yield opened


@asynccontextmanager
async def open_cluster(ctx: RunContext, services: Services) -> AsyncIterator[Services | None]:
    """The run's services with dispatch across the cluster (see the module docstring)."""
    p = ctx.prepared
    assert p.ray is not None
    address = p.ray.address
    if address == "local":
        p.redactor.add(local_auth(os.environ))
    ray = import_ray()
    ctx.stage(f"joining Ray cluster ({address})", step="cluster")
    joined: tuple[str, str] | None = None
    with ctx.interrupts.work_scope():  # the first Ctrl-C abandons Ray's connect loop
        joined = await join(ray, address, p.ray.resource, ctx.log, ctx.logs_hint)
    if joined is None:
        yield None
        return
    own_node, head_ip = joined
    try:
        async with trio.open_nursery() as nursery:
            # The bridge makes the run's certificate (its key stays in the bridge's process)
            # and serves the connections this door accepts from the cluster's nodes.
            try:
                pem = await services.bridge.start_tls(head_ip)
            except (OSError, subprocess.SubprocessError, ssl.SSLError, BridgeProcessError) as exc:
                raise LocalEvalError(f"--ray: {exc}".splitlines()[0]) from None
            if pem is None:
                plain = "no openssl found: the bridge across nodes is plain TCP (bearer only)"
                ctx.log("WARNING", "cluster", plain, None)
                ctx.ui.warning(plain, "RELAY_WITHOUT_TLS")
            peers = AllowedPeers(head_ip)  # and the alive nodes, from each poll on

            def refused(peer: str) -> None:
                ctx.log(
                    "WARNING", "cluster", "relay refused a peer not in the cluster", {"peer": peer}
                )

            async def hand_over(stream: trio.abc.Stream) -> None:
                assert isinstance(stream, trio.SocketStream)
                await services.bridge.adopt(
                    socket.socket(fileno=stream.socket.detach()), still_allowed=peers
                )

            relay_port = await nursery.start(serve_relay, hand_over, head_ip, None, peers, refused)
            ctx.log(
                "INFO",
                "cluster",
                "bridge relay listening",
                {"host": head_ip, "port": relay_port, "tls": pem is not None},
            )
            default = resolve_concurrency(p.options.max_in_flight, p.spec.batch_size, None)
            capacity = await services.server.probe_capacity() or default
            local = Replica(f"{head_ip} (supervisor)", own_node, capacity)

            def kill(replica: Replica) -> None:
                nursery.start_soon(
                    trio.to_thread.run_sync, partial(ray.kill, replica.actor, no_restart=True)
                )

            transport = RayTransport(
                RolloutClientTransport(services.server.client, services.server),
                local,
                ctx.run_dir.trials_dir,
                ctx.log,
                kill,
            )
            secrets = {n: os.environ[n] for n in p.config.secrets_required if n in os.environ}
            spec = AgentSpec(
                python=str(rollout_python(p.paths.rollout_dir, os.environ)),
                entrypoint=str(p.paths.entrypoint),
                rollout_dir=str(p.paths.rollout_dir),
                config_env=dict(p.config.env),
                secrets=secrets,
                relay_host=head_ip,
                relay_port=relay_port,
                relay_cert=pem,
                guest=os.environ.get("ROLLBRIDGE_AGENT_GUEST") == "1",
                deadman_s=deadman_seconds(os.environ),
            )
            python = rollout_python(p.paths.rollout_dir, os.environ)
            uv = find_uv(p.config.experiment.rollout)
            entrypoint = p.paths.entrypoint
            shipment = Shipment(ray, p.paths.rollout_dir, python, entrypoint, uv, ctx.log)
            cluster = _Cluster(
                ray, ctx, transport, spec, shipment, default, peers, services.bridge.cut
            )
            try:
                with ctx.interrupts.work_scope():  # agents starting (their builds) are cancelled
                    await nursery.start(cluster.manage)
                if ctx.interrupts.interrupted:
                    yield None
                    return
                nursery.start_soon(ping_replicas, transport)
                starting = cluster.count_starting
                ctx.ui.show_replicas(lambda: replica_line(transport.replicas, starting()))
                transport.on_change = announcer(
                    transport, starting, ctx.log, ctx.ui.replicas_changed
                )
                transport.on_change()
                remote = [r.name for r in transport.replicas if r.actor is not None]
                count = len(transport.replicas)
                others = ", ".join(remote) or "no other node"
                if not remote and cluster.refused:
                    others += f", {len(cluster.refused)} refused"
                if still := starting():
                    others += f", {still} still starting"
                ctx.stage(
                    f"{count} replica{'s' if count != 1 else ''} "
                    f"({others} besides the supervisor's), capacity {transport.capacity}",
                    step="cluster",
                )
                concurrency = resolve_concurrency(
                    p.options.max_in_flight, p.spec.batch_size, transport.capacity
                )
                capped = cap_notice(
                    p.options.max_in_flight, p.spec.batch_size, transport.capacity, "the replicas'"
                )
                if capped is not None:
                    ctx.log("WARNING", "dispatch", capped, None)
                    ctx.ui.warning(capped, "CONCURRENCY_CAPPED")
                minimum = partial(hold_minimum, transport, p.ray.min_replicas, starting)

                def grow_with(grow: Callable[[int], None]) -> None:
                    # A replica that joins adds its capacity to the run's (a node that joined,
                    # or one whose agent was still starting when dispatch began).
                    announce = transport.on_change

                    def grown() -> None:
                        capacity = transport.capacity
                        grow(resolve_concurrency(max_in_flight, p.spec.batch_size, capacity))

                    def changed() -> None:
                        announce()
                        grown()

                    transport.on_change = changed
                    grown()  # any that joined between the cluster's open and dispatch

                max_in_flight = p.options.max_in_flight
                _freeze_startup_heap()
                yield dataclasses.replace(
                    services,
                    transport=transport,
                    concurrency=concurrency,
                    watch_cluster=minimum,
                    grow_with=grow_with,
                )
            finally:
                gc.unfreeze()
                ctx.ui.show_replicas(None)
                with trio.CancelScope(shield=True):
                    await cluster.stop_all()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(ray.shutdown)
