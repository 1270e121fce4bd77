"""The upload plan of a finished run directory: its validation (spec C.3) and exactly the
files the 0.3.8 import protocol uploads (C.4), hashed, sorted by path.

Pure reading: nothing here writes (the re-redaction of ``logs.txt`` that precedes it is
:func:`launcher.upload.files.scrub_logs_file`) and nothing talks to the network, so the rules
are tested as plain functions on directories.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from launcher.rundir.projections import trajectory_identity
from launcher.upload.files import PlanFile, UploadError, hash_file, read_stable

__all__ = ["PROVENANCE_KEYS", "UploadPlan", "build_plan"]

PROVENANCE_KEYS = (
    "sdk_version",
    "git_head",
    "git_branch",
    "git_dirty",
    "config_branch",
    "config_commit_sha",
    "config_path",
)
_HEX32 = re.compile(r"[0-9a-f]{32}")
_TRAJECTORY_NAME = re.compile(r"trajectory[A-Za-z0-9._-]*\.json")
_STATUSES = ("success", "failed", "skipped")
_MAX_PATH = 1024


@dataclass(frozen=True)
class UploadPlan:
    """A validated run directory: the metadata of the start request and the files."""

    run_dir: Path
    local_run_id: str
    manifest_digest: str
    run: dict[str, Any]
    schema_versions: dict[str, Any]
    provenance: dict[str, Any]
    files: tuple[PlanFile, ...]

    @property
    def total_bytes(self) -> int:
        """The size of every file of the plan together."""
        return sum(f.size for f in self.files)

    def start_body(self, *, replace: bool) -> dict[str, Any]:
        """The body of ``POST /api/cli/eval-runs/imports`` (C.6), keys in the reference's order."""
        return {
            "schema_version": 1,
            "local_run_id": self.local_run_id,
            "manifest_digest": self.manifest_digest,
            "run": self.run,
            "schema_versions": self.schema_versions,
            "provenance": self.provenance,
            "files": [f.request() for f in self.files],
            "reimport": replace,
        }


