"""One event stream for the whole workspace (``GET /v1/events``): which runs exist and when
each starts, changes state and ends, so an IDE's run list needs one connection, not one per run.

Each look (every :data:`POLL_S`) stats a few files per run; only a run whose files or child
changed is viewed again (its journal replayed), so an idle workspace of many runs costs a few
``stat`` calls a second. Frames:

- ``event: runs`` first: ``{"runs": [brief, …]}``, every run as it is now;
- ``event: run`` when a run appears or its state, cause or counts change: ``{brief…,
  "previous_state"}`` (``previous_state`` is null for a new run);
- ``event: removed`` ``{"name"}`` when a run directory went away (``eval clean``);
- ``: ping`` after 15 s of silence.

The stream is a view, not a log: a client that reconnects gets a fresh ``runs`` snapshot.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from launcher.daemon.registry import ApiError, Registry
from launcher.daemon.stream import HEARTBEAT_S, sse

__all__ = ["POLL_S", "workspace_events"]

POLL_S = 0.5
_FILES = ("events.jsonl", "progress.json", "metrics.json", "logs.txt")
_BRIEF = ("name", "state", "cause", "stage", "total", "done", "pending", "pass_rate", "error")
_COMPARED = ("state", "cause", "stage", "total", "done")

Signature = tuple[Any, ...]


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


class _Scanner:
    """Remembers each run's file signature and last brief; answers what changed."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.signatures: dict[str, Signature] = {}
        self.briefs: dict[str, dict[str, Any]] = {}

    def _signature(self, name: str) -> Signature:
        run_dir = self.registry.output_root / name
        record = self.registry.runs_dir / f"{name}.json"
        files = tuple(_stat(run_dir / f) for f in _FILES)
        return (self.registry.live(name), _stat(record), *files)

    def scan(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The runs whose brief changed since the last scan (with ``previous_state``), and the
        names that disappeared."""
        names = set(self.registry.names())
        removed = sorted(set(self.briefs) - names)
        for name in removed:
            self.briefs.pop(name, None)
            self.signatures.pop(name, None)
        changed = []
        for name in sorted(names):
            signature = self._signature(name)
            if self.signatures.get(name) == signature:
                continue
            self.signatures[name] = signature
            try:
                doc = self.registry.view(name).doc
            except ApiError:
                continue
            brief = {key: doc.get(key) for key in _BRIEF}
            before = self.briefs.get(name)
            if before is not None and all(before[k] == brief[k] for k in _COMPARED):
                continue
            self.briefs[name] = brief
            changed.append({**brief, "previous_state": before["state"] if before else None})
        return changed, removed


async def workspace_events(registry: Registry) -> AsyncIterator[bytes]:
    """The frames of ``GET /v1/events`` (see the module docstring); runs until cancelled."""
    scanner = _Scanner(registry)
    await trio.to_thread.run_sync(scanner.scan)
    yield sse("runs", {"runs": list(scanner.briefs.values())})
    quiet_since = trio.current_time()
    while True:
        await trio.sleep(POLL_S)
        changed, removed = await trio.to_thread.run_sync(scanner.scan)
        for brief in changed:
            yield sse("run", brief)
        for name in removed:
            yield sse("removed", {"name": name})
        now = trio.current_time()
        if changed or removed:
            quiet_since = now
        elif now - quiet_since >= HEARTBEAT_S:
            quiet_since = now
            yield b": ping\n\n"
