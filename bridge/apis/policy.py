"""The request policy of the Responses and Messages routes, stated as data (docs/bridge.md).

Each API has an :class:`ApiPolicy`: the fields the bridge owns (it sets them itself), the
fields it refuses (stateful, billing or egress fields, with the reason the 400 gives), its core
prompt fields (exempt from the shared blocked list, which is chat-shaped: there ``input`` and
``system`` would replace the prompt, here they *are* the prompt), the tool types that run in the
client, and the client headers forwarded upstream. Any tool type that is not client-run is
provider-run (web search, code execution, remote MCP…) and refused unless the eval config grants
it, so a hosted tool invented tomorrow is refused by default.

Everything here is pure: :func:`check` raises :class:`~bridge.errors.BridgeRequestError` (a 400
that names the field) or returns nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.apis import Api
from bridge.errors import BridgeRequestError
from bridge.policy import is_blocked

_STATELESS = "the bridge is stateless (nothing is stored at the provider)"
_BILLING = "it changes what the provider bills; the eval config owns it"


@dataclass(frozen=True)
class ApiPolicy:
    """What one API's route does with each top-level request field and tool."""

    api: Api
    owned: frozenset[str]
    """Set by the bridge: the request's values are read, never forwarded as given."""
    core: frozenset[str]
    """The API's prompt fields: never refused by the shared blocked list."""
    refused: Mapping[str, str]
    """Field -> why it is refused (any value but ``None``)."""
    client_tools: tuple[str, ...]
    """Tool types (exact, or prefixes ending in ``_``) that run in the client."""
    forward_headers: tuple[str, ...] = ()
    """Client request headers copied upstream on the native path (lower-case); nothing else is."""


RESPONSES = ApiPolicy(
    api="responses",
    owned=frozenset({"model", "stream", "stream_options", "store", "input", "instructions"}),
    core=frozenset({"input", "instructions"}),
    refused={
        "previous_response_id": _STATELESS,
        "conversation": _STATELESS,
        "background": _STATELESS + "; background responses are never served",
        "prompt": "stored prompt templates live at the provider and can set the model",
        "service_tier": _BILLING,
    },
    client_tools=(
        "function",
        "custom",
        "namespace",
        "local_shell",
        "shell",
        "apply_patch",
        "computer",
        "computer_",
    ),
)

MESSAGES = ApiPolicy(
    api="messages",
    owned=frozenset({"model", "stream", "system", "messages"}),
    core=frozenset({"system", "messages"}),
    refused={
        "container": "containers run code at the provider",
        "mcp_servers": "remote MCP servers are reached by the provider, outside the sandbox",
        "service_tier": _BILLING,
        "inference_geo": _BILLING,
    },
    client_tools=("custom", "bash_", "text_editor_", "memory_", "tool_search_"),
    forward_headers=("anthropic-version", "anthropic-beta"),
)

POLICIES: Mapping[Api, ApiPolicy] = {"responses": RESPONSES, "messages": MESSAGES}


def tool_type(api: Api, tool: Any) -> str:
    """The type of one entry of ``tools`` (Messages custom tools may omit it)."""
    if not isinstance(tool, dict):
        raise BridgeRequestError("tools: every tool must be a JSON object")
    kind = tool.get("type")
    if kind is None and api == "messages":
        return "custom"
    if not isinstance(kind, str) or not kind:
        raise BridgeRequestError("tools: every tool needs a 'type'")
    return kind


def is_client_tool(policy: ApiPolicy, kind: str) -> bool:
    """True when tools of type ``kind`` run in the client (never at the provider)."""
    return any(kind.startswith(t) if t.endswith("_") else kind == t for t in policy.client_tools)


def without_defaults(policy: ApiPolicy, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the refused or blocked fields it sets to their default (``null``, or
    ``background: false``): such a field asks for nothing the policy refuses, so it neither
    refuses the request nor reaches the provider (SDKs and agents write them out)."""
    shared = policy.owned | policy.core
    inert = [
        name
        for name, value in body.items()
        if (value is None or (name == "background" and value is False))
        and (name in policy.refused or (name not in shared and is_blocked(name)))
    ]
    if not inert:
        return body
    return {name: value for name, value in body.items() if name not in inert}


def check(policy: ApiPolicy, body: dict[str, Any], hosted_tools: Collection[str] = ()) -> None:
    """Refuse a request that breaks ``policy``: a 400 naming the first field or tool at fault.

    ``hosted_tools`` are the provider-run tool types the eval config grants (``[bridge]
    hosted_tools``; a granted type also covers its dated versions, ``web_search`` covers
    ``web_search_20250305``).
    """
    for name in sorted(body):
        if body[name] is None:
            continue
        reason = policy.refused.get(name)
        if reason is not None:
            raise BridgeRequestError(f"Request field '{name}' is not accepted: {reason}")
    if policy.api == "responses" and body.get("store") not in (None, False):
        raise BridgeRequestError(f"Request field 'store' must be false: {_STATELESS}")
    blocked = sorted(
        name for name in body if name not in policy.owned | policy.core and is_blocked(name)
    )
    if blocked:
        raise BridgeRequestError(
            "Request fields cannot override eval bridge configuration: " + ", ".join(blocked)
        )
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise BridgeRequestError("tools must be a list")
    for tool in tools:
        kind = tool_type(policy.api, tool)
        if is_client_tool(policy, kind) or _granted(kind, hosted_tools):
            continue
        raise BridgeRequestError(
            f"Tool type '{kind}' runs at the provider, outside the sandbox; "
            "grant it in the eval config ([bridge] hosted_tools) to allow it"
        )


def _granted(kind: str, hosted_tools: Collection[str]) -> bool:
    return any(kind == g or kind.startswith(g + "_") for g in hosted_tools)


def forwarded_headers(policy: ApiPolicy, headers: Mapping[str, str]) -> dict[str, str]:
    """The client headers the native path copies upstream: the allowlist, nothing else."""
    return {name: headers[name] for name in policy.forward_headers if headers.get(name)}
