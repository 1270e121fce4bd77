"""One judge call through the bridge's upstream paths: the offline model, an OpenAI-compatible
provider called directly, or LiteLLM for the rest, exactly as ``eval run`` reaches its model.

Transient provider faults (429, 5xx, a connection lost before any answer) are retried with
the bridge's policy (:mod:`bridge.retry`). A call never raises for a failure the user can cause or the provider can have: it returns a
:class:`Verdict` with the (redacted) error text, so the other calls carry on, as in the
reference tool (spec Part D.4, D.5).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import trio

from bridge.calls import CallTrace
from bridge.errors import BridgeError, UpstreamError
from bridge.policy import PreparedRequest
from bridge.retry import ProviderFault, RetryPolicy, retrying
from bridge.scrub import ErrorScrubber
from bridge.upstreams.routing import OFFLINE_MODEL
from bridge.usage import CallUsage
from launcher.rubric.provider import JudgeModel, VerdictError, parse_verdict, request_params

if TYPE_CHECKING:
    import httpx

    from bridge.upstreams import Upstream

__all__ = ["Judge", "Verdict", "total_usage"]

_TIMED_OUT = "the judge's request timed out"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one judge call: a score and explanation, or an error; and its usage."""

    score: float | None
    explanation: str | None
    error: str | None
    usage: CallUsage
    call: dict[str, Any] | None = None
    """The judge call's record (bridge.calls, ``kind`` "judge"; billed to no rollout)."""

    @classmethod
    def failed(cls, error: str, usage: CallUsage | None = None) -> Verdict:
        """A call that produced no score."""
        return cls(None, None, error, usage or CallUsage())


def _content(completion: dict[str, Any]) -> Any:
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message.get("content") if isinstance(message, dict) else None


class Judge:
    """Scores prepared judge prompts with one model."""

    def __init__(
        self,
        model: JudgeModel,
        client: httpx.AsyncClient,
        *,
        timeout: float | None,
        redact: Callable[[str], str] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        # Imported here so that loading the command costs nothing until a judge is made.
        from bridge.upstreams import make_upstream

        self.model = model
        self.timeout = timeout if timeout is not None else model.default_timeout()
        self._upstream: Upstream = make_upstream(model.route, client, via_litellm=False)
        self._scrub = ErrorScrubber(self._upstream.secrets(), extra=redact)
        self._params = request_params(model)
        self._retry = retry or RetryPolicy()
        self.retries = 0
        """Calls made again after a transient provider fault (429, 5xx, a lost connection)."""

    def _count_retry(self, _fault: ProviderFault, retried: bool) -> None:
        self.retries += retried

    def scrub(self, text: str) -> str:
        """``text`` with every credential this judge knows of removed (shape kept)."""
        return self._scrub.scrub(text)

    async def judge(
        self, messages: list[dict[str, str]], score_min: float, score_max: float
    ) -> Verdict:
        """Send ``messages`` once and read the verdict."""
        missing = self.model.missing_key(os.environ)
        if missing is not None:
            return Verdict.failed(missing)
        usage: list[CallUsage] = []
        prepared = PreparedRequest(messages=list(messages), params=dict(self._params))
        trace = CallTrace(
            None, api="chat.completions", model=self._upstream.model, stream=False, kind="judge"
        )

        def on_fault(fault: ProviderFault, retried: bool) -> None:
            self._count_retry(fault, retried)
            if retried:
                trace.fault(fault.status, fault.kind)

        async def attempt() -> dict[str, Any]:
            # The timeout bounds each attempt; a timed-out attempt is not retried (the
            # provider may be working on it, and billing it).
            with trio.move_on_after(self.timeout):
                return await self._upstream.complete(
                    prepared, lambda raw: usage.append(CallUsage.from_json(raw))
                )
            raise UpstreamError(408, _TIMED_OUT, kind="Timeout")

        try:
            completion = await retrying(attempt, self._retry, on_fault)
        except BridgeError as exc:
            failed = Verdict.failed(self._failure(exc), total_usage(usage))
            return replace(failed, call=trace.finish(total_usage(usage) if usage else None, exc))
        trace.answered(completion)
        call = trace.finish(total_usage(usage) if usage else None)
        try:
            verdict = parse_verdict(_content(completion), score_min, score_max)
        except VerdictError as exc:
            message = str(exc)
            if self.model.route == OFFLINE_MODEL:
                message += f" ({OFFLINE_MODEL} repeats the prompt back, so it cannot judge)"
            return replace(Verdict.failed(self._scrub(message), total_usage(usage)), call=call)
        return Verdict(
            verdict.score, self.scrub(verdict.explanation), None, total_usage(usage), call
        )

    def _provider_failed(self, detail: str) -> str:
        provider = self.model.provider or "unknown"
        return f"Provider '{provider}' request for model '{self.model.bare}' failed. {detail}"

    def _failure(self, exc: BridgeError) -> str:
        kind = exc.kind if isinstance(exc, UpstreamError) else type(exc).__name__
        bare = self.model.bare
        if exc.message == _TIMED_OUT:
            return self._provider_failed(f"Request timed out after {self.timeout:g} seconds.")
        if kind == "NotFoundError":
            return self._provider_failed(
                f"Model '{bare}' was not found. Confirm the model identifier is correct and "
                f"your {self.model.provider or 'provider'} account has access to it."
            )
        if kind == "AuthenticationError" and self.model.provider is None:
            return (
                f"No API key found for model '{bare}'. Pass --api-key explicitly or set the "
                "provider-specific environment variable (e.g. OPENAI_API_KEY)."
            )
        return self._provider_failed(self._scrub(exc.message))


def total_usage(usage: Iterable[CallUsage]) -> CallUsage:
    """The sum of several calls' usage."""
    usage = list(usage)
    return CallUsage(
        prompt_tokens=sum(u.prompt_tokens for u in usage),
        completion_tokens=sum(u.completion_tokens for u in usage),
        total_tokens=sum(u.total_tokens for u in usage),
    )
