"""The Responses and Anthropic Messages APIs on the bridge, beside Chat Completions.

One rollout URL (``<base>/v1/rollouts/<id>``) serves all three APIs (docs/bridge.md, "Three
APIs"). Each API has a policy stated as data (:mod:`bridge.apis.policy`), translators to and
from Chat Completions (:mod:`bridge.apis.responses`, :mod:`bridge.apis.messages`) so that every
chat upstream (the echo model, the direct path, LiteLLM) answers it, a native pass-through where
the upstream speaks the API itself (:mod:`bridge.apis.native`), and errors in the caller's shape
(:mod:`bridge.apis.errors`). :mod:`bridge.apis.serve` is the HTTP side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Api = Literal["chat", "responses", "messages"]
"""The three request dialects the bridge speaks."""

MODES = ("auto", "native", "translate")
"""How a Responses or Messages call reaches the model (:func:`bridge.apis.native.native_api`)."""


@dataclass(frozen=True)
class ApiOptions:
    """The eval config's say on the Responses and Messages routes (``[bridge]``)."""

    hosted_tools: tuple[str, ...] = ()
    """Provider-run tool types granted (``web_search``…); none by default."""
    responses: str = "auto"
    """``auto`` | ``native`` | ``translate``: how Responses calls reach an ``openai/…`` model."""
    messages: str = "auto"
    """``auto`` | ``native`` | ``translate``: how Messages calls reach an ``anthropic/…`` model."""


__all__ = ["MODES", "Api", "ApiOptions"]
