"""The LiteLLM upstream path, for providers that need translation (docs/spec/bridge.md §6.2, §6.3)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx

from bridge.errors import BridgeRequestError, UpstreamError
from bridge.policy import PreparedRequest
from bridge.retry import ProviderFault, status_fault
from bridge.upstreams._loop import LiteLLMWorker, worker
from bridge.upstreams.routing import OFFICIAL_OPENAI_BASE, openai_base


@dataclass(frozen=True)
class Classification:
    """How LiteLLM sees the configured model."""

    provider: str
    resolved_model: str
    wire: bool
    """True when the upstream speaks the OpenAI chat API: parameters travel verbatim in
    ``extra_body`` instead of being translated."""
    native_claude: bool


class InvalidModel(ValueError):
    """LiteLLM cannot tell which provider a model string names."""


def _classify(litellm: ModuleType, model: str) -> Classification:
    try:
        resolved, provider, _, _ = litellm.get_llm_provider(model=model)
    except Exception as exc:
        raise InvalidModel(getattr(exc, "message", None) or str(exc)) from exc
    native_claude = provider in ("azure_ai", "vertex_ai") and "claude" in resolved
    wire = not native_claude and (
        provider == "openrouter"
        or provider in litellm.constants.openai_compatible_providers
        or (provider == "openai" and openai_base() != OFFICIAL_OPENAI_BASE)
    )
    return Classification(provider, resolved, wire, native_claude)


def _kwargs(
    model: str, how: Classification, prepared: PreparedRequest, stream: bool
) -> dict[str, Any]:
    # max_retries=0: the OpenAI SDK under LiteLLM would otherwise retry 429/5xx twice on its
    # own; retries are the bridge's (bridge/retry.py), counted and bounded in one place.
    kw: dict[str, Any] = {
        "model": model,
        "messages": prepared.messages,
        "drop_params": False,
        "max_retries": 0,
    }
    params = dict(prepared.params)
    if how.wire:
        if params:
            kw["extra_body"] = params
    else:
        if "metadata" in params:
            metadata = params.pop("metadata")
            if how.provider in ("openai", "azure"):
                kw["extra_body"] = {"metadata": metadata}
            elif how.provider == "anthropic" or how.native_claude:
                if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
                    raise BridgeRequestError("Anthropic metadata supports only user_id")
                kw["metadata"] = metadata
            else:
                raise BridgeRequestError(
                    f"LiteLLM cannot forward metadata to {how.provider}; "
                    "use its provider-specific parameter"
                )
        kw.update(params)
    if stream:
        kw["stream"] = True
        kw["stream_options"] = {"include_usage": True}
    return kw


def _dump(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_none=False)
    if hasattr(obj, "json") and callable(obj.json):
        return obj.json()
    return obj


def to_upstream_error(exc: BaseException) -> UpstreamError | BridgeRequestError:
    """Map a LiteLLM (or SDK) exception onto the bridge's errors (docs/spec/bridge.md §12)."""
    if isinstance(exc, UpstreamError | BridgeRequestError):
        return exc
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    headers = _headers(exc)
    seen: set[int] = set()
    cause: BaseException | None = exc
    lost: httpx.TransportError | None = None
    broke_off = False
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        broke_off = broke_off or _broke_off(cause)
        if isinstance(cause, httpx.TransportError) and lost is None:
            lost = cause
        if isinstance(cause, httpx.HTTPStatusError):
            lost, broke_off = None, False
            status = cause.response.status_code
            headers = cause.response.headers
            try:
                text = cause.response.text
            except httpx.ResponseNotRead:
                text = ""
            if text.strip():
                message = text
            break
        cause = cause.__cause__ or cause.__context__
    if type(exc).__name__ == "Timeout":
        status = 408
    elif broke_off or (lost is not None and not isinstance(lost, httpx.TimeoutException)):
        # LiteLLM calls a failed exchange a 500 of its own: the provider answered no status.
        # Lost before an answer, it may be made again; broken off while arriving, it is billed.
        if broke_off:
            return UpstreamError(
                502, f"the provider's answer broke off: {message}", kind="APIConnectionError"
            )
        return ProviderFault(
            502, f"could not reach the provider: {message}", kind="APIConnectionError"
        )
    if not isinstance(status, int) or isinstance(status, bool):
        status = 500
    return status_fault(status, str(message), headers, kind=type(exc).__name__)


