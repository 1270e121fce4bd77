"""A bridge process started before its configuration exists (see :mod:`bridge.process`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Final

import trio

from bridge.errors import BridgeProcessError

__all__ = ["IN_PROCESS_ENV", "BridgeSpare", "in_process_requested", "wait_exit"]

#: Set (``1``) to run the bridge inside the supervisor's process instead (debugging, profiling).
IN_PROCESS_ENV: Final = "ROLLBRIDGE_BRIDGE_IN_PROCESS"
#: How long a stopping supervisor gives the child to exit before SIGKILL (it stops when its
#: socket reads EOF, which the supervisor causes only once the rollout server has stopped).
STOP_GRACE_S: Final = 5.0


def in_process_requested() -> bool:
    """Whether :data:`IN_PROCESS_ENV` asks for the in-process bridge."""
    return os.environ.get(IN_PROCESS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


_ahead: BridgeSpare | None = None


class BridgeSpare:
    """A bridge process started before its configuration exists.

    Its web stack takes about 0.6 s to import, about as long as the supervisor takes to import
    its own and prepare the run; a spare started first does both at once, on the other core.
    It waits for :func:`bridge.process.run_bridge_process` to hand it a configuration (the
    environment it must serve with included), or exits when :meth:`discard` closes its socket.
    """

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.taken = False

    @classmethod
    def spawn(cls) -> BridgeSpare:
        """Start one (``python -m bridge.child``, in a session of its own)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "bridge.child", str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            parent.close()
            raise BridgeProcessError(f"could not start the LLM bridge process: {exc}") from None
        finally:
            child.close()
        return cls(process, parent)

    @classmethod
    def ahead(cls) -> BridgeSpare | None:
        """:meth:`spawn` one for the next bridge this process starts (:meth:`take` returns it),
        unless the bridge is to run in process (:data:`IN_PROCESS_ENV`) or the spawn fails
        (then the bridge's start spawns again, and reports the failure). The caller discards
        it on the way out, used or not."""
        global _ahead
        if in_process_requested():
            return None
        try:
            _ahead = cls.spawn()
        except BridgeProcessError:
            return None
        return _ahead

    @classmethod
    def take(cls) -> BridgeSpare:
        """The spare started :meth:`ahead` if it is still unused and alive, else a new one."""
        global _ahead
        spare, _ahead = _ahead, None
        if spare is None or spare.taken or spare.process.poll() is not None:
            if spare is not None:
                spare.discard()
            spare = cls.spawn()
        spare.taken = True
        return spare

    def discard(self) -> None:
        """Stop a spare that was never used (a no-op once :func:`run_bridge_process` took it)."""
        if self.taken:
            return
        self.taken = True
        self.sock.close()
        if self.process.poll() is None:
            self.process.terminate()  # it may still be importing: no need to wait for that
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()


async def wait_exit(process: subprocess.Popen[bytes]) -> int:
    """Wait for ``process`` to exit without blocking the event loop (a pidfd is readable once
    the process has exited); its exit code."""
    if process.poll() is None:
        try:
            pidfd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3, or refused (seccomp, gVisor)
            return await trio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
    return process.wait()
