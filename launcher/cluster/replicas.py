"""The replica set of a ``--ray`` run seen from the supervisor: pings, the minimum, the line.

- :func:`ping_replicas` asks every node agent, every :data:`PING_S`, whether its rollout server
  answers ``/health``. A failed or unanswered ping makes the replica *suspect* (no new work,
  its items keep running); an answer makes it healthy again; :data:`LOST_AFTER` failures in a
  row make it lost (its items are requeued), which also covers an agent wedged on a live node.
- :func:`hold_minimum` halts the run when fewer replicas than ``[ray].min_replicas`` /
  ``--ray-min-replicas`` are up (healthy or suspect, the supervisor's own included; replicas
  still starting count as up), after :data:`START_GRACE_S`. The halt is dispatch's own (the
  items in flight are cancelled and stay pending for a resume).
- :func:`replica_line` is the progress view's line, ``replicas: head 12 in flight ·
  10.203.0.2 11 in flight · 1 lost``; :func:`announcer` logs each change of the set as a
  ``replicas changed`` line of ``logs.txt`` (the daemon's ``replicas`` event) and tells the UI.
- :func:`nodes_to_start` picks the nodes that get a node agent: those without a working
  replica, a node whose replica was lost while it stayed after a delay per loss, none after
  :data:`MAX_LOSSES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from launcher.cluster.refs import await_ref, ray_cause
from launcher.cluster.transport import GONE, RayTransport, Replica

__all__ = [
    "CHANGED",
    "LOST_AFTER",
    "MAX_LOSSES",
    "PING_S",
    "RESTART_DELAY_S",
    "START_GRACE_S",
    "announcer",
    "hold_minimum",
    "nodes_to_start",
    "ping_replicas",
    "replica_line",
    "replica_states",
]

PING_S = 2.0
PING_TIMEOUT_S = 10.0
#: Failed pings in a row that make a suspect replica lost.
LOST_AFTER = 3
#: How long a run may start with fewer replicas up than its minimum (nodes joining late).
START_GRACE_S = 15.0
_POLL_S = 0.5
#: The ``logs.txt`` message of a change of the replica set (launcher.daemon.stream reads it).
CHANGED = "replicas changed"
#: States of a replica that count towards the minimum (not lost, not leaving).
_UP = ("healthy", "suspect")


def replica_line(replicas: Sequence[Replica], starting: int = 0) -> str:
    """``replicas: head 3 in flight · 10.0.0.2 suspect 2 in flight · 1 starting · 1 lost``."""
    parts = []
    lost = 0
    for replica in replicas:
        if replica.state == "lost":
            lost += 1
            continue
        if replica.state == "left":
            continue
        name = "head" if replica.actor is None else replica.name
        state = "" if replica.state == "healthy" else f" {replica.state}"
        parts.append(f"{name}{state} {replica.in_flight} in flight")
    if starting:
        parts.append(f"{starting} starting")
    if lost:
        parts.append(f"{lost} lost")
    return "replicas: " + " · ".join(parts)


def replica_states(replicas: Sequence[Replica], starting: int = 0) -> dict[str, Any]:
    """The replica set as data: each replica's name, state, items in flight and capacity."""
    return {
        "replicas": [
            {
                "name": replica.name,
                "head": replica.actor is None,
                "state": replica.state,
                "in_flight": replica.in_flight,
                "capacity": replica.capacity,
            }
            for replica in replicas
        ],
        "starting": starting,
        "line": replica_line(replicas, starting),
    }


def announcer(
    transport: RayTransport,
    starting: Callable[[], int],
    log: Callable[[str, str, str, dict[str, Any] | None], object],
    show: Callable[[], None],
) -> Callable[[], None]:
    """What to call when the replica set changed: a ``replicas changed`` line in
    ``logs.txt``, then ``show()`` (the UI's line on piped output)."""

    def changed() -> None:
        log("INFO", "cluster", CHANGED, replica_states(transport.replicas, starting()))
        show()

    return changed


def replicas_up(replicas: Sequence[Replica]) -> int:
    """Replicas that count towards the minimum."""
    return sum(replica.state in _UP for replica in replicas)


