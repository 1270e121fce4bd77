"""Projections of the journal (docs/spec/supervisor.md §3.4, §3.7): index/summary rows, trajectory
checks with token fallbacks, and the safe ``trajectories/`` and ``artifacts/`` copies.

Everything here is derived from the journal plus ``rollout_trials/``, so it can be rebuilt at
any time; per finished item only that item's files are touched.

Given the run's :class:`~launcher.redact.Redactor`, a projection also keeps the run's secrets out
of the rollout's files (docs/spec/supervisor.md §8.3): a rollout may put one in its conversation,
its diagnostics or an artifact, and the rollout server knows only the secrets its environment
names as such. The trajectory is checked in the bytes already read for its copy, every other
file of the trial directory (a remote trial's too: it is unpacked there before its result is
recorded) where it lies, an artifact before it is copied; a file that holds a secret is
rewritten in place, redacted, before anything is copied from it. A file holding none costs one
read and one scan (an artifact whose copy is up to date, none).

Why one module of this size: reading a trial's files, redacting them and copying them are one
pass over the same directory with the same rules (never through a link, the same size cap, a
copy made only of what was checked); split, each part would re-list or re-read what the other
just had in hand, on the per-item path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.redact import Redactor, json_bytes
from launcher.rundir.atomic import (
    atomic_copy_bytes,
    atomic_copy_file,
    atomic_write_bytes,
    read_to_end,
)
from launcher.rundir.journal import TerminalRecord

__all__ = [
    "ARTIFACT_MAX_BYTES",
    "INDEX_KEYS",
    "TRAJECTORY_FILENAME",
    "IndexValues",
    "SafeArtifacts",
    "TrajectoryFile",
    "index_line",
    "index_row",
    "index_values",
    "index_values_line",
    "index_values_row",
    "load_failure_detail",
    "load_valid_trajectory",
    "project_item",
    "projection_stem",
    "read_valid_trajectory",
    "redact_trial_files",
    "safe_artifacts",
    "trajectory_identity",
    "trajectory_usage",
]

TRAJECTORY_FILENAME = "trajectory.json"
DIAGNOSTICS_FILENAME = "diagnostics.json"
DIAGNOSTICS_MAX_BYTES = 1024 * 1024
# Per-file cap for projection copies: a runaway artifact must not double its disk use here.
# The canonical copy under rollout_trials/ is untouched.
ARTIFACT_MAX_BYTES = 64 * 1024 * 1024
# What project_item's walk of a trial directory leaves to its own steps.
_ARTIFACTS_ONLY = frozenset({"artifacts"})
_NOT_WALKED = frozenset({TRAJECTORY_FILENAME, "artifacts"})
INDEX_KEYS = (
    "row_index",
    "run_index",
    "rollout_id",
    "trajectory_filename",
    "status",
    "reward",
    "tokens",
    "max_context_tokens",
    "calls",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "retries",
    "metrics",
    "duration_ms",
    "error_type",
    "error",
    "resumed",
)

Warn = Callable[[str, dict[str, Any]], None]
IndexValues = tuple[Any, ...]
"""An index row's values in :data:`INDEX_KEYS` order, None for a key the row leaves out: the
form the supervisor keeps per item (a tuple is about a third of the row's dict)."""


def projection_stem(row_index: int, run_index: int) -> str:
    """``row_<r>_run_<k>``: the name of an item's projection files."""
    return f"row_{row_index}_run_{run_index}"


def trajectory_identity(doc: dict[str, Any]) -> str | None:
    """The ATIF rollout identity: ``extra.osmosis.rollout_id``, else ``session_id``, else the
    part of ``trajectory_id`` before its first ``/`` (an id without ``/`` does not count)."""
    extra = doc.get("extra")
    if isinstance(extra, dict):
        osmosis = extra.get("osmosis")
        rollout_id = osmosis.get("rollout_id") if isinstance(osmosis, dict) else None
        if isinstance(rollout_id, str):
            return rollout_id
    session_id = doc.get("session_id")
    if isinstance(session_id, str):
        return session_id
    trajectory_id = doc.get("trajectory_id")
    if isinstance(trajectory_id, str) and "/" in trajectory_id:
        return trajectory_id.split("/", 1)[0]
    return None


@dataclass(frozen=True)
class TrajectoryFile:
    """A valid ``trajectory.json`` as it was read: the document, the file's bytes and its
    status (what :func:`project_item` needs to copy it without reading it again)."""

    doc: dict[str, Any]
    data: bytes
    status: os.stat_result


def read_valid_trajectory(
    trials_dir: str | os.PathLike[str], rollout_id: str, *, redactor: Redactor | None = None
) -> TrajectoryFile | None:
    """``rollout_trials/<id>/trajectory.json`` if it is a real file holding a JSON object
    whose identity is ``rollout_id``; None otherwise (symlinks are never followed).

    With ``redactor``, a file holding one of its secrets is first rewritten in place, redacted
    (:meth:`~launcher.redact.Redactor.redact_json_bytes`), and that is what is returned."""
    trial = f"{os.fspath(trials_dir)}/{rollout_id}"  # a string: see project_item
    mode = _lstat_mode(trial)  # a link to a directory is not one here
    if mode is None or not stat.S_ISDIR(mode):
        return None
    path = f"{trial}/{TRAJECTORY_FILENAME}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        data = read_to_end(fd, status.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or trajectory_identity(doc) != rollout_id:
        return None  # judged on what the rollout wrote: redaction never makes one invalid
    if redactor is not None:
        clean = redactor.redact_json_bytes(data)
        if clean is not data:
            doc = json.loads(clean)
            if not isinstance(doc, dict) or trajectory_identity(doc) != rollout_id:
                # A short secret matched inside the rollout's own ids: they are ours (random,
                # not secret) and name the trajectory, so they stay as written.
                doc = _keep_identity(redactor.redact_obj(json.loads(data)), json.loads(data))
                clean = json_bytes(doc, indent=2)
            status = _rewrite(path, clean)
            data = clean
    return TrajectoryFile(doc, data, status)


def _keep_identity(redacted: Any, original: dict[str, Any]) -> dict[str, Any]:
    """``redacted`` (a redacted copy of the trajectory ``original``) with the fields
    :func:`trajectory_identity` reads put back as ``original`` has them."""
    doc = dict(redacted) if isinstance(redacted, dict) else {}
    for key in ("session_id", "trajectory_id"):
        if key in original:
            doc[key] = original[key]
    extra = original.get("extra")
    osmosis = extra.get("osmosis") if isinstance(extra, dict) else None
    if isinstance(osmosis, dict) and "rollout_id" in osmosis:
        kept_extra = doc.get("extra")
        kept_extra = dict(kept_extra) if isinstance(kept_extra, dict) else {}
        kept_osmosis = kept_extra.get("osmosis")
        kept_osmosis = dict(kept_osmosis) if isinstance(kept_osmosis, dict) else {}
        kept_osmosis["rollout_id"] = osmosis["rollout_id"]
        kept_extra["osmosis"] = kept_osmosis
        doc["extra"] = kept_extra
    return doc


def _rewrite(path: str, data: bytes) -> os.stat_result:
    """Replace the file ``path`` with ``data`` (durably: it replaces a file that held a
    secret) and return the new file's status."""
    atomic_write_bytes(path, data, durable=True)
    return os.stat(path)


def _redact_file(path: str, redactor: Redactor) -> None:
    """Rewrite the regular file ``path`` redacted when it holds a secret (never through a
    symlink; a file over :data:`ARTIFACT_MAX_BYTES` is left alone, as projections leave it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size > ARTIFACT_MAX_BYTES:
            return
        data = read_to_end(fd, status.st_size)
    finally:
        os.close(fd)
    clean = redactor.redact_bytes(data)
    if clean is data:
        return
    if path.endswith(".json"):
        clean = redactor.redact_json_bytes(data)
    elif (lines := _json_lines(data)) is not None:
        # Each record redacted on its own and kept on one line.
        clean = b"\n".join(redactor.redact_json_bytes(line, indent=None) for line in lines)
    if clean is not data:
        _rewrite(path, clean)


def _json_lines(data: bytes) -> list[bytes] | None:
    """``data``'s lines when every line that is not blank is a JSON document (JSON Lines,
    whatever the file's name), else None."""
    lines = data.split(b"\n")
    try:
        for line in lines:
            if line.strip():
                json.loads(line)
    except (ValueError, RecursionError):
        return None
    return lines


def redact_trial_files(
    trial: str | os.PathLike[str], redactor: Redactor, *, skip: frozenset[str] = frozenset()
) -> None:
    """Rewrite every regular file under the trial directory ``trial`` that holds one of
    ``redactor``'s secrets, redacted in place (:func:`_redact_file`); the top-level entries
    named in ``skip`` are left out (what the caller redacts itself). Symbolic links are
    neither followed nor changed."""
    stack = [(os.fspath(trial), True)]
    while stack:
        directory, top = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if top and entry.name in skip:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, False))
                elif entry.is_file(follow_symlinks=False):
                    _redact_file(entry.path, redactor)
            except OSError:
                continue


