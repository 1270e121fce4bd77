"""The HTTP shell: a small raw ASGI app over :class:`~rollout_server.service.RolloutService`.

It deliberately uses no web framework. A few routes do not need one, and going without avoids
quart-trio's keep-alive POST hang (docs/hazards.md #1: the whole body is always read here before a
handler runs), Quart's response/body timeouts that would cut long-polls (#5) and handler
cancellation on disconnect (#7). It is also several times cheaper per request.

Limits: request bodies are capped at :data:`DEFAULT_MAX_BODY_BYTES` (64 MiB, configurable);
larger bodies get ``413``. Client mistakes always get a 4xx JSON body; the server keeps serving.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import msgspec
import trio

from .jsonsafe import json_safe
from .net.asgi import BodyTooLarge, ClientDisconnected, header, read_body, send_json
from .probe_route import PROBE_ROUTE, answer_probe
from .protocol import (
    INSTANCE_ID_HEADER,
    LEASE_HEADER,
    SDK_VERSION_HEADER,
    RequestValidationError,
    parse_cancel_request,
    parse_rollout_init_request,
)
from .resultwait import CAPABILITY, WAIT_ROUTE, WAITER_HEADER, ResultWaits, valid_waiter
from .resultwait import MAX_BODY_BYTES as WAIT_MAX_BODY_BYTES
from .service import AdmissionRefused, LeaseMismatch, RolloutService, UnknownRollout

if TYPE_CHECKING:
    from .net.asgi import ASGIReceiveCallable, ASGISendCallable, HTTPScope, Scope

__all__ = ["DEFAULT_MAX_BODY_BYTES", "RolloutApp"]

logger = logging.getLogger("rollout_server")

DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_LEASE_HEADER_BYTES: Final = LEASE_HEADER.lower().encode("latin-1")
_WAITER_HEADER_BYTES: Final = WAITER_HEADER.encode("latin-1")


def _json_error(kind: str, msg: str, error: str) -> RequestValidationError:
    return RequestValidationError(
        [{"type": kind, "loc": ["body"], "msg": msg, "input": None, "ctx": {"error": error}}]
    )


#: What :meth:`_json_or_refusal` returns once it has answered the request itself.
_REFUSED: Any = object()


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
        self.waits = ResultWaits(service)
        self._expected_auth = ("Bearer " + api_key).encode() if api_key is not None else None
        self.max_body_bytes = max_body_bytes
        self.manage_service = manage_service

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except ClientDisconnected:
            return
        except Exception:
            logger.exception("unhandled error serving %s %s", scope["method"], scope["path"])
            await _respond(send, 500, {"detail": "Internal Server Error"})

    async def _lifespan(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if self.manage_service:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.service.run)
                await self._lifespan_messages(receive, send, self.service.shutdown)
            return
        await self._lifespan_messages(receive, send, None)

    async def _lifespan_messages(
        self,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        on_shutdown: Callable[[], Awaitable[None]] | None,
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

    async def _dispatch(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if self._expected_auth is not None:
            supplied = header(scope, b"authorization") or b""
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
            payload["rollbridge_capabilities"] = [CAPABILITY]
            try:
                body = _encode(payload)
            except (TypeError, ValueError, OverflowError):
                # A backend's health() put something unencodable in: drop it, still answer.
                body = _encode(json_safe(payload))
            await send_json(send, 200, body, extra)
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
        if path == PROBE_ROUTE:
            if method != "POST":
                await _not_allowed(send, "POST")
                return
            await self._probe(scope, receive, send)
            return
        if path == WAIT_ROUTE:
            if method != "POST":
                await _not_allowed(send, "POST")
                return
            await self._wait_results(scope, receive, send)
            return
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "rollout" and parts[3] == "result" and parts[2]:
            if method != "GET":
                await _not_allowed(send, "GET")
                return
            await self._result(parts[2], scope, send)
            return
        await _respond(send, 404, {"detail": "Not Found"})

    async def _json_or_refusal(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        limit: int,
        invalid: int,
    ) -> Any:
        """The JSON body of one of our own routes, or :data:`_REFUSED` once the request has been
        answered: 413 (and closed) over ``limit`` bytes, ``invalid`` when it is not JSON."""
        try:
            return await self._read_json(scope, receive, limit)
        except BodyTooLarge:
            detail = f"request body is larger than {limit} bytes"
            await _respond(send, 413, {"detail": detail}, close=True)
        except RequestValidationError:
            await _respond(send, invalid, {"detail": "the body must be a JSON object"})
        return _REFUSED

    async def _read_json(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, limit: int | None = None
    ) -> Any:
        """The decoded JSON body (``None`` when empty). Reads the whole body first."""
        body = await read_body(scope, receive, self.max_body_bytes if limit is None else limit)
        content_type = header(scope, b"content-type")
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
        except RecursionError:
            # msgspec guards its recursion with the interpreter's limit; the body is the
            # client's mistake, not the server's.
            raise _json_error(
                "json_invalid", "JSON decode error", "arrays or objects nested too deeply"
            ) from None

    async def _body_or_error(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> tuple[bool, Any]:
        try:
            return True, await self._read_json(scope, receive)
        except BodyTooLarge:
            await _respond(
                send,
                413,
                {"detail": f"request body is larger than {self.max_body_bytes} bytes"},
                close=True,
            )
        except RequestValidationError as exc:
            await _respond(send, 422, exc.body())
        return False, None

    async def _admit(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        ok, body = await self._body_or_error(scope, receive, send)
        if not ok:
            return
        raw_waiter = header(scope, _WAITER_HEADER_BYTES)
        waiter = raw_waiter.decode("latin-1") if raw_waiter is not None else None
        if waiter is not None and not valid_waiter(waiter):
            detail = f"{WAITER_HEADER} must be 16 to 128 characters of A-Z a-z 0-9 _ -"
            await _respond(send, 422, {"detail": detail})
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
        if waiter is not None:
            self.waits.watch_admitted(waiter, request.rollout_id)
        await _respond(send, 202, accepted)

    async def _cancel(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        ok, body = await self._body_or_error(scope, receive, send)
        if not ok:
            return
        try:
            request = parse_cancel_request(body)
        except RequestValidationError as exc:
            await _respond(send, 422, exc.body())
            return
        await _respond(send, 200, {"dispositions": self.service.cancel(request)})

    async def _probe(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """The optional sandbox probe (:mod:`rollout_server.probe_route`); bad input is 400."""
        body = await self._json_or_refusal(scope, receive, send, self.max_body_bytes, 400)
        if body is _REFUSED:
            return
        status, payload = await answer_probe(self.service.backend, body)
        await _respond(send, status, payload)

    async def _wait_results(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """The batched result wait (:mod:`rollout_server.resultwait`); bad input is 422."""
        limit = min(self.max_body_bytes, WAIT_MAX_BODY_BYTES)
        body = await self._json_or_refusal(scope, receive, send, limit, 422)
        if body is _REFUSED:
            return
        status, payload = await self.waits.answer(body)
        await send_json(send, status, payload)

    async def _result(self, rollout_id: str, scope: HTTPScope, send: ASGISendCallable) -> None:
        token = header(scope, _LEASE_HEADER_BYTES)
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
        await send_json(send, 200, body)


async def _not_allowed(send: ASGISendCallable, allow: str) -> None:
    await _respond(send, 405, {"detail": "Method Not Allowed"}, [(b"allow", allow.encode())])


async def _respond(
    send: ASGISendCallable,
    status: int,
    payload: Any,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
    *,
    close: bool = False,
) -> None:
    await send_json(send, status, _encode(payload), extra_headers, close=close)
