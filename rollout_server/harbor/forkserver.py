"""The rollout server's end of the long-lived Harbor worker (``_forkserver.py``).

One worker per backend, started with the first trial that can use it, from the interpreter of
Harbor's own environment. :meth:`HarborWorker.run` asks it for one ``harbor trial start``
process and waits for its exit; cancelling sends that trial's process group SIGINT, SIGKILL
after the grace (what the per-trial watchdog path does too). The worker stops every trial of its
own when this process dies (its stdin closes), and a trial stops when the worker dies.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
from pathlib import Path

import trio

__all__ = ["HarborWorker", "WorkerUnavailable", "harbor_python"]

logger = logging.getLogger("rollout_server.harbor")

_SERVER = Path(__file__).with_name("_forkserver.py")
_READY_TIMEOUT_S = 120.0
_KILL_WAIT_S = 10.0


class WorkerUnavailable(Exception):
    """The worker could not start or has gone away (the caller runs the trial on its own)."""


def harbor_python(harbor: list[str]) -> Path | None:
    """The interpreter of Harbor's environment: ``python`` beside a lone ``harbor`` executable
    (the test bed's venv, the ``rollbridge[harbor]`` extra); None for any other command."""
    if len(harbor) != 1:
        return None
    python = Path(harbor[0]).parent / "python"
    return python if os.access(python, os.X_OK) else None


class _Trial:
    def __init__(self) -> None:
        self.started = trio.Event()
        self.ended = trio.Event()
        self.pid: int | None = None
        self.error: str | None = None
        self.exit: int | None = None


class HarborWorker:
    """A Harbor fork server, started on first use; one per backend."""

    def __init__(self, python: Path, env: dict[str, str], grace: float) -> None:
        self.python = python
        self.env = env
        self.grace = grace
        self._process: trio.Process | None = None
        self._lock = trio.Lock()
        # One writer at a time: trio refuses concurrent sends on one stream.
        self._send_lock = trio.Lock()
        self._trials: dict[int, _Trial] = {}
        self._ids = itertools.count(1)
        self._dead = False

    async def _ensure(self) -> trio.Process:
        async with self._lock:
            if self._dead:
                raise WorkerUnavailable("the Harbor worker has gone away")
            if self._process is not None:
                return self._process
            argv = [str(self.python), str(_SERVER), str(os.getpid()), str(self.grace)]
            try:
                process = await trio.lowlevel.open_process(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                )
            except OSError as exc:
                self._dead = True
                raise WorkerUnavailable(f"cannot start the Harbor worker: {exc}") from exc
            assert process.stdout is not None
            lines = _lines(process.stdout)
            with trio.move_on_after(_READY_TIMEOUT_S):
                try:
                    first = await lines.__anext__()
                except StopAsyncIteration:
                    first = b"{}"
                if first.strip() == b'{"ready": true}':
                    self._process = process
                    trio.lowlevel.spawn_system_task(self._read, lines)
                    return process
            process.kill()
            self._dead = True
            raise WorkerUnavailable("the Harbor worker did not report ready")

    async def _read(self, lines: _LineIter) -> None:
        try:
            async for line in lines:
                try:
                    message = json.loads(line)
                    trial = self._trials[int(message["id"])]
                except (ValueError, KeyError, TypeError):
                    continue
                if "pid" in message:
                    trial.pid = int(message["pid"])
                    trial.started.set()
                elif "error" in message:
                    trial.error = str(message["error"])
                    trial.started.set()
                    trial.ended.set()
                elif "exit" in message:
                    trial.exit = int(message["exit"])
                    trial.ended.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self._dead = True
            for trial in self._trials.values():
                trial.error = trial.error or "the Harbor worker has gone away"
                trial.started.set()
                trial.ended.set()

    async def start(self) -> None:
        """Start the worker now (else the first :meth:`run` does); raises
        :class:`WorkerUnavailable` when it cannot."""
        await self._ensure()

    async def run(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log: Path,
        *,
        stop: trio.Event | None = None,
    ) -> int | None:
        """Run ``harbor <argv>`` as a process of the worker's; its exit code (None if unknown).
        Once ``stop`` is set, the process is stopped as a cancel would (SIGINT, SIGKILL after
        the grace) and its exit code returned.

        Raises :class:`WorkerUnavailable` when the worker cannot take the trial (nothing ran)."""
        process = await self._ensure()
        ident = next(self._ids)
        trial = self._trials[ident] = _Trial()
        request = {"id": ident, "argv": argv, "env": env, "cwd": str(cwd), "log": str(log)}
        try:
            assert process.stdin is not None
            try:
                async with self._send_lock:
                    await process.stdin.send_all((json.dumps(request) + "\n").encode())
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise WorkerUnavailable("the Harbor worker has gone away") from exc
            await trial.started.wait()
            if trial.pid is None:
                raise WorkerUnavailable(trial.error or "the Harbor worker refused the trial")
            try:
                await _first(trial.ended, stop)
                if not trial.ended.is_set():
                    with trio.CancelScope(shield=True):
                        await self._stop(trial)
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await self._stop(trial)
                raise
            return trial.exit
        finally:
            self._trials.pop(ident, None)

    async def _stop(self, trial: _Trial) -> None:
        assert trial.pid is not None
        _signal(trial.pid, signal.SIGINT)
        with trio.move_on_after(self.grace):
            await trial.ended.wait()
        if not trial.ended.is_set():
            _signal(trial.pid, signal.SIGKILL)
            with trio.move_on_after(_KILL_WAIT_S):
                await trial.ended.wait()

    async def aclose(self) -> None:
        """Close the worker's stdin (it stops its trials and exits) and wait for it."""
        process = self._process
        if process is None:
            return
        self._dead = True
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            assert process.stdin is not None
            await process.stdin.aclose()
        with trio.move_on_after(self.grace + _KILL_WAIT_S):
            await process.wait()
        if process.returncode is None:
            process.kill()


async def _first(ended: trio.Event, stop: trio.Event | None) -> None:
    """Return once ``ended`` is set, or ``stop`` (when given) is."""
    if stop is None:
        await ended.wait()
        return
    async with trio.open_nursery() as nursery:

        async def wait_then_cancel(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait_then_cancel, ended)
        nursery.start_soon(wait_then_cancel, stop)


def _signal(pid: int, sig: signal.Signals) -> None:
    # The group once the child has called setsid; the pid itself if it has not yet.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class _LineIter:
    """Lines (without the newline) from a receive stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    def __aiter__(self) -> _LineIter:
        return self

    async def __anext__(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise StopAsyncIteration
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def _lines(stream: trio.abc.ReceiveStream) -> _LineIter:
    return _LineIter(stream)
