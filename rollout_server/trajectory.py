"""``trajectory.json`` (ATIF v1.7) and ``diagnostics.json`` for one rollout (docs/spec/protocol.md §14).

A rollout may put a secret of its environment into its conversation or its failure (a workflow
that prints its key into a reply): :func:`render_rollout_files` replaces every secret the
server's environment holds (:func:`environment_secrets`, the one redaction policy's
:mod:`rollout_server.net.secrets`) before the files are written. The supervisor redacts them
again with every secret of the run (some of which the server cannot tell from other variables).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from .jsonsafe import json_safe
from .net.secrets import AMBIENT_MIN_LENGTH, REDACTED, SecretMatcher, secret_env_values
from .protocol import RAW_ARGUMENTS
from .sdk import RolloutSample

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "SDK_NAME",
    "build_trajectory",
    "environment_secrets",
    "make_private_dirs",
    "render_rollout_files",
    "write_rollout_files",
]

ATIF_SCHEMA_VERSION = "ATIF-v1.7"
SDK_NAME = "osmosis-rollout-sdk"
_SOURCES = {"system": "system", "developer": "system", "user": "user", "assistant": "agent"}


def _text(content: Any) -> str:
    """Flatten OpenAI message content (string or list of parts) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return json.dumps(content, default=str)


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        arguments: Any = function.get("arguments")
        raw: str | None = None
        if isinstance(arguments, str):
            text = arguments
            try:
                arguments = json.loads(text)
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                raw = text
        entry: dict[str, Any] = {
            "tool_call_id": call.get("id"),
            "function_name": function.get("name"),
            "arguments": arguments if arguments is not None else {},
        }
        if raw is not None:
            # ATIF's arguments are an object: text that is not a JSON object is kept whole,
            # and `extra` says so (an object whose only key is "raw" is then not mistaken
            # for it).
            entry["arguments"] = {"raw": raw}
            entry["extra"] = {RAW_ARGUMENTS: True}
        out.append(entry)
    return out


