"""Model preflight: one probe call before a run dispatches anything (runner.md §2.8, bridge.md §13)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.errors import PreflightError, UpstreamError
from bridge.policy import PreparedRequest
from bridge.scrub import Redactor
from bridge.upstreams.routing import path_kind

#: Failures that stop the run: the configuration is wrong and every rollout would fail.
FATAL = frozenset(
    {
        "AuthenticationError",
        "BudgetExceededError",
        "NotFoundError",
        "UnsupportedParamsError",
        "APIConnectionError",
        "BadRequestError",
        "PermissionDeniedError",
        "UnprocessableEntityError",
    }
)
#: Treated as healthy: the key works, the provider is just busy.
TOLERATED = frozenset({"RateLimitError"})

_PROBE = PreparedRequest(messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 256})

INVALID_FORMAT = (
    "Invalid LiteLLM model format. Use 'provider/model' (e.g. openai/gpt-5-mini, "
    "anthropic/claude-sonnet-4-6). Received: '{model}'. Details: {details}"
)


def _ignore(_: Any) -> None:
    """Preflight usage belongs to no rollout."""


async def preflight(model: str, *, redact: Callable[[str], str] | None = None) -> str | None:
    """Probe ``model`` once through the same path the bridge will use.

    Returns None on success, a warning text for a failure that does not stop the run, and
    raises :class:`PreflightError` (``model preflight failed for '<model>': <ExcName>: <msg>``)
    for a fatal one.
    """
    from bridge.upstreams.direct import DirectUpstream, new_client
    from bridge.upstreams.echo import EchoUpstream
    from bridge.upstreams.litellm import InvalidModel, LiteLLMUpstream, to_upstream_error

    kind = path_kind(model)
    redactor = Redactor(extra=redact)
    try:
        if kind == "echo":
            await EchoUpstream(model).complete(_PROBE, _ignore)
        elif kind == "direct":
            async with new_client() as client:
                upstream = DirectUpstream(model, client)
                redactor = Redactor(upstream.secrets(), extra=redact)
                await upstream.complete(_PROBE, _ignore)
        else:
            litellm_upstream = LiteLLMUpstream(model)
            try:
                await litellm_upstream.classify()
            except InvalidModel as exc:
                message = INVALID_FORMAT.format(model=model, details=redactor(str(exc)))
                raise PreflightError(
                    f"model preflight failed for '{model}': RuntimeError: {message}"
                ) from exc
            await litellm_upstream.complete(_PROBE, _ignore)
    except PreflightError:
        raise
    except Exception as exc:
        error = exc if isinstance(exc, UpstreamError) else to_upstream_error(exc)
        name = getattr(error, "kind", type(exc).__name__)
        message = redactor(error.message)
        if name in TOLERATED:
            return None
        if name in FATAL:
            raise PreflightError(
                f"model preflight failed for '{model}': {name}: {message}"
            ) from exc
        return f"Preflight non-fatal error: {name}: {message}"
    return None
