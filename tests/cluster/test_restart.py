"""Which nodes get a node agent (launcher.cluster.replicas.nodes_to_start): a node whose replica was
lost while the node stayed alive gets a new one after a delay that grows with its losses, and
none after MAX_LOSSES (the drills in test_ray_testbed.py cover losses of whole nodes)."""

from __future__ import annotations

from launcher.cluster.replicas import MAX_LOSSES, RESTART_DELAY_S, nodes_to_start
from launcher.cluster.transport import Replica

ALIVE = {"head": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}


def _replicas(*states: tuple[str, str]) -> list[Replica]:
    own = Replica("10.0.0.1", "head", 4)
    return [own, *(Replica(ALIVE[node], node, 4, actor=object(), state=s) for node, s in states)]


def test_nodes_without_a_working_replica_get_one() -> None:
    replicas = _replicas(("n2", "healthy"))
    assert nodes_to_start(ALIVE, replicas, set(), {}, 0.0) == ({"n3": "10.0.0.3"}, set())
    # Starting or refused nodes are left alone; so is a suspect or draining replica's node.
    assert nodes_to_start(ALIVE, replicas, {"n3"}, {}, 0.0) == ({}, set())
    replicas = _replicas(("n2", "suspect"), ("n3", "draining"))
    assert nodes_to_start(ALIVE, replicas, set(), {}, 0.0) == ({}, set())


def test_a_node_whose_replica_was_lost_gets_a_new_one_after_a_delay() -> None:
    replicas = _replicas(("n2", "lost"), ("n3", "healthy"))
    lost_at = {id(replicas[1]): 100.0}
    assert nodes_to_start(ALIVE, replicas, set(), lost_at, 100.0) == ({}, set())
    wanted = nodes_to_start(ALIVE, replicas, set(), lost_at, 100.0 + RESTART_DELAY_S)
    assert wanted == ({"n2": "10.0.0.2"}, set())
    # Lost again: the wait grows with the losses, the last loss counting from its own time.
    replicas.append(Replica("10.0.0.2", "n2", 4, actor=object(), state="lost"))
    lost_at[id(replicas[-1])] = 200.0
    assert nodes_to_start(ALIVE, replicas, set(), lost_at, 200.0 + RESTART_DELAY_S) == (
        {},
        set(),
    )
    assert nodes_to_start(ALIVE, replicas, set(), lost_at, 200.0 + 2 * RESTART_DELAY_S)[0] == {
        "n2": "10.0.0.2"
    }


def test_a_node_that_keeps_losing_its_replica_is_refused() -> None:
    replicas = _replicas(*[("n2", "lost")] * MAX_LOSSES)
    lost_at = {id(r): 0.0 for r in replicas[1:]}
    assert nodes_to_start(ALIVE, replicas, set(), lost_at, 1e9) == ({"n3": "10.0.0.3"}, {"n2"})


def test_a_node_that_left_is_not_counted_lost_and_may_return() -> None:
    from launcher.cluster.replicas import replica_line

    replicas = _replicas(("n2", "left"), ("n3", "lost"))
    assert replica_line(replicas) == "replicas: head 0 in flight · 1 lost"
    # A drained node that comes back (under the same id) is served again at once.
    wanted, spent = nodes_to_start(ALIVE, replicas, set(), {id(replicas[2]): 0.0}, 0.0)
    assert wanted == {"n2": "10.0.0.2"} and spent == set()
