"""Errors in the caller's API shape (docs/bridge.md, "Three APIs").

Chat Completions and Responses callers get the OpenAI shape the chat route has always sent
(``{"error": {...}, "detail": ...}``, :func:`bridge.errors.error_body`); Messages callers get
Anthropic's (``{"type": "error", "error": {"type": ..., "message": ...}}``), whose ``type``
follows the status the way Anthropic's own API names them.
"""

from __future__ import annotations

from typing import Any

from bridge.apis import Api
from bridge.codec import dumps, loads
from bridge.errors import error_body

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


#: Every ``error.type`` of Anthropic's API: a provider's own is kept on Messages only when it
#: is one of these (a translated call's provider speaks OpenAI's, ``server_error``, ...).
_ANTHROPIC_KINDS = frozenset(
    {*_ANTHROPIC_TYPES.values(), "api_error", "billing_error", "timeout_error"}
)


def anthropic_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status."""
    found = _ANTHROPIC_TYPES.get(status)
    if found is not None:
        return found
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def dialect_error(api: Api, status: int, message: str, upstream: int | None = None) -> bytes:
    """The JSON body of an error answer on ``api``'s route.

    A provider's own error (its body, redacted, is the message) is unwrapped: its ``message``
    becomes the message, on Messages its ``type`` is kept when it is one of Anthropic's, and on
    Responses its ``type``, ``code`` and ``param`` are kept, so a client reads the provider's
    words rather than a JSON document inside a string.
    """
    kind = anthropic_type(status)
    inner = _provider_error(message)
    if inner is not None:
        message = str(inner.get("message"))
        if inner.get("type") in _ANTHROPIC_KINDS:  # not an OpenAI-shaped provider's types
            kind = inner["type"]
    if api == "messages":
        return dumps({"type": "error", "error": {"type": kind, "message": message}})
    body = error_body(status, message, upstream)
    if api == "responses" and inner is not None:
        # The provider's own type, code and param, which SDK users test (`insufficient_quota`,
        # `rate_limit_exceeded`); the chat route keeps the reference's shape
        # (docs/spec/bridge.md §12).
        for key in ("type", "code", "param"):
            if inner.get(key) is not None:
                body["error"][key] = inner[key]
    return dumps(body)


def _provider_error(message: str) -> dict[str, Any] | None:
    if not message.startswith("{"):
        return None
    try:
        parsed = loads(message)
    except ValueError:
        return None  # cut to length, or not JSON: kept as the text it is
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return inner
    return None


def sse_error(api: Api, body: bytes, status: int, sequence: int = 0) -> bytes:
    """The SSE event that reports a failure once a stream's 200 has left; ``body`` is the
    failure's :func:`dialect_error` body, so the event says what the plain answer would.

    On Messages that body is Anthropic's ``error`` event as it is. On Responses the event's data
    has the error's code, message and param at the top, as OpenAI's own ``error`` event, and the
    ``error`` object too (openai-python raises ``APIError`` only when it is there).
    """
    if api == "messages":
        return b"event: error\ndata: " + body + b"\n\n"
    parsed = loads(body)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        error = {"message": "bridge error", "type": "bridge_error", "code": status}
    data: dict[str, Any] = {
        "type": "error",
        "code": str(error.get("code", status)),
        "message": str(error.get("message", "bridge error")),
        "param": error.get("param"),
        "sequence_number": sequence,
        "error": error,
    }
    return b"event: error\ndata: " + dumps(data) + b"\n\n"
