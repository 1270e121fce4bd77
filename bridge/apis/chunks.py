"""Reading a streamed chat chunk, for the translators that turn chunks into Responses and
Messages events (:mod:`bridge.apis.responses_stream`, :mod:`bridge.apis.messages`)."""

from __future__ import annotations

from typing import Any


def first_choice(chunk: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """A chunk's first choice, that choice's ``delta`` (``{}`` when absent) and the delta's
    text (``""`` when it has none), or ``None`` for a chunk without choices (a usage-only
    chunk); only the first choice is translated."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    delta = choice.get("delta") or {}
    text = delta.get("content")
    return choice, delta, text if isinstance(text, str) else ""
