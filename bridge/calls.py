"""Per-call records: what one model call of a rollout did, as the bridge saw it (docs/calls.md).

A :class:`CallTrace` follows one request from a rollout through the bridge: when it started,
when the provider's first byte arrived, every transient fault that was retried and why, and
how it ended (status, the provider's own status on error, usage, ``finish_reason``, logprobs
and token ids when the provider returned them). :meth:`CallTrace.finish` turns it into a plain
JSON object, the *call record*, which a :class:`CallBook` keeps per rollout id (in the
supervisor's process) or hands to an observer (the bridge's own process sends it to the
supervisor on its socket, before the answer it describes is written).

The record is deliberately a plain dict of JSON scalars and small lists: it crosses the
process boundary as one JSON array item and is written to ``calls.jsonl`` unchanged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from bridge.errors import BridgeError, UpstreamError, final_status
from bridge.usage import CallUsage, reported_kinds

__all__ = [
    "CALL_KINDS",
    "CallBook",
    "CallObserver",
    "CallTrace",
    "compact_logprobs",
]

#: Discarded rollout ids a :class:`CallBook` remembers (oldest dropped first).
_FORGOTTEN_KEPT = 4096

#: What a call was made for: a rollout's own call, the model preflight, the rubric judge.
CALL_KINDS = ("rollout", "preflight", "judge")


def compact_logprobs(content: Any) -> dict[str, list[Any]] | None:
    """OpenAI's ``logprobs.content`` (one object per token) as columns: ``token``,
    ``logprob`` and, when present, ``top`` (per token, ``[[token, logprob], ...]``).

    A list of per-token objects repeats every key for every token; columns are about a third
    of the size and read straight into Arrow."""
    if not isinstance(content, list) or not content:
        return None
    tokens: list[Any] = []
    logprobs: list[Any] = []
    top: list[Any] = []
    any_top = False
    for item in content:
        if not isinstance(item, dict):
            continue
        tokens.append(item.get("token"))
        logprobs.append(item.get("logprob"))
        alternatives = item.get("top_logprobs")
        if isinstance(alternatives, list) and alternatives:
            any_top = True
            top.append(
                [
                    [alt.get("token"), alt.get("logprob")]
                    for alt in alternatives
                    if isinstance(alt, dict)
                ]
            )
        else:
            top.append([])
    out: dict[str, list[Any]] = {"token": tokens, "logprob": logprobs}
    if any_top:
        out["top"] = top
    return out


def _choice_logprobs(choice: dict[str, Any]) -> Any:
    logprobs = choice.get("logprobs")
    return logprobs.get("content") if isinstance(logprobs, dict) else None


def _token_ids(choice: dict[str, Any]) -> list[int] | None:
    # vLLM and SGLang return the sampled ids beside the text when asked (return_token_ids).
    for name in ("token_ids", "output_token_ids"):
        ids = choice.get(name)
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return ids
    return None


class CallTrace:
    """One call in progress (see the module docstring). Not thread-safe: one task owns it."""

    __slots__ = (
        "_chunked",
        "_content",
        "_first",
        "_ids",
        "_t0",
        "_wall",
        "api",
        "billed",
        "error",
        "finish_reason",
        "kind",
        "model",
        "response_id",
        "retries",
        "rollout_id",
        "stream",
    )

    def __init__(
        self,
        rollout_id: str | None,
        *,
        api: str,
        model: str,
        stream: bool,
        kind: str = "rollout",
    ) -> None:
        self.rollout_id = rollout_id
        self.kind = kind
        self.api = api
        self.model = model
        self.stream = stream
        self.retries: list[dict[str, Any]] = []
        self.response_id: str | None = None
        """The provider's id of its answer (``chatcmpl-…``, ``resp_…``, ``msg_…``): what its
        support asks for."""
        self.finish_reason: str | None = None
        self.billed: CallUsage | None = None
        """The usage the ledger was given for this call (when the path records it itself)."""
        self.error: BaseException | None = None
        """The provider's error when it came as a frame of a stream that was relayed as is
        (nothing was raised): the record is that of a failed call."""
        self._wall = time.time()
        self._t0 = time.monotonic()
        self._first: float | None = None
        self._content: list[Any] | None = None
        self._ids: list[int] | None = None
        self._chunked = False

    def fault(self, status: int, kind: str, request_id: str | None = None) -> None:
        """A transient provider fault that was retried (its cause, and the provider's id of
        the request it failed, kept)."""
        fault: dict[str, Any] = {"status": status, "kind": kind}
        if request_id is not None:
            fault["request_id"] = request_id
        self.retries.append(fault)

    def first_byte(self) -> None:
        """The provider's answer began (the first chunk of a stream, a whole answer else)."""
        if self._first is None:
            self._first = time.monotonic()

    def answered(self, data: dict[str, Any]) -> None:
        """Take ``finish_reason``, the model, logprobs and token ids of a whole answer."""
        self.first_byte()
        self._take_model(data)
        choices = data.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            reason = choice.get("finish_reason")
            self.finish_reason = reason if isinstance(reason, str) else None
            content = _choice_logprobs(choice)
            if isinstance(content, list):
                self._content = content
            self._ids = _token_ids(choice)

    def chunk(self, raw: dict[str, Any]) -> None:
        """Take what a stream chunk says of the first choice (logprobs arrive per chunk)."""
        if self._first is None:
            self._first = time.monotonic()
        if not self._chunked:
            # The first chunk names the model (a translated stream may have sent the caller
            # its opening events, and so set the first byte, before any chunk arrived).
            self._chunked = True
            self._take_model(raw)
        choices = raw.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self.finish_reason = reason
            content = _choice_logprobs(choice)
            if isinstance(content, list) and content:
                if self._content is None:
                    self._content = []
                self._content.extend(content)
            ids = _token_ids(choice)
            if ids:
                self._ids = (self._ids or []) + ids

    def answered_as(self, data: dict[str, Any]) -> None:
        """Take the model and stop reason of a whole Responses or Messages object."""
        self.first_byte()
        self._take_model(data)
        reason = data.get("stop_reason", data.get("status"))
        self.finish_reason = reason if isinstance(reason, str) else self.finish_reason

    def _take_model(self, data: dict[str, Any]) -> None:
        model = data.get("model")
        if isinstance(model, str) and model:
            self.model = model
        ident = data.get("id")
        if self.response_id is None and isinstance(ident, str) and ident:
            self.response_id = ident[:200]

    def finish(
        self,
        usage: CallUsage | None,
        error: BaseException | None = None,
    ) -> dict[str, Any]:
        """The call record: ``error`` None for an answered call, the failure otherwise (a
        :class:`trio.Cancelled` or other ``BaseException`` that is not an ``Exception`` means
        the rollout went away before the answer)."""
        now = time.monotonic()
        usage = usage if usage is not None else self.billed
        record: dict[str, Any] = {
            "kind": self.kind,
            "rollout_id": self.rollout_id,
            "api": self.api,
            "model": self.model,
            "stream": self.stream,
            "started_at": _iso(self._wall),
        }
        if self.response_id is not None:
            record["response_id"] = self.response_id
        if self._first is not None:  # unknown (no byte came) is left out, as docs/calls.md says
            record["ttfb_ms"] = round((self._first - self._t0) * 1000, 3)
        record["duration_ms"] = round((now - self._t0) * 1000, 3)
        if error is None:
            record["status"] = 200
        elif isinstance(error, Exception):
            status = error.status if isinstance(error, BridgeError) else 500
            record["status"] = final_status(status)
            if isinstance(error, UpstreamError) and error.kind not in (
                "APIConnectionError",
                "Timeout",
            ):
                record["upstream_status"] = error.status
            record["error"] = (
                error.kind if isinstance(error, UpstreamError) else type(error).__name__
            )
            if isinstance(error, UpstreamError) and error.request_id is not None:
                record["request_id"] = error.request_id
        else:
            record["status"] = None
            record["error"] = "cancelled"
        if self.retries:
            record["retries"] = self.retries
        if usage is not None and usage.reported:
            record["prompt_tokens"] = usage.prompt_tokens
            record["completion_tokens"] = usage.completion_tokens
            record["total_tokens"] = usage.total_tokens
            record.update(reported_kinds(usage))
        if self.finish_reason is not None:
            record["finish_reason"] = self.finish_reason
        logprobs = compact_logprobs(self._content)
        if logprobs is not None:
            record["logprobs"] = logprobs
        if self._ids:
            record["token_ids"] = self._ids
        return record


