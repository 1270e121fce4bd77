"""Who owns the tunnel's processes, and where its log lines go: the seams the caller of
:func:`tunnel.cloudflared.run_cloudflared_tunnel` fills (the launcher records each cloudflared
so an orphan of a killed run can be reaped; standalone use stops just the process)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import trio

__all__ = ["ChildOwner", "LogSink", "Standalone", "no_log", "no_milestone", "unredacted"]


class LogSink(Protocol):
    """Where log lines go: ``(level, step, message, details)``; level is INFO/WARNING/ERROR."""

    def __call__(
        self, level: str, step: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None: ...


def no_log(level: str, step: str, message: str, details: Mapping[str, Any] | None = None) -> None:
    """A :class:`LogSink` that drops every line."""
    return None


def no_milestone(message: str) -> None:
    """Milestones go nowhere."""
    return None


def unredacted(text: str) -> str:
    """No redaction."""
    return text


class ChildOwner(Protocol):
    """Who owns each cloudflared process the tunnel starts (one at a time, its own session
    leader, so its pid is also its process group).

    ``record`` and ``release`` block (file I/O) and are called on a worker thread.
    """

    def record(self, pid: int, port: int) -> None:
        """Take ownership of the freshly started ``pid``, which forwards to ``port``.

        Raises :class:`ProcessLookupError` when the process cannot be identified (it is already
        gone), another :class:`OSError` when ownership cannot be recorded.
        """

    async def stop(self, process: trio.Process, grace: float) -> bool:
        """Stop ``process`` and whatever it started: SIGTERM, SIGKILL after ``grace`` seconds.
        Returns True when they are confirmed gone. Must finish even when cancelled."""

    def release(self, pid: int) -> None:
        """Give up ownership of ``pid``, which ``stop`` has confirmed gone."""


class Standalone:
    """The owner when none is given: records nothing and stops only the process it started."""

    def record(self, pid: int, port: int) -> None:
        return None

    async def stop(self, process: trio.Process, grace: float) -> bool:
        process.terminate()
        with trio.move_on_after(grace):
            await process.wait()
        if process.returncode is None:
            process.kill()
            with trio.move_on_after(2.0):
                await process.wait()
        return process.returncode is not None

    def release(self, pid: int) -> None:
        return None
