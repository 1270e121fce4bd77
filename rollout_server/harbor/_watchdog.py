"""Runs one Harbor trial command and stops it when its owner (the rollout server) dies.

Usage: ``python .../rollout_server/harbor/_watchdog.py <owner pid> <grace s> <argv...>`` (run by
path, so that it imports nothing of the project).

The backend starts this wrapper in a new session and signals that session's process group to
cancel. The wrapper ignores SIGINT itself (Harbor gets it from the group signal and cleans up),
waits for Harbor, and exits with its code. When the owner disappears (``kill -9`` of the rollout
server) it sends Harbor SIGINT, then SIGKILL after the grace; whatever containers survive are
reaped by label at the next server start. A parent-death signal cannot be used instead: trio
forks from a worker thread, and the kernel fires that signal when the forking thread exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

_POLL_S = 0.5


def main(argv: list[str]) -> int:
    """Run ``argv[2:]``; watch owner pid ``argv[0]``; ``argv[1]`` is the SIGKILL grace."""
    owner, grace, command = int(argv[0]), float(argv[1]), argv[2:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen(command, restore_signals=True, preexec_fn=_default_sigint)
    stop_at: float | None = None
    while True:
        try:
            return child.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if stop_at is None and os.getppid() != owner:
            child.send_signal(signal.SIGINT)
            stop_at = time.monotonic() + grace
        elif stop_at is not None and time.monotonic() >= stop_at:
            child.kill()


def _default_sigint() -> None:
    # The wrapper ignores SIGINT; Harbor must not inherit that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
