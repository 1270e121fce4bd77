"""``rollbridge daemon``: a per-workspace background service that starts, follows, cancels and
inspects eval runs over a local control API (docs/daemon.md).

Modules: ``discovery`` (lock, socket path, ``daemon.json``), ``children`` (run child processes
and their ownership records), ``status`` (a run's state derived from its run directory),
``registry`` (on-disk runs merged with live children), ``stream`` (the SSE event stream over
``events.jsonl``), ``api`` (the raw-ASGI control API), ``listen`` (sockets and the hypercorn
loop), ``service`` (the daemon's lifetime) and ``command`` (the click command).
"""
