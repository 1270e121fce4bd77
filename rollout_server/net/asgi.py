"""Raw ASGI helpers for the two hand-written HTTP layers (the rollout server and the bridge).

Both answer their routes without a web framework, and both need the same three things: the
whole request body read under a size cap before any handler runs, a request header's value,
and a complete JSON answer with its length. The types are hypercorn's, so an app built on
these helpers can be handed to ``hypercorn.trio.serve`` as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIFramework,
        ASGIReceiveCallable,
        ASGIReceiveEvent,
        ASGISendCallable,
        HTTPScope,
        Scope,
    )

__all__ = [
    "ASGIFramework",
    "ASGIReceiveCallable",
    "ASGIReceiveEvent",
    "ASGISendCallable",
    "BodyTooLarge",
    "ClientDisconnected",
    "HTTPScope",
    "Scope",
    "header",
    "read_body",
    "send_json",
]

# The types are imported from hypercorn.typing only when asked for: that module imports h2 (a
# twentieth of a second), and modules that use them in annotations import them for type
# checking only.
_TYPES: Final = frozenset(
    {
        "ASGIFramework",
        "ASGIReceiveCallable",
        "ASGIReceiveEvent",
        "ASGISendCallable",
        "HTTPScope",
        "Scope",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _TYPES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import hypercorn.typing

    value = getattr(hypercorn.typing, name)
    globals()[name] = value
    return value


_JSON_CONTENT_TYPE: Final = (b"content-type", b"application/json")
_CONNECTION_CLOSE: Final = (b"connection", b"close")


class BodyTooLarge(Exception):
    """The request body is larger than ``limit`` bytes, or its ``Content-Length`` says so."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


class ClientDisconnected(Exception):
    """The client went away before the whole request body arrived."""


def header(scope: HTTPScope, name: bytes) -> bytes | None:
    """The first value of request header ``name`` (give it in lower case), or ``None``."""
    for key, value in scope["headers"]:
        # ASGI servers should, but need not, lower-case header names.
        if key.lower() == name:
            return value
    return None


async def read_body(scope: HTTPScope, receive: ASGIReceiveCallable, limit: int) -> bytes:
    """The whole request body, read before anything else looks at the request.

    Raises :class:`BodyTooLarge` as soon as the declared ``Content-Length`` or the bytes
    received exceed ``limit`` (nothing past the cap is buffered), and
    :class:`ClientDisconnected` when the client leaves first.
    """
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            # The only other message an HTTP request receives is http.disconnect.
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_json(
    send: ASGISendCallable,
    status: int,
    body: bytes,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
    *,
    close: bool = False,
) -> None:
    """Send a complete answer whose ``body`` is already-encoded JSON.

    Headers: ``content-type: application/json``, ``content-length``, then ``extra_headers``,
    then ``connection: close`` when ``close`` is set (after refusing a body without reading
    it, the unread rest would otherwise be parsed as the next request).
    """
    headers = [_JSON_CONTENT_TYPE, (b"content-length", b"%d" % len(body)), *extra_headers]
    if close:
        headers.append(_CONNECTION_CLOSE)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
