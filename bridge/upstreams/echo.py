"""The built-in offline model ``rollbridge/echo``: no network, no key, deterministic.

It answers with the text of the last user message, so a rollout's behaviour is predictable
in demos and tests. Usage is counted with a crude word-and-punctuation tokenizer so the
numbers look like a real provider's (a few tokens per sentence, growing with the history).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncGenerator, Callable
from typing import Any

import trio

from bridge.policy import PreparedRequest

_TOKEN = re.compile(r"\w+|[^\w\s]")
_CREATED = 1_700_000_000


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return ""


def _count_tokens(text: str) -> int:
    # Roughly what a BPE tokenizer would say for English text.
    return len(_TOKEN.findall(text))


def _messages(prepared: PreparedRequest) -> list[dict[str, Any]]:
    messages = prepared.messages
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def answer(prepared: PreparedRequest) -> str:
    """The echo model's reply: the last user message's text."""
    for message in reversed(_messages(prepared)):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _usage(prepared: PreparedRequest, reply: str) -> dict[str, int]:
    # Each message costs a few tokens of chat framing, as with real chat models.
    prompt = sum(_count_tokens(_text(m.get("content"))) + 4 for m in _messages(prepared)) + 3
    completion = max(_count_tokens(reply), 1)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _id(prepared: PreparedRequest, reply: str) -> str:
    digest = hashlib.sha256(f"{len(_messages(prepared))}:{reply}".encode()).hexdigest()
    return "chatcmpl-echo-" + digest[:24]


class EchoUpstream:
    """The offline model behind the same interface as the real upstream paths."""

    def __init__(self, model: str) -> None:
        self.model = model

    def secrets(self) -> list[str]:
        """The offline model holds no credentials."""
        return []

    async def complete(
        self, prepared: PreparedRequest, record: Callable[[Any], None]
    ) -> dict[str, Any]:
        """A whole completion."""
        await trio.lowlevel.checkpoint()
        reply = answer(prepared)
        usage = _usage(prepared, reply)
        record(usage)
        return {
            "id": _id(prepared, reply),
            "object": "chat.completion",
            "created": _CREATED,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        """The reply one word per chunk, then the finish reason, then usage."""
        reply = answer(prepared)
        chunk_id = _id(prepared, reply)

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": _CREATED,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        for piece in re.findall(r"\S+\s*|\s+", reply) or [""]:
            await trio.lowlevel.checkpoint()
            yield chunk({"role": "assistant", "content": piece}, None)
        yield chunk({}, "stop")
        yield {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": _CREATED,
            "model": self.model,
            "choices": [],
            "usage": _usage(prepared, reply),
        }
