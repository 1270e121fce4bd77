"""Shaping provider answers into what the rollout receives (docs/spec/bridge.md §7).

The bridge owns a few fields of every answer: the envelope (``id``, ``object``, ``created``,
``model``, ``usage``), each choice's ``index`` and ``finish_reason``, and the assistant
message's ``role``, ``content`` (never null), reasoning fields, ``tool_calls`` and ``refusal``.
Every other field the provider sends, at any of those three levels (``system_fingerprint``,
``service_tier``, a choice's ``logprobs``, a message's ``annotations`` or ``audio``, a
provider's own additions), is relayed as sent: RL rollouts need ``logprobs`` in particular.
Null values are not relayed, because LiteLLM fills every field it knows with null whether the
provider sent it or not, and a missing field means the same to OpenAI clients.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bridge.usage import CallUsage

#: Reasoning fields copied from a message (or its ``provider_specific_fields``) when present.
REASONING_FIELDS = ("reasoning_content", "thinking_blocks", "reasoning_details")

NO_CHOICES_MESSAGE = "LLM response carried no choices; refusing to emit an empty completion"

#: Envelope fields the bridge sets itself.
OWNED_ENVELOPE = frozenset({"id", "object", "created", "model", "choices", "usage"})
#: Choice fields the bridge sets itself (``message`` or ``delta`` is reshaped).
OWNED_CHOICE = frozenset({"index", "message", "delta", "finish_reason"})
#: Message and delta fields the bridge sets itself.
OWNED_MESSAGE = frozenset({"role", "content", "tool_calls", "refusal", *REASONING_FIELDS})
#: LiteLLM's own bookkeeping rather than the provider's answer (the reasoning it carries is
#: taken out of it), never relayed.
LITELLM_INTERNAL = "provider_specific_fields"


def passed_through(obj: dict[str, Any], owned: frozenset[str]) -> dict[str, Any]:
    """The fields of ``obj`` the bridge does not own, as the provider sent them (nulls dropped)."""
    return {
        k: v for k, v in obj.items() if k not in owned and k != LITELLM_INTERNAL and v is not None
    }


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
    """The assistant message the rollout sees: content (never null), reasoning, tools, refusal,
    then every other field the provider sent."""
    message = message if isinstance(message, dict) else {}
    content = message.get("content")
    out: dict[str, Any] = {"role": "assistant", "content": "" if content is None else content}
    out.update(_reasoning(message))
    tool_calls = message.get("tool_calls")
    if tool_calls:
        out["tool_calls"] = tool_calls
    if message.get("refusal") is not None:
        out["refusal"] = message["refusal"]
    out.update(passed_through(message, OWNED_MESSAGE))
    return out


def shape_completion(data: dict[str, Any], model: str, usage: CallUsage | None) -> dict[str, Any]:
    """A non-streaming ``chat.completion``: the owned fields reshaped, the rest relayed."""
    out = _envelope(data, model, "chat.completion", "message", shape_message)
    if usage is not None:
        out["usage"] = usage.to_json()
    return out


def shape_delta(delta: Any) -> dict[str, Any]:
    """A streamed delta: ``role`` when the provider sent it (its first delta does), content,
    reasoning, tool calls, refusal, then every other field the provider sent."""
    delta = delta if isinstance(delta, dict) else {}
    out: dict[str, Any] = {}
    if delta.get("role") is not None:
        out["role"] = delta["role"]
    if delta.get("content") is not None:
        out["content"] = delta["content"]
    out.update(_reasoning(delta))
    if delta.get("tool_calls"):
        out["tool_calls"] = delta["tool_calls"]
    if delta.get("refusal") is not None:
        out["refusal"] = delta["refusal"]
    out.update(passed_through(delta, OWNED_MESSAGE))
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
    """The fields a completion and a chunk share; each choice's ``part`` is reshaped, and the
    fields the bridge does not own are relayed at both levels."""
    choices = data.get("choices")
    return {
        "id": data.get("id") or "chatcmpl-eval",
        "object": kind,
        "created": _created(data.get("created")),
        "model": model,
        **passed_through(data, OWNED_ENVELOPE),
        "choices": [
            {
                "index": choice.get("index", i),
                part: shape_part(choice.get(part)),
                **passed_through(choice, OWNED_CHOICE),
                "finish_reason": choice.get("finish_reason"),
            }
            for i, choice in enumerate(choices if isinstance(choices, list) else [])
            if isinstance(choice, dict)
        ],
    }


def completion_to_chunk(completion: dict[str, Any]) -> dict[str, Any]:
    """Turn a shaped completion into the single chunk that carries it whole.

    Used when the provider answered a streaming request without streaming. The message
    becomes the delta whole (``role`` included: it is the stream's first delta), with tool
    call indices rewritten to their position, as streamed tool calls require.
    """
    choices = []
    for choice in completion["choices"]:
        delta = dict(choice["message"])
        if "tool_calls" in delta:
            delta["tool_calls"] = [
                {**call, "index": i} if isinstance(call, dict) else call
                for i, call in enumerate(delta["tool_calls"])
            ]
        others = {k: v for k, v in choice.items() if k != "message"}
        choices.append({**others, "delta": delta})
    out = {**completion, "object": "chat.completion.chunk", "choices": choices}
    return out
