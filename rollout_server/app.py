"""The HTTP shell: a small raw ASGI app over :class:`~rollout_server.service.RolloutService`.

It deliberately uses no web framework. Four routes do not need one, and going without avoids
quart-trio's keep-alive POST hang (hazards.md #1: the whole body is always read here before a
handler runs), Quart's response/body timeouts that would cut long-polls (#5) and handler
cancellation on disconnect (#7). It is also several times cheaper per request.

Limits: request bodies are capped at :data:`DEFAULT_MAX_BODY_BYTES` (64 MiB, configurable);
larger bodies get ``413``. Client mistakes always get a 4xx JSON body; the server keeps serving.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
import trio

from .jsonsafe import json_safe
from .protocol import (
    INSTANCE_ID_HEADER,
    LEASE_HEADER,
    SDK_VERSION_HEADER,
    RequestValidationError,
    parse_cancel_request,
    parse_rollout_init_request,
)
from .service import AdmissionRefused, LeaseMismatch, RolloutService, UnknownRollout

__all__ = ["DEFAULT_MAX_BODY_BYTES", "RolloutApp"]

logger = logging.getLogger("rollout_server")

DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_LEASE_HEADER_BYTES: Final = LEASE_HEADER.lower().encode("latin-1")
_JSON_HEADERS: Final = [(b"content-type", b"application/json")]


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


def _json_error(kind: str, msg: str, error: str) -> RequestValidationError:
    return RequestValidationError(
        [{"type": kind, "loc": ["body"], "msg": msg, "input": None, "ctx": {"error": error}}]
    )


class RolloutApp:
    """ASGI application serving the rollout protocol for ``service``.

    ``api_key`` (non-blank) turns on bearer authentication for every path, ``/health``
    included. ``max_body_bytes`` caps request bodies (413 above it). With ``manage_service``
    the ASGI lifespan starts the service and shuts it down gracefully.
    """

    def __init__(
        self,
        service: RolloutService,
        *,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        manage_service: bool = False,
    ) -> None:
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key must be a non-blank string (or None for no authentication)")
        self.service = service
        self._expected_auth = ("Bearer " + api_key).encode() if api_key is not None else None
        self.max_body_bytes = max_body_bytes
        self.manage_service = manage_service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except _ClientGone:
            return
        except Exception:
            logger.exception("unhandled error serving %s %s", scope["method"], scope["path"])
            await _respond(send, 500, {"detail": "Internal Server Error"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        if self.manage_service:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.service.run)
                await self._lifespan_messages(receive, send, self.service.shutdown)
            return
        await self._lifespan_messages(receive, send, None)

    async def _lifespan_messages(
        self, receive: Receive, send: Send, on_shutdown: Callable[[], Awaitable[None]] | None
    ) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if on_shutdown is not None:
                    await on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        if self._expected_auth is not None:
            supplied = next((v for k, v in headers if k == b"authorization"), b"")
            if not hmac.compare_digest(supplied, self._expected_auth):
                await _respond(send, 401, {"detail": "unauthorized"})
                return
        method: str = scope["method"]
        path: str = scope["path"]
        if path == "/health":
            if method != "GET":
                await _not_allowed(send, "GET")
                return
            extra = [
                (
                    INSTANCE_ID_HEADER.encode(),
                    self.service.instance_id.encode("latin-1", "replace"),
                ),
                (
                    SDK_VERSION_HEADER.encode(),
                    self.service.sdk_version.encode("latin-1", "replace"),
                ),
            ]
            payload = self.service.health()
            try:
                body = _encode(payload)
            except (TypeError, ValueError, OverflowError):
                # A backend's health() put something unencodable in: drop it, still answer.
                body = _encode(json_safe(payload))
            await _send_raw(send, 200, body, extra)
            return
        if path == "/rollout":
            if method != "POST":
                await _not_allowed(send, "POST")
                return
            await self._admit(scope, receive, send)
            return
        if path == "/rollout/cancel":
            if method != "POST":
                await _not_allowed(send, "POST")
                return
            await self._cancel(scope, receive, send)
            return
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "rollout" and parts[3] == "result" and parts[2]:
            if method != "GET":
                await _not_allowed(send, "GET")
                return
            await self._result(parts[2], headers, send)
            return
        await _respond(send, 404, {"detail": "Not Found"})

    async def _read_json(self, scope: Scope, receive: Receive) -> Any:
        """The decoded JSON body (``None`` when empty). Reads the whole body first."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        content_length = next((v for k, v in headers if k == b"content-length"), None)
        if (
            content_length is not None
            and content_length.isdigit()
            and int(content_length) > self.max_body_bytes
        ):
            raise _BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = next((v for k, v in headers if k == b"content-type"), None)
        if content_type is not None:
            media = content_type.split(b";", 1)[0].strip().lower()
            if media != b"application/json" and not media.endswith(b"+json"):
                raise RequestValidationError(
                    [
                        {
                            "type": "model_attributes_type",
                            "loc": ["body"],
                            "msg": "Input should be a valid dictionary or object to extract "
                            "fields from (send Content-Type: application/json)",
                            "input": None,
                        }
                    ]
                )
        if not body.strip():
            return None
        try:
            return _decode(body)
        except msgspec.DecodeError as exc:
            # Also NaN / Infinity literals and out-of-range numbers: not JSON, so refused.
            raise _json_error("json_invalid", "JSON decode error", str(exc)) from None

    async def _body_or_error(self, scope: Scope, receive: Receive, send: Send) -> tuple[bool, Any]:
        try:
            return True, await self._read_json(scope, receive)
        except _BodyTooLarge:
            await _respond(
                send,
                413,
                {"detail": f"request body is larger than {self.max_body_bytes} bytes"},
                close=True,
            )
        except RequestValidationError as exc:
            await _respond(send, 422, exc.body())
        return False, None

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        ok, body = await self._body_or_error(scope, receive, send)
        if not ok:
            return
        try:
            request = parse_rollout_init_request(body)
            accepted = self.service.admit(request)
        except RequestValidationError as exc:
            await _respond(send, 422, exc.body())
            return
        except AdmissionRefused as exc:
            extra = [(k.encode(), v.encode()) for k, v in exc.headers.items()]
            await _respond(send, exc.status, {"detail": exc.detail}, extra)
            return
        await _respond(send, 202, accepted)

    async def _cancel(self, scope: Scope, receive: Receive, send: Send) -> None:
        ok, body = await self._body_or_error(scope, receive, send)
        if not ok:
            return
        try:
            request = parse_cancel_request(body)
        except RequestValidationError as exc:
            await _respond(send, 422, exc.body())
            return
        await _respond(send, 200, {"dispositions": self.service.cancel(request)})

    async def _result(
        self, rollout_id: str, headers: list[tuple[bytes, bytes]], send: Send
    ) -> None:
        token = next((v for k, v in headers if k == _LEASE_HEADER_BYTES), None)
        if token is None or not token:
            kind, msg = (
                ("missing", "Field required")
                if token is None
                else ("string_too_short", "String should have at least 1 character")
            )
            error: dict[str, Any] = {
                "type": kind,
                "loc": ["header", LEASE_HEADER],
                "msg": msg,
                "input": None if token is None else "",
            }
            if token is not None:
                error["ctx"] = {"min_length": 1}
            await _respond(send, 422, {"detail": [error]})
            return
        try:
            body = await self.service.poll(rollout_id, token.decode("latin-1"))
        except UnknownRollout:
            await _respond(send, 404, {"detail": "unknown rollout_id"})
            return
        except LeaseMismatch:
            await _respond(send, 403, {"detail": "invalid polling lease"})
            return
        await _send_raw(send, 200, body)


async def _not_allowed(send: Send, allow: str) -> None:
    await _respond(send, 405, {"detail": "Method Not Allowed"}, [(b"allow", allow.encode())])


async def _respond(
    send: Send,
    status: int,
    payload: Any,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
    *,
    close: bool = False,
) -> None:
    await _send_raw(send, status, _encode(payload), extra_headers, close=close)


async def _send_raw(
    send: Send,
    status: int,
    body: bytes,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
    *,
    close: bool = False,
) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra_headers:
        headers.extend(extra_headers)
    if close:
        # The unread rest of an oversized body would otherwise be parsed as the next request.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
