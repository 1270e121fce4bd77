"""Rubric verdicts kept inside a run directory: ``rubric/<digest>.jsonl``, one file per rubric,
judge model and score range.

Each verdict is one line, appended and fsync'd before the next of the same worker is asked
for, so a killed ``eval rubric --run`` loses at most the calls that were in flight; a re-run
finds the lines and judges only what has no score yet. The journal, index and metrics of the
run are never written. A torn last line (the process died mid-write) is cut off when the file
is next opened, under an exclusive lock that also keeps two writers apart.

Line fields: ``rollout_id``, ``row_index``, ``run_index``, ``judge_run`` (0-based repeat of
``-n``), ``model``, ``score`` (null when the call failed), ``explanation``, ``error``,
``usage`` and ``judged_at``. ``rubric/<digest>.json`` records the rubric, model and range.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import trio

from launcher.errors import ConflictError
from launcher.rundir.atomic import atomic_write_json, canonical_json, ensure_dir
from launcher.rundir.logs import utc_now_iso

__all__ = ["RUBRIC_DIR", "RubricStore", "read_rubric_scores", "rubric_digest"]

RUBRIC_DIR = "rubric"

StoreKey = tuple[str, int]
"""``(rollout_id, judge_run)``."""


def rubric_digest(rubric: str, model: str, score_min: float, score_max: float) -> str:
    """16 hex digits naming the verdict file of one rubric, judge model and score range."""
    identity = {"model": model, "rubric": rubric, "score_max": score_max, "score_min": score_min}
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()[:16]


def _parse_lines(data: bytes) -> list[dict[str, Any]]:
    lines = []
    for raw in data.split(b"\n"):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue  # blank, or damaged by hand: never fatal for the run
        if isinstance(obj, dict) and isinstance(obj.get("rollout_id"), str):
            lines.append(obj)
    return lines


def _latest(lines: list[dict[str, Any]]) -> dict[StoreKey, dict[str, Any]]:
    """Per key the first scored line, else the last failed one."""
    latest: dict[StoreKey, dict[str, Any]] = {}
    for line in lines:
        run = line.get("judge_run")
        if not isinstance(run, int):
            continue
        key = (line["rollout_id"], run)
        current = latest.get(key)
        if current is None or current.get("score") is None:
            latest[key] = line
    return latest


class RubricStore:
    """The open verdict file of one judge; create with :meth:`open`, then :meth:`close`."""

    def __init__(self, path: Path, fd: int, lines: dict[StoreKey, dict[str, Any]]) -> None:
        self.path = path
        self._fd = fd
        self.lines = lines
        self._write_lock = trio.Lock()

    @classmethod
    def open(
        cls, run_dir: Path, *, rubric: str, model: str, score_min: float, score_max: float
    ) -> RubricStore:
        """Open (creating it and its ``.json`` description if needed) and lock the file."""
        digest = rubric_digest(rubric, model, score_min, score_max)
        directory = run_dir / RUBRIC_DIR
        ensure_dir(directory)
        meta = directory / f"{digest}.json"
        if not meta.exists():
            description = {
                "digest": digest,
                "model": model,
                "rubric": rubric,
                "score_min": score_min,
                "score_max": score_max,
                "created_at": utc_now_iso(),
            }
            atomic_write_json(meta, description)
        path = directory / f"{digest}.jsonl"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConflictError(
                f"another 'eval rubric' is writing {path}; wait for it to finish"
            ) from None
        with open(path, "rb") as fh:
            data = fh.read()
        committed = data.rfind(b"\n") + 1
        if committed < len(data):
            os.truncate(fd, committed)
            os.fsync(fd)
        return cls(path, fd, _latest(_parse_lines(data[:committed])))

    def get(self, rollout_id: str, judge_run: int) -> dict[str, Any] | None:
        """The stored line for this rollout and run of the judge, if any."""
        return self.lines.get((rollout_id, judge_run))

    async def append(self, line: dict[str, Any]) -> None:
        """Append ``line`` and fsync it (in a worker thread)."""
        data = (json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        async with self._write_lock:
            await trio.to_thread.run_sync(self._write, data)
        key = (str(line["rollout_id"]), int(line["judge_run"]))
        current = self.lines.get(key)
        if current is None or current.get("score") is None:
            self.lines[key] = line

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def close(self) -> None:
        """Release the lock and close the file."""
        os.close(self._fd)


def read_rubric_scores(run_dir: Path) -> list[dict[str, Any]]:
    """Every verdict file of ``run_dir`` (read-only), for reports beside the rewards.

    Each entry: the file's description (``digest``, ``model``, ``rubric``, ``score_min``,
    ``score_max``) and ``scores``: rollout id -> mean of its scored judge runs.
    """
    directory = run_dir / RUBRIC_DIR
    entries = []
    for meta_path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            data = meta_path.with_suffix(".jsonl").read_bytes()
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        by_rollout: dict[str, list[float]] = {}
        for (rollout_id, _), line in _latest(_parse_lines(data)).items():
            score = line.get("score")
            if isinstance(score, int | float) and not isinstance(score, bool):
                by_rollout.setdefault(rollout_id, []).append(float(score))
        scores = {rid: sum(values) / len(values) for rid, values in by_rollout.items()}
        entries.append({**meta, "scores": scores})
    return entries
