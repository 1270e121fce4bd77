"""``rollbridge eval run --ray``: rollout-server replicas across a Ray cluster (docs/scale-out.md).

``run`` opens the cluster for one run (Ray driver, bridge relay, replica manager), ``transport``
is the :class:`~launcher.dispatch.RolloutTransport` over the replicas, ``agent`` the Ray actor
that runs on each node, ``relay`` the byte relays of the bridge path, ``lifeline`` the watchdog
that stops a node's rollout server when its agent dies, and ``refs`` awaits Ray results from
trio. Only ``run`` and ``agent`` import Ray; nothing here is imported without ``--ray``.
"""
