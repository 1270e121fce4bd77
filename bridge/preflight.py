"""Model preflight: one probe call before a run dispatches anything (docs/spec/supervisor.md §2.8, docs/spec/bridge.md §13)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from bridge.calls import CallTrace
from bridge.errors import PreflightError, UpstreamError
from bridge.policy import PreparedRequest
from bridge.retry import ProviderFault, RetryPolicy, retrying
from bridge.scrub import ErrorScrubber
from bridge.upstreams.routing import missing_key, model_problem
from bridge.usage import CallUsage
from rollout_server.net.secrets import is_secret_env_name, names_a_file

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


#: Characters no HTTP header value may hold (a tab inside a key is no key either).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: How LiteLLM words a provider key that is not set when it reports it as a 500 (the OpenAI
#: SDK's "Missing credentials", older versions' "api_key client option must be set").
_MISSING_CREDENTIALS = re.compile(r"Missing credentials|api_key client option must be set")
_KEY_VARIABLE = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_API_KEY\b")


def unsendable_credential(model: str, environ: Mapping[str, str]) -> str | None:
    """Why a credential variable of ``model``'s provider cannot be sent, naming the variable
    (never its value): ``OPENAI_API_KEY contains non-ASCII characters, so ...``; None when
    every one can.

    HTTP headers carry keys as visible ASCII, so such a key fails every call, and fails it
    before the provider sees it, with an encoding or protocol error that does not say which
    variable is wrong. A pasted typographic quote or non-breaking space is the usual non-ASCII
    cause; a dotenv value that spans lines the usual control character. Only the provider's
    own secret-named variables are looked at (others may hold anything).
    """
    provider = model.split("/", 1)[0].lower() if "/" in model else ""
    if not provider:
        return None
    prefixes = _CREDENTIAL_PREFIXES.get(provider, (provider.upper() + "_",))
    for name in sorted(environ):
        value = environ[name]
        if not (name.startswith(prefixes) and is_secret_env_name(name)):
            continue
        if names_a_file(name, value):
            continue  # a file's path (GOOGLE_APPLICATION_CREDENTIALS), never sent as it is
        if not value.isascii():
            return (
                f"{name} contains non-ASCII characters, so no request can carry it (often a "
                f"pasted typographic quote or non-breaking space); set {name} to the key "
                "exactly as the provider issued it"
            )
        if _CONTROL.search(value):
            return (
                f"{name} contains a line break or other control character, so no request can "
                f"carry it (often a quoted value that spans lines in a dotenv file); set {name} "
                "to the key exactly as the provider issued it, on one line"
            )
    return None


def missing_credentials(model: str, fault: UpstreamError) -> UpstreamError | None:
    """The authentication failure ``fault`` is when it says that the provider's key is not
    set (which LiteLLM reports as a 500, a transient fault), else None: no retry can help,
    and the message is the direct path's own (:func:`bridge.upstreams.routing.missing_key`)."""
    if not _MISSING_CREDENTIALS.search(fault.message):
        return None
    variable = _KEY_VARIABLE.search(fault.message)
    return missing_key(variable.group() if variable else "the provider's API key", model)


class _Busy(Exception):
    """A 429 during the probe: the key works, so it is not retried (see :data:`TOLERATED`)."""


async def preflight(
    model: str,
    *,
    redact: Callable[[str], str] | None = None,
    retry: RetryPolicy | None = None,
    on_retry: Callable[[str], None] | None = None,
    on_call: Callable[[dict[str, Any]], None] | None = None,
) -> str | None:
    """Probe ``model`` through the same path the bridge will use.

    A transient fault (a 5xx, a connection that failed or was reset before an answer) is
    retried with ``retry``, by default the policy of the rollouts' calls, so one bad answer at
    start does not stop a run; ``on_retry`` is told of each retry (a line for the log), and
    ``on_call`` gets the probe's call record (its retries and their causes included).

    Returns None on success, a warning text for a failure that does not stop the run, and
    raises :class:`PreflightError` (``model preflight failed for '<model>': <ExcName>: <msg>``)
    for a fatal one. A model name that names no model (:func:`model_problem`) and a provider
    key no header can carry (:func:`unsendable_credential`) are fatal before any call is made
    (the message names the variable, never its value); so is a key LiteLLM reports missing,
    however it words it (:func:`missing_credentials`), without a retry. ``on_call`` gets the probe's call record
    (bridge.calls, ``kind`` "preflight"): it is billed like any call, to no rollout.
    """
    bad = model_problem(model) or unsendable_credential(model, os.environ)
    if bad is not None:
        raise PreflightError(f"model preflight failed for '{model}': {bad}")
    from bridge.upstreams import make_upstream
    from bridge.upstreams.direct import LazyClient

    attempts = 0

    def on_fault(fault: ProviderFault, again: bool) -> None:
        if again and on_retry is not None:
            on_retry(f"retrying the model preflight after a provider fault: {fault.kind}")

    client = LazyClient()
    try:
        upstream = make_upstream(model, client, via_litellm=False)
        scrubber = ErrorScrubber(upstream.secrets(), extra=redact)
        trace = CallTrace(
            None, api="chat.completions", model=upstream.model, stream=False, kind="preflight"
        )
        usage: list[CallUsage] = []

        def record(raw: Any) -> None:
            usage.append(CallUsage.from_json(raw))

        async def probe() -> dict[str, Any]:
            nonlocal attempts
            attempts += 1
            try:
                return await upstream.complete(_PROBE, record)
            except ProviderFault as fault:
                if fault.status == 429:
                    raise _Busy from fault
                missing = missing_credentials(model, fault)
                if missing is not None:
                    raise missing from fault
                raise

        def traced(fault: ProviderFault, again: bool) -> None:
            if again:
                trace.fault(fault.status, fault.kind, fault.request_id)
            on_fault(fault, again)

        def done(error: Exception | None = None) -> None:
            if on_call is not None:
                on_call(trace.finish(usage[-1] if usage else None, error))

        try:
            trace.answered(await retrying(probe, retry or RetryPolicy(), traced))
        except _Busy as busy:
            done(busy)
            return None
        except Exception as exc:
            done(exc)
            return _verdict(model, exc, scrubber, attempts)
        done()
    finally:
        await client.aclose()
    return None


def _verdict(model: str, exc: Exception, scrubber: ErrorScrubber, attempts: int = 1) -> str | None:
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
    if attempts > 1:
        message += f" (after {attempts} attempts)"
    if name in TOLERATED:
        return None
    if name in FATAL:
        raise PreflightError(f"model preflight failed for '{model}': {name}: {message}") from exc
    return f"Preflight non-fatal error: {name}: {message}"
