"""The journal's record types (docs/spec/supervisor.md §3.3): one terminal attempt of a work
item (:class:`TerminalRecord`), why it failed (:class:`ErrorInfo`), and the check a record
passes before it is appended. :mod:`launcher.rundir.journal` reads and writes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from launcher.rundir.atomic import canonical_json_bytes
from rollout_server.protocol import is_single_path_segment

__all__ = [
    "ERROR_MESSAGE_LIMIT",
    "ERROR_PHASES",
    "STATUSES",
    "ErrorInfo",
    "Status",
    "TerminalRecord",
    "WorkKey",
    "bounded_text",
    "graded_reward",
    "scalar_metrics",
    "validate_record",
]

STATUSES = ("failed", "skipped", "success")
#: A record's status. As a ``Literal`` the decoder checks it in C and hands every record the
#: same three string objects (a replay of a million records keeps no million copies).
Status = Literal["failed", "skipped", "success"]
WorkKey = tuple[int, int]

#: Where a failure happened: the workflow, the grader, the model bridge or provider, the
#: rollout server itself, the link to it (transport), its refusal to take the row, or
#: ``rollout`` when the server reported a failure without saying where (a reference server).
ERROR_PHASES = (
    "agent",
    "grader",
    "bridge",
    "network",
    "server",
    "transport",
    "admission",
    "rollout",
)
#: A failure message is cut to this many UTF-8 bytes once redacted (the journal stays small,
#: and a runaway exception text cannot fill the disk one row at a time).
ERROR_MESSAGE_LIMIT = 2048


def bounded_text(text: str, limit: int = ERROR_MESSAGE_LIMIT) -> str:
    """``text`` with lone surrogates spelled ``\\udXXX``, cut to ``limit`` UTF-8 bytes
    (never inside a character), with ``…`` marking a cut."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[: limit - 3].decode("utf-8", "ignore") + "…"


def scalar_metrics(metrics: Any) -> dict[str, Any] | None:
    """A workflow's metrics as the journal keeps them: string keys with finite numbers,
    booleans and (bounded) strings; anything else (nested values, NaN) is left out, and an
    empty result is None."""
    if not isinstance(metrics, dict):
        return None
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, bool) or (isinstance(value, int | float) and math.isfinite(value)):
            out[bounded_text(key, 200)] = value
        elif isinstance(value, str):
            out[bounded_text(key, 200)] = bounded_text(value, 1024)
    return out or None


