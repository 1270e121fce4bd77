"""The built-in offline model ``rollbridge/echo``: no network, no key, deterministic.

It answers with the text of the last user message, so a rollout's behaviour is predictable
in demos and tests; tool calls, JSON modes and logprobs follow the rules of
:mod:`bridge.upstreams.echo_plan`. Usage is counted with a crude word-and-punctuation tokenizer so the
numbers look like a real provider's (a few tokens per sentence, growing with the history).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncGenerator, Callable
from typing import Any

import trio

from bridge.policy import PreparedRequest
from bridge.upstreams.echo_plan import Plan, logprobs, pieces, plan, text_of

_TOKEN = re.compile(r"\w+|[^\w\s]")
_CREATED = 1_700_000_000


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
            return text_of(message.get("content"))
    return ""


def prompt_tokens(prepared: PreparedRequest) -> int:
    """The prompt tokens the echo model counts for a request."""
    # Each message costs a few tokens of chat framing, as with real chat models.
    return sum(_count_tokens(text_of(m.get("content"))) + 4 for m in _messages(prepared)) + 3


def _usage(prepared: PreparedRequest, reply: str) -> dict[str, int]:
    prompt = prompt_tokens(prepared)
    completion = max(_count_tokens(reply), 1)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _id(prepared: PreparedRequest, reply: str) -> str:
    digest = hashlib.sha256(f"{len(_messages(prepared))}:{reply}".encode()).hexdigest()
    return "chatcmpl-echo-" + digest[:24]


def _plan(prepared: PreparedRequest) -> Plan:
    return plan(_messages(prepared), prepared.params)


def _spoken(answer: Plan) -> str:
    """What the completion tokens are counted on: the text, or the calls' names and arguments."""
    return answer.text + " ".join(f"{name} {args}" for _, name, args in answer.calls)


def _logprobs_wanted(prepared: PreparedRequest) -> int | None:
    """How many alternatives per token (``top_logprobs``) when logprobs are asked for, else None."""
    if not prepared.params.get("logprobs"):
        return None
    top = prepared.params.get("top_logprobs")
    return top if isinstance(top, int) and not isinstance(top, bool) and top > 0 else 1


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
        answer = _plan(prepared)
        usage = _usage(prepared, _spoken(answer))
        record(usage)
        message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
        if answer.calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, n, a in answer.calls
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": answer.finish_reason,
        }
        top = _logprobs_wanted(prepared)
        if top is not None:
            choice["logprobs"] = {"content": logprobs(answer.text, top)}
        return {
            "id": _id(prepared, _spoken(answer)),
            "object": "chat.completion",
            "created": _CREATED,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        """The reply one word per chunk (a tool call: its name, then its arguments in pieces),
        then the finish reason, then usage."""
        answer = _plan(prepared)
        chunk_id = _id(prepared, _spoken(answer))
        top = _logprobs_wanted(prepared)

        def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> dict[str, Any]:
            return {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": _CREATED,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}],
            }

        if answer.text or not answer.calls:
            for piece in pieces(answer.text) or [""]:
                await trio.lowlevel.checkpoint()
                extra = {} if top is None else {"logprobs": {"content": logprobs(piece, top)}}
                yield chunk({"role": "assistant", "content": piece}, None, **extra)
        for n, (call_id, name, arguments) in enumerate(answer.calls):
            await trio.lowlevel.checkpoint()
            start = {
                "index": n,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            yield chunk({"role": "assistant", "tool_calls": [start]}, None)
            for piece in re.findall(r".{1,16}", arguments, re.S):
                await trio.lowlevel.checkpoint()
                part = {"index": n, "function": {"arguments": piece}}
                yield chunk({"tool_calls": [part]}, None)
        yield chunk({}, answer.finish_reason)
        yield {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": _CREATED,
            "model": self.model,
            "choices": [],
            "usage": _usage(prepared, _spoken(answer)),
        }
