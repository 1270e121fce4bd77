"""A fake provider speaking OpenAI's Responses API and Anthropic's Messages API natively.

A hand-written HTTP/1.1 server on 127.0.0.1, port 0 (one request per connection, answers
delimited by closing it), so that faults are exact: ``faults`` is a queue of what the next calls
get instead of an answer: ``"429"`` (with ``Retry-After: 0``), ``"500"``, ``"529"``, ``"reset"``
(the connection is reset before any answer), ``"echo_key"`` (a 400 whose message quotes the
credential the request carried) or ``"midstream"`` (a streamed answer that sends
two events, then the provider's own error event) or ``"cutoff"`` (the same two events, then the
connection closed cleanly, with no event that ends the answer) or ``"truncated"`` (a whole
answer whose body stops half-way through its ``Content-Length``) or ``"html"`` (a 200 page of
``text/html``, as a proxy in the way answers). Answers name the model
asked for with a snapshot date (``<model>-20250101``), as providers do.

``POST /v1/responses``: the reply is ``"native: " + <input text>``; usage
``input_tokens=100`` of which ``cached_tokens=40``, ``output_tokens=7`` of which
``reasoning_tokens=2``. Streamed: the full event grammar with sequence numbers, usage in
``response.completed``. When ``include`` asks for ``reasoning.encrypted_content`` the output
also holds a reasoning item (``rs_1``, encrypted content ``ENC-1``).

``POST /v1/messages``: checks ``x-api-key`` (401) and ``anthropic-version`` (400); usage
``input_tokens=10`` (excluding the cache), ``cache_read_input_tokens=60``,
``cache_creation_input_tokens=30``, ``output_tokens=5``. Streamed: ``message_start`` with the
input usage and ``output_tokens=1``, a ``ping``, text deltas, then ``message_delta`` with the
*cumulative* ``output_tokens=5``. ``POST /v1/messages/count_tokens``: ``{"input_tokens": 42}``.

``POST /v1/responses/compact`` answers one encrypted ``compaction`` item.
``POST /v1/chat/completions`` answers ``"ok"`` (for a run's model preflight). Every request is
recorded in ``requests`` (path, lower-case headers, parsed body). Every answer names its
request as Anthropic does: ``request-id: req_<n>``, ``n`` counting answers from 1 across servers.
"""

from __future__ import annotations

import itertools
import json
import socket
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio

RESPONSES_USAGE = {
    "input_tokens": 100,
    "input_tokens_details": {"cached_tokens": 40},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 2},
    "total_tokens": 107,
}
MESSAGES_START_USAGE = {
    "input_tokens": 10,
    "cache_read_input_tokens": 60,
    "cache_creation_input_tokens": 30,
    "output_tokens": 1,
}
MESSAGES_FINAL_OUTPUT = 5
REASONING_ITEM = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "ENC-1"}


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class ApiUpstream:
    """State and knobs of the fake."""

    base_url: str = ""
    faults: deque[str] = field(default_factory=deque)
    requests: list[Recorded] = field(default_factory=list)

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


