"""A scripted OpenAI-compatible upstream that plays terminus-2's part for the example task.

A real HTTP server on 127.0.0.1, port 0 (raw ASGI on hypercorn's trio worker). Each
``POST .../chat/completions`` gets the reply that fits the conversation so far, counted by the
assistant turns already in ``messages``, so concurrent trials are served independently:

0. the command that solves ``tasks/hello`` (``echo hello > /app/answer.txt``), not yet complete;
1. ``task_complete: true`` with no command;
2. and later: ``task_complete: true`` again, which terminus-2 takes as the confirmation it asks for.

These are terminus-2's JSON reply fields (``analysis``, ``plan``, ``commands`` of
``{keystrokes, duration}``, ``task_complete``), as its ``json`` parser in Harbor 0.25 reads them.
A request that is not terminus-2's (the bridge's preflight) gets a plain ``ok``.

Every call reports the same usage, :data:`USAGE`, whose ``total_tokens`` is deliberately one more
than prompt + completion: the bridge keeps a provider's total, while anything recomputed from the
agent's own counts would not have the extra token. So a rollout's ``tokens`` is
``calls * USAGE["total_tokens"]`` exactly when it came from the bridge.

Run by hand (prints the ``OPENAI_BASE_URL`` to export)::

    python -m tests.harbor.scripted_upstream
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

__all__ = ["USAGE", "ScriptedUpstream", "run_scripted_upstream"]

USAGE = {"prompt_tokens": 200, "completion_tokens": 50, "total_tokens": 251}
SOLVE = "echo hello > /app/answer.txt\n"


def terminus_reply(assistant_turns: int) -> dict[str, Any]:
    """The JSON object terminus-2 gets after ``assistant_turns`` earlier replies."""
    if assistant_turns == 0:
        return {
            "analysis": "The file /app/answer.txt does not exist yet.",
            "plan": "Write the word hello into it.",
            "commands": [{"keystrokes": SOLVE, "duration": 0.5}],
            "task_complete": False,
        }
    return {
        "analysis": "/app/answer.txt contains hello.",
        "plan": "Nothing left to do.",
        "commands": [],
        "task_complete": True,
    }


@dataclass
class ScriptedUpstream:
    """State of one scripted upstream server."""

    base_url: str = ""
    #: Replies given to terminus-2 (preflight calls are not counted).
    agent_calls: int = 0
    preflight_calls: int = 0
    #: Authorization headers seen (the bridge must send the provider key, never the bearer).
    authorizations: list[str] = field(default_factory=list)
    _shutdown: trio.Event = field(default_factory=trio.Event)

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return self.base_url + "/v1"

    def stop(self) -> None:
        """Stop serving."""
        self._shutdown.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
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
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.authorizations.append(headers.get("authorization", ""))
        if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await _send_json(send, 404, {"error": {"message": "not found"}})
            return
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if not isinstance(request, dict) or request.get("stream"):
            # terminus-2 does not stream; a streamed request means the wiring changed.
            await _send_json(send, 400, {"error": {"message": "expected a non-streamed body"}})
            return
        messages = request.get("messages") or []
        if "task_complete" in json.dumps(messages):
            turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
            text = json.dumps(terminus_reply(turns), indent=2)
            self.agent_calls += 1
        else:
            text = "ok"
            self.preflight_calls += 1
        await _send_json(
            send,
            200,
            {
                "id": f"chatcmpl-scripted-{self.agent_calls}",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": str(request.get("model", "scripted")),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": dict(USAGE),
            },
        )


async def _send_json(send: Any, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def run_scripted_upstream(
    upstream: ScriptedUpstream | None = None,
    *,
    task_status: trio.TaskStatus[ScriptedUpstream] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on 127.0.0.1:0 until ``upstream.stop()`` or cancellation."""
    upstream = upstream or ScriptedUpstream()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                cast(Any, upstream),  # a raw ASGI callable; hypercorn's type wants its own
                config,
                shutdown_trigger=upstream._shutdown.wait,
                task_status=task_status,
            )
        )
        upstream.base_url = binds[0]
        task_status.started(upstream)


async def _main() -> None:
    async with trio.open_nursery() as nursery:
        upstream: ScriptedUpstream = await nursery.start(run_scripted_upstream)
        print(f"OPENAI_BASE_URL={upstream.v1}", flush=True)


if __name__ == "__main__":
    trio.run(_main)
