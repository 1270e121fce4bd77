"""``manifest.json`` (docs/spec/supervisor.md §3.2, §4.2-§4.5): the resolved-input lock and provenance,
the manifest gate (create, open or archive) and the ``--fresh`` archive.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher.config import EvalConfig, RunSpec, upstream_base_url
from launcher.dataset import DatasetSelection
from launcher.errors import ConflictError, LocalEvalError
from launcher.rundir.atomic import atomic_write_json, ensure_dir, fsync_dir
from launcher.rundir.logs import utc_now_iso
from launcher.workspace import GitState, Workspace
from rollout_server.protocol import PROTOCOL_VERSION

__all__ = [
    "INPUT_GROUPS",
    "LATER_GROUPS",
    "MANIFEST_NAME",
    "STATE_SCHEMA",
    "GateOutcome",
    "Manifest",
    "archive_run_dir",
    "build_inputs",
    "build_provenance",
    "changed_groups",
    "changed_inputs_message",
    "is_archive_name",
    "is_run_dir",
    "manifest_gate",
    "new_manifest",
    "read_manifest",
    "resumable",
]

MANIFEST_NAME = "manifest.json"
STATE_SCHEMA = 1
ROLLOUT_PROTOCOL = PROTOCOL_VERSION
DATASET_NORMALIZATION = 1
_MISSING = object()
INPUT_GROUPS = (
    "dataset",
    "env",
    "model",
    "model_path",
    "n",
    "rollout",
    "secret_names",
    "timeouts",
    "versions",
)
#: Groups added after the first manifests were written: a manifest without one predates it,
#: and the group counts as unchanged (so those runs still resume).
LATER_GROUPS = frozenset({"model"})


@dataclass(frozen=True)
class Manifest:
    """The parsed ``manifest.json``."""

    local_run_id: str
    run_name: str
    created_at: str
    inputs: dict[str, Any]
    provenance: dict[str, Any]
    schema_version: int = STATE_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to disk (key order of §3.2)."""
        return {
            "schema_version": self.schema_version,
            "local_run_id": self.local_run_id,
            "run_name": self.run_name,
            "created_at": self.created_at,
            "inputs": self.inputs,
            "provenance": self.provenance,
        }