# How a body that broke off while arriving shows in LiteLLM's cause chain: aiohttp's
# payload errors (its default transport), httpx's incomplete body, LiteLLM's stream that ended
# before a finish reason. Named, not imported: aiohttp is LiteLLM's dependency, not ours.
_BROKE_OFF_TYPES = frozenset(
    {"ClientPayloadError", "ContentLengthError", "TransferEncodingError", "MidStreamFallbackError"}
)
_BROKE_OFF_TEXT = ("complete message body", "incomplete chunked read")


def _broke_off(exc: BaseException) -> bool:
    if type(exc).__name__ in _BROKE_OFF_TYPES:
        return True
    return isinstance(exc, httpx.RemoteProtocolError) and any(
        text in str(exc) for text in _BROKE_OFF_TEXT
    )


def _headers(exc: BaseException) -> httpx.Headers | None:
    """The provider's answer headers as LiteLLM kept them (for its ``Retry-After`` and request
    id): the exception's ``litellm_response_headers``, else its ``response``'s."""
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if isinstance(headers, httpx.Headers | dict) and headers:
            return httpx.Headers(headers)
    return None


class LiteLLMUpstream:
    """Calls the configured model through ``litellm.acompletion`` on the worker loop."""

    def __init__(self, model: str, litellm_worker: LiteLLMWorker | None = None) -> None:
        self.model = model
        self._worker = litellm_worker or worker()
        self._how: Classification | None = None

    def warm(self) -> None:
        """Start importing LiteLLM in the background."""
        self._worker.start()

    def secrets(self) -> list[str]:
        """LiteLLM reads its credentials from secret-named environment variables, which the
        redactor scrubs anyway."""
        return []

    async def _classification(self) -> Classification:
        # Cached. A model string LiteLLM cannot parse is a 400 whose cause is the InvalidModel
        # (preflight reports it in its own words).
        if self._how is None:
            try:
                self._how = await self._worker.call(lambda litellm: _classify(litellm, self.model))
            except InvalidModel as exc:
                raise UpstreamError(400, str(exc), kind="BadRequestError") from exc
        return self._how

    async def complete(
        self, prepared: PreparedRequest, record: Callable[[Any], None]
    ) -> dict[str, Any]:
        """One non-streaming call. ``record`` runs on the loop thread as soon as it returns."""
        kw = _kwargs(self.model, await self._classification(), prepared, stream=False)

        async def call(litellm: ModuleType) -> Any:
            response = _dump(await litellm.acompletion(**kw))
            record(response.get("usage") if isinstance(response, dict) else None)
            return response

        try:
            data = await self._worker.run(call)
        except Exception as exc:
            raise to_upstream_error(exc) from exc
        if not isinstance(data, dict):
            raise UpstreamError(502, "LiteLLM returned something that is not a completion")
        return data

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Relay LiteLLM's stream chunks as plain dicts."""
        kw = _kwargs(self.model, await self._classification(), prepared, stream=True)

        async def open_stream(litellm: ModuleType) -> AsyncGenerator[Any, None]:
            response = await litellm.acompletion(**kw)

            async def items() -> AsyncGenerator[Any, None]:
                async for chunk in response:
                    yield _dump(chunk)

            return items()

        chunks = self._worker.stream(open_stream)
        try:
            async for chunk in chunks:
                if isinstance(chunk, dict):
                    yield chunk
        except Exception as exc:
            raise to_upstream_error(exc) from exc
        finally:
            await chunks.aclose()
