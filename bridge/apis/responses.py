"""The Responses API translated to and from Chat Completions (docs/bridge.md, "Three APIs").

:func:`to_chat` turns a Responses request (after :mod:`bridge.apis.policy`) into a chat request
body; :func:`to_response` turns a chat completion into a Responses object; :class:`ResponsesStream`
turns chat chunks into the Responses event grammar (:mod:`bridge.apis.responses_stream`). Whatever cannot be carried to a chat upstream is refused with a 400 naming
it; reasoning items a client replays are dropped (a chat upstream has no slot for them, and the
translated path never emits any).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from bridge.apis.policy import RESPONSES, tool_type
from bridge.codec import dumps
from bridge.errors import BridgeRequestError
from bridge.usage import CallUsage

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# `include` values that ask for nothing a translated answer could lack.
_HARMLESS_INCLUDES = frozenset({LOGPROBS_INCLUDE, "reasoning.encrypted_content"})
# Responses parameters with the same name and meaning in Chat Completions.
_SAME = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "metadata",
    "top_logprobs",
    "seed",
)
# Responses-only parameters a chat upstream cannot honour.
_UNCARRIED = ("max_tool_calls", "context_management", "prompt_cache_retention")


def _refuse(what: str) -> BridgeRequestError:
    return BridgeRequestError(f"{what} cannot be carried to this model's chat API")


def _output_text(output: Any) -> str:
    """A tool output's text: a string, or text parts (anything else cannot be carried)."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise _refuse("a function_call_output that is neither text nor a list of parts")
    texts = []
    for part in output:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise _refuse(f"function_call_output content of type '{kind}'")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _content(content: Any) -> str | list[dict[str, Any]]:
    """A message's content: a string, or chat content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BridgeRequestError("input: a message's content must be a string or a list")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal"):
            parts.append({"type": "text", "text": str(part.get("text", part.get("refusal", "")))})
        elif kind == "input_image" and isinstance(part, dict) and part.get("image_url"):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise _refuse(f"input content of type '{kind}'")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if items is None:
        raise BridgeRequestError("input is required (the bridge keeps no stored conversation)")
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return out
    if not isinstance(items, list):
        raise BridgeRequestError("input must be a string or a list of items")
    for item in items:
        if not isinstance(item, dict):
            raise BridgeRequestError("input: every item must be a JSON object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _content(item.get("content", ""))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                # Text then calls, or parallel calls: one assistant turn in chat.
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _output_text(output),
                }
            )
        elif kind == "reasoning":
            continue  # no chat slot; see the module docstring
        else:
            raise _refuse(f"input item of type '{kind}'")
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools or []:
        kind = tool_type("responses", tool)
        if kind != "function":
            raise _refuse(f"tool type '{kind}'")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise _refuse(f"tool_choice of type '{kind}'")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise _refuse(f"text.format of type '{fmt['type']}'")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request that carries a Responses request (its policy already checked)."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body)}
    handled = set(RESPONSES.owned) | {
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "include",
        "truncation",
        "max_output_tokens",
        *_SAME,
    }
    for name in _UNCARRIED:
        if body.get(name) is not None:
            raise _refuse(f"'{name}'")
    for name in _SAME:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None and chat.get("tools"):
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if not chat.get("tools"):
        # Without tools these mean nothing, and chat APIs refuse them (OpenAI: a 400).
        chat.pop("parallel_tool_calls", None)
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    text = body.get("text")
    if isinstance(text, dict) and text.get("verbosity") is not None:
        chat["verbosity"] = text["verbosity"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    include = body.get("include") or []
    unknown = sorted(set(include) - _HARMLESS_INCLUDES) if isinstance(include, list) else []
    if unknown:
        raise _refuse(f"include '{unknown[0]}'")
    if LOGPROBS_INCLUDE in include or body.get("top_logprobs") is not None:
        chat["logprobs"] = True
    if body.get("truncation") not in (None, "disabled"):
        raise _refuse(f"truncation '{body['truncation']}'")
    for name, value in body.items():
        if name not in handled and name not in _UNCARRIED:
            chat[name] = value  # a custom parameter: forwarded like on the chat route
    return chat


# Answers ------------------------------------------------------------------------------


def _ident(prefix: str, *parts: Any) -> str:
    return prefix + hashlib.sha256(dumps(list(parts))).hexdigest()[:24]


def usage_json(call: CallUsage) -> dict[str, Any]:
    """A Responses ``usage`` object from the normalized numbers."""
    return {
        "input_tokens": call.prompt_tokens,
        "input_tokens_details": {"cached_tokens": call.cached_tokens or 0},
        "output_tokens": call.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": call.reasoning_tokens or 0},
        "total_tokens": call.total_tokens,
    }


def _shell(request: dict[str, Any], model: str, rid: str, status: str) -> dict[str, Any]:
    """The fields of a Response object other than ``output`` and ``usage``."""
    text = request.get("text") if isinstance(request.get("text"), dict) else None
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning"),
        "store": False,
        "temperature": request.get("temperature"),
        "text": text or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "metadata": request.get("metadata") or {},
    }


def _finish(shell: dict[str, Any], finish: str | None) -> None:
    if finish == "length":
        shell["status"] = "incomplete"
        shell["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish == "content_filter":
        shell["status"] = "incomplete"
        shell["incomplete_details"] = {"reason": "content_filter"}
    else:
        shell["status"] = "completed"


def _logprobs(entries: Any) -> list[dict[str, Any]]:
    out = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            top = [
                {k: t.get(k) for k in ("token", "logprob", "bytes")}
                for t in entry.get("top_logprobs") or []
                if isinstance(t, dict)
            ]
            out.append(
                {**{k: entry.get(k) for k in ("token", "logprob", "bytes")}, "top_logprobs": top}
            )
    return out


def _message_item(
    item_id: str, text: str, logprobs: list[dict[str, Any]], status: str
) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def _call_item(item_id: str, call: dict[str, Any], status: str) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.get("id"),
        "name": function.get("name"),
        "arguments": function.get("arguments") or "",
        "status": status,
    }


def to_response(
    request: dict[str, Any], completion: dict[str, Any], model: str, call: CallUsage
) -> dict[str, Any]:
    """The Responses object for a chat completion (first choice), ``model`` echoed."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    rid = _ident("resp_", completion.get("id"), message)
    shell = _shell(request, model, rid, "completed")
    text = message.get("content")
    if isinstance(text, str) and text:
        logprobs = _logprobs((choice.get("logprobs") or {}).get("content"))
        shell["output"].append(_message_item(_ident("msg_", rid), text, logprobs, "completed"))
    for n, tool_call in enumerate(message.get("tool_calls") or []):
        shell["output"].append(_call_item(_ident("fc_", rid, n), tool_call, "completed"))
    _finish(shell, choice.get("finish_reason"))
    shell["usage"] = usage_json(call)
    return shell