async def hold_minimum(
    transport: RayTransport,
    minimum: int,
    starting: Callable[[], int],
    halt: Callable[[str], None],
    *,
    grace_s: float = START_GRACE_S,
) -> None:
    """Call ``halt(reason)`` once fewer than ``minimum`` replicas are up (see the module
    docstring); returns then, or never."""
    if minimum <= 1:  # the supervisor's own replica lives as long as the run
        return
    await trio.sleep(grace_s)
    while True:
        up = replicas_up(transport.replicas) + starting()
        if up < minimum:
            line = replica_line(transport.replicas, starting()).removeprefix("replicas: ")
            halt(
                f"only {up} of the {minimum} replicas the run needs are healthy "
                f"(--ray-min-replicas / [ray].min_replicas): {line}"
            )
            return
        await trio.sleep(_POLL_S)


async def ping_replicas(
    transport: RayTransport,
    *,
    interval_s: float = PING_S,
    timeout_s: float = PING_TIMEOUT_S,
    lost_after: int = LOST_AFTER,
) -> None:
    """Ping the node agents until cancelled (see the module docstring)."""
    misses: dict[str, int] = {}
    while True:
        async with trio.open_nursery() as nursery:
            for replica in list(transport.replicas):
                if replica.actor is not None and replica.state in _UP:
                    nursery.start_soon(_ping, transport, replica, misses, timeout_s, lost_after)
        await trio.sleep(interval_s)


async def _ping(
    transport: RayTransport,
    replica: Replica,
    misses: dict[str, int],
    timeout_s: float,
    lost_after: int,
) -> None:
    cause = f"no answer to a ping within {timeout_s:g}s"
    with trio.move_on_after(timeout_s):
        try:
            if await await_ref(replica.actor.health.remote()):
                misses.pop(replica.node_id, None)
                transport.recover(replica)
                return
            cause = "its rollout server does not answer /health"
        except Exception as exc:  # RayActorError, ActorUnavailableError, ...
            cause = ray_cause(exc)
    missed = misses[replica.node_id] = misses.get(replica.node_id, 0) + 1
    if missed >= lost_after:
        transport.lose(replica, f"{missed} pings in a row failed; the last: {cause}")
    else:
        transport.suspect(replica, cause)


#: A node whose replica was lost while the node stayed (its server or agent died) gets a new
#: one after this many seconds per loss so far, and none after :data:`MAX_LOSSES` losses.
RESTART_DELAY_S = 5.0
MAX_LOSSES = 3


def nodes_to_start(
    alive: dict[str, str],
    replicas: list[Replica],
    skip: set[str],
    lost_at: dict[int, float],
    now: float,
) -> tuple[dict[str, str], set[str]]:
    """The alive nodes (id -> address) that should get a node agent now, and the nodes whose
    replicas were lost :data:`MAX_LOSSES` times (to refuse from now on).

    The supervisor's node (``replicas[0]``) has its local replica. A node with a replica that
    is not lost, or in ``skip`` (starting, refused), gets none. A node whose replicas were all
    lost while it stayed alive (a killed server or agent) gets a new one
    :data:`RESTART_DELAY_S` seconds per loss after its last loss (``lost_at``: ``id`` of a
    replica -> when it was seen lost), so a node whose server keeps dying is not restarted in a loop.
    """
    own = replicas[0].node_id
    working = {r.node_id for r in replicas if r.state not in GONE}
    losses: dict[str, list[float]] = {}
    for replica in replicas:
        if replica.state == "lost":
            losses.setdefault(replica.node_id, []).append(lost_at.get(id(replica), now))
    wanted: dict[str, str] = {}
    spent: set[str] = set()
    for node_id, address in alive.items():
        if node_id == own or node_id in working or node_id in skip:
            continue
        times = losses.get(node_id, [])
        if len(times) >= MAX_LOSSES:
            spent.add(node_id)
        elif not times or now >= max(times) + RESTART_DELAY_S * len(times):
            wanted[node_id] = address
    return wanted, spent
