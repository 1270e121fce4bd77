"""A host-side Harbor agent's conversation: its ATIF ``agent/trajectory.json`` as chat messages.

Harbor's own agents (terminus-2 and the installed ones) write their turns as an ATIF document:
steps from ``system``, ``user`` or ``agent``, an agent step's ``tool_calls``
(``tool_call_id``, ``function_name``, ``arguments``) and its ``observation.results``
(``source_call_id``, ``content``). The row's sample takes them as the messages a
``LocalBackend`` rollout would have produced (``system``/``user``/``assistant`` messages, OpenAI
``tool_calls`` with the arguments as a JSON string, each result a ``tool`` message after its
call; a result that answers no call, as a terminal's output does for terminus-2, is the
``user`` message the agent sent next), so the row's ``trajectory.json``, the export, the report
and the daemon show every turn. The trial archive keeps the original document.

Text is scrubbed of the run's secrets (fail-closed: a document in which one survives gives no
messages) before it is parsed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..backend import ExecutionOutcome
from .archive import scrub_bytes, secret_spellings

__all__ = ["agent_messages", "atif_messages", "with_agent_messages"]

_ROLES = {"system": "system", "user": "user", "agent": "assistant"}
#: A trajectory larger than this is left to the archive (it would not fit a sample anyway).
_MAX_BYTES = 32 * 1024 * 1024


def _text(content: Any) -> str:
    """A step's ``message`` or a result's ``content``: a string, or content parts (ATIF 1.5+)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return "" if content is None else json.dumps(content, ensure_ascii=False, default=str)


def _tool_call(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    arguments = call.get("arguments")
    text = (
        arguments
        if isinstance(arguments, str)
        else json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    )
    return {
        "id": call.get("tool_call_id"),
        "type": "function",
        "function": {"name": call.get("function_name"), "arguments": text},
    }


def atif_messages(document: Any) -> list[dict[str, Any]]:
    """The chat messages of an ATIF document (see the module docstring); [] without steps."""
    steps = document.get("steps") if isinstance(document, dict) else None
    messages: list[dict[str, Any]] = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        role = _ROLES.get(str(step.get("source")), "user")
        message: dict[str, Any] = {"role": role, "content": _text(step.get("message"))}
        calls = [c for c in map(_tool_call, step.get("tool_calls") or []) if c is not None]
        if calls and role == "assistant":
            message["tool_calls"] = calls
        reasoning = step.get("reasoning_content")
        if role == "assistant" and isinstance(reasoning, str) and reasoning:
            message["reasoning_content"] = reasoning
        messages.append(message)
        called = {c["id"] for c in calls}
        observation = step.get("observation")
        results = observation.get("results") if isinstance(observation, dict) else None
        for result in results if isinstance(results, list) else []:
            if not isinstance(result, dict):
                continue
            source = result.get("source_call_id")
            content = _text(result.get("content"))
            if source is not None and source in called:
                messages.append({"role": "tool", "tool_call_id": source, "content": content})
            else:
                messages.append({"role": "user", "content": content})
    return messages


def agent_messages(trial_dir: Path, secrets: Sequence[str]) -> list[dict[str, Any]]:
    """The messages of ``<trial>/agent/trajectory.json``, scrubbed of ``secrets``; [] when the
    file is absent, unreadable, too large, not JSON, or still holds a secret after scrubbing."""
    path = trial_dir / "agent" / "trajectory.json"
    try:
        if path.is_symlink() or path.stat().st_size > _MAX_BYTES:
            return []
        data = path.read_bytes()
    except OSError:
        return []
    clean = scrub_bytes(data, secret_spellings(secrets))
    if clean is None:
        return []
    try:
        document = json.loads(clean)
    except ValueError:
        return []
    return atif_messages(document)


def with_agent_messages(
    outcome: ExecutionOutcome, messages: list[dict[str, Any]]
) -> ExecutionOutcome:
    """``outcome`` with each phase's sample holding ``messages`` (the agent's turns) as its
    conversation and trajectory, when there are any."""
    if not messages:
        return outcome
    for phase in (outcome.workflow, outcome.grader):
        sample = phase.sample if phase is not None else None
        if sample is not None:
            sample.messages = [dict(m) for m in messages]
            sample.trajectory_messages = [dict(m) for m in messages]
    return outcome
