"""Exceptions the bridge raises or maps to HTTP answers (docs/spec/bridge.md §12)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Messages sent back to a rollout are cut to this many characters (docs/spec/bridge.md §12).
MAX_ERROR_MESSAGE = 1000


class BridgeError(Exception):
    """A failure that already knows the HTTP status the rollout should see."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BridgeRequestError(BridgeError):
    """The request breaks the bridge's request policy (always a 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


# LiteLLM exception class names by upstream status, so that preflight (which matches on the
# class name, docs/spec/bridge.md §13) treats a direct-path failure exactly like a LiteLLM one.
_KIND_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "Timeout",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "APIConnectionError",
    503: "ServiceUnavailableError",
}


def answer_kind(status: int) -> str:
    """The kind of a provider's own error answer with HTTP ``status`` (LiteLLM's name for it).
    A 502 the provider answered is a ``BadGatewayError``: ``APIConnectionError`` (the bare
    502 default) means no answer came at all, which the preflight treats as fatal."""
    if status == 502:
        return "BadGatewayError"
    return _KIND_BY_STATUS.get(status, "APIError")


class UpstreamError(BridgeError):
    """The provider answered with an error, or could not be reached.

    ``status`` is the provider's own status (or 408 for a timeout, 502 for a connection
    failure); :func:`final_status` turns it into what the rollout sees. ``kind`` is the name
    LiteLLM would give the same failure. ``request_id`` is the provider's id of the request
    it answered (:func:`provider_request_id`): what its support asks for when no answer came.
    """

    def __init__(
        self, status: int, message: str, *, kind: str | None = None, request_id: str | None = None
    ) -> None:
        super().__init__(status, message)
        self.kind = kind or _KIND_BY_STATUS.get(status, "APIError")
        self.request_id = request_id


#: Where providers name the request they answered: OpenAI and most compatible servers,
#: Anthropic, AWS, Azure's API gateway (each checked in this order).
_REQUEST_ID_HEADERS = ("x-request-id", "request-id", "x-amzn-requestid", "apim-request-id")
_MAX_REQUEST_ID = 200


def provider_request_id(headers: Mapping[str, str]) -> str | None:
    """The provider's request id among an answer's ``headers`` (lower-case names, or a
    case-insensitive mapping), when it sent a printable one; cut to 200 characters."""
    for name in _REQUEST_ID_HEADERS:
        value = headers.get(name)
        if isinstance(value, str):
            value = value.strip()[:_MAX_REQUEST_ID]
            if value and value.isascii() and value.isprintable():
                return value
    return None


def with_request_id(error: UpstreamError, headers: Mapping[str, str]) -> UpstreamError:
    """``error`` (raised after the answer's ``headers`` came) naming the provider's request
    id when it does not yet."""
    if error.request_id is None:
        error.request_id = provider_request_id(headers)
    return error


class BridgeBindError(OSError):
    """The bridge's listening socket could not be bound."""


class BridgeProcessError(RuntimeError):
    """The bridge's own process (bridge.process) could not start, or died; one-line message."""


class PreflightError(RuntimeError):
    """The model preflight failed in a way that must abort the run (docs/spec/supervisor.md §2.8)."""


def final_status(status: int | None) -> int:
    """A 4xx status is kept; everything else (5xx, unknown) becomes 502."""
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 499:
        return status
    return 502


def error_body(status: int, message: str, upstream_status: int | None = None) -> dict[str, Any]:
    """The JSON error object the rollout receives, for plain JSON and SSE error events.

    ``upstream_status`` is the provider's own status when the rollout is told another (a 5xx
    becomes 502), so the failure reason a run keeps can name what the provider answered."""
    kind = "invalid_request_error" if status == 400 else "bridge_error"
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    if upstream_status is not None and upstream_status != status:
        error["upstream_status"] = upstream_status
    return {"error": error, "detail": message}
