"""Stops a node's rollout server when its node agent dies (run by path: stdlib only).

Usage: ``python lifeline.py <process group> <grace s> <root>`` with the read end of a pipe on stdin;
the agent holds the write end for its whole life. The script forks once and the parent exits,
so the watchdog is no direct child of the Ray worker (Ray kills a worker's direct children when
the worker exits, which would take the watchdog before it could act). When the pipe reaches
end of file, whatever killed the agent (``ray.kill``, ``kill -9``, its node's raylet going),
the watchdog sends the server's process group SIGTERM, then SIGKILL after the grace, and then
removes the agent's node-local directory ``root`` (the server's artifact root).

A Harbor replica's containers carry their rollout server's owner label (``pid:start time``,
:mod:`rollout_server.harbor.containers`); a server killed before its shutdown finished leaves
them running. So for a Harbor server (a fourth argument, ``containers``) the watchdog also
removes, once the group is gone, with each container engine found on PATH, every container
labelled with the server as owner, sweeping again for a short while (a trial's Harbor, stopped
by its own watchdog, may still be starting one).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

#: The label a Harbor trial's containers carry (rollout_server.harbor.containers.OWNER_LABEL).
OWNER_LABEL = "io.rollbridge.harbor.owner"
_ENGINES = ("podman", "docker")
#: Sweeps after the group is gone: until two in a row find nothing, at most this long.
_SWEEP_FOR_S = 30.0
_SWEEP_EVERY_S = 2.0


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(pid: int) -> str | None:
    """``<pid>:<start time>`` as the Harbor backend labels its containers (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return f"{pid}:{fields[19].decode()}" if len(fields) > 19 else None


def _remove_owned(owner: str) -> int:
    """Remove the containers labelled with ``owner`` on every engine here; how many there were."""
    found = 0
    for engine in _ENGINES:
        if shutil.which(engine) is None:
            continue
        try:
            listed = subprocess.run(
                [engine, "ps", "-a", "-q", "--filter", f"label={OWNER_LABEL}={owner}"],
                capture_output=True,
                timeout=60,
                check=False,
            )
            ids = listed.stdout.decode().split()
            if ids:
                found += len(ids)
                subprocess.run(
                    [engine, "rm", "-f", "-t", "0", *ids], capture_output=True, timeout=60
                )
        except (OSError, subprocess.TimeoutExpired):
            continue
    return found


def _sweep(owner: str) -> None:
    stop_at, empty = time.monotonic() + _SWEEP_FOR_S, 0
    while empty < 2 and time.monotonic() < stop_at:
        empty = empty + 1 if _remove_owned(owner) == 0 else 0
        if empty < 2:
            time.sleep(_SWEEP_EVERY_S)


def main(argv: list[str]) -> int:
    """Watch stdin; on end of file stop process group ``argv[0]`` within grace ``argv[1]``,
    then remove directory ``argv[2]`` (and with ``argv[3] == "containers"`` the group leader's
    containers)."""
    pgid, grace, root = int(argv[0]), float(argv[1]), argv[2]
    owner = _owner(pgid) if argv[3:4] == ["containers"] else None
    if os.fork():
        return 0
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    if _alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
        stop_at = time.monotonic() + grace
        while time.monotonic() < stop_at and _alive(pgid):
            time.sleep(0.1)
        if _alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.2)
    shutil.rmtree(root, ignore_errors=True)
    if owner is not None:
        _sweep(owner)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
