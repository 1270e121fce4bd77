"""The daemon's run children: each run is a ``rollbridge eval run … --yes --json`` process in its
own session, and its ownership record ``.osmosis/daemon/runs/<name>.json``.

A child in its own session is not touched by a signal sent to the daemon's terminal, and it
outlives the daemon: its output goes to files, never to a pipe the daemon would have to drain.
The record carries the pid and the kernel start token of the child, so a restarted daemon can
prove a recorded pid is still that child before trusting or signalling it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import trio

from launcher.process import child_environment, start_token
from launcher.rundir.atomic import atomic_write_json, ensure_dir
from launcher.rundir.logs import utc_now_iso

__all__ = ["ChildRecord", "RunChild", "read_records", "spawn_logged", "spawn_run"]


@dataclass
class ChildRecord:
    """The daemon's durable facts about one run child (one file per run name)."""

    name: str
    pid: int
    start_token: str
    started_at: str
    #: Size of ``logs.txt`` when the child started: stage lines after it are this child's.
    log_offset: int
    #: Work items with a result when the child started (the ETA counts only this child's).
    done_at_start: int = 0
    #: Highest cancel stage sent (0 = none), so ``cancelled`` survives a daemon restart.
    cancel_stage: int = 0
    returncode: int | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def save(self, runs_dir: Path) -> None:
        """Write the record atomically (0600)."""
        atomic_write_json(runs_dir / f"{self.name}.json", asdict(self), durable=False)


def output_paths(runs_dir: Path, name: str) -> tuple[Path, Path]:
    """The child's ``stdout`` (the JSON envelope) and ``stderr`` files."""
    return runs_dir / f"{name}.stdout", runs_dir / f"{name}.stderr"


def read_records(runs_dir: Path) -> dict[str, ChildRecord]:
    """Every readable record under ``runs_dir`` by run name (malformed ones are skipped)."""
    records: dict[str, ChildRecord] = {}
    if not runs_dir.is_dir():
        return records
    for path in sorted(runs_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            record = ChildRecord(**doc)
        except (OSError, ValueError, TypeError):
            continue
        records[record.name] = record
    return records


def envelope(runs_dir: Path, name: str) -> dict[str, Any] | None:
    """The child's JSON result envelope (its last stdout line), if it printed one."""
    out, _ = output_paths(runs_dir, name)
    try:
        lines = [line for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]
        doc = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _same_live_process(pid: int, token: str) -> bool:
    """Whether ``pid`` is still the process with start ``token`` and has not exited (a zombie
    keeps its start time until its parent reaps it)."""
    if start_token(pid) != token:
        return False
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


class RunChild:
    """A live (or just finished) run child: ours (a :class:`trio.Process`) or adopted from a
    previous daemon (only a pid we keep proving through its start token)."""

    def __init__(self, record: ChildRecord, runs_dir: Path, process: trio.Process | None) -> None:
        self.record = record
        self._runs_dir = runs_dir
        self._process = process
        self.exited = trio.Event()

    @property
    def alive(self) -> bool:
        """Whether the recorded pid is still this child (safe from worker threads).

        Our own child's pid cannot be reused before :meth:`watch` reaps it and sets
        :attr:`exited`, so the event alone answers for it. ``trio.Process.returncode`` is not
        asked here: it closes the process's pidfd through trio's I/O manager, which raises
        outside the trio thread (the daemon builds run views in worker threads).
        """
        if self.exited.is_set():
            return False
        if self._process is not None:
            return True
        return _same_live_process(self.record.pid, self.record.start_token)

    def send_interrupt(self) -> bool:
        """One SIGINT (the CLI's Ctrl-C) to the child, after proving its identity."""
        if not self.alive:
            return False
        try:
            os.kill(self.record.pid, signal.SIGINT)
        except ProcessLookupError:
            return False
        return True

    async def watch(self, poll_s: float = 0.2) -> None:
        """Wait for the child to exit, record how, and set :attr:`exited`."""
        try:
            if self._process is not None:
                self.record.returncode = await self._process.wait()
            else:
                # Not our child: no exit event exists, so prove its identity on a timer.
                while _same_live_process(self.record.pid, self.record.start_token):  # noqa: ASYNC110
                    await trio.sleep(poll_s)
            self.record.save(self._runs_dir)
        finally:
            self.exited.set()


def run_argv(config: str, name: str, flags: Mapping[str, Any]) -> list[str]:
    """``python -m launcher eval run CONFIG --name NAME --yes --json`` plus the run's flags."""
    argv = [sys.executable, "-m", "launcher", "eval", "run", config, "--name", name, "--yes"]
    argv.append("--json")
    for flag, value in flags.items():
        option = "--" + flag.replace("_", "-")
        if value is True:
            argv.append(option)
        elif value is not None and value is not False:
            argv += [option, str(value)]
    return argv


async def spawn_logged(
    argv: list[str], *, cwd: Path, secrets: Mapping[str, str], out: Path, err: Path
) -> trio.Process:
    """Start a CLI child in its own session, unbuffered, its stdout and stderr to the files
    ``out`` and ``err`` (created private, truncated) and ``secrets`` in its environment only."""
    env = child_environment(os.environ, {"PYTHONUNBUFFERED": "1"}, secrets)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fds = (os.open(out, flags, 0o600), os.open(err, flags, 0o600))
    try:
        return await trio.lowlevel.open_process(
            argv,
            cwd=str(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fds[0],
            stderr=fds[1],
            start_new_session=True,
        )
    finally:
        for fd in fds:
            os.close(fd)


async def spawn_run(
    *,
    workspace: Path,
    runs_dir: Path,
    logs_path: Path,
    config: str,
    name: str,
    flags: Mapping[str, Any],
    secrets: Mapping[str, str],
    done_at_start: int = 0,
) -> RunChild:
    """Start the run child in its own session with output to files; record it.

    ``secrets`` reach the child through its environment only (the CLI resolves
    ``[secrets].required`` from there), never through argv, a file or a record.
    """
    ensure_dir(runs_dir)
    out, err = output_paths(runs_dir, name)
    try:
        offset = os.stat(logs_path).st_size
    except FileNotFoundError:
        offset = 0
    process = await spawn_logged(
        run_argv(config, name, flags), cwd=workspace, secrets=secrets, out=out, err=err
    )
    token = start_token(process.pid) or ""
    record = ChildRecord(
        name=name,
        pid=process.pid,
        start_token=token,
        started_at=utc_now_iso(),
        log_offset=offset,
        done_at_start=done_at_start,
        args={"config": config, **{k: v for k, v in flags.items() if v is not None}},
    )
    record.save(runs_dir)
    return RunChild(record, runs_dir, process)