def _iso(wall: float) -> str:
    seconds = int(wall)
    micros = round((wall - seconds) * 1_000_000)
    if micros == 1_000_000:
        seconds, micros = seconds + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


class CallObserver(Protocol):
    """Told of every finished call, in the thread that finished it, before its answer is
    written (how the bridge's own process reports calls: :mod:`bridge.process`)."""

    def called(self, record: dict[str, Any]) -> None: ...


class CallBook:
    """Call records per rollout id, in the order the calls finished.

    ``keep`` False (the bridge's own process) keeps nothing and only tells the observer;
    the supervisor's copy keeps them until :meth:`pop` (the result is recorded) or
    :meth:`discard` (it will not be). Thread-safe, like the usage ledger.
    """

    def __init__(
        self,
        *,
        keep: bool = True,
        observer: CallObserver | None = None,
        before_read: Callable[[], None] | None = None,
    ) -> None:
        self._keep = keep
        self._observer = observer
        self._before_read = before_read
        self._lock = threading.Lock()
        self._calls: dict[str, list[dict[str, Any]]] = {}
        # Rollouts discarded lately: a call of theirs still running when they were forgotten
        # (a cancelled rollout) finishes later and must not be kept for ever.
        self._forgotten: dict[str, None] = {}

    def add(self, record: dict[str, Any]) -> None:
        """Keep (and report) one finished call."""
        if self._keep:
            key = record.get("rollout_id")
            if isinstance(key, str):
                with self._lock:
                    if key not in self._forgotten:
                        self._calls.setdefault(key, []).append(record)
        if self._observer is not None:
            self._observer.called(record)

    def pop(self, rollout_id: str) -> list[dict[str, Any]]:
        """Remove and return a rollout's calls ([] when it made none)."""
        if self._before_read is not None:
            self._before_read()
        with self._lock:
            return self._calls.pop(rollout_id, [])

    def get(self, rollout_id: str) -> list[dict[str, Any]]:
        """A rollout's calls so far, without removing them."""
        if self._before_read is not None:
            self._before_read()
        with self._lock:
            return list(self._calls.get(rollout_id, ()))

    def discard(self, rollout_id: str) -> None:
        """Forget a rollout's calls (those still in transit included: a mirror drains first)."""
        if self._before_read is not None:
            self._before_read()
        with self._lock:
            self._calls.pop(rollout_id, None)
            if self._keep:
                self._forgotten[rollout_id] = None
                if len(self._forgotten) > _FORGOTTEN_KEPT:
                    del self._forgotten[next(iter(self._forgotten))]