def build_trajectory(
    rollout_id: str,
    sample: RolloutSample,
    *,
    sdk_version: str,
    request_label: str | None = None,
    request_metadata: dict[str, Any] | None = None,
    request_extra_fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ATIF document for a sample (its ``trajectory_messages``)."""
    steps: list[dict[str, Any]] = []
    for message in sample.trajectory_messages or []:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("tool", "function") and steps and steps[-1]["source"] == "agent":
            observation = steps[-1].setdefault("observation", {"results": []})
            observation["results"].append(
                {
                    "source_call_id": message.get("tool_call_id"),
                    "content": _text(message.get("content")),
                }
            )
            continue
        step: dict[str, Any] = {
            "step_id": len(steps) + 1,
            "source": _SOURCES.get(role, "user") if isinstance(role, str) else "user",
            "message": _text(message.get("content")),
        }
        if role not in _SOURCES:
            step["extra"] = {"original_role": role}
        calls = _tool_calls(message.get("tool_calls"))
        if calls:
            step["tool_calls"] = calls
        steps.append(step)
    osmosis: dict[str, Any] = {
        "rollout_id": rollout_id,
        "label": sample.label if sample.label is not None else request_label,
        "reward": sample.reward,
        "sample_metrics": json_safe(sample.metrics) if sample.metrics else None,
        "sample_extra_fields": json_safe(sample.extra_fields) if sample.extra_fields else None,
        "request_metadata": json_safe(request_metadata) if request_metadata else None,
        "request_extra_fields": json_safe(request_extra_fields) if request_extra_fields else None,
    }
    return {
        "schema_version": ATIF_SCHEMA_VERSION,
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": {"name": SDK_NAME, "version": sdk_version},
        "steps": steps,
        "final_metrics": {"total_steps": len(steps)},
        "extra": {"osmosis": {k: v for k, v in osmosis.items() if v is not None}},
    }


def _pretty(document: Any, encoder: msgspec.json.Encoder) -> str:
    # msgspec (C) instead of json.dumps(indent=...), whose pure-Python encoder cost about as
    # much CPU as the rest of the rollout. NaN/Infinity become null, unknown objects strings.
    try:
        raw = encoder.encode(document)
    except (TypeError, ValueError, OverflowError):
        raw = encoder.encode(json_safe(document) if isinstance(document, dict) else None)
    return msgspec.json.format(raw, indent=2).decode("utf-8")


_trajectory_encoder = msgspec.json.Encoder(enc_hook=str)
_diagnostics_encoder = msgspec.json.Encoder(enc_hook=str, order="sorted")


def environment_secrets(environ: Mapping[str, str] | None = None) -> SecretMatcher | None:
    """The secret values of ``environ`` (default ``os.environ``) as the policy names them
    (:func:`~rollout_server.net.secrets.secret_env_values`), or None when it holds none."""
    values = secret_env_values(os.environ if environ is None else environ)
    if not values:
        return None
    matcher = SecretMatcher()
    for value in values:
        matcher.add(value, min_length=AMBIENT_MIN_LENGTH)
    return matcher


def _redact_strings(document: Any, secrets: SecretMatcher) -> Any:
    """A copy of JSON-like ``document`` with every string (keys included) redacted."""
    if isinstance(document, str):
        return secrets.sub(REDACTED, document)
    if isinstance(document, dict):
        return {
            _redact_strings(key, secrets): _redact_strings(value, secrets)
            for key, value in document.items()
        }
    if isinstance(document, list | tuple):
        return [_redact_strings(value, secrets) for value in document]
    return document


def _render(document: Any, encoder: msgspec.json.Encoder, secrets: SecretMatcher | None) -> str:
    """``document`` as pretty JSON, with no spelling of a secret of ``secrets`` in it."""
    text = _pretty(document, encoder)
    if secrets is None or not secrets.found(text):
        return text  # the usual case: one scan
    clean = secrets.sub(REDACTED, text)
    try:
        json.loads(clean)
        return clean
    except (ValueError, RecursionError):
        # A match took a backslash of the text around it: redact the strings instead (when
        # none holds a secret, the match was an escape's letter and a secret's start).
        loaded = json.loads(text)
        redacted = _redact_strings(loaded, secrets)
        return text if redacted == loaded else _pretty(redacted, encoder)


def render_rollout_files(
    *,
    trajectory: dict[str, Any] | None,
    diagnostics: dict[str, Any] | None,
    secrets: SecretMatcher | None = None,
) -> dict[str, str]:
    """File name -> text for ``trajectory.json`` and ``diagnostics.json`` (when given), every
    spelling of a value of ``secrets`` (:func:`environment_secrets`) replaced."""
    files: dict[str, str] = {}
    if trajectory is not None:
        files["trajectory.json"] = _render(trajectory, _trajectory_encoder, secrets)
    if diagnostics is not None:
        files["diagnostics.json"] = _render(diagnostics, _diagnostics_encoder, secrets)
    return files


_DIR_MODE = 0o700
_FILE_MODE = 0o600


def make_private_dirs(path: Path | str) -> bool:
    """Create directory ``path`` and its missing parents, each 0700 (``mkdir(parents=True)``
    would give the parents the umask's default instead); True when ``path`` itself was created
    here, False when it was a directory already.

    The usual case, a new directory under an existing parent, is a single ``mkdir`` call: on
    this kind of storage every inode creation costs tens of microseconds, so nothing is looked
    up first.
    """
    target = os.fspath(path)
    try:
        os.mkdir(target, _DIR_MODE)
        return True
    except FileExistsError:
        if os.path.isdir(target):
            return False
        raise
    except FileNotFoundError:
        parent = os.path.dirname(target)
        if not parent or parent == target:
            raise
    make_private_dirs(parent)
    try:
        os.mkdir(target, _DIR_MODE)
    except FileExistsError:
        if os.path.isdir(target):
            return False
        raise
    return True


def write_rollout_files(rollout_dir: Path | str, files: dict[str, str]) -> None:
    """Create ``rollout_dir`` and ``artifacts/`` if needed, then write each file atomically.

    Trajectories hold prompts and model output, so directories are 0700 and files 0600
    (docs/eval-run.md), whatever the umask.
    """
    base = os.fspath(rollout_dir)
    artifacts = os.path.join(base, "artifacts")
    if not os.path.isdir(artifacts):  # the usual case: the backend made both already
        make_private_dirs(artifacts)
    for name, text in files.items():
        tmp = os.path.join(base, f".{name}.tmp")
        data = memoryview(text.encode("utf-8"))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
        try:
            # A temp file left by an earlier crash keeps its old mode through O_CREAT.
            os.fchmod(fd, _FILE_MODE)
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(base, name))
