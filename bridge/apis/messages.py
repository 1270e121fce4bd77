"""Anthropic's Messages API translated to and from Chat Completions (docs/bridge.md, "Three APIs").

:func:`to_chat` turns a Messages request into a chat request body; :func:`to_message` turns a
chat completion into a Message; :class:`MessagesStream` turns chat chunks into the Messages event
grammar (``message_start``, ``content_block_start``/``_delta``/``_stop``, ``message_delta`` with
the usage, ``message_stop``) that anthropic's ``messages.stream`` accumulates. ``cache_control``
marks and thinking blocks have no chat slot and are left out (a cache hint and the model's own
reasoning, neither part of the prompt's meaning); anything else that cannot be carried is a 400
naming it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

from bridge.apis.chunks import first_choice
from bridge.apis.policy import MESSAGES, tool_type
from bridge.codec import dumps, loads
from bridge.errors import BridgeRequestError
from bridge.usage import CallUsage

_SAME = ("max_tokens", "temperature", "top_p", "top_k")
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def _refuse(what: str) -> BridgeRequestError:
    return BridgeRequestError(f"{what} cannot be carried to this model's chat API")


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n\n".join(
            str(b.get("text", ""))
            for b in system
            if isinstance(b, dict) and b.get("type") == "text"
        )
    raise BridgeRequestError("system must be a string or a list of text blocks")


def _image(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise _refuse(f"image source of type '{source.get('type')}'")
    return {"type": "image_url", "image_url": {"url": url}}


TOOL_ERROR_PREFIX = "Error: "
"""How a ``tool_result`` with ``is_error: true`` reaches a chat upstream: its text, prefixed."""


def _tool_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else None
            raise _refuse(f"tool_result content of type '{kind}'")
    return "".join(parts)


def _user(content: Any) -> list[dict[str, Any]]:
    """One user turn: its tool results first (chat wants them right after the calls), then
    the rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            text = _tool_result_text(block.get("content"))
            if block.get("is_error") is True:
                # Chat has no flag for a failed tool: the model is told in the text instead.
                text = f"{TOOL_ERROR_PREFIX}{text}" if text else TOOL_ERROR_PREFIX.rstrip(": ")
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image(block))
        else:
            raise _refuse(f"content block of type '{kind}'")
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant(content: Any) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = dumps(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # see the module docstring
        else:
            raise _refuse(f"content block of type '{kind}'")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools or []:
        kind = tool_type("messages", tool)
        if kind != "custom":
            raise _refuse(f"tool type '{kind}'")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict):
        raise BridgeRequestError("tool_choice must be an object")
    kind = choice.get("type")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise _refuse(f"tool_choice of type '{kind}'")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request that carries a Messages request (its policy already checked)."""
    if body.get("max_tokens") is None:
        raise BridgeRequestError("max_tokens: Field required")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _system(body["system"])})
    turns = body.get("messages")
    if not isinstance(turns, list):
        raise BridgeRequestError("messages: Field required (a list)")
    for turn in turns:
        role = turn.get("role") if isinstance(turn, dict) else None
        if role == "user":
            messages.extend(_user(turn.get("content")))
        elif role == "assistant":
            messages.append(_assistant(turn.get("content")))
        else:
            raise BridgeRequestError(f"messages: unexpected role '{role}'")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for name in _SAME:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None and chat.get("tools"):
        # Without tools it means nothing, and chat APIs refuse it (OpenAI: a 400).
        _tool_choice(body["tool_choice"], chat)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id"):
        chat["user"] = metadata["user_id"]
    handled = {*MESSAGES.owned, *_SAME, "stop_sequences", "tools", "tool_choice", "metadata"}
    for name, value in body.items():
        if name not in handled:
            chat[name] = value  # a custom parameter (thinking, output_config…), as on chat
    return chat


# Answers ------------------------------------------------------------------------------


def _ident(prefix: str, *parts: Any) -> str:
    return prefix + hashlib.sha256(dumps(list(parts))).hexdigest()[:24]


def usage_json(call: CallUsage) -> dict[str, Any]:
    """A Messages ``usage`` from the normalized numbers: ``input_tokens`` excludes the cache."""
    cached, written = call.cached_tokens or 0, call.cache_write_tokens or 0
    return {
        "input_tokens": max(call.prompt_tokens - cached - written, 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "output_tokens": call.completion_tokens,
    }


def _arguments(text: str) -> Any:
    try:
        value = loads(text or "{}")
    except ValueError:
        return {"_raw_arguments": text}  # the model wrote invalid JSON: kept, visibly
    return value if isinstance(value, dict) else {"_raw_arguments": text}


def to_message(completion: dict[str, Any], model: str, call: CallUsage) -> dict[str, Any]:
    """The Message for a chat completion (first choice), ``model`` echoed."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for tool_call in message.get("tool_calls") or []:
        function = tool_call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": tool_call.get("id"),
                "name": function.get("name"),
                "input": _arguments(function.get("arguments") or ""),
            }
        )
    return {
        "id": _ident("msg_", completion.get("id"), message),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": usage_json(call),
    }


class MessagesStream:
    """Chat chunks in, Messages events out."""

    def __init__(self, model: str, seed: str) -> None:
        self.model = model
        self.id = _ident("msg_", seed, time.time_ns())
        self._index = -1
        self._open: str | None = None  # "text" or "tool_use"
        self._calls: dict[int, int] = {}  # chat tool-call index -> block index
        self.finish: str | None = None

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **fields}) + b"\n\n"

    def start(self) -> Iterator[bytes]:
        """``message_start`` (usage not known yet: the chat upstream reports it at the end)."""
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        yield self._event("message_start", message=message)

    def _close(self) -> Iterator[bytes]:
        if self._open is not None:
            self._open = None
            yield self._event("content_block_stop", index=self._index)

    def _begin(self, block: dict[str, Any]) -> Iterator[bytes]:
        yield from self._close()
        self._index += 1
        self._open = block["type"]
        yield self._event("content_block_start", index=self._index, content_block=block)

    def chunk(self, chunk: dict[str, Any]) -> Iterator[bytes]:
        """The events for one chat chunk (only its first choice is read)."""
        first = first_choice(chunk)
        if first is None:
            return
        choice, delta, text = first
        if text:
            if self._open != "text":
                yield from self._begin({"type": "text", "text": ""})
            yield self._event(
                "content_block_delta", index=self._index, delta={"type": "text_delta", "text": text}
            )
        for tool_call in delta.get("tool_calls") or []:
            n = tool_call.get("index", 0)
            function = tool_call.get("function") or {}
            if n not in self._calls:
                block = {
                    "type": "tool_use",
                    "id": tool_call.get("id"),
                    "name": function.get("name"),
                    "input": {},
                }
                yield from self._begin(block)
                self._calls[n] = self._index
            if function.get("arguments"):
                yield self._event(
                    "content_block_delta",
                    index=self._calls[n],
                    delta={"type": "input_json_delta", "partial_json": function["arguments"]},
                )
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]

    def end(self, call: CallUsage) -> Iterator[bytes]:
        """Close the open block, then ``message_delta`` (stop reason, usage) and ``message_stop``."""
        yield from self._close()
        stop = _STOP_REASONS.get(self.finish or "stop", "end_turn")
        yield self._event(
            "message_delta",
            delta={"stop_reason": stop, "stop_sequence": None},
            usage=usage_json(call),
        )
        yield self._event("message_stop")
