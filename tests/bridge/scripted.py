"""A scripted HTTP upstream for cases the shared fake cannot produce.

Each request pops the next :class:`Reply` (the last one repeats). A reply is a status, a
content type and either a body or a list of ``(delay, bytes)`` parts sent one by one, so tool
calls, refusals, empty choices, odd errors and slow streams can all be scripted. Requests are
recorded with their parsed JSON body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    content_type: str = "application/json"
    parts: list[tuple[float | trio.Event, bytes]] | None = None
    """Sent one by one, each after a delay in seconds or after an event is set."""


@dataclass
class Scripted:
    base_url: str = ""
    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    disconnects: int = 0

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def reply(self, *replies: Reply) -> None:
        self.replies = list(replies)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.paths.append(scope["path"])
        self.headers.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        try:
            self.requests.append(json.loads(body) if body else None)
        except ValueError:
            self.requests.append(body.decode("utf-8", "replace"))
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if reply.parts is None:
            await send(
                {
                    "type": "http.response.start",
                    "status": reply.status,
                    "headers": [(b"content-type", reply.content_type.encode())],
                }
            )
            payload = reply.body if isinstance(reply.body, bytes | str) else json.dumps(reply.body)
            payload = payload.encode() if isinstance(payload, str) else payload
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            return
        with trio.CancelScope() as guard:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, receive, guard)
                await send(
                    {
                        "type": "http.response.start",
                        "status": reply.status,
                        "headers": [(b"content-type", reply.content_type.encode())],
                    }
                )
                for delay, part in reply.parts:
                    if isinstance(delay, trio.Event):
                        await delay.wait()
                    elif delay:
                        await trio.sleep(delay)
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                nursery.cancel_scope.cancel()
        if guard.cancelled_caught:
            self.disconnects += 1

    async def _watch(self, receive: Any, guard: trio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                guard.cancel()
                return


def sse(
    *objs: Any, done: bool = True, delay: float = 0.0
) -> list[tuple[float | trio.Event, bytes]]:
    """SSE parts for ``objs`` (``[DONE]`` appended), each after ``delay`` seconds."""
    parts = [(delay, b"data: " + json.dumps(o).encode() + b"\n\n") for o in objs]
    if done:
        parts.append((0.0, b"data: [DONE]\n\n"))
    return parts


async def run_scripted(
    upstream: Scripted, *, task_status: trio.TaskStatus[Scripted] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``upstream`` on 127.0.0.1:0 until cancelled."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(upstream, config, task_status=task_status)
        )
        upstream.base_url = binds[0]
        task_status.started(upstream)
