"""One ``harbor trial start`` process: forked by the Harbor worker (:mod:`.forkserver`) or
started under the watchdog, polled, stopped on cancel.

The process runs in its own session under ``_watchdog.py`` (which stops Harbor if the rollout
server dies). While it runs, the rollout's status turns ``grading`` once the trial's
``verifier/`` dir appears. Cancelling sends SIGINT to the session's group (Harbor tears its
containers down), SIGKILL after the grace, then sweeps the trial's containers by label.
``stop_when`` stops it the same way but keeps its trial dir and returns: the caller has seen a
reason to end the trial (its container exited) and reads, archives and retires it as usual.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from ..protocol import RolloutStatus
from ..sdk import get_rollout_context
from . import containers
from .forkserver import HarborWorker, WorkerUnavailable

__all__ = ["run_trial_process"]

logger = logging.getLogger("rollout_server.harbor")

_WATCHDOG = Path(__file__).with_name("_watchdog.py")
_STATUS_POLL_S = 1.0
_KILL_WAIT_S = 10.0


async def run_trial_process(
    harbor: list[str],
    config: Path,
    log_path: Path,
    env: dict[str, str],
    trial_dir: Path,
    *,
    grace: float,
    engine: str | None,
    worker: HarborWorker | None = None,
    stop_when: Callable[[], bool] | None = None,
) -> int | None:
    """Run the trial of ``config`` to its end; its output goes to ``log_path`` (0600).

    With ``worker``, the trial is a process forked by the long-lived Harbor worker (no
    interpreter start); when the worker cannot take it, it runs on its own as below.
    ``stop_when`` is asked about once a second; once it says yes the trial is stopped (SIGINT,
    SIGKILL after the grace) and its exit code returned."""
    if worker is not None:
        try:
            return await _run_on_worker(worker, config, log_path, env, trial_dir, engine, stop_when)
        except WorkerUnavailable as exc:
            logger.warning("harbor: %s; this trial runs in a process of its own", exc)
    argv = [
        sys.executable,
        # By path, not -m: importing the package would cost ~0.6 s of trio/msgspec imports.
        str(_WATCHDOG),
        str(os.getpid()),
        str(grace),
        *harbor,
        "trial",
        "start",
        "-c",
        str(config),
    ]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=env,
            start_new_session=True,
            cwd=str(config.parent),
        )
    finally:
        os.close(fd)
    try:
        grading = False
        ctx = get_rollout_context()
        while process.returncode is None:
            with trio.move_on_after(_STATUS_POLL_S):
                await process.wait()
            if process.returncode is None and stop_when is not None and stop_when():
                with trio.CancelScope(shield=True):
                    await _interrupt(process, grace)
                break
            if not grading and (trial_dir / "verifier").is_dir():
                grading = True
                if ctx is not None:
                    await ctx.set_status(RolloutStatus.GRADING)
        return process.returncode
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            await _stop(process, trial_dir, grace, engine)
        raise


async def _run_on_worker(
    worker: HarborWorker,
    config: Path,
    log_path: Path,
    env: dict[str, str],
    trial_dir: Path,
    engine: str | None,
    stop_when: Callable[[], bool] | None,
) -> int | None:
    result: list[int | None] = []
    ctx = get_rollout_context()
    argv = ["trial", "start", "-c", str(config)]
    stop = trio.Event()

    async def watch_stop(done: trio.CancelScope) -> None:
        # A file another process writes: nothing to wait on but a look now and then.
        with done:
            while True:
                if stop_when is not None and stop_when():
                    stop.set()
                    break
                await trio.sleep(_STATUS_POLL_S)

    async def poll_grading(done: trio.CancelScope) -> None:
        with done:
            while True:
                if (trial_dir / "verifier").is_dir():
                    break
                await trio.sleep(_STATUS_POLL_S)
            if ctx is not None:
                await ctx.set_status(RolloutStatus.GRADING)
            await trio.sleep_forever()

    refused: list[WorkerUnavailable] = []
    try:
        async with trio.open_nursery() as nursery:
            polling, watching = trio.CancelScope(), trio.CancelScope()
            nursery.start_soon(poll_grading, polling)
            if stop_when is not None:
                nursery.start_soon(watch_stop, watching)
            try:
                result.append(await worker.run(argv, env, config.parent, log_path, stop=stop))
            except WorkerUnavailable as exc:
                # Raised outside the nursery, where it is not wrapped in a group.
                refused.append(exc)
            finally:
                polling.cancel()
                watching.cancel()
    except trio.Cancelled:
        # The worker has SIGINTed (and, after the grace, SIGKILLed) the trial's group.
        with trio.CancelScope(shield=True):
            await _sweep(trial_dir, engine)
        raise
    if refused:
        raise refused[0]
    return result[0]


async def _stop(process: trio.Process, trial_dir: Path, grace: float, engine: str | None) -> None:
    """SIGINT the trial's group (Harbor tears down), SIGKILL after the grace, then sweep."""
    await _interrupt(process, grace)
    await _sweep(trial_dir, engine)


async def _interrupt(process: trio.Process, grace: float) -> None:
    """SIGINT the trial's group (Harbor writes its result and tears down), SIGKILL after the
    grace."""
    _signal_group(process.pid, signal.SIGINT)
    with trio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGKILL)
        with trio.move_on_after(_KILL_WAIT_S):
            await process.wait()


async def _sweep(trial_dir: Path, engine: str | None) -> None:
    """Remove what a stopped trial left: its containers (by label) and its Harbor dir."""
    if engine is not None:
        removed = await containers.sweep_trial(engine, trial_dir.name)
        if removed:
            logger.info("harbor: removed %d container(s) of %s", len(removed), trial_dir.name)
    await trio.to_thread.run_sync(shutil.rmtree, trial_dir, True)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
