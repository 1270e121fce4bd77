"""The bridge's retry policy for transient provider faults (docs/bridge.md, "Retries").

A call is made again only when the fault says nothing about the request itself: a 429 (but
not OpenAI's ``insufficient_quota``, an account out of credit), a 500/502/503/504/529, or a connection that failed or was reset before any answer arrived. The
upstream paths mark those faults by raising :class:`ProviderFault`; every other failure (any
other 4xx, a timeout, an answer that broke off while arriving, which the provider has billed)
goes back to the rollout at once. The request is sent again unchanged: no parameter is ever
dropped to make a retry pass.

Delays grow exponentially with jitter, a provider's ``Retry-After`` (seconds or an HTTP date)
is a floor, and no retry starts past the call's budget: when the wait a provider asks for would
end beyond it, the fault is answered now instead. A cancelled call (the rollout went away)
stops waiting at once.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from bridge.errors import UpstreamError, answer_kind, provider_request_id

__all__ = [
    "QUOTA_CODE",
    "TRANSIENT_STATUSES",
    "ProviderFault",
    "RetryPolicy",
    "parse_retry_after",
    "retrying",
    "retrying_stream",
    "status_fault",
]

T = TypeVar("T")

#: Provider statuses that say "try again later" rather than "this request is wrong" (529 is
#: Anthropic's "overloaded").
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
#: OpenAI's 429 for an account out of credit (its error ``code`` and ``type``): no wait ends it,
#: so it is answered at once rather than retried and counted as rate-limit pressure.
QUOTA_CODE = "insufficient_quota"


class ProviderFault(UpstreamError):
    """A provider failure that may pass if the same request is sent again.

    ``retry_after`` is the provider's ``Retry-After`` in seconds, when it sent one.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(status, message, kind=kind, request_id=request_id)
        self.retry_after = retry_after


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP date.

    ``now`` is the wall-clock time (``time.time()``) a date is measured from. A date in the
    past means 0; anything unparsable means the header was not sent (None).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def status_fault(
    status: int,
    message: str,
    headers: Mapping[str, str] | None,
    *,
    kind: str | None = None,
    retry_after: str | None = None,
) -> UpstreamError:
    """The error for a provider's non-2xx answer with ``headers`` (for its ``Retry-After``, or
    ``retry_after`` when the headers are not at hand, and its request id): a
    :class:`ProviderFault` when transient."""
    kind = kind or answer_kind(status)
    request_id = None
    if headers is not None:
        retry_after = headers.get("retry-after") or retry_after
        request_id = provider_request_id(headers)
    if status in TRANSIENT_STATUSES and not (status == 429 and QUOTA_CODE in message):
        wait = parse_retry_after(retry_after)
        return ProviderFault(status, message, kind=kind, retry_after=wait, request_id=request_id)
    return UpstreamError(status, message, kind=kind, request_id=request_id)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a transient fault is retried."""

    max_attempts: int = 6
    """Calls in all, the first included (1 turns retries off)."""
    base_delay: float = 0.5
    """The first backoff; each further one doubles, up to ``max_delay``."""
    max_delay: float = 8.0
    budget: float = 300.0
    """Seconds from the first attempt within which a retry may still start: the call's
    deadline (a rollout's own client timeout ends it sooner, by cancelling the call)."""
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, retry: int, fault: ProviderFault) -> float:
        """The wait before retry number ``retry`` (1-based): "equal jitter" backoff (half fixed,
        half random, so a crowd of calls that failed together spreads out but none comes back
        at once), never shorter than the provider's ``Retry-After``."""
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** (retry - 1))
        backoff = ceiling / 2 + self.rng.uniform(0.0, ceiling / 2)
        return max(backoff, fault.retry_after or 0.0)


OnFault = Callable[[ProviderFault, bool], None]
"""``on_fault(fault, retrying)``: told of every transient fault, and whether it is retried."""


async def retrying(call: Callable[[], Awaitable[T]], policy: RetryPolicy, on_fault: OnFault) -> T:
    """``await call()``, made again after each :class:`ProviderFault` the policy allows."""
    started = trio.current_time()
    attempt = 1
    while True:
        try:
            return await call()
        except ProviderFault as fault:
            wait = _next_wait(policy, attempt, fault, started)
            on_fault(fault, wait is not None)
            if wait is None:
                raise
        await trio.sleep(wait)
        attempt += 1


async def retrying_stream(
    open_stream: Callable[[], AsyncGenerator[T, None]], policy: RetryPolicy, on_fault: OnFault
) -> AsyncGenerator[T, None]:
    """The items of ``open_stream()``, reopened after a :class:`ProviderFault` that came before
    the first item. Once an item has been passed on, a fault ends the stream: what was
    relayed cannot be taken back."""
    started = trio.current_time()
    attempt = 1
    while True:
        stream = open_stream()
        relayed = False
        try:
            async for item in stream:
                relayed = True
                yield item
            return
        except ProviderFault as fault:
            if relayed:
                raise
            wait = _next_wait(policy, attempt, fault, started)
            on_fault(fault, wait is not None)
            if wait is None:
                raise
        finally:
            await stream.aclose()
        await trio.sleep(wait)
        attempt += 1


def _next_wait(
    policy: RetryPolicy, attempt: int, fault: ProviderFault, started: float
) -> float | None:
    """The wait before the next attempt, or None when the fault must be answered now."""
    if attempt >= policy.max_attempts:
        return None
    wait = policy.delay(attempt, fault)
    if trio.current_time() + wait - started > policy.budget:
        return None
    return wait
