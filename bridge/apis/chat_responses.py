"""Chat Completions carried over OpenAI's Responses API, for models served only there.

Some OpenAI models (``o1-pro``, ``gpt-5-pro``, the ``…-codex`` family…) answer only
``/responses``; a chat caller of such a model is served through it, as the reference does
(:mod:`bridge.upstreams.responses_only`). :func:`to_responses` turns a chat request into a
Responses request (stateless: ``store: false``); :func:`to_completion` turns a Response into a
chat completion; :class:`ChunkStream` turns Responses stream events into chat chunks. A chat
parameter the Responses API has no place for is refused with a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bridge.codec import dumps
from bridge.errors import BridgeRequestError
from bridge.policy import PreparedRequest

# Chat parameters with the same name and meaning in the Responses API.
_SAME = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "metadata",
    "top_logprobs",
    "truncation",
    "include",
    "reasoning",
    "text",
    "max_tool_calls",
)
# Chat parameters the Responses API does not take.
_UNCARRIED = (
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "n",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "functions",
    "function_call",
)


def _refuse(name: str) -> BridgeRequestError:
    return BridgeRequestError(f"'{name}' cannot be carried to this model's Responses API")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _content(role: str, content: Any) -> Any:
    if isinstance(content, str) or content is None:
        return content or ""
    kind = "output_text" if role == "assistant" else "input_text"
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append({"type": kind, "text": str(part.get("text", ""))})
        elif part.get("type") == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, dict) else image
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        else:
            raise _refuse(f"content part of type {part.get('type')}")
    return parts


def _input(messages: list[Any]) -> tuple[str | None, list[dict[str, Any]]]:
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("system", "developer") and not items:
            instructions.append(_text(message.get("content")))
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id"),
                          "output": _text(message.get("content"))})  # fmt: skip
        else:
            content = message.get("content")
            if content or role != "assistant":
                items.append({"role": role, "content": _content(str(role), content)})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                items.append({"type": "function_call", "call_id": call.get("id"),
                              "name": function.get("name"),
                              "arguments": function.get("arguments") or ""})  # fmt: skip
    return ("\n\n".join(instructions) or None), items


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise _refuse(f"tools of type {tool.get('type') if isinstance(tool, dict) else tool}")
        out.append({"type": "function", **function})
    return out


def to_responses(prepared: PreparedRequest, model: str, *, stream: bool) -> dict[str, Any]:
    """The Responses request that carries a chat request (its policy already applied)."""
    params = dict(prepared.params)
    for name in _UNCARRIED:
        if params.get(name) is not None and not (name == "n" and params[name] == 1):
            raise _refuse(name)
    instructions, items = _input(prepared.messages)
    body: dict[str, Any] = {"model": model, "input": items, "store": False, "stream": stream}
    if instructions:
        body["instructions"] = instructions
    for name in _SAME:
        if params.get(name) is not None:
            body[name] = params[name]
    if params.get("tools"):
        body["tools"] = _tools(params["tools"])
    choice = params.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        body["tool_choice"] = {"type": "function", "name": choice["function"].get("name")}
    elif choice is not None:
        body["tool_choice"] = choice
    limit = params.get("max_completion_tokens", params.get("max_tokens"))
    if limit is not None:
        body["max_output_tokens"] = limit
    if params.get("reasoning_effort") is not None:
        body["reasoning"] = {**body.get("reasoning", {}), "effort": params["reasoning_effort"]}
    fmt = params.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        body["text"] = {"format": {"type": "json_object"}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        body["text"] = {"format": {"type": "json_schema", **(fmt.get("json_schema") or {})}}
    if params.get("verbosity") is not None:
        body["text"] = {**body.get("text", {}), "verbosity": params["verbosity"]}
    if params.get("logprobs"):
        body["include"] = [*body.get("include", []), "message.output_text.logprobs"]
    handled = {*_SAME, "tools", "tool_choice", "max_completion_tokens", "max_tokens",
               "reasoning_effort", "response_format", "verbosity", "logprobs", "n"}  # fmt: skip
    for name, value in params.items():
        if name not in handled:
            body[name] = value  # a custom parameter, forwarded as on the chat route
    return body


def _finish(response: dict[str, Any], calls: bool) -> str:
    details = response.get("incomplete_details") or {}
    if response.get("status") == "incomplete":
        return "content_filter" if details.get("reason") == "content_filter" else "length"
    return "tool_calls" if calls else "stop"


def to_completion(response: dict[str, Any]) -> dict[str, Any]:
    """The chat completion for a Response (its usage left in the Responses shape, which
    :meth:`~bridge.usage.CallUsage.from_json` reads)."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            text.append(_text(item.get("content")))
        elif item.get("type") == "function_call":
            calls.append({"id": item.get("call_id"), "type": "function",
                          "function": {"name": item.get("name"),
                                       "arguments": item.get("arguments") or ""}})  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": response.get("id"),
        "object": "chat.completion",
        "created": response.get("created_at"),
        "model": response.get("model"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": _finish(response, bool(calls))}
        ],
        "usage": response.get("usage"),
    }


class ChunkStream:
    """Responses stream events in, chat chunks out."""

    def __init__(self) -> None:
        self.id: str | None = None
        self._calls: dict[str, int] = {}  # function_call item id -> tool call index

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip

    def event(self, data: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks for one event (a terminal event gives the finish and the usage)."""
        kind = data.get("type")
        if kind == "response.created":
            response = data.get("response") or {}
            self.id = response.get("id")
        elif kind == "response.output_text.delta":
            yield self._chunk({"role": "assistant", "content": str(data.get("delta", ""))})
        elif kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "function_call":
                index = self._calls[str(item.get("id"))] = len(self._calls)
                start = {"index": index, "id": item.get("call_id"), "type": "function",
                         "function": {"name": item.get("name"), "arguments": ""}}  # fmt: skip
                yield self._chunk({"role": "assistant", "tool_calls": [start]})
        elif kind == "response.function_call_arguments.delta":
            index = self._calls.get(str(data.get("item_id")), 0)
            part = {"index": index, "function": {"arguments": str(data.get("delta", ""))}}
            yield self._chunk({"tool_calls": [part]})
        elif kind in ("response.completed", "response.incomplete"):
            response = data.get("response") or {}
            yield self._chunk({}, _finish(response, bool(self._calls)))
            yield {"id": self.id, "object": "chat.completion.chunk", "choices": [],
                   "usage": response.get("usage")}  # fmt: skip
        elif kind in ("response.failed", "error"):
            from bridge.errors import UpstreamError

            raise UpstreamError(502, dumps(data).decode())
