"""A fake OpenAI-compatible upstream: a real HTTP server on 127.0.0.1, port 0.

It answers ``POST /v1/chat/completions`` (and ``/chat/completions``) deterministically:
the reply is ``"echo: " + <last user message text>`` and ``usage`` counts whitespace-separated
words (prompt = words in all message contents, completion = words in the reply). With
``stream: true`` it sends one SSE chunk per word and, when ``stream_options.include_usage`` is
set, a final chunk with ``usage``.

Faults are injected by setting attributes on the :class:`FakeUpstream` between requests:
``delay`` (seconds before the answer), ``chunk_delay`` (seconds between streamed chunks),
``fail_statuses`` (a queue of statuses answered before normal service resumes),
``fail_body`` (the body sent with those statuses). Every request is recorded in ``requests``;
``disconnects`` counts requests whose client went away before the answer was sent.
``usage_extra`` is merged into every ``usage`` (cached and reasoning token details, say), and a
request asking for ``logprobs`` gets one logprob per word of the reply (in each streamed chunk).

Transient faults, at random: ``fault_rate`` (the fraction of chat calls that get one) of the
kinds in ``fault_kinds``: ``"500"``, ``"429"`` (with ``Retry-After: <retry_after>``) and
``"reset"`` (the connection is reset before any answer; needs ``run_fake_upstream(resets=True)``,
which puts a small TCP relay in front of the server so that a request's connection can be
aborted). :meth:`FakeUpstream.rate_limit_for` answers every chat call with a 429 for the next
T seconds. ``faults`` counts what was injected, by kind. None of this is on by default.

It is a raw ASGI app on hypercorn's trio worker (no framework), so it has none of the
framework hazards our own servers must guard against, and trio sockets set TCP_NODELAY.
"""

from __future__ import annotations

