"""``bench_ray.py --parts``: the thread CPU of a remote item's own steps in each supervisor.

Loaded by every Python process whose ``PYTHONPATH`` starts with this directory (bench_ray puts
it there for its measured runs); it does nothing unless the process is an ``eval run`` with
``--name`` and ``BENCH_PARTS_DIR`` is set. Once :mod:`launcher.cluster.transport` is
imported it wraps, with ``time.thread_time`` around each call (the calling thread's CPU, the
kernel's work for it included): the remote trial's unpack (``unpack_trial``: its ``mkdir``s
and file creations) and the node agent's batched actor calls as the trio thread pays them
(``AgentLink._call``: Ray's ``.remote()`` and ``.future()``; ``AgentLink._collected``: a
collect's answers handed out, without the next call it makes). At exit it writes ``<BENCH_PARTS_DIR>/<name>.json``:
``{part: [calls, seconds]}``. A measurement aid only: never on a real run's path.
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

_PARTS: dict[str, list[float]] = {}
_NESTED: list[float] = []  # per wrapped call in progress: its wrapped callees' time


def _wrap(owner: Any, attr: str, label: str) -> None:
    inner: Callable[..., Any] = getattr(owner, attr)
    clock = time.thread_time
    tally = _PARTS.setdefault(label, [0, 0.0])

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        _NESTED.append(0.0)
        try:
            return inner(*args, **kwargs)
        finally:
            spent = clock() - start
            tally[0] += 1
            tally[1] += spent - _NESTED.pop()  # exclusive: a collect's next call is a call's
            if _NESTED:
                _NESTED[-1] += spent

    setattr(owner, attr, timed)


def _install() -> None:
    import launcher.cluster.batch as batch
    import launcher.cluster.transport as transport

    _wrap(transport, "unpack_trial", "unpack")
    _wrap(batch.AgentLink, "_call", "call")
    _wrap(batch.AgentLink, "_collected", "collected")


def _dump(directory: str, name: str) -> None:
    with open(os.path.join(directory, f"{name}.json"), "w") as fh:
        json.dump(_PARTS, fh)


def _arm() -> None:
    directory = os.environ.get("BENCH_PARTS_DIR")
    if not directory or "eval" not in sys.argv or "--name" not in sys.argv:
        return
    name = sys.argv[sys.argv.index("--name") + 1]
    original = builtins.__import__
    done = False

    def importing(module: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal done
        imported = original(module, *args, **kwargs)
        if not done and module == "launcher.cluster.transport":
            done = True
            builtins.__import__ = original
            _install()
        return imported

    builtins.__import__ = importing
    atexit.register(_dump, directory, name)


_arm()