def _json_object(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise UploadError(f"{where} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise UploadError(f"{where} must be a JSON object")
    return doc


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _nonneg(doc: Mapping[str, Any], key: str, where: str) -> int:
    value = doc.get(key)
    if not _is_int(value) or value < 0:
        raise UploadError(f"{where} {key} must be a non-negative integer")
    return int(value)


def _text(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise UploadError(f"{where} {key} must be a non-empty string")
    return value


def _object(doc: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise UploadError(f"{where} {key} must be a JSON object")
    return value


@dataclass(frozen=True)
class _Manifest:
    local_run_id: str
    run_name: str
    inputs: dict[str, Any]
    provenance: dict[str, Any]


def _manifest(doc: dict[str, Any], run_dir: Path) -> _Manifest:
    where = "manifest.json"
    if doc.get("schema_version") != 1 or isinstance(doc.get("schema_version"), bool):
        raise UploadError("manifest.json schema_version must be 1")
    local_run_id = doc.get("local_run_id")
    if not isinstance(local_run_id, str) or not _HEX32.fullmatch(local_run_id):
        raise UploadError("manifest.json local_run_id must be 32 lowercase hex characters")
    run_name = _text(doc, "run_name", where)
    if run_name != run_dir.name:
        raise UploadError(
            f"manifest.json run_name {run_name!r} does not match the directory name "
            f"{run_dir.name!r}"
        )
    inputs = _object(doc, "inputs", where)
    _text(inputs, "model_path", "manifest.json inputs")
    rollout = _object(inputs, "rollout", "manifest.json inputs")
    for key in ("name", "entrypoint", "source_digest"):
        _text(rollout, key, "manifest.json inputs.rollout")
    dataset = _object(inputs, "dataset", "manifest.json inputs")
    for key in ("sha256", "selected_source_rows"):
        _text(dataset, key, "manifest.json inputs.dataset")
    n = inputs.get("n")
    if not _is_int(n) or n <= 0:
        raise UploadError("manifest.json inputs.n must be a positive integer")
    _object(inputs, "versions", "manifest.json inputs")
    provenance = doc.get("provenance")
    if provenance is not None and not isinstance(provenance, dict):
        raise UploadError("manifest.json provenance must be a JSON object when present")
    return _Manifest(local_run_id, run_name, inputs, provenance or {})


def _index(data: bytes) -> list[dict[str, Any]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UploadError("index.jsonl must be UTF-8") from None
    rows: list[dict[str, Any]] = []
    pairs: set[tuple[int, int]] = set()
    ids: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"index.jsonl line {number}"
        if not line.strip():
            raise UploadError(f"{where} is blank")
        row = _json_object(line.encode(), where)
        pair = (_nonneg(row, "row_index", where), _nonneg(row, "run_index", where))
        if pair in pairs:
            raise UploadError(f"{where} repeats row_index {pair[0]} run_index {pair[1]}")
        pairs.add(pair)
        rollout_id = row.get("rollout_id")
        if not isinstance(rollout_id, str) or not _HEX32.fullmatch(rollout_id):
            raise UploadError(f"{where} rollout_id must be 32 lowercase hex characters")
        if rollout_id in ids:
            raise UploadError(f"{where} repeats rollout_id {rollout_id}")
        ids.add(rollout_id)
        if row.get("status") not in _STATUSES:
            raise UploadError(f"{where} status must be one of {', '.join(_STATUSES)}")
        name = row.get("trajectory_filename")
        if name is not None and (not isinstance(name, str) or not _TRAJECTORY_NAME.fullmatch(name)):
            raise UploadError(f"{where} trajectory_filename must be a bare trajectory*.json name")
        rows.append(row)
    return rows


def _check_grid(rows: list[dict[str, Any]], progress: dict[str, Any], n: int) -> None:
    total = _nonneg(progress, "total_runs", "progress.json")
    sampled = _nonneg(progress, "sampled_rows", "progress.json")
    dataset_rows = _nonneg(progress, "total_dataset_rows", "progress.json")
    if len(rows) != total:
        raise UploadError(
            f"local evaluation is incomplete: index.jsonl has {len(rows)} terminal results "
            f"but progress.json expects {total}"
        )
    if total != sampled * n:
        raise UploadError("progress.json total_runs must equal sampled_rows x n")
    runs: dict[int, set[int]] = {}
    for row in rows:
        runs.setdefault(row["row_index"], set()).add(row["run_index"])
    if len(runs) != sampled or sampled > dataset_rows:
        raise UploadError("index.jsonl rows do not match progress.json sampled_rows")
    if set(runs) != set(range(sampled)):
        raise UploadError("index.jsonl row indices must be exactly 0..sampled_rows-1")
    if any(found != set(range(n)) for found in runs.values()):
        raise UploadError("index.jsonl must hold every run_index 0..n-1 of every row")


def _metrics(doc: dict[str, Any], m: _Manifest) -> tuple[dict[str, Any], float]:
    eval_run = _object(doc, "eval_run", "metrics.json")
    summary = _object(doc, "summary", "metrics.json")
    if eval_run.get("id") != m.local_run_id or eval_run.get("name") != m.run_name:
        raise UploadError("metrics.json eval_run does not belong to this run's manifest")
    if eval_run.get("status") != "finished":
        raise UploadError("local evaluation is not completed: metrics.json status must be finished")
    for key in ("started_at", "completed_at", "dataset_name"):
        _text(eval_run, key, "metrics.json eval_run")
    if eval_run.get("model_name") != m.inputs["model_path"]:
        raise UploadError("metrics.json eval_run.model_name does not match the manifest")
    if eval_run.get("rollout_name") != m.inputs["rollout"]["name"]:
        raise UploadError("metrics.json eval_run.rollout_name does not match the manifest")
    threshold = summary.get("pass_threshold")
    if not isinstance(threshold, int | float) or isinstance(threshold, bool):
        raise UploadError("metrics.json summary.pass_threshold must be a finite number")
    if not math.isfinite(threshold):
        raise UploadError("metrics.json summary.pass_threshold must be a finite number")
    return eval_run, float(threshold)


def _check_atif(doc: dict[str, Any], where: str) -> None:
    """The ATIF structure every reader of a trajectory relies on (schema, agent, steps)."""
    version = doc.get("schema_version")
    agent = doc.get("agent")
    steps = doc.get("steps")
    if (
        not isinstance(version, str)
        or not version.startswith("ATIF-")
        or not isinstance(agent, dict)
        or not isinstance(agent.get("name"), str)
        or not isinstance(steps, list)
        or any(
            not isinstance(s, dict)
            or not _is_int(s.get("step_id"))
            or s.get("source") not in ("system", "user", "agent")
            for s in steps
        )
    ):
        raise UploadError(f"{where} is not valid ATIF")


def _trajectory(run_dir: Path, row: dict[str, Any]) -> PlanFile:
    rollout_id, name = row["rollout_id"], row["trajectory_filename"]
    trial = run_dir / "rollout_trials" / rollout_id
    mode = _lstat_mode(trial)
    if mode is None or not stat.S_ISDIR(mode):
        raise UploadError(f"rollout_trials/{rollout_id} must be a directory")
    relative = f"rollout_trials/{rollout_id}/{name}"
    doc = _json_object(read_stable(trial / name, relative), relative)
    _check_atif(doc, relative)
    if trajectory_identity(doc) != rollout_id:
        raise UploadError(f"{relative} does not belong to rollout {rollout_id}")
    osmosis = (
        (doc.get("extra") or {}).get("osmosis") if isinstance(doc.get("extra"), dict) else None
    )
    fields = osmosis.get("request_extra_fields") if isinstance(osmosis, dict) else None
    if not isinstance(fields, dict) or any(
        not _is_int(fields.get(k)) or fields.get(k) != row[k] for k in ("row_index", "run_index")
    ):
        raise UploadError(f"{relative} row_index/run_index do not match index.jsonl")
    return hash_file(trial / name, relative)


def _lstat_mode(path: Path) -> int | None:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8 on disk (surrogate escapes)
        return False
    return True


def _check_upload_path(path: str) -> None:
    if (
        len(path) > _MAX_PATH
        or "\\" in path
        or not _utf8(path)
        or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in path)  # C0, DEL, C1
        or path.startswith("/")
        or any(part in ("", ".", "..") for part in path.split("/"))
        or PurePosixPath(path).as_posix() != path
    ):
        raise UploadError(f"{path[:200]!r} is not a safe upload path")


def _artifacts(run_dir: Path, rollout_id: str) -> list[PlanFile]:
    base = f"rollout_trials/{rollout_id}/artifacts"
    trial_mode = _lstat_mode(run_dir / "rollout_trials" / rollout_id)
    if trial_mode is not None and stat.S_ISLNK(trial_mode):  # its artifacts would be elsewhere
        raise UploadError(f"rollout_trials/{rollout_id} must not be a symlink")
    root = run_dir / base
    mode = _lstat_mode(root)
    if mode is None:
        return []
    if stat.S_ISLNK(mode):
        raise UploadError(f"{base} must not be a symlink")
    if not stat.S_ISDIR(mode):
        return []
    found: list[PlanFile] = []
    pending = [(root, "")]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = f"{prefix}{entry.name}"
                path = f"{base}/{rel}"
                _check_upload_path(path)  # first: a name is shown only once it is safe to show
                if entry.is_symlink():
                    raise UploadError(f"{path} must not be a symlink")
                if entry.is_dir(follow_symlinks=False):
                    pending.append((Path(entry.path), f"{rel}/"))
                elif entry.is_file(follow_symlinks=False) and rel != "manifest.json":
                    found.append(hash_file(Path(entry.path), path))
    return found


def _provenance(source: dict[str, Any], config_path: str | None) -> dict[str, Any]:
    provenance: dict[str, Any] = {}
    for key in PROVENANCE_KEYS:
        value = source.get(key)
        if value is None:
            continue
        if key == "git_dirty":
            if not isinstance(value, bool):
                raise UploadError("manifest.json provenance.git_dirty must be a boolean")
        elif not isinstance(value, str) or not value:
            raise UploadError(f"manifest.json provenance.{key} must be a non-empty string")
        provenance[key] = value
    if config_path:
        provenance["config_path"] = config_path
    return provenance


def build_plan(run_dir: Path, *, config_path: str | None = None) -> UploadPlan:
    """Validate ``run_dir`` and hash what it uploads. ``config_path`` (from ``eval run
    --upload``) overrides ``provenance.config_path``; the manifest file is never rewritten."""
    mode = _lstat_mode(run_dir)
    if mode is None or not stat.S_ISDIR(mode):
        raise UploadError(f"{run_dir} is not a run directory (or it is a symlink)")
    run_dir = run_dir.resolve()
    trials_mode = _lstat_mode(run_dir / "rollout_trials")
    if trials_mode is not None and stat.S_ISLNK(trials_mode):
        raise UploadError("rollout_trials must not be a symlink")
    manifest_bytes = read_stable(run_dir / "manifest.json", "manifest.json")
    m = _manifest(_json_object(manifest_bytes, "manifest.json"), run_dir)
    progress = _json_object(
        read_stable(run_dir / "progress.json", "progress.json"), "progress.json"
    )
    rows = _index(read_stable(run_dir / "index.jsonl", "index.jsonl"))
    _check_grid(rows, progress, m.inputs["n"])
    metrics = _json_object(read_stable(run_dir / "metrics.json", "metrics.json"), "metrics.json")
    eval_run, threshold = _metrics(metrics, m)

    files = [hash_file(run_dir / "index.jsonl", "index.jsonl")]
    files.append(hash_file(run_dir / "progress.json", "progress.json"))
    logs_mode = _lstat_mode(run_dir / "logs.txt")
    if logs_mode is not None and stat.S_ISREG(logs_mode):
        files.append(hash_file(run_dir / "logs.txt", "logs.txt"))
    for row in rows:
        if row.get("trajectory_filename") is not None:
            files.append(_trajectory(run_dir, row))
    for row in rows:
        files.extend(_artifacts(run_dir, row["rollout_id"]))
    files.sort(key=lambda f: f.path)

    provenance = _provenance(m.provenance, config_path)
    rollout = m.inputs["rollout"]
    rollout_config: dict[str, Any] = {
        "name": rollout["name"],
        "source_digest": rollout["source_digest"],
    }
    if "config_branch" in provenance:
        rollout_config["branch"] = provenance["config_branch"]
    if "config_commit_sha" in provenance:
        rollout_config["commit_sha"] = provenance["config_commit_sha"]
    dataset = m.inputs["dataset"]
    run = {
        "name": m.run_name,
        "started_at": eval_run["started_at"],
        "completed_at": eval_run["completed_at"],
        "experiment_config": {
            "rollout": rollout_config,
            "entrypoint": rollout["entrypoint"],
            "model_path": m.inputs["model_path"],
            "dataset": {
                "name": eval_run["dataset_name"],
                "sha256": dataset["sha256"],
                "selected_source_rows": dataset["selected_source_rows"],
            },
        },
        "evaluation_config": {"n": m.inputs["n"], "pass_threshold": threshold},
    }
    return UploadPlan(
        run_dir=run_dir,
        local_run_id=m.local_run_id,
        manifest_digest=hashlib.sha256(manifest_bytes).hexdigest(),
        run=run,
        schema_versions=dict(m.inputs["versions"]),
        provenance=provenance,
        files=tuple(files),
    )
