"""Live usage of the rollouts in flight: ``<run>/usage_live.json``, written by the supervisor
while it dispatches and read by the daemon (``GET /v1/runs/{name}/usage``, ``event: usage``).

The journal carries a rollout's tokens only once its result is recorded. While it runs, the
bridge's ledger (in the supervisor's process) already knows its calls and tokens, so
:func:`publish_live_usage` samples the ledger every :data:`SAMPLE_S` and atomically replaces
the file when what it would write changed. The file is a side channel, never an input: nothing
reads it back into a run, and the ``pid`` in it lets a reader ignore a file left by a
supervisor that is gone (a ``kill -9`` leaves the last sample behind).

Rollouts are keyed by rollout id (the bridge knows nothing else); :func:`dispatched_keys` maps
ids to their ``(row_index, run_index)`` from the dispatcher's ``dispatching rollout`` lines of
``logs.txt``, and :func:`dispatched_in` keeps that map per log, folding only the lines added
since its last read. Both ends of the format live here so they cannot drift apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import trio

from launcher.daemon.logscan import LineFold
from launcher.rundir.atomic import atomic_write_json
from launcher.rundir.logs import utc_now_iso

__all__ = [
    "LIVE_USAGE_FILE",
    "SAMPLE_S",
    "dispatched_in",
    "dispatched_keys",
    "live_doc",
    "live_rollouts",
    "publish_live_usage",
    "read_live_usage",
]

LIVE_USAGE_FILE = "usage_live.json"
#: How often the ledger is sampled (a sample that changed nothing writes nothing).
SAMPLE_S = 0.5
VERSION = 1
_DISPATCHED = re.compile(r" INFO \[dispatch\] dispatching rollout (\{.*\})$")
_DISPATCHING = b"dispatching rollout"
#: Maps kept (of the live runs whose usage is asked for; about 150 bytes per rollout).
_KEPT = 32


class RolloutUsageLike(Protocol):
    """What the ledger holds per rollout (``bridge.usage.RolloutUsage`` has this shape)."""

    def to_json(self) -> dict[str, int]: ...


def live_doc(usage: Mapping[str, RolloutUsageLike], in_flight: int) -> dict[str, Any]:
    """The file's content without its timestamp: per-rollout usage and the totals over them."""
    rollouts = {rid: u.to_json() for rid, u in sorted(usage.items())}
    totals = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for doc in rollouts.values():
        for key in totals:
            totals[key] += doc.get(key, 0)
    largest = max((doc.get("max_context_tokens", 0) for doc in rollouts.values()), default=0)
    return {
        "version": VERSION,
        "pid": os.getpid(),
        "in_flight": in_flight,
        "rollouts": rollouts,
        "totals": {**totals, "max_context_tokens": largest},
        "done": False,
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    # A side channel: a full disk must not stop the run (the journal's writes report it).
    with contextlib.suppress(OSError):
        atomic_write_json(path, {**doc, "updated_at": utc_now_iso()}, durable=False)


async def publish_live_usage(
    run_dir: Path,
    usage: Callable[[], Mapping[str, RolloutUsageLike]],
    in_flight: Callable[[], int],
    *,
    interval_s: float = SAMPLE_S,
) -> None:
    """Keep ``run_dir/usage_live.json`` current until cancelled, then mark it ``done``.

    ``usage`` is the ledger's snapshot (the rollouts with calls whose results are not recorded
    yet) and ``in_flight`` the number of rollouts holding a dispatch slot.
    """
    path = run_dir / LIVE_USAGE_FILE
    last: dict[str, Any] | None = None
    try:
        while True:
            doc = live_doc(usage(), in_flight())
            if doc != last:
                # On the loop: a small file, no fsync, at most twice a second.
                _write(path, doc)
                last = doc
            await trio.sleep(interval_s)
    finally:
        # Synchronous on purpose: this runs while the dispatch is being cancelled.
        _write(path, {**live_doc({}, 0), "done": True})


def read_live_usage(run_dir: Path, pid: int | None) -> dict[str, Any] | None:
    """The live usage written by process ``pid`` while it still dispatches, else None."""
    if pid is None:
        return None
    try:
        doc = json.loads((run_dir / LIVE_USAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("pid") != pid or doc.get("done"):
        return None
    return doc


def dispatched_keys(lines: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``rollout_id -> (row_index, run_index)`` from ``logs.txt`` lines."""
    keys: dict[str, tuple[int, int]] = {}
    for line in lines:
        if "dispatching rollout" not in line:
            continue
        match = _DISPATCHED.search(line)
        if match is None:
            continue
        try:
            details = json.loads(match.group(1))
            keys[str(details["rollout_id"])] = (
                int(details["row_index"]),
                int(details["run_index"]),
            )
        except (ValueError, KeyError, TypeError):
            continue
    return keys


def _fold_dispatched(keys: dict[str, tuple[int, int]], block: bytes) -> None:
    """Fold the ``dispatching rollout`` lines of ``block`` into ``keys``, found with one search
    each (the other lines are never decoded)."""
    lines: list[bytes] = []
    at = block.find(_DISPATCHING)
    while at >= 0:
        start = block.rfind(b"\n", 0, at) + 1
        stop = block.find(b"\n", at)
        stop = len(block) if stop < 0 else stop
        # Split at "\r" too, as a text-mode read of the file splits it.
        lines += block[start:stop].splitlines()
        at = block.find(_DISPATCHING, stop)
    keys.update(dispatched_keys(line.decode("utf-8", "replace") for line in lines))


def _no_keys() -> dict[str, tuple[int, int]]:
    return {}


_dispatched = LineFold(_no_keys, _fold_dispatched, dict.copy, kept=_KEPT)


def dispatched_in(logs_path: Path) -> Mapping[str, tuple[int, int]]:
    """:func:`dispatched_keys` of every line of ``logs_path`` (``{}`` when it cannot be read).

    The map is kept per file: a later call folds only the lines added since (a line over
    :data:`launcher.daemon.logscan.MAX_LINE`, which the log's writer never writes, is passed
    over). It is shared: not to be changed.
    """
    return _dispatched(logs_path, 0)


def live_rollouts(doc: Mapping[str, Any], keys: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    """The API form of a live-usage document: rollouts as a list with their work-item keys
    (``row_index``/``run_index`` are null for an id whose dispatch line was not seen)."""
    rollouts = doc.get("rollouts")
    listed = []
    for rid, usage in rollouts.items() if isinstance(rollouts, dict) else ():
        row, run = keys.get(rid, (None, None))
        extra = usage if isinstance(usage, dict) else {}
        listed.append({"rollout_id": rid, "row_index": row, "run_index": run, **extra})
    return {
        "in_flight": doc.get("in_flight"),
        "rollouts": listed,
        "totals": doc.get("totals"),
        "updated_at": doc.get("updated_at"),
    }