import json
import math
import random
import socket
import struct
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from tests.fakes.echo_reply import last_user_text, prompt_words


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeUpstream:
    """State and knobs of one fake upstream server."""

    base_url: str = ""
    delay: float = 0.0
    chunk_delay: float = 0.0
    fail_statuses: deque[int] = field(default_factory=deque)
    fail_body: str = '{"error": {"message": "injected failure", "type": "server_error"}}'
    requests: list[RecordedRequest] = field(default_factory=list)
    disconnects: int = 0
    completed: int = 0
    in_flight: int = 0
    reply_prefix: str = "echo: "
    usage: bool = True
    usage_extra: dict[str, Any] = field(default_factory=dict)
    fault_rate: float = 0.0
    fault_kinds: tuple[str, ...] = ("500", "429", "reset")
    retry_after: str = "1"
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    faults: Counter[str] = field(default_factory=Counter)
    failed_answers: int = 0
    """Error answers sent; each named ``x-request-id: req_fail_<n>``."""
    _limited_until: float = -math.inf
    _links: dict[int, tuple[trio.SocketStream, trio.CancelScope]] = field(default_factory=dict)
    _shutdown: trio.Event = field(default_factory=trio.Event)

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return self.base_url + "/v1"

    def stop(self) -> None:
        self._shutdown.set()

    def rate_limit_for(self, seconds: float) -> None:
        """Answer every chat call with a 429 (and ``Retry-After``) for the next ``seconds``."""
        self._limited_until = trio.current_time() + seconds

    def _pick_fault(self) -> str | None:
        if trio.current_time() < self._limited_until:
            return "429"
        if self.fault_rate and self.rng.random() < self.fault_rate:
            return self.rng.choice(self.fault_kinds)
        return None

    async def _inject(self, fault: str, client_port: int, send: Any) -> None:
        self.faults[fault] += 1
        if fault == "reset":
            link = self._links.get(client_port)
            if link is None:
                raise RuntimeError("a reset fault needs run_fake_upstream(resets=True)")
            inbound, relay = link
            # SO_LINGER 0: closing sends an RST instead of a FIN.
            inbound.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            relay.cancel()
            # Answer nothing: hypercorn's own 500 must not reach the relay before it is gone.
            await trio.sleep_forever()
        body = json.dumps({"error": {"message": f"injected {fault}", "type": "server_error"}})
        headers = [(b"retry-after", self.retry_after.encode())] if fault == "429" else []
        headers.append(self._request_id())
        await _send_raw(send, int(fault), body.encode(), b"application/json", headers)

    def _request_id(self) -> tuple[bytes, bytes]:
        """The header naming a failed answer's request as OpenAI does: ``req_fail_<n>``."""
        self.failed_answers += 1
        return (b"x-request-id", b"req_fail_%d" % self.failed_answers)

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
                self.disconnects += 1
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope["path"]
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        self.requests.append(RecordedRequest(scope["method"], path, headers, parsed))

        if path.endswith("/models") and scope["method"] == "GET":
            await _send_json(
                send, 200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
            )
            return
        if not path.endswith("/chat/completions") or scope["method"] != "POST":
            await _send_json(send, 404, {"error": {"message": "not found"}})
            return
        if not isinstance(parsed, dict):
            await _send_json(send, 400, {"error": {"message": "body must be a JSON object"}})
            return

        self.in_flight += 1
        answered = False

        async def tracked_send(message: dict[str, Any]) -> None:
            # Once the last body chunk is handed over the answer is complete: the server may
            # then report the connection's end as a disconnect, which is not the client leaving.
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered = True
            await send(message)

        async def watch_disconnect(scope_guard: trio.CancelScope) -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not answered:
                        scope_guard.cancel()
                    return

        try:
            with trio.CancelScope() as scope_guard:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch_disconnect, scope_guard)
                    fault = self._pick_fault()
                    if fault is not None:
                        await self._inject(fault, scope["client"][1], tracked_send)
                    else:
                        await self._answer(parsed, tracked_send)
                    nursery.cancel_scope.cancel()
            if answered:
                self.completed += 1
            else:
                self.disconnects += 1
        finally:
            self.in_flight -= 1

    async def _answer(self, request: dict[str, Any], send: Any) -> None:
        if self.delay:
            await trio.sleep(self.delay)
        if self.fail_statuses:
            status = self.fail_statuses.popleft()
            headers = [self._request_id()]
            await _send_raw(send, status, self.fail_body.encode(), b"application/json", headers)
            return
        text = self.reply_prefix + last_user_text(request.get("messages"))
        model = str(request.get("model", "fake-model"))
        prompt_tokens = prompt_words(request.get("messages"))
        completion_tokens = len(text.split())
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            **self.usage_extra,
        }
        if request.get("stream"):
            await self._stream(send, model, text, usage, request)
            return
        payload: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }
        if request.get("logprobs"):
            payload["choices"][0]["logprobs"] = {"content": _logprobs(text.split(" "))}
        if self.usage:
            payload["usage"] = usage
        await _send_json(send, 200, payload)

    async def _stream(
        self, send: Any, model: str, text: str, usage: dict[str, int], request: dict[str, Any]
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        words = text.split(" ")
        for i, word in enumerate(words):
            piece = word if i == 0 else " " + word
            delta: dict[str, Any] = {"content": piece}
            if i == 0:
                delta["role"] = "assistant"
            chunk = _chunk(model, delta, None)
            if request.get("logprobs"):
                chunk["choices"][0]["logprobs"] = {"content": _logprobs([piece], i)}
            await send({"type": "http.response.body", "body": _sse(chunk), "more_body": True})
            if self.chunk_delay:
                await trio.sleep(self.chunk_delay)
        await send(
            {
                "type": "http.response.body",
                "body": _sse(_chunk(model, {}, "stop")),
                "more_body": True,
            }
        )
        options = request.get("stream_options")
        if self.usage and isinstance(options, dict) and options.get("include_usage"):
            final = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            await send({"type": "http.response.body", "body": _sse(final), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _logprobs(tokens: list[str], first: int = 0) -> list[dict[str, Any]]:
    return [
        {"token": token, "logprob": -0.5 * (first + i), "bytes": None, "top_logprobs": []}
        for i, token in enumerate(tokens)
    ]


def _chunk(model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _send_json(send: Any, status: int, payload: Any) -> None:
    await _send_raw(send, status, json.dumps(payload).encode(), b"application/json")


async def _send_raw(
    send: Any,
    status: int,
    body: bytes,
    content_type: bytes,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *(extra_headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, link: trio.CancelScope) -> None:
    try:
        async for data in source:
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    link.cancel()


async def _serve_relay(
    upstream: FakeUpstream,
    target_port: int,
    backlog: int,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A TCP relay on 127.0.0.1:0 in front of the server. Each client connection gets its own
    server connection, keyed by that connection's local port (the ``client`` the server sees),
    so that a request can reset the client's connection."""

    async def link(inbound: trio.SocketStream) -> None:
        try:
            outbound = await trio.open_tcp_stream("127.0.0.1", target_port)
        except OSError:
            await trio.aclose_forcefully(inbound)
            return
        key = outbound.socket.getsockname()[1]
        with trio.CancelScope() as relay:
            upstream._links[key] = (inbound, relay)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, inbound, outbound, relay)
                    nursery.start_soon(_pump, outbound, inbound, relay)
            finally:
                upstream._links.pop(key, None)
                await trio.aclose_forcefully(inbound)
                await trio.aclose_forcefully(outbound)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=backlog)
    port: int = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, link, listeners)
        task_status.started(port)
        await upstream._shutdown.wait()
        nursery.cancel_scope.cancel()


async def run_fake_upstream(
    upstream: FakeUpstream | None = None,
    *,
    backlog: int = 1024,
    resets: bool = False,
    task_status: trio.TaskStatus[FakeUpstream] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a fake upstream on 127.0.0.1:0 until ``upstream.stop()`` or cancellation.

    ``resets`` puts the TCP relay in front (``base_url`` is then the relay's), so that the
    ``"reset"`` fault can abort a connection."""
    upstream = upstream or FakeUpstream()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 600
    config.backlog = backlog
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                upstream, config, shutdown_trigger=upstream._shutdown.wait, task_status=task_status
            )
        )
        upstream.base_url = binds[0]
        if resets:
            port = int(binds[0].rsplit(":", 1)[1])
            relay_port = await nursery.start(_serve_relay, upstream, port, backlog)
            upstream.base_url = f"http://127.0.0.1:{relay_port}"
        task_status.started(upstream)
