"""The bridge's HTTP surface: a quart-trio app behind a body-buffering ASGI layer (docs/spec/bridge.md §2–§3).

The chat routes are answered by that layer directly (:class:`ChatRoutes`), without quart: quart's
request/response machinery costs about as much CPU per call as the rest of the bridge's own work,
and the chat routes are the only hot path. Everything else (404/405, trailing-slash redirects of
other shapes) still goes through the quart app (:mod:`bridge.fallback`, made at the first such
request), and the chat routes answer byte for byte as the quart handlers did.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING
from urllib.parse import quote

import trio

from bridge.apis import ApiOptions
from bridge.apis.errors import dialect_error
from bridge.apis.serve import ApiRoutes, Match, api_routes
from bridge.bearers import Bearers
from bridge.codec import dumps
from bridge.door import Door, announces_body, bridge_routes
from bridge.errors import error_body
from bridge.handler import Bridge
from bridge.policy import (
    MAX_BODY_BYTES,
    check_auth,
    is_stream,
)
from bridge.preamble import admitted_body, header_text
from bridge.probe import ProbeKey
from bridge.revoke import REVOKED_STATUS, Revocations
from bridge.watch import DisconnectWatch
from rollout_server.net.asgi import (
    BodyTooLarge,
    ClientDisconnected,
    read_body,
    send_json,
)

if TYPE_CHECKING:
    import httpx
    from hypercorn.typing import ASGISendEvent

    # Types only: they come from hypercorn.typing, which imports h2.
    from rollout_server.net.asgi import (
        ASGIFramework,
        ASGIReceiveCallable,
        ASGIReceiveEvent,
        ASGISendCallable,
        HTTPScope,
        Scope,
    )

#: Header naming the usage bucket of a plain ``/v1/chat/completions`` call (daemon mode).
ROLLOUT_ID_HEADER = "X-Rollbridge-Rollout-Id"
DEFAULT_ROLLOUT_ID = "default"

# The route with a trailing slash redirects to the route (as the reference's Starlette does).
# A call's path with a trailing slash gets a 307 to the path without it (the reference's
# redirect of the chat route, extended to the other two APIs' calls).
_TRAILING_SLASH = re.compile(
    r"/v1/rollouts/[^/]+/(?:chat/completions|responses|(?:v1/)?messages(?:/count_tokens)?)/"
)

_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class BufferedBody:
    """Reads the whole request body before the app sees the request, then replays it.

    quart-trio on hypercorn leaves some keep-alive POSTs unanswered under concurrency when the
    app reads the body itself (docs/hazards.md #1); handing it a body that is already complete
    avoids that. The size cap is enforced here too, before anything is buffered past it. With
    a ``door`` (:mod:`bridge.door`), route, method, token and declared size are checked from
    the head first, and a refused request's body is never read.
    """

    def __init__(
        self,
        app: ASGIFramework,
        max_body: int = MAX_BODY_BYTES,
        chat: ChatRoutes | None = None,
        apis: ApiRoutes | None = None,
        door: Door | None = None,
        revoked: Revocations | None = None,
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.chat = chat
        self.apis = apis
        self.door = door
        self.revoked = revoked if revoked is not None else Revocations(lambda level, line: None)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _TRAILING_SLASH.fullmatch(scope["path"]):
            await _redirect(send, scope["path"].rstrip("/"), scope.get("query_string", b""))
            return
        max_body = self.max_body
        call = self.apis.match(scope) if self.apis is not None else None
        if call is not None and self.apis is not None and not self.apis.authorized(scope, call):
            # From the head, as the door would, but in the caller's API's shape.
            await send_json(send, 401, self.apis.unauthorized(call), close=True)
            return
        if self.door is not None:
            refusal = self.door.check(scope)
            if refusal is not None:
                await send_json(send, refusal.status, refusal.body, close=refusal.close)
                return
            max_body = self.door.cap(scope)
        chat_id = self.chat.match(scope) if self.chat is not None else None
        rollout_id = chat_id if call is None else call.rollout_id
        if rollout_id is not None and rollout_id in self.revoked:
            # Before the body is read: a revoked rollout spends nothing (bridge.revoke).
            self.revoked.refused(rollout_id)
            await send_json(
                send,
                REVOKED_STATUS,
                _revoked_body(call, self.revoked.message(rollout_id)),
                close=announces_body(scope),
            )
            return
        try:
            body = await read_body(scope, receive, max_body)
        except BodyTooLarge:
            await _too_large(send)
            return
        except ClientDisconnected:
            return
        if rollout_id is not None:
            await self._serve_call(scope, call, rollout_id, body, receive, send)
            return
        replayed = False

        async def replay() -> ASGIReceiveEvent:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _serve_call(
        self,
        scope: HTTPScope,
        call: Match | None,
        rollout_id: str,
        body: bytes,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
    ) -> None:
        """One model call, cancelled if its rollout is revoked meanwhile: answered with the
        refusal when nothing was sent yet, else its answer is cut short."""
        answered = False

        async def tracked(message: ASGISendEvent) -> None:
            nonlocal answered
            answered = True
            await send(message)

        with self.revoked.running(rollout_id) as running:
            if call is None:
                assert self.chat is not None
                await self.chat.serve(scope, rollout_id, body, receive, tracked)
            else:
                # The Responses and Messages routes (bridge.apis.serve.ROUTES).
                assert self.apis is not None
                await self.apis.serve(scope, call, body, receive, tracked)
        if running.cancelled_caught and not answered:
            await send_json(
                send,
                REVOKED_STATUS,
                _revoked_body(call, self.revoked.message(rollout_id)),
                close=True,
            )


def _revoked_body(call: Match | None, message: str) -> bytes:
    """The refusal of a revoked or ended rollout's call, in its API's shape (chat: OpenAI's)."""
    if call is None:
        return dumps(error_body(REVOKED_STATUS, message))
    return dialect_error(call.api, REVOKED_STATUS, message)


async def _redirect(send: ASGISendCallable, path: str, query: bytes) -> None:
    location = quote(path, safe="/%").encode() + (b"?" + query if query else b"")
    await send(
        {
            "type": "http.response.start",
            "status": 307,
            "headers": [(b"location", location), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _too_large(send: ASGISendCallable) -> None:
    await send_json(send, 413, b'{"detail":"Request Entity Too Large"}', close=True)


_CHAT_PATH = re.compile(r"/v1/rollouts/([^/]+)/chat/completions")
_JSON_TYPE = (b"content-type", b"application/json")
_SSE_HEADER_LIST = [(k.lower().encode(), v.encode()) for k, v in _SSE_HEADERS.items()]


class ChatRoutes:
    """The chat routes as raw ASGI, answered without quart.

    Same checks in the same order, same statuses, bodies and response headers as the quart
    handlers they replaced. Like quart-trio, the handler is cancelled when the client goes
    away (so the provider call stops too), once the call has run for a second
    (:mod:`bridge.watch` says why).
    """

    def __init__(self, bridge: Bridge, *, bearers: Bearers, plain_chat_route: bool) -> None:
        self.bridge = bridge
        self.bearers = bearers
        self.plain_chat_route = plain_chat_route
        self.watch = DisconnectWatch(bridge.nursery)

    def match(self, scope: HTTPScope) -> str | None:
        """The rollout id a request is for, or ``None`` when it is not a chat call."""
        if scope["method"] != "POST":
            return None
        path: str = scope["path"]
        found = _CHAT_PATH.fullmatch(path)
        if found is not None:
            return found.group(1)
        if self.plain_chat_route and path == "/v1/chat/completions":
            return header_text(scope, b"x-rollbridge-rollout-id") or DEFAULT_ROLLOUT_ID
        return None

    async def serve(
        self,
        scope: HTTPScope,
        rollout_id: str,
        body: bytes,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
    ) -> None:
        """Answer one chat call whose whole body has been read."""
        await self.watch.run(receive, lambda: self._answer(scope, rollout_id, body, send))

    async def _answer(
        self, scope: HTTPScope, rollout_id: str, raw: bytes, send: ASGISendCallable
    ) -> None:
        authorized = check_auth(
            header_text(scope, b"authorization"), self.bearers.expected(scope["path"])
        )
        body = await admitted_body(
            send, authorized=authorized, rollout_id=rollout_id, raw=raw, error=_detail
        )
        if body is None:
            return
        if is_stream(body):
            await _send_stream(send, _SSE_HEADER_LIST, self.bridge.sse(rollout_id, body))
            return
        outcome = await self.bridge.respond(rollout_id, body)
        if not isinstance(outcome, tuple):
            # Keepalive mode, slow call: a 200 whose body trickles (bridge.Bridge.respond).
            await _send_stream(send, [_JSON_TYPE], outcome)
            return
        status, payload = outcome
        await send_json(send, status, payload)


def _detail(status: int, message: str) -> bytes:
    """The chat routes' error body (FastAPI's shape, as the reference answers)."""
    return dumps({"detail": message})


async def _send_stream(
    send: ASGISendCallable, headers: list[tuple[bytes, bytes]], body: AsyncGenerator[bytes, None]
) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    async with aclosing(body) as parts:
        async for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class FirstUse:
    """An ASGI app made at its first request, in a worker thread (its imports are slow), so
    that a bridge which never needs it never pays for it."""

    def __init__(self, make: Callable[[], ASGIFramework]) -> None:
        self._make: Callable[[], ASGIFramework] | None = make
        self._app: ASGIFramework | None = None
        self._lock = trio.Lock()

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if self._app is None:
            async with self._lock:
                if self._make is not None:
                    self._app = await trio.to_thread.run_sync(self._make)
                    self._make = None
        assert self._app is not None
        await self._app(scope, receive, send)


def create_app(
    bridge: Bridge,
    *,
    token: str,
    plain_chat_route: bool,
    per_rollout_bearers: bool = False,
    max_body: int = MAX_BODY_BYTES,
    probe: ProbeKey | None = None,
    apis: ApiOptions | None = None,
    http: Callable[[], httpx.AsyncClient] | None = None,
) -> BufferedBody:
    """The ASGI app serving ``bridge`` (whose ``keepalive`` mode may be switched while serving).

    With ``probe``, ``GET /v1/rollbridge/probe/<nonce>`` answers sandbox probes (bridge.probe).
    Requests other than chat calls go to the quart app of :mod:`bridge.fallback`, made when the
    first of them arrives. ``apis`` and ``http`` serve the Responses and Messages routes
    (:mod:`bridge.apis.serve`; ``http`` is the native path's client)."""

    def make() -> ASGIFramework:
        from bridge.fallback import build_app

        return build_app(bridge, token=token, plain_chat_route=plain_chat_route, probe=probe)

    bearers = Bearers(token, per_rollout=per_rollout_bearers)
    chat = ChatRoutes(bridge, bearers=bearers, plain_chat_route=plain_chat_route)
    routes = ApiRoutes(
        bridge, bearers=bearers, plain_route=plain_chat_route, options=apis, http=http
    )
    door = Door(
        [
            *bridge_routes(plain_chat_route=plain_chat_route, probe=probe is not None),
            *api_routes(plain_route=plain_chat_route),
        ],
        bearers=bearers,
        max_body=max_body,
    )
    return BufferedBody(FirstUse(make), max_body, chat, routes, door, bridge.revoked)
