"""The rollout client's errors (the hierarchy :mod:`rollout_server.client` documents and
re-exports) and the encoding of an admission body, which raises the first of them.

Apart from :mod:`rollout_server.client` so that module keeps its retry rules in one piece
under the size limit; import these names from :mod:`rollout_server.client`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .protocol import RolloutInitRequest

__all__ = [
    "AdmissionRejected",
    "CapacityExhausted",
    "InvalidRolloutRequest",
    "RolloutAdmissionTimeout",
    "RolloutClientError",
    "RolloutIdConflict",
    "RolloutProtocolError",
    "RolloutServerUnreachable",
    "ServerShuttingDown",
    "UnsendableRequest",
    "encode_request",
]

_encode = msgspec.json.Encoder().encode


class RolloutClientError(Exception):
    """Base of every error this client raises."""


class RolloutServerUnreachable(RolloutClientError):
    """Transport failure (after retries where the protocol allows them)."""


class RolloutProtocolError(RolloutClientError):
    """The server's answer is not one the protocol accepts here."""

    def __init__(self, message: str, *, status_code: int | None = None, detail: Any = None):
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class AdmissionRejected(RolloutProtocolError):
    """``POST /rollout`` answered neither 202 nor 429."""


class RolloutIdConflict(AdmissionRejected):
    """409: the id is in flight or still retained on the server."""


class InvalidRolloutRequest(AdmissionRejected):
    """422: the server rejected the request body."""


class ServerShuttingDown(AdmissionRejected):
    """503: the server no longer admits rollouts."""


class CapacityExhausted(RolloutProtocolError):
    """429: the server's queue is full; ``retry_after`` is the clamped delay in seconds."""

    def __init__(self, message: str, *, retry_after: float, detail: Any = None):
        super().__init__(message, status_code=429, detail=detail)
        self.retry_after = retry_after


class UnsendableRequest(RolloutClientError, ValueError):
    """The request cannot be written as JSON (text that is not valid Unicode, such as a lone
    surrogate from a ``\\udXXX`` escape in a dataset row); nothing was sent. It is about this
    request only: other requests are unaffected."""


def _unencodable_at(value: Any, path: str = "") -> str | None:
    """The path (``initial_messages[0].content``) of the first string in ``value`` that is not
    valid Unicode, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "the request"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _unencodable_at(key, f"{path} (a key)") if isinstance(key, str) else None
            found = found or _unencodable_at(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _unencodable_at(item, f"{path}[{index}]")
            if found:
                return found
    return None


def encode_request(request: RolloutInitRequest) -> bytes:
    """The JSON body of ``request``; :class:`UnsendableRequest` names the text that cannot be
    encoded."""
    try:
        return _encode(request)
    except UnicodeEncodeError as exc:
        where = _unencodable_at(msgspec.to_builtins(request)) or "the request"
        bad = exc.object[exc.start : exc.end] if isinstance(exc.object, str) else ""
        raise UnsendableRequest(
            f"{where} holds text that is not valid Unicode ({bad!r}: {exc.reason}); "
            "fix the dataset row"
        ) from None


class RolloutAdmissionTimeout(RolloutClientError, TimeoutError):
    """Admission did not succeed in time. ``maybe_admitted`` is true when a POST was in
    flight when time ran out (the rollout may exist; its lease will expire unpolled)."""

    def __init__(self, message: str, *, maybe_admitted: bool):
        super().__init__(message)
        self.maybe_admitted = maybe_admitted
