"""Chat chunks in, Responses events out: the grammar openai-python's stream helper and Codex check.

``response.created`` and ``response.in_progress`` first; each output item announced
(``response.output_item.added``, and ``response.content_part.added`` for a message) before its
deltas; each closed with its ``…done`` events before the next opens; ``response.completed`` (or
``response.incomplete``) last, carrying the whole response and its usage; every event numbered
by ``sequence_number``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from bridge.apis.chunks import first_choice
from bridge.apis.responses import (
    _call_item,
    _finish,
    _ident,
    _logprobs,
    _message_item,
    _shell,
    usage_json,
)
from bridge.codec import dumps
from bridge.usage import CallUsage


class ResponsesStream:
    """Chat chunks in, Responses events out (``event:`` + ``data:`` frames, numbered)."""

    def __init__(self, request: dict[str, Any], model: str, seed: str) -> None:
        self.request = request
        self.shell = _shell(request, model, _ident("resp_", seed, time.time_ns()), "in_progress")
        self.sequence = 0
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its item
        self.finish: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"

    def start(self) -> Iterator[bytes]:
        """``response.created`` and ``response.in_progress``."""
        yield self._event("response.created", response=self._snapshot())
        yield self._event("response.in_progress", response=self._snapshot())

    def _snapshot(self) -> dict[str, Any]:
        return {**self.shell, "output": [dict(i) for i in self.shell["output"]]}

    def _close(self) -> Iterator[bytes]:
        item, self._open = self._open, None
        if item is None:
            return
        index = self.shell["output"].index(item)
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            yield self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=part["logprobs"],
            )
            yield self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
        else:
            yield self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield self._event("response.output_item.done", output_index=index, item=item)

    def _add(self, item: dict[str, Any]) -> Iterator[bytes]:
        yield from self._close()
        self.shell["output"].append(item)
        self._open = item
        announced = dict(item)
        if item["type"] == "message":
            announced["content"] = []
        yield self._event(
            "response.output_item.added", output_index=len(self.shell["output"]) - 1, item=announced
        )
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=len(self.shell["output"]) - 1,
                content_index=0,
                part=part,
            )

    def chunk(self, chunk: dict[str, Any]) -> Iterator[bytes]:
        """The events for one chat chunk (only its first choice is read)."""
        first = first_choice(chunk)
        if first is None:
            return
        choice, delta, text = first
        if text:
            if self._open is None or self._open["type"] != "message":
                item = _message_item(
                    _ident("msg_", self.shell["id"], len(self.shell["output"])),
                    "",
                    [],
                    "in_progress",
                )
                yield from self._add(item)
            assert self._open is not None
            part = self._open["content"][0]
            part["text"] += text
            logprobs = _logprobs((choice.get("logprobs") or {}).get("content"))
            part["logprobs"].extend(logprobs)
            yield self._event(
                "response.output_text.delta",
                item_id=self._open["id"],
                output_index=len(self.shell["output"]) - 1,
                content_index=0,
                delta=text,
                logprobs=logprobs,
            )
        for tool_call in delta.get("tool_calls") or []:
            index = tool_call.get("index", 0)
            found = self._calls.get(index)
            if found is not None:
                item = found
            else:
                call = {"id": tool_call.get("id"), "function": tool_call.get("function") or {}}
                item = _call_item(_ident("fc_", self.shell["id"], index), call, "in_progress")
                item["arguments"] = ""
                self._calls[index] = item
                yield from self._add(item)
            arguments = (tool_call.get("function") or {}).get("arguments")
            if arguments:
                item["arguments"] += arguments
                yield self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.shell["output"].index(item),
                    delta=arguments,
                )
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]

    def end(self, call: CallUsage) -> Iterator[bytes]:
        """Close the open item, then ``response.completed`` (or ``response.incomplete``)."""
        yield from self._close()
        _finish(self.shell, self.finish)
        self.shell["usage"] = usage_json(call)
        kind = (
            "response.completed" if self.shell["status"] == "completed" else "response.incomplete"
        )
        yield self._event(kind, response=self._snapshot())

    def failed(self, message: str) -> bytes:
        """``response.failed``, after an error event."""
        self.shell["status"] = "failed"
        self.shell["error"] = {"code": "server_error", "message": message}
        return self._event("response.failed", response=self._snapshot())
