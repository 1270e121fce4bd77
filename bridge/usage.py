"""Per-rollout token accounting (docs/spec/bridge.md §11, ``max_context_tokens`` included)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

#: The largest token count taken from a provider (2**53, the largest integer a JSON reader in
#: a browser keeps exact; far past any real call). A count outside 0..this is not a count.
MAX_TOKENS = 2**53


def token_count(value: Any) -> int | None:
    """``value`` as a provider's token count: a non-negative integer (an integral float too)
    up to :data:`MAX_TOKENS`; anything else (a bool, a string, NaN, infinity, a negative or
    absurd number) None, so that it can break no sum, no file and no export."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not value.is_integer():  # NaN and infinity included
            return None
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def _first_int(*values: Any) -> int | None:
    for value in values:
        number = token_count(value)
        if number is not None:
            return number
    return None


@dataclass(frozen=True)
class CallUsage:
    """The usage one provider call reported, normalized."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int | None = None
    """Prompt tokens read from the provider's cache (part of ``prompt_tokens``)."""
    reasoning_tokens: int | None = None
    """Completion tokens spent reasoning (part of ``completion_tokens``)."""
    cache_write_tokens: int | None = None
    """Prompt tokens written to the provider's cache (part of ``prompt_tokens``)."""
    reported: bool = field(default=True, compare=False)
    """Whether the provider reported a usage at all: a call's record leaves its token counts
    out when it did not (zero would claim a count nobody made); the ledger adds the zeros."""

    @classmethod
    def from_json(cls, usage: Any) -> CallUsage:
        """Normalize a provider ``usage`` object; anything that is not an object counts as zero.

        ``prompt_tokens`` falls back to ``input_tokens``, ``completion_tokens`` to
        ``output_tokens``, ``total_tokens`` to their sum (a reported total is kept as is).
        """
        if not isinstance(usage, dict):
            return cls(reported=False)
        prompt = _first_int(usage.get("prompt_tokens"), usage.get("input_tokens")) or 0
        completion = _first_int(usage.get("completion_tokens"), usage.get("output_tokens")) or 0
        total = token_count(usage.get("total_tokens"))
        prompt_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
        completion_details = usage.get("completion_tokens_details") or usage.get(
            "output_tokens_details"
        )
        cached = _first_int(
            prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None,
            usage.get("cache_read_input_tokens"),
        )
        reasoning = _first_int(
            completion_details.get("reasoning_tokens")
            if isinstance(completion_details, dict)
            else None,
            usage.get("reasoning_tokens"),
        )
        cache_write = _first_int(
            prompt_details.get("cache_write_tokens") if isinstance(prompt_details, dict) else None,
            usage.get("cache_creation_input_tokens"),
        )
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=total if total is not None else prompt + completion,
            cached_tokens=cached,
            reasoning_tokens=reasoning,
            cache_write_tokens=cache_write,
        )

    def to_json(self) -> dict[str, int]:
        """The ``usage`` object the rollout receives: prompt, completion and total only."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


def reported_kinds(usage: CallUsage | RolloutUsage) -> dict[str, int]:
    """The token kinds a provider may leave out (cached, reasoning, cache write), those it
    reported: a kind never reported is left out of a record, not written as zero."""
    kinds = {
        "cached_tokens": usage.cached_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
    }
    return {kind: count for kind, count in kinds.items() if count is not None}


def _add(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


@dataclass(frozen=True)
class RolloutUsage:
    """Everything one rollout spent through the bridge."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int | None
    reasoning_tokens: int | None
    max_context_tokens: int
    """The largest single call's prompt + completion tokens."""
    retries: int = 0
    """Calls the bridge made again after a transient provider fault (bridge/retry.py)."""
    cache_write_tokens: int | None = None
    """Prompt tokens written to the provider's cache (part of ``prompt_tokens``)."""

    def plus(self, call: CallUsage) -> RolloutUsage:
        """This total with one more call added."""
        return RolloutUsage(
            retries=self.retries,
            calls=self.calls + 1,
            prompt_tokens=self.prompt_tokens + call.prompt_tokens,
            completion_tokens=self.completion_tokens + call.completion_tokens,
            total_tokens=self.total_tokens + call.total_tokens,
            cached_tokens=_add(self.cached_tokens, call.cached_tokens),
            reasoning_tokens=_add(self.reasoning_tokens, call.reasoning_tokens),
            cache_write_tokens=_add(self.cache_write_tokens, call.cache_write_tokens),
            max_context_tokens=max(
                self.max_context_tokens, call.prompt_tokens + call.completion_tokens
            ),
        )

    def to_json(self) -> dict[str, int]:
        """A compact dict for the journal; token kinds the provider never reported are left out."""
        out = {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "max_context_tokens": self.max_context_tokens,
            **reported_kinds(self),
        }
        if self.retries:
            out["retries"] = self.retries
        return out


