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


def anthropic_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status."""
    found = _ANTHROPIC_TYPES.get(status)
    if found is not None:
        return found
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def dialect_error(api: Api, status: int, message: str, upstream: int | None = None) -> bytes:
    """The JSON body of an error answer on ``api``'s route.

    A provider's own error (its body, redacted, is the message) is unwrapped: its ``message``
    becomes the message, and on Messages its ``type`` is kept, so a client reads the
    provider's words rather than a JSON document inside a string.
    """
    kind = anthropic_type(status)
    inner = _provider_error(message)
    if inner is not None:
        message = str(inner.get("message"))
        if isinstance(inner.get("type"), str) and inner["type"]:
            kind = inner["type"]
    if api == "messages":
        return dumps({"type": "error", "error": {"type": kind, "message": message}})
    return dumps(error_body(status, message, upstream))


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


def sse_error(api: Api, payload: dict[str, Any], status: int, sequence: int = 0) -> bytes:
    """The SSE event that reports a failure after a stream has started.

    ``payload`` is the OpenAI-shaped error object of :meth:`bridge.handler.Bridge.error`. On
    Responses the event's data carries an ``error`` object too (openai-python raises
    ``APIError`` only when it does); on Messages it is Anthropic's ``error`` event.
    """
    message = str(payload.get("error", {}).get("message", "bridge error"))
    if api == "messages":
        shaped = {"type": "error", "error": {"type": anthropic_type(status), "message": message}}
        return b"event: error\ndata: " + dumps(shaped) + b"\n\n"
    data: dict[str, Any] = {
        "type": "error",
        "code": str(status),
        "message": message,
        "param": None,
        "sequence_number": sequence,
        "error": payload.get("error"),
    }
    return b"event: error\ndata: " + dumps(data) + b"\n\n"
