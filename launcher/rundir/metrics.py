"""Metrics (docs/spec/supervisor.md §6.2, §3.6): pure functions over index rows, plus O(1) live counters.

Skipped rows are counted and otherwise excluded; failed rows are scored non-passing attempts
unless they carry a reward meeting the threshold.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, ge, is_not, ne
from typing import Any, TypeGuard

from launcher.rundir.projections import INDEX_KEYS, IndexValues

__all__ = [
    "USAGE_KEYS",
    "LiveCounters",
    "aggregate_index_values",
    "aggregate_metrics",
    "pass_at_k",
    "pass_at_k_estimate",
    "reward_stats",
]


_GET_STATUS = attrgetter("status")
_GET_REWARD = attrgetter("reward")
_GET_TOKENS = attrgetter("tokens")
_NOT_NONE = partial(is_not, None)


def _numeric(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def reward_stats(rewards: list[float]) -> dict[str, float] | None:
    """``{mean, median, std (population), min, max}`` or None when there is no reward."""
    if not rewards:
        return None
    return {
        "mean": statistics.fmean(rewards),
        "median": float(statistics.median(rewards)),
        "std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "min": float(min(rewards)),
        "max": float(max(rewards)),
    }


def pass_at_k_estimate(attempts: int, passes: int, k: int) -> float:
    """The unbiased pass@k estimator for one row: 1 - C(a-p, k) / C(a, k)."""
    if attempts - passes < k:
        return 1.0
    product = 1.0
    for i in range(k):
        product *= (attempts - passes - i) / (attempts - i)
    return 1.0 - product


def pass_at_k(per_row: Mapping[int, tuple[int, int]], n_runs: int) -> list[dict[str, Any]]:
    """Mean pass@k over rows with ``attempts >= k`` for k = 1, 2, 4, ... <= ``n_runs``.

    ``per_row`` maps a row index to ``(attempts, passes)`` (skipped attempts excluded).
    A k with no eligible row is dropped.
    """
    return _pass_at_k_pairs(lambda: per_row.values(), n_runs)


def _pass_at_k_pairs(
    pairs: Callable[[], Iterable[tuple[int, int]]], n_runs: int
) -> list[dict[str, Any]]:
    """:func:`pass_at_k` over ``pairs()``, the rows' ``(attempts, passes)`` (read once per k)."""
    points: list[dict[str, Any]] = []
    k = 1
    while k <= n_runs:
        values = [pass_at_k_estimate(a, p, k) for a, p in pairs() if a >= k]
        if values:
            points.append({"k": k, "value": sum(values) / len(values)})
        k *= 2
    return points