def load_valid_trajectory(trials_dir: Path, rollout_id: str) -> dict[str, Any] | None:
    """The parsed document of :func:`read_valid_trajectory`, or None."""
    found = read_valid_trajectory(trials_dir, rollout_id)
    return found.doc if found is not None else None


def load_failure_detail(trials_dir: Path, rollout_id: str) -> dict[str, Any] | None:
    """The ``failure`` object the rollout server put in ``rollout_trials/<id>/diagnostics.json``
    (phase, exception type, status: what the wire's ``err_message`` cannot say), or None.

    Read like the trajectory: never through a symlink, and only a small file (the object is a
    few hundred bytes; anything huge is not ours to parse on the way to the journal).
    """
    trial = trials_dir / rollout_id
    if trial.is_symlink() or not trial.is_dir():
        return None
    try:
        fd = os.open(trial / DIAGNOSTICS_FILENAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(DIAGNOSTICS_MAX_BYTES + 1)
        doc = json.loads(data) if len(data) <= DIAGNOSTICS_MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    failure = doc.get("failure") if isinstance(doc, dict) else None
    return failure if isinstance(failure, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def trajectory_usage(doc: dict[str, Any]) -> tuple[int | None, int | None]:
    """Fallback ``(tokens, max_context_tokens)`` from ATIF metrics.

    tokens = ``final_metrics.total_prompt_tokens + total_completion_tokens`` (whichever are
    ints); max_context_tokens = the largest ``prompt_tokens + completion_tokens`` of a step's
    ``metrics``. Each is None when the document reports nothing usable.
    """
    tokens: int | None = None
    final = doc.get("final_metrics")
    if isinstance(final, dict):
        parts = [_int(final.get("total_prompt_tokens")), _int(final.get("total_completion_tokens"))]
        present = [p for p in parts if p is not None]
        if present:
            tokens = sum(present)
    max_context: int | None = None
    steps = doc.get("steps")
    if isinstance(steps, list):
        for step in steps:
            metrics = step.get("metrics") if isinstance(step, dict) else None
            if not isinstance(metrics, dict):
                continue
            parts = [_int(metrics.get("prompt_tokens")), _int(metrics.get("completion_tokens"))]
            present = [p for p in parts if p is not None]
            if present:
                value = sum(present)
                max_context = value if max_context is None else max(max_context, value)
    return tokens, max_context


def index_values(
    record: TerminalRecord, trajectory: dict[str, Any] | None, *, resumed: bool
) -> IndexValues:
    """One index.jsonl row (:func:`index_row`) as :data:`IndexValues`."""
    tokens, max_context = record.tokens, record.max_context_tokens
    if trajectory is not None and (tokens is None or max_context is None):
        fallback_tokens, fallback_max = trajectory_usage(trajectory)
        tokens = fallback_tokens if tokens is None else tokens
        max_context = fallback_max if max_context is None else max_context
    return (
        record.row_index,
        record.run_index,
        record.rollout_id,
        TRAJECTORY_FILENAME if trajectory is not None else None,
        record.status,
        float(record.reward) if record.reward is not None else None,
        tokens,
        max_context,
        record.calls,
        record.cached_tokens,
        record.cache_write_tokens,
        record.reasoning_tokens,
        record.retries,
        record.metrics,
        float(record.duration_ms or 0.0),
        record.error_type,
        record.error.to_json() if record.error is not None else None,
        True if resumed else None,
    )


def index_row(
    record: TerminalRecord, trajectory: dict[str, Any] | None, *, resumed: bool
) -> dict[str, Any]:
    """One index.jsonl row in §3.4 key order, None values left out (``error``, why a failed
    attempt failed, is our addition).

    ``tokens``/``max_context_tokens`` come from the journal record, falling back to the valid
    trajectory's metrics when the bridge saw no usage.
    """
    return index_values_row(index_values(record, trajectory, resumed=resumed))


def index_values_row(values: IndexValues) -> dict[str, Any]:
    """The index row (a dict in §3.4 key order, None values left out) of ``values``."""
    return {k: v for k, v in zip(INDEX_KEYS, values, strict=True) if v is not None}


def index_values_line(values: IndexValues) -> bytes:
    """:func:`index_line` of the row ``values`` hold."""
    return index_line(index_values_row(values))


def index_line(row: dict[str, Any]) -> bytes:
    """An index.jsonl line: default separators, UTF-8 text kept, NaN refused, newline."""
    return (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode(
        "utf-8", "backslashreplace"
    )


@dataclass
class SafeArtifacts:
    """Artifact files that may be copied (relative POSIX path -> source) and why others were not."""

    files: dict[str, Path]
    skipped: list[tuple[str, str]]


def safe_artifacts(root: str | os.PathLike[str]) -> SafeArtifacts:
    """List the safe regular files under an ``artifacts/`` root (§3.7), sorted.

    Skipped (with a reason): a symlinked root (everything), symlinks, non-files, odd path parts,
    a top-level ``manifest.json``, anything resolving outside the root, files over
    :data:`ARTIFACT_MAX_BYTES`.
    """
    result = SafeArtifacts(files={}, skipped=[])
    mode = _lstat_mode(root)
    if mode is not None and stat.S_ISLNK(mode):
        result.skipped.append((".", "artifacts root is a symbolic link"))
        return result
    if mode is None or not stat.S_ISDIR(mode):
        return result
    try:
        if not os.listdir(root):
            return result  # the common case: nothing to list (and no root to resolve)
    except OSError:
        return result  # unreadable: os.walk would list nothing either
    root = Path(root)
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        current = Path(dirpath)
        kept = []
        for name in sorted(dirnames):
            rel = (current / name).relative_to(root).as_posix()
            if (current / name).is_symlink():
                result.skipped.append((rel, "symbolic link"))
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = current / name
            rel_path = path.relative_to(root)
            rel = rel_path.as_posix()
            if any(part in ("", ".", "..") for part in rel_path.parts):
                result.skipped.append((rel, "unsafe path"))
            elif path.is_symlink():
                result.skipped.append((rel, "symbolic link"))
            elif not path.is_file():
                result.skipped.append((rel, "not a regular file"))
            elif rel == "manifest.json":
                result.skipped.append((rel, "reserved name"))
            elif not path.resolve().is_relative_to(real_root):
                result.skipped.append((rel, "outside the artifacts root"))
            elif path.stat().st_size > ARTIFACT_MAX_BYTES:
                result.skipped.append((rel, f"larger than {ARTIFACT_MAX_BYTES} bytes"))
            else:
                result.files[rel] = path
    result.files = dict(sorted(result.files.items()))
    return result


def _lstat_mode(path: str | os.PathLike[str]) -> int | None:
    """``path``'s own file type and mode (a link is not followed), None when it is missing."""
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def _is_copy_of(source: os.stat_result, dst: str | os.PathLike[str]) -> bool:
    """Whether ``dst`` is a regular file with ``source``'s size and mtime (a copy keeps it)."""
    try:
        copy = os.lstat(dst)
    except OSError:
        return False
    return (
        source.st_size == copy.st_size
        and source.st_mtime_ns == copy.st_mtime_ns
        and not stat.S_ISLNK(copy.st_mode)
    )


def _copy_if_changed(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    durable: bool,
    redactor: Redactor | None = None,
) -> None:
    """Copy ``src`` to ``dst`` unless ``dst`` is a copy of it already; with ``redactor``, a
    source holding a secret is rewritten redacted first, so a copy is only ever made of a
    redacted file (and one already made is not read again)."""
    try:
        source = os.stat(src)
    except OSError:
        source = None
    if source is None or not _is_copy_of(source, dst):
        if redactor is not None:
            _redact_file(os.fspath(src), redactor)
        atomic_copy_file(src, dst, durable=durable)


def project_item(
    run_dir: Path,
    record: TerminalRecord,
    *,
    trajectory_valid: bool,
    warn: Warn | None = None,
    durable: bool = False,
    trajectory: TrajectoryFile | None = None,
    redactor: Redactor | None = None,
) -> None:
    """Make ``trajectories/<stem>.json`` and ``artifacts/<stem>/`` mirror this record's attempt.

    Files already identical (size and mtime) are left alone, stale files are removed, so the
    same call serves the per-item update and the full refresh at start and finalize. Unsafe
    artifacts are skipped with ``warn(message, details)``; nothing here is fatal for the run
    except I/O errors on the run directory itself. ``trajectory``, the valid trajectory the
    caller has just read (:func:`read_valid_trajectory`), is copied from those bytes: the
    copy is then exactly the document that was validated, and the file is not read twice.
    With ``redactor`` (the run's), no file of the trial directory or of its copies is left
    holding one of its secrets: ``trajectory`` must then have been read with it too.
    """
    stem = projection_stem(record.row_index, record.run_index)
    # The paths are strings: this runs once per finished item, where a dozen pathlib joins
    # cost more than the system calls they name (pathlib is used only to walk artifacts).
    root = os.fspath(run_dir)
    trial = f"{root}/rollout_trials/{record.rollout_id}"
    traj_dst = f"{root}/trajectories/{stem}.json"
    trial_mode = _lstat_mode(trial)
    if redactor is not None and trial_mode is not None and stat.S_ISDIR(trial_mode):
        # Before anything is copied from it. The trajectory read with the redactor is clean;
        # artifacts are redacted below, as they are listed and copied (one listing, not two).
        skip = _NOT_WALKED if trajectory is not None else _ARTIFACTS_ONLY
        redact_trial_files(trial, redactor, skip=skip)
    if trajectory is not None:
        if not _is_copy_of(trajectory.status, traj_dst):
            atomic_copy_bytes(traj_dst, trajectory.data, trajectory.status, durable=durable)
    elif trajectory_valid:
        _copy_if_changed(f"{trial}/{TRAJECTORY_FILENAME}", traj_dst, durable=durable)
    elif _lstat_mode(traj_dst) is not None:
        os.unlink(traj_dst)

    art_dst = f"{root}/artifacts/{stem}"
    safe = (
        safe_artifacts(f"{trial}/artifacts")
        if trial_mode is None or not stat.S_ISLNK(trial_mode)
        else SafeArtifacts(files={}, skipped=[(".", "trial directory is a symbolic link")])
    )
    if warn is not None:
        for rel, reason in safe.skipped:
            warn(
                "skipped an unsafe artifact",
                {"rollout_id": record.rollout_id, "path": rel, "reason": reason},
            )
    # One look at what is there now: a link or a file is removed, a directory pruned.
    mode = _lstat_mode(art_dst)
    was_dir = mode is not None and stat.S_ISDIR(mode)
    if mode is not None and not was_dir:
        os.unlink(art_dst)
    if was_dir:
        art_root = Path(art_dst)
        for dirpath, _dirnames, filenames in os.walk(art_root, topdown=False):
            current = Path(dirpath)
            for name in filenames:
                rel = (current / name).relative_to(art_root).as_posix()
                if rel not in safe.files:
                    (current / name).unlink()
            if current != art_root and not any(current.iterdir()):
                current.rmdir()
    if redactor is not None:
        for rel, _reason in safe.skipped:  # not copied, but left in the trial directory
            if rel != ".":
                _redact_file(f"{trial}/artifacts/{rel}", redactor)
    for rel, src in safe.files.items():
        _copy_if_changed(src, f"{art_dst}/{rel}", durable=durable, redactor=redactor)
    if was_dir and not safe.files:
        shutil.rmtree(art_dst)
