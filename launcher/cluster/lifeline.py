"""Stops a node's rollout server when its node agent dies (run by path: stdlib only).

Usage: ``python lifeline.py <process group> <grace s> <root>`` with the read end of a pipe on stdin;
the agent holds the write end for its whole life. The script forks once and the parent exits,
so the watchdog is no direct child of the Ray worker (Ray kills a worker's direct children when
the worker exits, which would take the watchdog before it could act). When the pipe reaches
end of file, whatever killed the agent (``ray.kill``, ``kill -9``, its node's raylet going),
the watchdog sends the server's process group SIGTERM, then SIGKILL after the grace, and then
removes the agent's node-local directory ``root`` (the server's artifact root).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    """Watch stdin; on end of file stop process group ``argv[0]`` within grace ``argv[1]``,
    then remove directory ``argv[2]``."""
    pgid, grace, root = int(argv[0]), float(argv[1]), argv[2]
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
