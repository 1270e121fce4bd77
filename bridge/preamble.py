"""What every route of the bridge checks before it reads a call: the same order, the same
statuses, the error body in the route's own shape (chat's ``detail``, or the Responses and
Messages APIs' error objects).

Auth first (before the rollout id and the body, so an unauthorized caller learns nothing of
either), then the rollout id, then the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bridge.policy import InvalidBody, parse_body, valid_rollout_id
from rollout_server.net.asgi import header, send_json

if TYPE_CHECKING:
    from rollout_server.net.asgi import ASGISendCallable, HTTPScope

ErrorBody = Callable[[int, str], bytes]
"""A route's error body for a status and a message."""


def header_text(scope: HTTPScope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case), decoded as latin-1 like quart does."""
    value = header(scope, name)
    return None if value is None else value.decode("latin-1")


async def admitted_body(
    send: ASGISendCallable, *, authorized: bool, rollout_id: str, raw: bytes, error: ErrorBody
) -> dict[str, Any] | None:
    """The call's parsed body, or ``None`` once its refusal is sent: 401 when not
    ``authorized``, 422 for an invalid ``rollout_id``, 400 for a body that is not a JSON
    object; ``error`` makes the refusal's body."""
    if not authorized:
        await send_json(send, 401, error(401, "Unauthorized"))
        return None
    if not valid_rollout_id(rollout_id):
        await send_json(send, 422, error(422, "invalid rollout_id"))
        return None
    try:
        return parse_body(raw)
    except InvalidBody as exc:
        await send_json(send, 400, error(400, str(exc)))
        return None
