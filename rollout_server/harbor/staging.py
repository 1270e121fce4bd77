"""A trial's private scratch: the staged task copy, its compose overlays, its owner file.

Layout under the backend's trials root (``/tmp/rollbridge-harbor-<uid>`` by default, 0700)::

    staging/<rollout_id>/owner.json      {"owner": "<pid>:<start time>", "trial": "trial-<id>"}
    staging/<rollout_id>/task/           the task, copied (the row's prompt as instruction.md)
    staging/<rollout_id>/rollbridge-overlay.json, trial-config.json, harbor.log
    staging/<rollout_id>/reports/        what the compose shim reports (trialreport.py)
    trials/trial-<rollout_id>/           Harbor's own trial dir

The owner file is written before anything else, and the staging dir lives exactly as long as its
trial: the backend removes it when the trial ends, however it ends (after the trial dir is
archived and retired). So a staging dir whose owner process is gone (``kill -9`` of the rollout
server) marks an abandoned trial, and :func:`stale_trials` finds it; a trial dir kept on purpose
for debugging has no staging dir, carries :data:`~.archive.KEPT_MARK` and is never touched. A
trial dir with neither (:func:`orphan_trial_dirs`) was written by a Harbor process that outlived
its rollout server and its reaping (it finishes its cancelled trial after the next server removed
the trial's scratch); nothing owns it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backend import ExecutionRequest
from .archive import KEPT_MARK
from .containers import owner_alive
from .installed import wire_installed

__all__ = [
    "OWNER_FILE",
    "StagedTrial",
    "agent_timeout",
    "orphan_trial_dirs",
    "prompt_text",
    "remove_scratch",
    "stage_trial",
    "stale_trials",
    "task_agent_timeout",
    "timeout_note",
    "trial_config",
    "write_private",
]

OWNER_FILE = "owner.json"
#: A staging dir with no readable owner file is only judged once it is this old (its owner may
#: be between ``mkdir`` and writing the file).
_UNOWNED_GRACE_S = 300.0
#: A trial dir nobody owns is only removed once untouched this long (a Harbor process that
#: outlived its server may still be writing it).
_ORPHAN_DIR_GRACE_S = 600.0
#: Where a verifier environment of its own (``environment_mode = "separate"``) can be defined;
#: Harbor does not pass run-level compose overlays to it, but it does read a
#: ``docker-compose.yaml`` found next to its Dockerfile.
_ENVIRONMENT_DIRS = ("environment", "tests", "steps/*/tests")


@dataclass(frozen=True)
class StagedTrial:
    """Paths of one staged trial."""

    staging: Path
    task_dir: Path
    overlay: Path
    config: Path
    log: Path
    reports: Path


def prompt_text(prompt: list[dict[str, Any]]) -> str:
    """The instruction a template task gets: the text of the row's messages, in order."""
    parts: list[str] = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
            )
    return "\n\n".join(p.strip() for p in parts if p and p.strip()) + "\n"


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a 0600 file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def task_agent_timeout(task_dir: Path) -> float | None:
    """The task's own ``[agent] timeout_sec`` (``task.toml``), or None when it sets none (or
    the file does not say it readably: Harbor itself reports a broken task)."""
    try:
        doc = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    agent = doc.get("agent")
    value = agent.get("timeout_sec") if isinstance(agent, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def agent_timeout(eval_timeout: float | None, task_timeout: float | None) -> float | None:
    """The agent's time in a trial: the shorter of the eval's ``agent_workflow_timeout_s`` and
    the task's own ``[agent] timeout_sec``, so the task author's limit is honoured and the eval
    can only shorten it (None: neither says, Harbor's default applies)."""
    given = [t for t in (eval_timeout, task_timeout) if t is not None]
    return min(given) if given else None


def timeout_note(noted: set[str], task: str, task_dir: Path, asked: float | None) -> str | None:
    """The warning, once per task (``noted`` remembers), that its own ``[agent] timeout_sec``
    and the eval's ``agent_workflow_timeout_s`` differ and the shorter applies; else None."""
    own = task_agent_timeout(task_dir)
    if own is None or asked is None or own == asked or task in noted:
        return None
    noted.add(task)
    return (
        f"task {task}: the agent gets {min(own, asked):g} s: its own [agent] timeout_sec is "
        f"{own:g} s, the eval's agent_workflow_timeout_s {asked:g} s; the shorter applies"
    )


def trial_config(
    request: ExecutionRequest,
    task_dir: Path,
    *,
    trials_root: Path,
    agent: str,
    agent_kwargs: Mapping[str, Any],
    model_name: str | None,
    chat_url: str,
    environment: Mapping[str, Any],
    timeout_grace: float = 0.0,
    verify: bool = True,
) -> dict[str, Any]:
    """The ``TrialConfig`` document of one trial (``harbor trial start -c``)."""
    agent_doc: dict[str, Any] = {"kwargs": dict(agent_kwargs)}
    agent_doc["import_path" if ":" in agent else "name"] = agent
    if model_name is not None:
        agent_doc["model_name"] = model_name
    wire_installed(agent_doc, agent, model_name, chat_url)  # claude-code, codex: the bridge
    if agent.startswith("terminus"):
        # The bearer travels in the child's environment (OPENAI_API_KEY), never in a file.
        agent_doc["kwargs"].setdefault("api_base", chat_url)
        agent_doc["kwargs"].setdefault("enable_summarize", False)
        agent_doc["kwargs"].setdefault("record_terminal_session", False)
    limit = agent_timeout(request.agent_timeout_sec, task_agent_timeout(task_dir))
    if limit is not None:
        agent_doc["override_timeout_sec"] = float(limit) + timeout_grace
    verifier: dict[str, Any] = {"disable": not (request.grade and verify)}
    if request.grader_timeout_sec is not None:
        verifier["override_timeout_sec"] = float(request.grader_timeout_sec)
    return {
        "task": {"path": str(task_dir)},
        "trial_name": f"trial-{request.id}",
        "trials_dir": str(trials_root / "trials"),
        "agent": agent_doc,
        "environment": dict(environment),
        "verifier": verifier,
    }


def stage_trial(
    trials_root: Path,
    rollout_id: str,
    source: Path,
    *,
    owner: str,
    instruction: str | None,
    service: Mapping[str, Any],
) -> StagedTrial:
    """Create ``staging/<rollout_id>`` (owner file first), copy the task, write the overlays.

    ``service`` is the compose ``main`` service overlay (labels, init). Besides the run-level
    overlay file, it is written as ``docker-compose.yaml`` into every environment directory of
    the copy that builds an image and has no compose file of its own, so that a separate
    verifier environment gets the labels (orphan reaping) and the init (fast teardown) too.
    """
    trial_name = f"trial-{rollout_id}"
    staging = trials_root / "staging" / rollout_id
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(trials_root, 0o700)
    staging.mkdir(mode=0o700)
    owner_doc = {"owner": owner, "trial": trial_name}
    write_private(staging / OWNER_FILE, json.dumps(owner_doc).encode())
    task_dir = staging / "task"
    shutil.copytree(source, task_dir, symlinks=False)
    if instruction is not None:
        (task_dir / "instruction.md").write_text(instruction)
    overlay_doc = json.dumps({"services": {"main": dict(service)}}).encode()
    for pattern in _ENVIRONMENT_DIRS:
        for env_dir in sorted(task_dir.glob(pattern)):
            compose = env_dir / "docker-compose.yaml"
            if (env_dir / "Dockerfile").is_file() and not compose.exists():
                # JSON is YAML; Harbor (and podman-compose) merge it over their own files.
                compose.write_bytes(overlay_doc)
    overlay = staging / "rollbridge-overlay.json"
    overlay.write_bytes(overlay_doc)
    (trials_root / "trials").mkdir(mode=0o700, exist_ok=True)
    shutil.rmtree(trials_root / "trials" / trial_name, ignore_errors=True)
    reports = staging / "reports"
    reports.mkdir(mode=0o700)
    return StagedTrial(
        staging, task_dir, overlay, staging / "trial-config.json", staging / "harbor.log", reports
    )


def _owner_of(staging: Path) -> str | None:
    try:
        document = json.loads((staging / OWNER_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    owner = document.get("owner") if isinstance(document, dict) else None
    return owner if isinstance(owner, str) else None


def stale_trials(trials_root: Path) -> list[str]:
    """Rollout ids of the staged trials whose owner process is gone (sorted)."""
    try:
        entries = sorted((trials_root / "staging").iterdir())
    except OSError:
        return []
    stale = []
    for staging in entries:
        if not staging.is_dir() or staging.is_symlink():
            continue
        owner = _owner_of(staging)
        if owner is None:
            try:
                age = time.time() - staging.stat().st_mtime
            except OSError:
                continue
            if age < _UNOWNED_GRACE_S:
                continue
        elif owner_alive(owner):
            continue
        stale.append(staging.name)
    return stale


def orphan_trial_dirs(trials_root: Path, grace: float = _ORPHAN_DIR_GRACE_S) -> list[Path]:
    """Harbor trial dirs (``trials/trial-<id>``) with no staging dir and no kept mark, untouched
    for ``grace`` seconds (sorted)."""
    try:
        entries = sorted((trials_root / "trials").iterdir())
    except OSError:
        return []
    now = time.time()
    orphans = []
    for trial in entries:
        rollout_id = trial.name.removeprefix("trial-")
        if rollout_id == trial.name or trial.is_symlink() or not trial.is_dir():
            continue
        try:
            if now - trial.stat().st_mtime < grace:
                continue
        except OSError:
            continue
        if (trial / KEPT_MARK).exists() or (trials_root / "staging" / rollout_id).exists():
            continue
        orphans.append(trial)
    return orphans


def remove_scratch(trials_root: Path, rollout_id: str) -> None:
    """Remove a trial's staging dir and Harbor trial dir."""
    shutil.rmtree(trials_root / "trials" / f"trial-{rollout_id}", ignore_errors=True)
    shutil.rmtree(trials_root / "staging" / rollout_id, ignore_errors=True)
