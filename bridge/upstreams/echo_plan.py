"""What the offline echo model answers, as pure functions (docs/bridge.md, "The offline model").

Deterministic rules, so an agent loop can be driven without a key:

- **Tool calls.** When tools are offered and a line of the last user message reads
  ``call NAME {json arguments}`` (or ``/call …``) naming an offered tool, the answer is that
  call (several such lines: parallel calls; arguments left out: a minimal instance of the
  tool's schema). A forced ``tool_choice`` (``required`` or a named function) with no such line
  calls the named (or first) tool with a minimal instance of its schema.
- **Tool results.** When the last message is a tool result, the answer quotes it:
  ``tool result: <text>``.
- **JSON.** ``response_format`` ``json_object`` gives ``{"echo": <text>}``; ``json_schema``
  gives a minimal valid instance of the schema (required properties, first enum value, strings
  carrying the text).
- **Logprobs.** With ``logprobs``, one entry per word piece with fixed values and
  ``top_logprobs`` alternatives.
- Otherwise the text of the last user message, as always.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

_DIRECTIVE = re.compile(r"^\s*/?call\s+([A-Za-z0-9_.:-]+)\s*(\{.*\})?\s*$")
_PIECE = re.compile(r"\S+\s*|\s+")


def text_of(content: Any) -> str:
    """The text of a message's content (a string, or the text parts of a list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return ""


@dataclass(frozen=True)
class Plan:
    """One echo answer: text and/or tool calls (``(id, name, arguments JSON)``)."""

    text: str
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        """``tool_calls`` when the answer calls tools, else ``stop``."""
        return "tool_calls" if self.calls else "stop"


def _tools(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Offered function tools by name -> their JSON schema."""
    out: dict[str, dict[str, Any]] = {}
    for tool in params.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            schema = function.get("parameters")
            out[function["name"]] = schema if isinstance(schema, dict) else {}
    return out


def minimal(schema: Any, text: str = "") -> Any:
    """A small value valid for ``schema`` (the JSON Schema subset tools and formats use)."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return minimal(schema[key][0], text)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        return {name: minimal(properties.get(name, {}), text) for name in required}
    if kind == "array":
        count = schema.get("minItems", 0) if isinstance(schema.get("minItems"), int) else 0
        return [minimal(schema.get("items", {}), text) for _ in range(count)]
    if kind == "string":
        return text
    if kind in ("integer", "number"):
        low = schema.get("minimum", 0)
        return low if isinstance(low, int | float) else 0
    if kind == "boolean":
        return False
    return None


def _call_id(messages: list[dict[str, Any]], n: int, name: str) -> str:
    digest = hashlib.sha256(f"{len(messages)}:{n}:{name}".encode()).hexdigest()
    return "call_echo_" + digest[:20]


def _directives(text: str, tools: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for line in text.splitlines():
        match = _DIRECTIVE.match(line)
        if match is None or match.group(1) not in tools:
            continue
        name, raw = match.group(1), match.group(2)
        if raw is None:
            found.append((name, minimal(tools[name])))
            continue
        try:
            found.append((name, json.loads(raw)))
        except ValueError:
            continue
    return found


def _forced(params: dict[str, Any], tools: dict[str, dict[str, Any]]) -> str | None:
    choice = params.get("tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return name if name in tools else None
    if choice == "required" and tools:
        return next(iter(tools))
    return None


def _format(params: dict[str, Any], text: str) -> str:
    fmt = params.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return json.dumps({"echo": text}, ensure_ascii=False)
    if kind == "json_schema" and isinstance(fmt, dict):
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return json.dumps(minimal(schema or {"type": "object"}, text), ensure_ascii=False)
    return text


def plan(messages: list[dict[str, Any]], params: dict[str, Any]) -> Plan:
    """The echo model's answer to a chat request."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return Plan(_format(params, "tool result: " + text_of(last.get("content"))))
    text = ""
    for message in reversed(messages):
        if message.get("role") == "user":
            text = text_of(message.get("content"))
            break
    tools = _tools(params)
    if tools and params.get("tool_choice") != "none":
        wanted = _directives(text, tools)
        forced = _forced(params, tools)
        if not wanted and forced is not None:
            wanted = [(forced, minimal(tools[forced]))]
        if wanted:
            calls = [
                (_call_id(messages, n, name), name, json.dumps(args, ensure_ascii=False))
                for n, (name, args) in enumerate(wanted)
            ]
            return Plan("", calls)
    return Plan(_format(params, text))


def pieces(text: str) -> list[str]:
    """The streamed pieces of a text: one word and its trailing space each."""
    return _PIECE.findall(text)


def logprobs(text: str, top: int) -> list[dict[str, Any]]:
    """Chat ``logprobs.content`` entries for ``text``: fixed values, ``top`` alternatives."""
    entries = []
    for piece in pieces(text):
        alternatives = [
            {"token": piece, "logprob": -0.1, "bytes": list(piece.encode())},
            *(
                {"token": f"<alt{i}>", "logprob": -2.0 - i, "bytes": list(f"<alt{i}>".encode())}
                for i in range(1, top)
            ),
        ][:top]
        entries.append(
            {
                "token": piece,
                "logprob": -0.1,
                "bytes": list(piece.encode()),
                "top_logprobs": alternatives,
            }
        )
    return entries