class ErrorInfo(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """Why an attempt failed: the journal's optional ``error`` object.

    ``phase`` is one of :data:`ERROR_PHASES`; ``type`` the exception class name when one is
    known; ``message`` the (redacted, bounded) text; ``status`` an HTTP status when the failure
    was an HTTP answer (a provider error relayed by the bridge, a refused admission).
    """

    phase: str
    message: str
    type: str | None = None
    status: int | None = None

    def with_detail(self, detail: dict[str, Any] | None) -> ErrorInfo:
        """This reason completed by what the rollout server recorded about the failure (the
        ``failure`` object of its ``diagnostics.json``); fields of the wrong kind are ignored."""
        if not detail:
            return self
        phase, kind = detail.get("phase"), detail.get("type")
        status, message = detail.get("status"), detail.get("message")
        return ErrorInfo(
            phase=phase if phase in ERROR_PHASES else self.phase,
            message=message if isinstance(message, str) and message else self.message,
            type=kind if isinstance(kind, str) and kind else self.type,
            status=(
                status if isinstance(status, int) and not isinstance(status, bool) else self.status
            ),
        )

    def redacted(self, redact: Callable[[str], str]) -> ErrorInfo:
        """A copy with ``type`` and ``message`` redacted, then bounded (in that order, so a
        cut can never leave part of a secret that redaction would have matched whole)."""
        return ErrorInfo(
            phase=self.phase,
            message=bounded_text(redact(self.message)),
            type=bounded_text(redact(self.type), 200) if self.type else None,
            status=self.status,
        )

    def describe(self, limit: int | None = None) -> str:
        """One line for people: ``agent: ValueError: <message>``, ``bridge: HTTP 502: …``;
        whitespace runs (newlines included) become one space, and ``limit`` cuts the message
        to that many characters."""
        parts = [self.phase]
        if self.type:
            parts.append(self.type)
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        head = ": ".join(parts)
        message = " ".join(self.message.split())
        if self.type and self.status is None and message.startswith(f"{self.type}: "):
            # The message already names its type (Harbor's `AgentTimeoutError: …`): once.
            message = message[len(self.type) + 2 :]
        if limit is not None and len(message) > limit:
            message = message[: max(limit - 1, 0)] + "…"
        return f"{head}: {message}" if message else head

    def to_json(self) -> dict[str, Any]:
        """The JSON object (absent fields left out)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def graded_reward(reward: Any) -> float | None:
    """The one rule for a reward: a finite number is the grade, anything else (None, NaN,
    infinity) is no grade. JSON cannot hold NaN/inf, and losing a whole result over one would
    be worse than recording the attempt as ungraded; the journal, the index and the metrics all
    read what this gives (:func:`launcher.dispatch.classify` applies it where a record is born).
    """
    if reward is None or isinstance(reward, bool):
        return None
    value = float(reward)
    return value if math.isfinite(value) else None


class TerminalRecord(msgspec.Struct, kw_only=True, gc=False):
    """One terminal attempt of a work item, as journaled.

    ``tokens`` is the sum of the rollout's model-call usage and ``max_context_tokens`` the
    largest single call (prompt + completion), both from the bridge; None when unknown.
    ``duration_ms`` is wall time from dispatch start. ``error_type`` is set for failures (the
    reference's category); ``error`` says why, where known (an addition of ours: readers that
    do not know it ignore it).

    Records (and their :class:`ErrorInfo`) hold only scalars and a flat ``metrics`` dict of
    scalars, so they can never be part of a reference cycle: ``gc=False`` keeps them out of the cycle collector, which makes replay's
    decode cheaper and keeps a long run's full collections from walking every record.
    """

    row_index: int
    run_index: int
    rollout_id: str
    status: Status
    source_row_index: int | None = None
    reward: float | None = None
    tokens: int | None = None
    max_context_tokens: int | None = None
    retries: int | None = None
    """Model calls the bridge made again after a transient provider fault (ours; None: none)."""
    calls: int | None = None
    """Model calls the rollout made through the bridge (ours; their records are in
    ``calls.jsonl``, launcher.rundir.calls)."""
    cached_tokens: int | None = None
    """Prompt tokens the provider served from its cache, summed over the calls (ours)."""
    cache_write_tokens: int | None = None
    """Prompt tokens the provider wrote to its cache (Anthropic's cache creation), summed
    over the calls (ours)."""
    reasoning_tokens: int | None = None
    """Completion tokens the provider spent reasoning, summed over the calls (ours)."""
    metrics: dict[str, Any] | None = None
    """The workflow's own metrics (the sample's ``metrics``: JSON scalars only; ours)."""
    duration_ms: float | None = None
    error_type: str | None = None
    error: ErrorInfo | None = None

    @property
    def key(self) -> WorkKey:
        """``(row_index, run_index)``."""
        return (self.row_index, self.run_index)

    def to_dict(self) -> dict[str, Any]:
        """The journal fields with None omitted (``duration_ms`` always present, default 0.0).

        A non-finite reward (NaN, infinity) is left out: JSON cannot hold it, and losing the
        whole result over it would be worse than recording the attempt as ungraded.
        """
        out: dict[str, Any] = {
            name: value
            for name, value in zip(
                self.__struct_fields__, msgspec.structs.astuple(self), strict=True
            )
            if value is not None
        }
        if isinstance(self.error, ErrorInfo):
            out["error"] = self.error.to_json()
        duration = float(self.duration_ms or 0.0)
        out["duration_ms"] = duration if math.isfinite(duration) else 0.0
        reward = graded_reward(out.pop("reward", None))
        if reward is not None:
            out["reward"] = reward
        return out

    def to_line(self) -> bytes:
        """The canonical JSON line (sorted keys, compact, UTF-8, NaN refused) with ``\\n``."""
        validate_record(self)
        return canonical_json_bytes(self.to_dict()) + b"\n"


def validate_record(record: TerminalRecord) -> None:
    """Raise ValueError when ``record`` could not be replayed (used before appending)."""
    if record.status not in STATUSES:
        raise ValueError(f"status must be one of {list(STATUSES)}")
    if not is_single_path_segment(record.rollout_id):
        raise ValueError("rollout_id must be a single path segment")