@dataclass(frozen=True)
class UpstreamPressure:
    """Running totals over every rollout, for whoever paces the calls (the supervisor's
    adaptive concurrency): they only grow, so a reader compares two snapshots."""

    rate_limited: int = 0
    """Provider 429 answers, retried or not."""
    answered: int = 0
    """Calls the provider answered (the calls counted in the usage)."""


_EMPTY = RolloutUsage(0, 0, 0, 0, None, None, 0)


class UsageObserver(Protocol):
    """Told of every change a :class:`UsageLedger` records, in the thread that records it and
    before :meth:`UsageLedger.record` returns (so before the answer it counts leaves): how a
    bridge in its own process reports usage to the supervisor (:mod:`bridge.process`)."""

    def recorded(self, rollout_id: str, call: CallUsage) -> None: ...

    def faulted(self, rollout_id: str, status: int, retried: bool) -> None: ...


class UsageLedger:
    """Usage per rollout id.

    Thread-safe: calls that go through LiteLLM record from the LiteLLM loop thread the moment
    the provider answers, so the usage is kept even if the rollout's request is cancelled
    before the answer reaches it.
    """

    def __init__(
        self,
        on_forget: Callable[[str], None] | None = None,
        observer: UsageObserver | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._usage: dict[str, RolloutUsage] = {}
        self._on_forget = on_forget
        self._observer = observer
        self._pressure = UpstreamPressure()

    def record(self, rollout_id: str, call: CallUsage) -> None:
        """Add one provider call's usage to ``rollout_id``."""
        with self._lock:
            self._usage[rollout_id] = self._usage.get(rollout_id, _EMPTY).plus(call)
            pressure = self._pressure
            self._pressure = UpstreamPressure(pressure.rate_limited, pressure.answered + 1)
        if self._observer is not None:
            self._observer.recorded(rollout_id, call)

    def fault(self, rollout_id: str, status: int, *, retried: bool) -> None:
        """Count a transient provider fault of ``rollout_id``'s call (a retry when ``retried``)."""
        if self._observer is not None:
            self._observer.faulted(rollout_id, status, retried)
        with self._lock:
            if retried:
                usage = self._usage.get(rollout_id, _EMPTY)
                self._usage[rollout_id] = replace(usage, retries=usage.retries + 1)
            if status == 429:
                self._pressure = replace(
                    self._pressure, rate_limited=self._pressure.rate_limited + 1
                )

    def pressure(self) -> UpstreamPressure:
        """The running totals of 429s and answered calls."""
        with self._lock:
            return self._pressure

    def get(self, rollout_id: str) -> RolloutUsage | None:
        """The usage so far, without removing it."""
        with self._lock:
            return self._usage.get(rollout_id)

    def snapshot(self) -> dict[str, RolloutUsage]:
        """Usage of every rollout id seen so far (nothing is removed)."""
        with self._lock:
            return dict(self._usage)

    def pop(self, rollout_id: str) -> RolloutUsage | None:
        """Remove and return a rollout's usage; None when the bridge never recorded any."""
        with self._lock:
            usage = self._usage.pop(rollout_id, None)
        if self._on_forget is not None:
            self._on_forget(rollout_id)
        return usage

    def discard(self, rollout_id: str) -> None:
        """Forget a rollout's usage (and anything else the bridge kept for it)."""
        self.pop(rollout_id)
