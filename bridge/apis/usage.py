"""One ledger across the three APIs: each dialect's ``usage`` normalized to a
:class:`~bridge.usage.CallUsage` (docs/bridge.md, "Usage accounting").

The normalized record follows the OpenAI convention: ``prompt_tokens`` counts *every* input
token, cached ones included, so a rollout's ``tokens`` and ``max_context_tokens`` mean the same
whatever API it used. Chat Completions and Responses report that way already
(:meth:`CallUsage.from_json` reads both); Anthropic's ``input_tokens`` excludes the tokens read
from or written to its cache, which are added back here.
"""

from __future__ import annotations

from typing import Any

from bridge.apis import Api
from bridge.usage import CallUsage, token_count


def _int(value: Any) -> int:
    return token_count(value) or 0


def from_messages(usage: Any) -> CallUsage:
    """An Anthropic ``usage`` object, normalized."""
    if not isinstance(usage, dict):
        return CallUsage(reported=False)
    read = _int(usage.get("cache_read_input_tokens"))
    written = _int(usage.get("cache_creation_input_tokens"))
    prompt = _int(usage.get("input_tokens")) + read + written
    completion = _int(usage.get("output_tokens"))
    details = usage.get("output_tokens_details")
    thinking = details.get("thinking_tokens") if isinstance(details, dict) else None
    return CallUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cached_tokens=read if "cache_read_input_tokens" in usage else None,
        reasoning_tokens=_int(thinking) if thinking is not None else None,
        cache_write_tokens=written if "cache_creation_input_tokens" in usage else None,
    )


def normalize(api: Api, usage: Any) -> CallUsage:
    """``usage`` as reported on ``api``'s wire, normalized."""
    if api == "messages":
        return from_messages(usage)
    return CallUsage.from_json(usage)


class StreamedMessagesUsage:
    """The usage of a streamed Messages answer: ``message_start`` gives the first values,
    then each ``message_delta`` replaces the fields it carries (running totals, never added)."""

    def __init__(self) -> None:
        self.usage: dict[str, Any] = {}
        self.seen = False

    def event(self, data: dict[str, Any]) -> None:
        """Take the usage of one Messages stream event, if it carries any."""
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
        elif kind == "message_delta":
            usage = data.get("usage")
        else:
            return
        if isinstance(usage, dict):
            self.seen = True
            self.usage.update({k: v for k, v in usage.items() if v is not None})

    def call(self) -> CallUsage:
        """The normalized usage so far."""
        return from_messages(self.usage)
