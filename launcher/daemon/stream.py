"""Server-Sent Events over a run directory: the journal records of ``events.jsonl`` with
``id:`` = their line number (1-based), and ephemeral ``state``/``stage``/``progress``/``usage``
events between them (no ``id:``, so they never move a client's resume cursor).

A reconnect with ``Last-Event-ID: N`` continues at line N + 1, so the union of what a client
received is exactly the journal: a line is sent only once it is complete (the journal writes a
line in full and fsyncs it before the supervisor counts it; a torn tail from a ``kill -9`` has
no newline and is never sent). The stream of a run with no live child replays what is left and
ends with an ``end`` event; a live run's stream ends the same way once its child exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import trio

from launcher.daemon.live_usage import (
    LIVE_USAGE_FILE,
    dispatched_keys,
    live_rollouts,
    read_live_usage,
)
from launcher.daemon.logscan import last_lines
from launcher.rundir.logs import line_details

__all__ = [
    "MAX_TAIL",
    "READ_LIMIT",
    "LineTail",
    "journal_events",
    "log_events",
    "sse",
    "tail_lines",
]

#: How often a live stream looks for new lines (an ``os.stat`` per look).
POLL_S = 0.02
#: A comment line after this long without an event, so idle proxies and clients stay open.
HEARTBEAT_S = 15.0
#: Steps logged once per work item: the ``record`` events already tell them, so they are no
#: milestones (``dispatching rollout`` and ``work item finished`` lines).
PER_ITEM_STEPS = frozenset({"dispatch", "result"})
_LOG_STEP = re.compile(r"^\S+ INFO \[(?P<step>[^\]]+)\] (?P<message>.*)$")
#: Steps under which a child's own output is copied into ``logs.txt`` (launcher.services'
#: sinks: uv's lines under ``deps``, the rollout server's under ``rollout-server``): kept in
#: the log, but no milestones. ``deps`` also carries one milestone of the supervisor's own.
_OUTPUT_STEPS = frozenset({"deps", "rollout-server"})
_DEPS_MILESTONE = "syncing rollout dependencies"


#: The cluster's line per work item run on another node (launcher.cluster.transport): no
#: milestone either (the ``record`` event tells it).
_PER_ITEM_CLUSTER = "rollout finished on replica"


def _child_output(step: str, message: str) -> bool:
    if step == "cluster":
        return message.startswith(_PER_ITEM_CLUSTER)
    return step in _OUTPUT_STEPS and not message.startswith(_DEPS_MILESTONE)


#: A ``--ray`` run's replica set changed (launcher.cluster.replicas.CHANGED): a ``replicas``
#: event with the line's details in place of a stage.
_REPLICAS = "replicas changed "


def sse(event: str, data: Any, event_id: int | None = None) -> bytes:
    """One SSE frame; ``data`` is JSON-encoded unless it is already ``bytes`` (a JSON line)."""
    payload = data if isinstance(data, bytes) else json.dumps(data).encode()
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + payload + b"\n\n"


#: The most lines ``GET /v1/runs/{name}/logs?tail=N`` answers (or a follow replays first): a
#: larger tail would hold the whole of a log of hundreds of megabytes in one answer.
MAX_TAIL = 10_000

#: The most bytes one read of a file takes (a line longer than this is read whole, in pieces):
#: a replay of a large journal or log goes out in frames of about this size, never all at once.
READ_LIMIT = 256 * 1024


class LineTail:
    """Complete lines of a growing file from line ``after`` + 1 on, with their line numbers.

    Only whole lines are returned: a trailing fragment waits until its newline arrives. When
    the file is replaced (another inode, for example after ``--fresh`` archived the run) or
    shrinks, :attr:`reset` is set and numbering restarts at 1. One call reads at most about
    ``limit`` bytes; :attr:`behind` says whether more were there to read.
    """

    def __init__(self, path: Path, after: int = 0, limit: int = READ_LIMIT) -> None:
        self.path = path
        self.line = 0
        self.reset = False
        self.behind = True
        """Whether the last call left bytes unread (true before the first call)."""
        self._offset = 0
        self._inode: int | None = None
        self._skip = max(0, after)
        self._limit = limit

    def read_new(self) -> list[tuple[int, bytes]]:
        """The complete lines added since the last call (and not skipped), from at most about
        ``limit`` bytes."""
        self.behind = False
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._inode is not None and (info.st_ino != self._inode or info.st_size < self._offset):
            self.reset, self._offset, self.line, self._skip = True, 0, 0, 0
        self._inode = info.st_ino
        if info.st_size <= self._offset:
            return []
        data = b""
        end = -1
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            while end < 0:
                want = min(self._limit, info.st_size - self._offset - len(data))
                piece = fh.read(want) if want > 0 else b""
                if not piece:
                    return []  # only a fragment without its newline so far
                end = piece.rfind(b"\n")
                if end >= 0:
                    end += len(data)
                data += piece
        self._offset += end + 1
        self.behind = self._offset < info.st_size
        out = []
        for raw in data[: end + 1].splitlines():
            self.line += 1
            if self.line > self._skip:
                out.append((self.line, raw))
        return out


async def _read(tail: LineTail) -> list[tuple[int, bytes]]:
    """``tail.read_new()``: on a worker thread while it is behind (a backlog), else here (the
    few bytes written since the last look)."""
    if tail.behind:
        return await trio.to_thread.run_sync(tail.read_new)
    return tail.read_new()


async def _lines_until_end(
    tail: LineTail, live: Callable[[], bool], poll_s: float
) -> AsyncIterator[list[tuple[int, bytes]]]:
    """Batches of new lines (an empty batch at most every ``poll_s``; a backlog in batches of
    at most ``READ_LIMIT`` bytes) until the file is drained and ``live()`` is false (checked
    before the final reads, so no line is missed)."""
    while True:
        running = live()
        yield await _read(tail)
        if tail.behind:
            continue
        if not running:
            yield await _read(tail)
            while tail.behind:
                yield await _read(tail)
            return
        await trio.sleep(poll_s)


async def journal_events(
    run_dir: Path,
    *,
    after: int,
    live: Callable[[], bool],
    state: Callable[[], dict[str, Any]],
    usage_pid: Callable[[], int | None] = lambda: None,
    poll_s: float = POLL_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> AsyncIterator[bytes]:
    """The ``GET /v1/runs/{name}/events`` stream (see the module docstring). ``usage_pid``
    gives the live child's pid, whose ``usage_live.json`` becomes ``usage`` events."""
    first = state()
    yield sse("state", first)
    journal = LineTail(run_dir / "events.jsonl", after)
    logs = LineTail(run_dir / "logs.txt")
    usage_file = _LiveUsage(run_dir, usage_pid)
    # Stage events are ephemeral (only those from now on), but the rollouts already dispatched
    # are needed to name the work items of usage events.
    usage_file.saw(raw for _, raw in logs.read_new())
    last_state = first.get("state")
    quiet_since = trio.current_time()
    checks = 0
    async for batch in _lines_until_end(journal, live, poll_s):
        frames: list[bytes] = []
        if journal.reset:
            journal.reset = False
            frames.append(sse("reset", {"reason": "events.jsonl was replaced"}))
        for number, raw in batch:
            frames.append(sse("record", raw, number))
            usage_file.recorded(raw)
        new_logs = [raw for _, raw in logs.read_new()]
        usage_file.saw(new_logs)
        for raw in new_logs:
            match = _LOG_STEP.match(raw.decode("utf-8", "replace"))
            if match is None or match["step"] in PER_ITEM_STEPS:
                continue
            if _child_output(match["step"], match["message"]):
                continue
            replicas = _replicas(match["step"], match["message"])
            if replicas is not None:
                frames.append(sse("replicas", replicas))
            else:
                frames.append(sse("stage", {"step": match["step"], "message": match["message"]}))
        if batch:
            frames.append(sse("progress", {"journal_lines": journal.line}))
        checks += 1
        if checks % 10 == 0:  # usage_live.json is rewritten at most every 0.5 s
            usage = usage_file.changed()
            if usage is not None:
                frames.append(sse("usage", usage))
        if checks % 25 == 0:  # the state (cheap, but not free) about twice a second
            current = state()
            if current.get("state") != last_state:
                last_state = current.get("state")
                frames.append(sse("state", current))
        if frames:
            quiet_since = trio.current_time()
            yield b"".join(frames)
        elif trio.current_time() - quiet_since >= heartbeat_s:
            quiet_since = trio.current_time()
            yield b": ping\n\n"
    yield sse("end", state())


