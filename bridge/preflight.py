"""Model preflight: one probe call before a run dispatches anything (docs/spec/supervisor.md §2.8, docs/spec/bridge.md §13)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from bridge.errors import PreflightError, UpstreamError
from bridge.policy import PreparedRequest
from bridge.scrub import ErrorScrubber
from rollout_server.net.secrets import is_secret_env_name

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


# Where a provider's credentials live when their names do not start with the provider's own
# name in capitals (``openai/...`` reads ``OPENAI_API_KEY``, ``anthropic/...`` ``ANTHROPIC_*``).
_CREDENTIAL_PREFIXES = {
    "openrouter": ("OPENROUTER_", "OR_"),
    "bedrock": ("AWS_",),
    "sagemaker": ("AWS_",),
    "vertex_ai": ("VERTEXAI_", "VERTEX_"),
    "gemini": ("GEMINI_", "GOOGLE_"),
    "together_ai": ("TOGETHER_", "TOGETHERAI_"),
    "fireworks_ai": ("FIREWORKS_",),
    "huggingface": ("HUGGINGFACE_", "HF_"),
}


def _ignore(_: Any) -> None:
    """Preflight usage belongs to no rollout."""


def non_ascii_credential(model: str, environ: Mapping[str, str]) -> str | None:
    """The name of a credential variable of ``model``'s provider whose value is not ASCII.

    HTTP headers carry keys as ASCII, so such a key fails every call, and fails it before the
    provider sees it, with an encoding error that does not say which variable is wrong; a
    pasted typographic quote or a non-breaking space is the usual cause. Only the provider's
    own secret-named variables are looked at (others may hold anything).
    """
    provider = model.split("/", 1)[0].lower() if "/" in model else ""
    if not provider:
        return None
    prefixes = _CREDENTIAL_PREFIXES.get(provider, (provider.upper() + "_",))
    for name in sorted(environ):
        if name.startswith(prefixes) and is_secret_env_name(name) and not environ[name].isascii():
            return name
    return None


async def preflight(model: str, *, redact: Callable[[str], str] | None = None) -> str | None:
    """Probe ``model`` once through the same path the bridge will use.

    Returns None on success, a warning text for a failure that does not stop the run, and
    raises :class:`PreflightError` (``model preflight failed for '<model>': <ExcName>: <msg>``)
    for a fatal one. A provider key that is not ASCII is fatal before any call is made (the
    message names the variable, never its value).
    """
    bad = non_ascii_credential(model, os.environ)
    if bad is not None:
        raise PreflightError(
            f"model preflight failed for '{model}': {bad} contains non-ASCII characters, so no "
            "request can carry it (often a pasted typographic quote or non-breaking space); "
            f"set {bad} to the key exactly as the provider issued it"
        )
    from bridge.upstreams import make_upstream
    from bridge.upstreams.direct import LazyClient

    client = LazyClient()
    try:
        upstream = make_upstream(model, client, via_litellm=False)
        scrubber = ErrorScrubber(upstream.secrets(), extra=redact)
        try:
            await upstream.complete(_PROBE, _ignore)
        except Exception as exc:
            return _verdict(model, exc, scrubber)
    finally:
        await client.aclose()
    return None


def _verdict(model: str, exc: Exception, scrubber: ErrorScrubber) -> str | None:
    """What a failed probe means for the run (see :func:`preflight`)."""
    # Only a failure can have come from the LiteLLM path, so only a failure imports it.
    from bridge.upstreams.litellm import InvalidModel, to_upstream_error

    if isinstance(exc.__cause__, InvalidModel):
        message = INVALID_FORMAT.format(model=model, details=scrubber(str(exc.__cause__)))
        raise PreflightError(
            f"model preflight failed for '{model}': RuntimeError: {message}"
        ) from exc.__cause__
    error = exc if isinstance(exc, UpstreamError) else to_upstream_error(exc)
    name = getattr(error, "kind", type(exc).__name__)
    message = scrubber(error.message)
    if name in TOLERATED:
        return None
    if name in FATAL:
        raise PreflightError(f"model preflight failed for '{model}': {name}: {message}") from exc
    return f"Preflight non-fatal error: {name}: {message}"