def aggregate_metrics(rows: Iterable[Mapping[str, Any]], pass_threshold: float) -> dict[str, Any]:
    """``metrics.json.summary`` from index rows (one per work item with a record), key order §6.2."""
    total = skipped = failed = graded = passed = tokens_used = 0
    usage = _UsageTotals()
    rewards: list[float] = []
    # Two int maps rather than a [attempts, passes] list per row: the counts are small
    # (cached) ints, so a row costs two table slots instead of a list object as well.
    attempts: dict[int, int] = {}
    passes: dict[int, int] = {}
    max_run = -1
    for row in rows:
        total += 1
        tokens = row.get("tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            tokens_used += tokens
        usage.add(*(row.get(key) for key in USAGE_KEYS))
        run_index = row.get("run_index", 0)
        max_run = max(max_run, run_index)
        status = row.get("status")
        if status == "skipped":
            skipped += 1
            continue
        if status == "failed":
            failed += 1
        row_index = row["row_index"]
        attempts[row_index] = attempts.get(row_index, 0) + 1
        reward = row.get("reward")
        if _numeric(reward):
            graded += 1
            rewards.append(float(reward))
            if reward >= pass_threshold:
                passed += 1
                passes[row_index] = passes.get(row_index, 0) + 1
    return usage.into(
        _summary(
            (total, skipped, failed, graded, passed, tokens_used),
            rewards,
            lambda: ((a, passes.get(r, 0)) for r, a in attempts.items()),
            max_run + 1,
            pass_threshold,
        )
    )


_ROW, _RUN, _STATUS, _REWARD, _TOKENS = (
    INDEX_KEYS.index(key) for key in ("row_index", "run_index", "status", "reward", "tokens")
)
#: Index keys summed into the summary beside ``tokens_used`` (ours; a key no row carries is
#: left out of the summary). The report keeps the same keys per item.
USAGE_KEYS = ("calls", "cached_tokens", "cache_write_tokens", "reasoning_tokens", "retries")
_USAGE_SLOTS = tuple(INDEX_KEYS.index(key) for key in USAGE_KEYS)


class _UsageTotals:
    """Sums of :data:`USAGE_KEYS` over index rows; a key stays None until a row has it."""

    __slots__ = ("sums",)

    def __init__(self) -> None:
        self.sums: list[int | None] = [None] * len(USAGE_KEYS)

    def add(self, *values: Any) -> None:
        for i, value in enumerate(values):
            if isinstance(value, int) and not isinstance(value, bool):
                current = self.sums[i]
                self.sums[i] = value if current is None else current + value

    def into(self, summary: dict[str, Any]) -> dict[str, Any]:
        """``summary`` with each sum that some row had."""
        for key, value in zip(USAGE_KEYS, self.sums, strict=True):
            if value is not None:
                summary[key] = value
        return summary


def aggregate_index_values(rows: Iterable[IndexValues], pass_threshold: float) -> dict[str, Any]:
    """:func:`aggregate_metrics` over index rows in their compact form
    (:func:`~launcher.rundir.projections.index_values`), given in ``(row_index, run_index)``
    order: each row's attempts are then contiguous, so its counts are kept as two machine
    ints in arrays (the same row order, hence the same sums, as the mapping form)."""
    total = skipped = failed = graded = passed = tokens_used = 0
    usage = _UsageTotals()
    rewards: list[float] = []
    attempts, passes = array("q"), array("q")
    current = None
    max_run = -1
    for row in rows:
        total += 1
        tokens = row[_TOKENS]
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            tokens_used += tokens
        if row[_USAGE_SLOTS[0]] is not None or row[_USAGE_SLOTS[-1]] is not None:
            usage.add(*(row[slot] for slot in _USAGE_SLOTS))
        max_run = max(max_run, row[_RUN])
        status = row[_STATUS]
        if status == "skipped":
            skipped += 1
            continue
        if status == "failed":
            failed += 1
        row_index = row[_ROW]
        if row_index != current:
            if current is not None and row_index < current:
                raise ValueError("index rows must be in (row_index, run_index) order")
            current = row_index
            attempts.append(0)
            passes.append(0)
        attempts[-1] += 1
        reward = row[_REWARD]
        if _numeric(reward):
            graded += 1
            rewards.append(float(reward))
            if reward >= pass_threshold:
                passed += 1
                passes[-1] += 1
    return usage.into(
        _summary(
            (total, skipped, failed, graded, passed, tokens_used),
            rewards,
            lambda: zip(attempts, passes, strict=True),
            max_run + 1,
            pass_threshold,
        )
    )


def _summary(
    counts: tuple[int, int, int, int, int, int],
    rewards: list[float],
    pairs: Callable[[], Iterable[tuple[int, int]]],
    n_runs: int,
    pass_threshold: float,
) -> dict[str, Any]:
    total, skipped, failed, graded, passed, tokens_used = counts
    completed = total - skipped
    summary: dict[str, Any] = {
        "total_samples": total,
        "completed_samples": completed,
        "graded": graded,
        "passed": passed,
        "failed": failed,
        "skipped": skipped,
        "pass_rate": passed / completed if completed else 0,
        "pass_threshold": float(pass_threshold),
        "tokens_used": tokens_used,
    }
    stats = reward_stats(rewards)
    if stats is not None:
        summary["reward_stats"] = stats
    if n_runs >= 2:
        summary["n_runs"] = n_runs
        points = _pass_at_k_pairs(pairs, n_runs)
        if len(points) >= 2:
            summary["pass_at_k"] = points
    return summary


@dataclass
class LiveCounters:
    """Counts over the latest record per work item, updated in O(1) per result (§6.2 live rate).

    Call :meth:`apply` with the new record's fields and the fields of the record it supersedes
    (None for a first record), so ``--retry-failed`` replacements are counted once.
    """

    pass_threshold: float = 1.0
    completed: int = 0
    skipped: int = 0
    failed: int = 0
    succeeded: int = 0
    passed: int = 0
    tokens: int = 0
    """Model-call tokens of the latest records (skipped ones included, as ``tokens_used``)."""

    def _delta(self, status: str, reward: Any, tokens: int | None, sign: int) -> None:
        self.completed += sign
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            self.tokens += sign * tokens
        if status == "skipped":
            self.skipped += sign
            return
        if status == "failed":
            self.failed += sign
        elif status == "success":
            self.succeeded += sign
        if _numeric(reward) and reward >= self.pass_threshold:
            self.passed += sign

    def apply(
        self,
        status: str,
        reward: Any,
        previous: tuple[str, Any] | tuple[str, Any, int | None] | None = None,
        *,
        tokens: int | None = None,
    ) -> None:
        """Count a new latest record, removing the superseded ``(status, reward[, tokens])`` if
        any; ``tokens`` is the new record's ``tokens`` field."""
        if previous is not None:
            old_tokens = previous[2] if len(previous) == 3 else None
            self._delta(previous[0], previous[1], old_tokens, -1)
        self._delta(status, reward, tokens, +1)

    def add_all(self, records: Sequence[Any]) -> None:
        """Count ``records`` (objects with ``status``, ``reward`` and ``tokens``, each the latest
        of its item) as :meth:`apply` would one by one, a column at a time in C (a resume
        counts up to millions of replayed records); any reward or token count of an odd kind
        falls back to :meth:`apply` per record."""
        statuses = list(map(_GET_STATUS, records))
        rewards = list(
            filter(
                _NOT_NONE, map(_GET_REWARD, compress(records, map(ne, statuses, repeat("skipped"))))
            )
        )
        tokens = list(filter(_NOT_NONE, map(_GET_TOKENS, records)))
        if not (
            set(map(type, rewards)) <= {float, int}
            and all(map(math.isfinite, rewards))
            and set(map(type, tokens)) <= {int}
        ):
            for record in records:
                self.apply(record.status, record.reward, tokens=record.tokens)
            return
        counts = Counter(statuses)
        self.completed += len(statuses)
        self.skipped += counts["skipped"]
        self.failed += counts["failed"]
        self.succeeded += counts["success"]
        self.passed += sum(map(ge, rewards, repeat(self.pass_threshold)))
        self.tokens += sum(tokens)

    @property
    def pass_rate(self) -> float:
        """``passed / (completed - skipped)``, or 0.0 when nothing was scored."""
        scored = self.completed - self.skipped
        return self.passed / scored if scored else 0.0