def build_inputs(
    config: EvalConfig,
    spec: RunSpec,
    selection: DatasetSelection,
    source_digest: str,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The resolved-input lock (§4.3). Excludes names, paths, concurrency, thresholds, UI flags.

    ``model`` locks the upstream's identity next to ``model_path``: the base URL the bridge
    will call, resolved from ``environ`` (default: this process's environment), never a key.
    """
    model_path = config.experiment.model_path
    upstream = upstream_base_url(model_path, os.environ if environ is None else environ)
    return {
        "model_path": model_path,
        "model": {"upstream_base_url": upstream},
        "dataset": {
            "sha256": selection.sha256,
            "selected_source_rows": selection.selected_source_rows,
        },
        "n": spec.n,
        "rollout": {
            "name": config.experiment.rollout,
            "entrypoint": config.experiment.entrypoint,
            "source_digest": source_digest,
        },
        "env": dict(sorted(config.env.items())),
        "secret_names": sorted(config.secrets_required),
        "timeouts": {
            "agent_timeout_sec": spec.agent_timeout_sec,
            "grader_timeout_sec": spec.grader_timeout_sec,
        },
        "versions": {
            "rollout_protocol": ROLLOUT_PROTOCOL,
            "dataset_normalization": DATASET_NORMALIZATION,
            "state_schema": STATE_SCHEMA,
        },
    }


def build_provenance(
    config: EvalConfig, workspace: Workspace | None, git: GitState | None, sdk_version: str
) -> dict[str, Any]:
    """Provenance (§3.2): versions, config pins, config path, ``[advanced]``, git state."""
    prov: dict[str, Any] = {
        "sdk_version": sdk_version,
        "config_branch": config.experiment.branch,
        "config_commit_sha": config.experiment.commit_sha,
    }
    if workspace is not None:
        with contextlib.suppress(ValueError):
            prov["config_path"] = workspace.config_relpath
    if config.advanced:
        prov["advanced"] = config.advanced
    if git is not None:
        prov["git_head"] = git.head
        prov["git_branch"] = git.branch
        prov["git_dirty"] = git.dirty
    return {k: v for k, v in prov.items() if v is not None}


def new_manifest(run_name: str, inputs: dict[str, Any], provenance: dict[str, Any]) -> Manifest:
    """A manifest for a new run: fresh ``local_run_id`` (uuid4 hex) and ``created_at`` now."""
    return Manifest(
        local_run_id=uuid.uuid4().hex,
        run_name=run_name,
        created_at=utc_now_iso(),
        inputs=inputs,
        provenance=provenance,
    )


def read_manifest(path: Path, *, remedy: str = "Start a new run with --fresh.") -> Manifest:
    """Read and check ``manifest.json`` (schema version, object shapes); ``remedy`` ends the
    error (what the command reading it can do about it)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LocalEvalError(f"{path} is unreadable: {exc}. {remedy}") from None
    if not isinstance(data, dict):
        raise LocalEvalError(f"{path} is unreadable: not a JSON object. {remedy}")
    version = data.get("schema_version")
    if version != STATE_SCHEMA:
        raise LocalEvalError(
            f"{path} was written by state schema version {version}; this SDK writes version "
            f"{STATE_SCHEMA}. {remedy}"
        )
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        raise LocalEvalError(f"{path} is unreadable: inputs must be an object. {remedy}")
    provenance = data.get("provenance")
    return Manifest(
        local_run_id=str(data.get("local_run_id", "")),
        run_name=str(data.get("run_name", "")),
        created_at=str(data.get("created_at", "")),
        inputs=inputs,
        provenance=provenance if isinstance(provenance, dict) else {},
    )


def changed_groups(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Sorted top-level input keys whose values differ (added or removed keys included, except
    a :data:`LATER_GROUPS` group the old manifest predates)."""
    return sorted(
        k
        for k in set(old) | set(new)
        if old.get(k, _MISSING) != new.get(k, _MISSING) and not (k in LATER_GROUPS and k not in old)
    )


def changed_inputs_message(name: str, groups: list[str]) -> str:
    """The exact refusal text of §4.2."""
    return (
        f"run '{name}' was created with different resolved inputs, so resuming it would mix "
        f"versions inside one set of metrics. Changed: {', '.join(groups)}. Restart under the "
        "same name with --fresh (the previous results are archived, never deleted)."
    )


#: The suffix :func:`archive_run_dir` gives: ``.archive-<UTC YYYYMMDDTHHMMSSZ>[-k]``.
_ARCHIVE_SUFFIX = re.compile(r"\.archive-\d{8}T\d{6}Z(-\d+)?\Z")


def is_archive_name(name: str) -> bool:
    """Whether ``name`` is one :func:`archive_run_dir` made (``my.archive-old`` is not)."""
    return _ARCHIVE_SUFFIX.search(name) is not None


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory: a supervisor wrote its manifest or its journal.
    Any other directory under an output root (a workspace's ``configs/`` under ``-o .``, the
    user's own files) is neither listed nor ever cleaned."""
    return (path / MANIFEST_NAME).is_file() or (path / "events.jsonl").is_file()


def archive_run_dir(run_dir: Path, now: datetime | None = None) -> Path:
    """Rename ``run_dir`` to ``<name>.archive-<UTC YYYYMMDDTHHMMSSZ>[-k]`` and fsync the parent."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = run_dir.parent / f"{run_dir.name}.archive-{stamp}"
    target = base
    suffix = 0
    while target.exists() or target.is_symlink():
        suffix += 1
        target = base.with_name(f"{base.name}-{suffix}")
    os.replace(run_dir, target)
    fsync_dir(run_dir.parent)
    return target


@dataclass(frozen=True)
class GateOutcome:
    """What the manifest gate did: the manifest in force, whether it was created, any archive."""

    manifest: Manifest
    created: bool
    archived_to: Path | None = None


def resumable(run_dir: Path, run_name: str, inputs: dict[str, Any]) -> Manifest:
    """The manifest of ``run_dir`` when ``inputs`` may resume it; ConflictError with the
    ``Changed: ...`` message when they differ (what the gate refuses, checked without writing
    anything: the daemon's validate asks it too)."""
    existing = read_manifest(run_dir / MANIFEST_NAME)
    groups = changed_groups(existing.inputs, inputs)
    if groups:
        message = changed_inputs_message(run_name, groups)
        if groups == ["shard"]:
            # Only the shard differs: the run resumes as the shard it is (--fresh would
            # throw its results away for nothing).
            was = existing.inputs.get("shard")
            flag = (
                f"--shard {was['index']}/{was['count']}"
                if isinstance(was, dict) and {"index", "count"} <= set(was)
                else "no --shard"
            )
            message += f" To resume it as it was made, run it with {flag}."
        raise ConflictError(message, details={"changed": groups})
    return existing


def manifest_gate(
    run_dir: Path,
    run_name: str,
    inputs: dict[str, Any],
    provenance: dict[str, Any],
    *,
    fresh: bool,
) -> GateOutcome:
    """Open, archive-then-create, or create the run's manifest (§4.2). Call under the run lock.

    With an existing manifest and no ``fresh``: inputs must match (else ConflictError with the
    ``Changed: ...`` message; nothing is written). With ``fresh``: the directory is archived
    first. A directory without a manifest is reused.
    """
    if run_dir.is_symlink():
        raise ConflictError(
            f"run directory {run_dir} is a symbolic link; refusing to use it. Remove the link "
            "or choose a different --name."
        )
    manifest_path = run_dir / MANIFEST_NAME
    archived: Path | None = None
    if manifest_path.exists():
        if fresh:
            archived = archive_run_dir(run_dir)
        else:
            return GateOutcome(manifest=resumable(run_dir, run_name, inputs), created=False)
    ensure_dir(run_dir / "rollout_trials")
    manifest = new_manifest(run_name, inputs, provenance)
    atomic_write_json(manifest_path, manifest.to_dict())
    return GateOutcome(manifest=manifest, created=True, archived_to=archived)
