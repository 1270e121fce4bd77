"""The bridge's request policy as pure functions (docs/spec/bridge.md §2–§5).

Nothing here does I/O: the HTTP layer calls these in order (auth, rollout id, body, policy)
and turns the outcome into a status code.
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass
from typing import Any

from bridge._blocked import BILLING_NAMES, BLOCKED_NAMES, RESERVED_PREFIXES
from bridge.errors import BridgeRequestError

#: Keys the bridge owns: removed from what is forwarded, never reported as blocked.
ENVELOPE_FIELDS: frozenset[str] = frozenset({"model", "messages", "stream", "stream_options", "n"})

BLOCKED_MESSAGE = "Request fields cannot override eval bridge configuration: "
N_MESSAGE = "The eval bridge supports only n=1"
EXTRA_BODY_TYPE_MESSAGE = "extra_body must be a JSON object"
NESTED_EXTRA_BODY_MESSAGE = "extra_body cannot contain another extra_body"

#: Largest request body the bridge accepts (413 above it). Chat requests carrying several
#: base64 images run to tens of MiB; this leaves room for that while bounding memory.
MAX_BODY_BYTES = 64 * 1024 * 1024


class InvalidBody(ValueError):
    """The request body is not a JSON object."""


@dataclass(frozen=True)
class PreparedRequest:
    """A request that passed the policy: what may be sent to the provider."""

    messages: list[Any]
    params: dict[str, Any]


def check_auth(authorization: str | None, token: str) -> bool:
    """True when ``authorization`` is ``Bearer <token>`` (scheme case-insensitive).

    The header is split at its first space, so ``Bearer  <token>`` (two spaces) fails. The
    token comparison is constant-time.
    """
    if not authorization:
        return False
    scheme, sep, credentials = authorization.partition(" ")
    if not sep or scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(credentials.encode("utf-8"), token.encode("utf-8"))


def valid_rollout_id(rollout_id: str) -> bool:
    """A rollout id is one plain path segment, by the protocol's rule (posix and Windows),
    and was valid UTF-8 once percent-decoded.

    See :func:`rollout_server.protocol.is_single_path_segment`.
    """
    # Imported here: the protocol module brings msgspec and importlib.metadata (~0.1 s), which
    # ``import bridge`` (and so the CLI's start-up) should not pay; a request pays a dict lookup.
    from rollout_server.protocol import is_single_path_segment

    # U+FFFD is what percent-decoding leaves of bytes that are not UTF-8 (`%ff`, `%c3`…):
    # refused, so that different raw ids are never counted under one.
    return "\ufffd" not in rollout_id and is_single_path_segment(rollout_id)


def parse_body(raw: bytes) -> dict[str, Any]:
    """Parse a request body as a JSON object, whatever the Content-Type (as ``json.loads``
    reads it, less what no provider can be sent: :func:`bridge.codec.loads_request`)."""
    # Imported here, like the protocol module above: msgspec stays out of ``import bridge``.
    from bridge.codec import NotSendable, loads_request

    try:
        body = loads_request(raw)
    except NotSendable as exc:
        raise InvalidBody(f"invalid body: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise InvalidBody("invalid body") from exc
    if not isinstance(body, dict):
        raise InvalidBody("invalid body")
    return body


def is_stream(body: dict[str, Any]) -> bool:
    """The top-level ``stream`` by truthiness, as the reference reads it (``"false"`` streams)."""
    return bool(body.get("stream"))


def response_model(body: dict[str, Any], configured: str) -> str:
    """The ``model`` echoed back: the request's if it has a truthy one, else the configured one."""
    model = body.get("model")
    return str(model) if model else configured


def is_blocked(name: str) -> bool:
    """True when a top-level request key may not be forwarded."""
    return name in BLOCKED_NAMES or name in BILLING_NAMES or name.startswith(RESERVED_PREFIXES)


def blocked_fields(params: dict[str, Any]) -> list[str]:
    """The blocked top-level keys of ``params``, sorted by code point."""
    return sorted(key for key in params if is_blocked(key))


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Overlay ``overlay`` onto ``base`` recursively where both hold objects; overlay wins."""
    merged = dict(base)
    for key, value in overlay.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = _merge(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _n_ok(n: Any) -> bool:
    # Equality, not identity, as in the reference: 1.0 and true pass, "1" and 2 do not.
    return n is None or (isinstance(n, int | float) and n == 1)


def prepare(body: dict[str, Any]) -> PreparedRequest:
    """Apply the request policy (docs/spec/bridge.md §5.5 order) and return what may be forwarded.

    Raises :class:`BridgeRequestError` (a 400) naming the problem.
    """
    extra = body.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        raise BridgeRequestError(EXTRA_BODY_TYPE_MESSAGE)
    merged = {k: v for k, v in body.items() if k != "extra_body"}
    if extra:
        merged = _merge(merged, extra)
    if not _n_ok(merged.get("n")):
        raise BridgeRequestError(N_MESSAGE)
    params = {k: v for k, v in merged.items() if k not in ENVELOPE_FIELDS}
    blocked = blocked_fields(params)
    if blocked:
        raise BridgeRequestError(BLOCKED_MESSAGE + ", ".join(blocked))
    if "extra_body" in params:
        raise BridgeRequestError(NESTED_EXTRA_BODY_MESSAGE)
    messages = body.get("messages")
    return PreparedRequest(messages=messages if messages is not None else [], params=params)
