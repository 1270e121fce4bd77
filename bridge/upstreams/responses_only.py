"""OpenAI models served only by the Responses API, reached from the chat route through it.

:func:`responses_only` says which models: those LiteLLM's model map (read from the installed
LiteLLM's JSON, without importing LiteLLM) lists with mode ``responses`` for OpenAI (``o1-pro``,
``gpt-5-pro``, the ``…-codex`` family…), as the reference routes them. :class:`ResponsesOnlyUpstream`
is the direct path for them: each chat call is carried to ``<base>/responses`` by
:mod:`bridge.apis.chat_responses` and its answer carried back, streamed or not.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from bridge.apis.chat_responses import ChunkStream, to_completion, to_responses
from bridge.codec import dumps, loads
from bridge.errors import UpstreamError
from bridge.policy import PreparedRequest
from bridge.upstreams.routing import resolve_direct

if TYPE_CHECKING:
    import httpx

    from bridge.upstreams.direct import LazyClient

_MAP = "model_prices_and_context_window_backup.json"


class _Entry(msgspec.Struct):
    """The two fields read of a model map entry (msgspec skips the rest: ~10 ms for the map)."""

    mode: str | None = None
    litellm_provider: str | None = None


@lru_cache(maxsize=1)
def _responses_models() -> frozenset[str]:
    spec = importlib.util.find_spec("litellm")  # finds the package; imports nothing
    if spec is None or spec.origin is None:
        return frozenset()
    decoder = msgspec.json.Decoder(dict[str, _Entry])
    try:
        table = decoder.decode((Path(spec.origin).parent / _MAP).read_bytes())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(
        name.removeprefix("openai/")
        for name, entry in table.items()
        if entry.mode == "responses" and entry.litellm_provider == "openai"
    )


def responses_only(model: str) -> bool:
    """Whether ``openai/<name>`` is a model OpenAI serves only through the Responses API."""
    provider, _, name = model.partition("/")
    return provider == "openai" and name in _responses_models()


class ResponsesOnlyUpstream:
    """Chat calls to a Responses-only OpenAI model, through ``<base>/responses``."""

    def __init__(self, model: str, client: LazyClient | httpx.AsyncClient) -> None:
        self.model = model
        from bridge.upstreams.direct import LazyClient

        self._http: Callable[[], httpx.AsyncClient] = (
            client.http if isinstance(client, LazyClient) else (lambda: client)
        )

    def secrets(self) -> list[str]:
        """The credential this path sends, for redaction."""
        try:
            key = resolve_direct(self.model).api_key
        except UpstreamError:
            return []
        return [key] if key else []

    def _request(
        self, prepared: PreparedRequest, stream: bool
    ) -> tuple[str, dict[str, str], bytes]:
        route = resolve_direct(self.model)
        url = route.url.removesuffix("/chat/completions") + "/responses"
        body = to_responses(prepared, route.upstream_model, stream=stream)
        return url, route.headers, dumps(body)

    async def complete(
        self, prepared: PreparedRequest, record: Callable[[Any], None]
    ) -> dict[str, Any]:
        """One non-streaming call, answered as a chat completion."""
        from bridge.apis.native import NativeRoute, call

        url, headers, content = self._request(prepared, False)
        route = NativeRoute(url, headers, "", "")
        # `call` hands its own normalized usage to a callback; the chat route's `record` takes
        # the provider's usage object, which it normalizes itself (Responses shape included).
        response = await call(self._http(), "responses", route, content, "", _ignore)
        record(response.get("usage"))
        return to_completion(response)

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        """The Responses events of one streamed call, as chat chunks."""
        from bridge.apis.native import NativeRoute, NativeStream, stream

        url, headers, content = self._request(prepared, True)
        chunks = ChunkStream()
        relay = NativeStream("responses", "")
        frames = stream(self._http(), NativeRoute(url, headers, "", ""), content, relay)
        async with aclosing(frames) as events:
            async for frame in events:
                data = _data(frame)
                if data is not None:
                    for chunk in chunks.event(data):
                        yield chunk


def _ignore(_: Any) -> None:
    pass


def _data(frame: bytes) -> dict[str, Any] | None:
    for line in frame.decode("utf-8", "replace").splitlines():
        if line.startswith("data: "):
            try:
                parsed = loads(line[6:])
            except ValueError:
                return None
            return parsed if isinstance(parsed, dict) else None
    return None
