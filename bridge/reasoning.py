"""Reasoning replay per rollout (docs/spec/bridge.md §10).

Clients often drop the provider's reasoning (Anthropic thinking blocks with signatures,
OpenRouter ``reasoning_details``) from the history they send back, and some providers then
reject the tool turn. The bridge remembers the reasoning that came with each tool call and
puts it back on the assistant message that carries that tool call on the same rollout.
"""

from __future__ import annotations

import threading
from typing import Any

from bridge.policy import PreparedRequest
from bridge.shaping import REASONING_FIELDS


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == ""


class ReasoningMemory:
    """``rollout id → tool call id → reasoning fields``, in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store: dict[str, dict[str, dict[str, Any]]] = {}

    def remember(self, rollout_id: str, message: dict[str, Any]) -> None:
        """Keep the reasoning of an assistant message that has both reasoning and tool calls."""
        fields = {k: message[k] for k in REASONING_FIELDS if not _empty(message.get(k))}
        calls = message.get("tool_calls")
        if not fields or not isinstance(calls, list):
            return
        ids: list[str] = [
            c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)
        ]
        if not ids:
            return
        with self._lock:
            store = self._store.setdefault(rollout_id, {})
            for call_id in ids:
                store[call_id] = fields

    def replay(self, rollout_id: str, prepared: PreparedRequest) -> PreparedRequest:
        """Fill missing reasoning into assistant messages whose tool calls we remember."""
        with self._lock:
            store = self._store.get(rollout_id)
            if not store or not isinstance(prepared.messages, list):
                return prepared
            store = dict(store)
        messages: list[Any] = []
        changed = False
        for message in prepared.messages:
            fields = _fields_for(message, store)
            if fields:
                missing = {k: v for k, v in fields.items() if _empty(message.get(k))}
                if missing:
                    message = {**message, **missing}
                    changed = True
            messages.append(message)
        return PreparedRequest(messages, prepared.params) if changed else prepared

    def keep(self, rollout_id: str, key: str, fields: dict[str, Any]) -> None:
        """Remember ``fields`` under ``key`` (a Responses reasoning item's id, say) for a rollout."""
        with self._lock:
            self._store.setdefault(rollout_id, {})[key] = fields

    def recall(self, rollout_id: str, key: str) -> dict[str, Any] | None:
        """What :meth:`keep` remembered under ``key``, or None."""
        with self._lock:
            return self._store.get(rollout_id, {}).get(key)

    def forget(self, rollout_id: str) -> None:
        """Drop everything remembered for a rollout."""
        with self._lock:
            self._store.pop(rollout_id, None)


def _fields_for(message: Any, store: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return None
    for call in calls:
        if isinstance(call, dict) and call.get("id") in store:
            return store[call["id"]]
    return None


class StreamedMessage:
    """Accumulates the reasoning and tool call ids of a streamed first choice."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.tool_calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        """Fold one shaped chunk in."""
        for choice in chunk.get("choices", []):
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta", {})
            for name in REASONING_FIELDS:
                value = delta.get(name)
                if isinstance(value, str):
                    self.fields[name] = self.fields.get(name, "") + value
                elif isinstance(value, list):
                    self.fields[name] = [*self.fields.get(name, []), *value]
            for i, call in enumerate(delta.get("tool_calls") or []):
                if isinstance(call, dict):
                    index = call.get("index", i)
                    index = index if isinstance(index, int) else i
                    slot = self.tool_calls.setdefault(index, {})
                    if isinstance(call.get("id"), str):
                        slot["id"] = call["id"]

    def message(self) -> dict[str, Any]:
        """The accumulated message, in the shape :meth:`ReasoningMemory.remember` takes."""
        return {**self.fields, "tool_calls": list(self.tool_calls.values())}
