"""Reading a streamed chat chunk, for the translators that turn chunks into Responses and
Messages events (:mod:`bridge.apis.responses_stream`, :mod:`bridge.apis.messages`)."""

from __future__ import annotations

from typing import Any


def first_choice(chunk: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A chunk's first choice and that choice's ``delta`` (``{}`` when absent), or ``None``
    for a chunk without choices (a usage-only chunk); only the first choice is translated."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    return choice, choice.get("delta") or {}