def _replicas(step: str, message: str) -> dict[str, Any] | None:
    """The details of a ``replicas changed`` line, or None for any other line."""
    return line_details(message, _REPLICAS) if step == "cluster" else None


class _LiveUsage:
    """``usage_live.json`` for one stream: re-read only when its inode, size or mtime moved."""

    def __init__(self, run_dir: Path, pid: Callable[[], int | None]) -> None:
        self._run_dir = run_dir
        self._path = run_dir / LIVE_USAGE_FILE
        self._pid = pid
        self._seen: tuple[int, int, int] | None = None
        self._keys: dict[str, tuple[int, int]] = {}

    def saw(self, lines: Any) -> None:
        """Learn the work items of rollouts from new ``logs.txt`` lines."""
        self._keys.update(dispatched_keys(raw.decode("utf-8", "replace") for raw in lines))

    def recorded(self, raw: bytes) -> None:
        """A journal record ends its rollout: its key is no longer needed."""
        with contextlib.suppress(ValueError, AttributeError):
            self._keys.pop(str(json.loads(raw).get("rollout_id")), None)

    def changed(self) -> dict[str, Any] | None:
        """The new live usage, or None when the file did not change (or is not this child's)."""
        try:
            info = os.stat(self._path)
        except FileNotFoundError:
            return None
        seen = (info.st_ino, info.st_size, info.st_mtime_ns)
        if seen == self._seen:
            return None
        self._seen = seen
        doc = read_live_usage(self._run_dir, self._pid())
        return live_rollouts(doc, self._keys) if doc is not None else None


async def log_events(
    path: Path, *, after: int, live: Callable[[], bool], poll_s: float = 0.2
) -> AsyncIterator[bytes]:
    """``logs?follow=1``: each ``logs.txt`` line as an ``event: log`` with its line number."""
    tail = LineTail(path, after)
    async for batch in _lines_until_end(tail, live, poll_s):
        if batch:
            yield b"".join(
                sse("log", {"line": raw.decode("utf-8", "replace")}, number)
                for number, raw in batch
            )
    yield sse("end", {})


def tail_lines(path: Path, count: int, *, keep: bool = True) -> tuple[int, list[str]]:
    """The last ``count`` lines of ``path`` and the line number before the first of them; none
    of them without ``keep``, when only the line number is wanted.

    The lines are read from the end of the file, and only they are held; the line number comes
    from a count of the file's lines kept per file, which reads only what was added since the
    last call (:func:`launcher.daemon.logscan.last_lines`). Lines are split as
    :class:`LineTail` splits them, so that a follow resumes after exactly these lines.
    """
    try:
        before, raws = last_lines(path, max(0, count) if keep else 0)
    except OSError:
        return 0, []
    if not keep:
        return max(0, before - count), []
    return before, [raw.decode("utf-8", "replace") for raw in raws]
