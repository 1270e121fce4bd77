"""Shaping provider answers into what the rollout receives (docs/spec/bridge.md §7)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bridge.usage import CallUsage

#: Reasoning fields copied from a message (or its ``provider_specific_fields``) when present.
REASONING_FIELDS = ("reasoning_content", "thinking_blocks", "reasoning_details")

NO_CHOICES_MESSAGE = "LLM response carried no choices; refusing to emit an empty completion"


def _reasoning(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    specific = message.get("provider_specific_fields")
    for name in REASONING_FIELDS:
        value = message.get(name)
        if value is None and isinstance(specific, dict):
            value = specific.get(name)
        if value is not None:
            out[name] = value
    return out


def _created(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        return int(value)
    return int(time.time())


def shape_message(message: Any) -> dict[str, Any]:
    """The assistant message the rollout sees: content (never null), reasoning, tools, refusal."""
    message = message if isinstance(message, dict) else {}
    content = message.get("content")
    out: dict[str, Any] = {"role": "assistant", "content": "" if content is None else content}
    out.update(_reasoning(message))
    tool_calls = message.get("tool_calls")
    if tool_calls:
        out["tool_calls"] = tool_calls
    if message.get("refusal") is not None:
        out["refusal"] = message["refusal"]
    return out


def shape_completion(data: dict[str, Any], model: str, usage: CallUsage | None) -> dict[str, Any]:
    """A non-streaming ``chat.completion``; everything not listed in docs/spec/bridge.md §7 is dropped."""
    out = _envelope(data, model, "chat.completion", "message", shape_message)
    if usage is not None:
        out["usage"] = usage.to_json()
    return out


def shape_delta(delta: Any) -> dict[str, Any]:
    """A streamed delta: content, reasoning, tool calls and refusal (no ``role``)."""
    delta = delta if isinstance(delta, dict) else {}
    out: dict[str, Any] = {}
    if delta.get("content") is not None:
        out["content"] = delta["content"]
    out.update(_reasoning(delta))
    if delta.get("tool_calls"):
        out["tool_calls"] = delta["tool_calls"]
    if delta.get("refusal") is not None:
        out["refusal"] = delta["refusal"]
    return out


def shape_chunk(data: dict[str, Any], model: str) -> dict[str, Any]:
    """A ``chat.completion.chunk`` relayed to the rollout (usage is attached by the caller)."""
    return _envelope(data, model, "chat.completion.chunk", "delta", shape_delta)


def _envelope(
    data: dict[str, Any],
    model: str,
    kind: str,
    part: str,
    shape_part: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:
    """The fields a completion and a chunk share; each choice's ``part`` is reshaped."""
    choices = data.get("choices")
    return {
        "id": data.get("id") or "chatcmpl-eval",
        "object": kind,
        "created": _created(data.get("created")),
        "model": model,
        "choices": [
            {
                "index": choice.get("index", i),
                part: shape_part(choice.get(part)),
                "finish_reason": choice.get("finish_reason"),
            }
            for i, choice in enumerate(choices if isinstance(choices, list) else [])
            if isinstance(choice, dict)
        ],
    }


def completion_to_chunk(completion: dict[str, Any]) -> dict[str, Any]:
    """Turn a shaped completion into the single chunk that carries it whole.

    Used when the provider answered a streaming request without streaming. Tool call
    indices are rewritten to their position, as streamed tool calls require.
    """
    choices = []
    for choice in completion["choices"]:
        delta = {k: v for k, v in choice["message"].items() if k != "role"}
        if "tool_calls" in delta:
            delta["tool_calls"] = [
                {**call, "index": i} if isinstance(call, dict) else call
                for i, call in enumerate(delta["tool_calls"])
            ]
        choices.append(
            {"index": choice["index"], "delta": delta, "finish_reason": choice["finish_reason"]}
        )
    out = {**completion, "object": "chat.completion.chunk", "choices": choices}
    return out