async def run_api_upstream(
    state: ApiUpstream, *, task_status: trio.TaskStatus[ApiUpstream] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``state`` until cancelled."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    state.base_url = f"http://127.0.0.1:{port}"
    task_status.started(state)
    await trio.serve_listeners(lambda s: _connection(state, s), listeners)


async def _read_request(stream: trio.SocketStream) -> tuple[str, dict[str, str], bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        body += chunk
    return path, headers, body


async def _send(
    stream: trio.SocketStream,
    status: int,
    body: bytes,
    kind: str = "application/json",
    extra: str = "",
    *,
    truncated: bool = False,
) -> None:
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n{_request_id()}{extra}\r\n"
    )
    await stream.send_all(head.encode() + (body[: len(body) // 2] if truncated else body))


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _input_text(body: dict[str, Any]) -> str:
    value = body.get("input")
    if isinstance(value, str):
        return value
    for message in body.get("messages") or []:
        content = message.get("content")
        return content if isinstance(content, str) else str(content)
    return str(value)


SNAPSHOT = "-20250101"

_REQUEST_IDS = itertools.count(1)


def _request_id() -> str:
    return f"request-id: req_{next(_REQUEST_IDS)}\r\n"


async def _connection(state: ApiUpstream, stream: trio.SocketStream) -> None:
    async with stream:
        request = await _read_request(stream)
        if request is None:
            return
        path, headers, raw = request
        path = path.split("?", 1)[0]
        body = json.loads(raw or b"{}")
        state.requests.append(Recorded(path, headers, body))
        fault = state.faults.popleft() if state.faults else None
        if fault == "reset":
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        if fault == "echo_key":
            # A provider error that quotes the credential it was sent (some do).
            key = headers.get("x-api-key") or headers.get("authorization", "")
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": f"bad request for key {key}"},
            }
            await _send(stream, 400, json.dumps(error).encode())
            return
        if fault == "html":  # a 200 that is a proxy's page, not the API's answer
            await _send(stream, 200, b"<html><body>Gateway says hi</body></html>", "text/html")
            return
        if fault in ("429", "500", "529"):
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
            await _send(stream, int(fault), json.dumps(error).encode(), extra="retry-after: 0\r\n")
            return
        if path == "/v1/chat/completions":
            # Only for a run's model preflight (one small non-streaming call).
            chat = {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "ok"},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            await _send(stream, 200, json.dumps(chat).encode())
        elif path == "/v1/responses/compact":
            compacted = {
                "id": "resp_c",
                "object": "response.compaction",
                "created_at": 1,
                "output": [{"type": "compaction", "id": "cmp_1", "encrypted_content": "ENC-C"}],
                "usage": RESPONSES_USAGE,
            }
            await _send(stream, 200, json.dumps(compacted).encode())
        elif path == "/v1/responses":
            await _responses(stream, body, fault=fault)
        elif path.startswith("/v1/messages"):
            if headers.get("x-api-key") != "sk-ant-provider-key-000000000000":
                error = {
                    "type": "error",
                    "error": {"type": "authentication_error", "message": "key"},
                }
                await _send(stream, 401, json.dumps(error).encode())
            elif not headers.get("anthropic-version"):
                await _send(
                    stream,
                    400,
                    b'{"type":"error","error":{"type":"invalid_request_error","message":"anthropic-version"}}',
                )
            elif path.endswith("/count_tokens"):
                await _send(stream, 200, b'{"input_tokens": 42}')
            else:
                await _messages(stream, body, fault=fault)
        else:
            await _send(stream, 404, b'{"error": "not found"}')


async def _responses(stream: trio.SocketStream, body: dict[str, Any], *, fault: str | None) -> None:
    text = "native: " + _input_text(body)
    reasoning = []
    if "reasoning.encrypted_content" in (body.get("include") or []):
        # After the message (index 1), which keeps the message's events at index 0.
        reasoning.append(REASONING_ITEM)
    item = {
        "type": "message",
        "id": "msg_1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": f"{body.get('model')}{SNAPSHOT}",
        "output": [item, *reasoning],
        "usage": RESPONSES_USAGE,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    if not body.get("stream"):
        await _send(stream, 200, json.dumps(response).encode(), truncated=fault == "truncated")
        return
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
        + _request_id().encode()
        + b"\r\n"
    )
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    seq = iter(range(100))
    added = {**item, "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    events = [
        ("response.created", {"response": start}),
        ("response.in_progress", {"response": start}),
        ("response.output_item.added", {"output_index": 0, "item": added}),
        (
            "response.content_part.added",
            {"item_id": "msg_1", "output_index": 0, "content_index": 0, "part": part},
        ),
    ]
    if fault == "midstream":
        events.append(("error", {"code": "server_error", "message": "boom", "param": None}))
    elif fault != "cutoff":
        events += [
            (
                "response.output_text.delta",
                {
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                },
            ),
            (
                "response.output_text.done",
                {
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                },
            ),
            (
                "response.content_part.done",
                {
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "part": {**part, "text": text},
                },
            ),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            *(
                (kind, {"output_index": 1, "item": r})
                for r in reasoning
                for kind in ("response.output_item.added", "response.output_item.done")
            ),
            ("response.completed", {"response": response}),
        ]
    for kind, data in events:
        await stream.send_all(_sse(kind, {"type": kind, "sequence_number": next(seq), **data}))


async def _messages(stream: trio.SocketStream, body: dict[str, Any], *, fault: str | None) -> None:
    text = "native: " + _input_text(body)
    final_usage = {**MESSAGES_START_USAGE, "output_tokens": MESSAGES_FINAL_OUTPUT}
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": f"{body.get('model')}{SNAPSHOT}",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": final_usage,
    }
    if not body.get("stream"):
        await _send(stream, 200, json.dumps(message).encode(), truncated=fault == "truncated")
        return
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
        + _request_id().encode()
        + b"\r\n"
    )
    start = {**message, "content": [], "stop_reason": None, "usage": MESSAGES_START_USAGE}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": start}),
        ("ping", {}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    if fault == "midstream":
        events.append(("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}}))
    elif fault != "cutoff":
        events += [
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"index": 0}),
            # Cumulative: the final totals, not an increment (input_tokens left out).
            (
                "message_delta",
                {
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": MESSAGES_FINAL_OUTPUT},
                },
            ),
            ("message_stop", {}),
        ]
    for kind, data in events:
        await stream.send_all(_sse(kind, {"type": kind, **data}))
