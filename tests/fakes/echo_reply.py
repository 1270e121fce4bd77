"""What the lean fake upstream answers a chat call with: pure functions, no I/O.

The rules are tests/fakes/upstream.py's (FakeUpstream's): the reply is ``"echo: "`` + the text
of the last user message (a string content, or the ``text`` of each part of a list content,
joined by spaces); prompt tokens are the whitespace-separated words of every message's content
(at least 1 when ``messages`` is a list, 0 otherwise), completion tokens the words of the reply;
a streamed answer is one SSE event per space-separated word of the reply (the first with
``role``), a finish event, a usage event when ``stream_options.include_usage`` is set, then
``[DONE]``. Bodies are encoded by msgspec (compact JSON, the same values).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = [
    "completion",
    "content_text",
    "encode",
    "error",
    "events",
    "last_user_text",
    "prompt_words",
    "reply_text",
    "usage",
]

CREATED: Final = 1_700_000_000
encode: Final = msgspec.json.Encoder().encode


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def last_user_text(messages: Any) -> str:
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return content_text(message.get("content"))
    return ""


def prompt_words(messages: Any) -> int:
    if not isinstance(messages, list):
        return 0
    words = sum(
        len(content_text(message.get("content")).split())
        for message in messages
        if isinstance(message, dict)
    )
    return max(words, 1)


def reply_text(request: dict[str, Any]) -> str:
    """The reply to ``request``: ``"echo: "`` and the last user message's text."""
    return "echo: " + last_user_text(request.get("messages"))


def usage(request: dict[str, Any], text: str) -> dict[str, int]:
    """The ``usage`` of the reply ``text`` to ``request``."""
    prompt = prompt_words(request.get("messages"))
    words = len(text.split())
    return {"prompt_tokens": prompt, "completion_tokens": words, "total_tokens": prompt + words}


def completion(model: str, text: str, tokens: dict[str, int]) -> bytes:
    """The body of a non-streamed answer."""
    return encode(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": tokens,
        }
    )


def _event(model: str, choices: list[Any], tokens: dict[str, int] | None = None) -> bytes:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": choices,
    }
    if tokens is not None:
        chunk["usage"] = tokens
    return b"data: " + encode(chunk) + b"\n\n"


def events(request: dict[str, Any], model: str, text: str, tokens: dict[str, int]) -> list[bytes]:
    """The SSE events of a streamed answer: one per word, the finish, the usage, ``[DONE]``."""
    out = []
    for i, word in enumerate(text.split(" ")):
        delta = {"role": "assistant", "content": word} if i == 0 else {"content": " " + word}
        out.append(_event(model, [{"index": 0, "delta": delta, "finish_reason": None}]))
    out.append(_event(model, [{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        out.append(_event(model, [], tokens))
    out.append(b"data: [DONE]\n\n")
    return out


def error(message: str) -> bytes:
    """An OpenAI-style error body."""
    return encode({"error": {"message": message}})
