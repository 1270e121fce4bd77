"""Where the bridge sends a call: the offline echo model, an OpenAI-compatible upstream called
directly, or LiteLLM on its own asyncio loop thread.

:func:`make_upstream` is the one place that chooses. Each path's module is imported only when
that path is chosen: LiteLLM itself is imported (on its own thread) only by the LiteLLM path.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, Protocol

from bridge.policy import PreparedRequest
from bridge.upstreams.routing import path_kind

if TYPE_CHECKING:
    import httpx

    from bridge.upstreams.direct import LazyClient


class Upstream(Protocol):
    """One way of reaching the configured model."""

    model: str
    """The configured model string."""

    def secrets(self) -> list[str]:
        """The credentials this path sends, for redaction."""
        ...

    async def complete(
        self, prepared: PreparedRequest, record: Callable[[Any], None]
    ) -> dict[str, Any]:
        """One non-streaming call; ``record`` gets the provider's usage as soon as it answers."""
        ...

    def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        """The raw chunks of one streaming call (a whole completion if the provider did not
        stream)."""
        ...


def make_upstream(
    model: str, client: LazyClient | httpx.AsyncClient, *, via_litellm: bool
) -> Upstream:
    """The upstream path for ``model``; ``client`` is the bridge's pooled client (direct path):
    a :class:`~bridge.upstreams.direct.LazyClient`, or :func:`~bridge.upstreams.direct.new_client`'s.

    ``via_litellm`` sends a model the direct path could serve through LiteLLM instead
    (diagnostics, benchmarks). The LiteLLM path starts importing LiteLLM at once.
    """
    kind = path_kind(model)
    if kind == "echo":
        from bridge.upstreams.echo import EchoUpstream

        return EchoUpstream(model)
    if kind == "direct" and not via_litellm:
        from bridge.upstreams.responses_only import ResponsesOnlyUpstream, responses_only

        if responses_only(model):
            # Served only by OpenAI's Responses API: chat calls are carried through it.
            return ResponsesOnlyUpstream(model, client)
        from bridge.upstreams.direct import DirectUpstream

        return DirectUpstream(model, client)
    from bridge.upstreams.litellm import LiteLLMUpstream

    upstream = LiteLLMUpstream(model)
    upstream.warm()
    return upstream


__all__ = ["Upstream", "make_upstream"]
