"""The bridge's HTTP surface: a quart-trio app behind a body-buffering ASGI layer (bridge.md §2–§3)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from quart import Response, request
from quart_trio import QuartTrio

from bridge.core import Bridge, dumps
from bridge.policy import (
    MAX_BODY_BYTES,
    InvalidBody,
    check_auth,
    is_stream,
    parse_body,
    valid_rollout_id,
)

#: Header naming the usage bucket of a plain ``/v1/chat/completions`` call (daemon mode).
ROLLOUT_ID_HEADER = "X-Rollbridge-Rollout-Id"
DEFAULT_ROLLOUT_ID = "default"

# The route with a trailing slash redirects to the route (as the reference's Starlette does).
_TRAILING_SLASH = re.compile(r"/v1/rollouts/[^/]+/chat/completions/")

_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def _detail(status: int, detail: str) -> Response:
    return Response(dumps({"detail": detail}), status=status, content_type="application/json")


class BufferedBody:
    """Reads the whole request body before the app sees the request, then replays it.

    quart-trio on hypercorn leaves some keep-alive POSTs unanswered under concurrency when the
    app reads the body itself (hazards.md #1); handing it a body that is already complete
    avoids that. The size cap is enforced here too, before anything is buffered past it.
    """

    def __init__(self, app: Any, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _TRAILING_SLASH.fullmatch(scope["path"]):
            await _redirect(send, scope["path"].rstrip("/"), scope.get("query_string", b""))
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await _too_large(send)
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            part = message.get("body", b"")
            size += len(part)
            if size > self.max_body:
                await _too_large(send)
                return
            parts.append(part)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(parts), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _redirect(send: Any, path: str, query: bytes) -> None:
    location = quote(path, safe="/%").encode() + (b"?" + query if query else b"")
    await send(
        {
            "type": "http.response.start",
            "status": 307,
            "headers": [(b"location", location), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _too_large(send: Any) -> None:
    body = b'{"detail":"Request Entity Too Large"}'
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_app(
    bridge: Bridge,
    *,
    token: str,
    keepalive: list[bool],
    plain_chat_route: bool,
    max_body: int = MAX_BODY_BYTES,
) -> Any:
    """The ASGI app serving ``bridge``. ``keepalive[0]`` may be flipped while serving."""
    app = QuartTrio("rollbridge-bridge")
    # Quart's defaults cut long answers (hazards.md #5): a streamed or trickled answer may run
    # as long as the provider takes, and the body is already read by BufferedBody.
    app.config.update(
        RESPONSE_TIMEOUT=None,
        BODY_TIMEOUT=None,
        MAX_CONTENT_LENGTH=None,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )

    async def serve_chat(rollout_id: str) -> Response:
        # Auth first: before the rollout id is checked and before the body is parsed.
        if not check_auth(request.headers.get("Authorization"), token):
            return _detail(401, "Unauthorized")
        if not valid_rollout_id(rollout_id):
            return _detail(422, "invalid rollout_id")
        try:
            body = parse_body(await request.get_data(as_text=False))
        except InvalidBody:
            return _detail(400, "invalid body")
        if is_stream(body):
            response = Response(bridge.sse(rollout_id, body), status=200, headers=_SSE_HEADERS)
            response.timeout = None
            return response
        if keepalive[0]:
            outcome = await bridge.keepalive(rollout_id, body)
            if not isinstance(outcome, tuple):
                response = Response(outcome, status=200, content_type="application/json")
                response.timeout = None
                return response
            status, payload = outcome
        else:
            status, payload = await bridge.answer(rollout_id, body)
        return Response(payload, status=status, content_type="application/json")

    @app.route("/v1/rollouts/<rollout_id>/chat/completions", methods=["POST"])
    async def rollout_chat(rollout_id: str) -> Response:
        return await serve_chat(rollout_id)

    if plain_chat_route:

        @app.route("/v1/chat/completions", methods=["POST"])
        async def plain_chat() -> Response:
            return await serve_chat(request.headers.get(ROLLOUT_ID_HEADER) or DEFAULT_ROLLOUT_ID)

    @app.errorhandler(404)
    async def not_found(_: Exception) -> Response:
        return _detail(404, "Not Found")

    @app.errorhandler(405)
    async def not_allowed(_: Exception) -> Response:
        return _detail(405, "Method Not Allowed")

    @app.errorhandler(413)
    async def too_large(_: Exception) -> Response:
        return _detail(413, "Request Entity Too Large")

    return BufferedBody(app, max_body)
