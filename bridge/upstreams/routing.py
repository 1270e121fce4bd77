"""Which upstream path serves a model, and where its credentials come from.

Upstreams that speak the OpenAI chat API are called directly; their base URL and key come from
the same environment variables LiteLLM reads, in LiteLLM's order, so a user's
``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` / ``OPENROUTER_API_KEY`` work unchanged. Everything
else goes through LiteLLM.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from bridge.errors import UpstreamError

#: The built-in offline model (see :mod:`bridge.upstreams.echo`).
OFFLINE_MODEL = "rollbridge/echo"

OFFICIAL_OPENAI_BASE = "https://api.openai.com/v1"
"""OpenAI's own API; any other ``openai/…`` base is an OpenAI-compatible server."""
_OPENROUTER_BASE = "https://openrouter.ai/api/v1"

PathKind = Literal["echo", "direct", "litellm"]

_DIRECT_PREFIXES = ("openai/", "openrouter/", "hosted_vllm/")
_EXAMPLE = "write provider/model, for example openai/gpt-4o-mini"


def model_problem(model: str) -> str | None:
    """Why ``model`` names no model any path could call, as a sentence that names it; None
    when it may be called.

    Empty names and empty parts (``openai/``) would reach LiteLLM, which reports them as a
    missing key or a wall of text; a ``rollbridge/`` name other than :data:`OFFLINE_MODEL`
    is not a model at all.
    """
    if not model.strip():
        return f"the model name is empty; {_EXAMPLE} (or {OFFLINE_MODEL}, which needs no key)"
    if model.endswith("/"):
        return f"'{model}' names no model after the provider; {_EXAMPLE}"
    if model.startswith("/"):
        return f"'{model}' names no provider before the model; {_EXAMPLE}"
    if "//" in model:
        return f"'{model}' has an empty name between two slashes; {_EXAMPLE}"
    if model.startswith("rollbridge/") and model != OFFLINE_MODEL:
        return (
            f"'{model}' is not a model: the only rollbridge/ model is {OFFLINE_MODEL} "
            "(offline, no key)"
        )
    return None


def path_kind(model: str) -> PathKind:
    """The upstream path for a configured model string."""
    if model == OFFLINE_MODEL:
        return "echo"
    if model.startswith(_DIRECT_PREFIXES) and model.split("/", 1)[1]:
        return "direct"
    return "litellm"


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def openai_base() -> str:
    """The base URL ``openai/…`` models are sent to, without a trailing slash."""
    return (_env("OPENAI_BASE_URL", "OPENAI_API_BASE") or "").rstrip("/") or OFFICIAL_OPENAI_BASE


@dataclass(frozen=True)
class DirectRoute:
    """Where and how to send one direct call, resolved from the environment at call time."""

    provider: str
    upstream_model: str
    url: str
    headers: dict[str, str]
    extra_params: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None


def resolve_direct(model: str) -> DirectRoute:
    """Resolve a direct-path model (``openai/…``, ``openrouter/…``, ``hosted_vllm/…``).

    Raises :class:`UpstreamError` when a required credential or base URL is not set.
    """
    provider, upstream_model = model.split("/", 1)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    extra: dict[str, Any] = {}
    if provider == "openai":
        base = openai_base()
        key = _env("OPENAI_API_KEY")
        if not key:
            raise missing_key("OPENAI_API_KEY", model)
        organization = _env("OPENAI_ORGANIZATION")
        if organization:
            headers["OpenAI-Organization"] = organization
    elif provider == "openrouter":
        base = _env("OPENROUTER_API_BASE") or _OPENROUTER_BASE
        key = _env("OPENROUTER_API_KEY", "OR_API_KEY")
        if not key:
            raise missing_key("OPENROUTER_API_KEY", model)
        site = _env("OR_SITE_URL")
        if site:
            headers["HTTP-Referer"] = site
        headers["X-Title"] = _env("OR_APP_NAME") or "rollbridge"
        # As LiteLLM does: ask OpenRouter for its full usage accounting.
        extra["usage"] = {"include": True}
    else:
        base = _env("HOSTED_VLLM_API_BASE") or ""
        if not base:
            raise UpstreamError(
                500,
                f"HOSTED_VLLM_API_BASE is not set; export the vLLM server's base URL "
                f"(for example http://127.0.0.1:8000/v1) to use '{model}'",
                kind="AuthenticationError",
            )
        # vLLM needs no key unless it was started with one.
        key = _env("HOSTED_VLLM_API_KEY") or "fake-api-key"
    headers["Authorization"] = f"Bearer {key}"
    return DirectRoute(
        provider=provider,
        upstream_model=upstream_model,
        url=base.rstrip("/") + "/chat/completions",
        headers=headers,
        extra_params=extra,
        api_key=key,
    )


def missing_key(variable: str, model: str) -> UpstreamError:
    """The error for ``model``'s unset key ``variable``.

    LiteLLM reports a missing key as a 500 (so a rollout sees 502); this one is an
    authentication failure, so the preflight stops the run before any work is dispatched.
    """
    return UpstreamError(
        500,
        f"{variable} is not set; export it or put it in --secrets-file to use '{model}'",
        kind="AuthenticationError",
    )
