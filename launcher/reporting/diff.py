"""The paired comparison of two runs (``rollbridge eval diff``), pure over two :class:`RunData`.

Items pair by ``(row_index, run_index)``, and only when both manifests lock the same dataset
and the same selected rows (the ``dataset`` group of the resume lock); otherwise the diff is
refused with that lock's ``Changed: …`` wording. The binary outcome of an item is "passed" as
``metrics.json`` counts it (reward at or above the run's own threshold); pairs where either
side was skipped are not scored. Flips feed McNemar's exact test; reward differences of pairs
graded on both sides feed a paired bootstrap interval.

Tokens, context and calls are compared over the pairs where both sides have the number
(``pairs`` in each of their objects says how many); ``all_total_a``/``all_total_b`` are the
totals over every item of each run, paired or not (what ``metrics.json`` counts).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from launcher.errors import ConflictError
from launcher.reporting.model import ReportItem, RunData
from launcher.reporting.stats import mcnemar_exact_p, paired_bootstrap_ci, percentile
from launcher.rundir.manifest import changed_groups

__all__ = ["DiffResult", "Flip", "RowsMismatch", "check_pairable", "diff_runs"]

PASS_TO_FAIL = "pass→fail"
FAIL_TO_PASS = "fail→pass"


class RowsMismatch(ConflictError):
    """The two runs did not evaluate the same dataset and rows, so no item has a partner."""


@dataclass(frozen=True)
class Flip:
    """A pair whose binary outcome differs: ``direction`` is ``pass→fail`` or ``fail→pass``."""

    a: ReportItem
    b: ReportItem
    direction: str

    @property
    def key(self) -> tuple[int, int]:
        """``(row_index, run_index)``."""
        return self.a.key


@dataclass
class DiffResult:
    """Every number of the comparison; :meth:`to_json` is what ``--json`` prints."""

    a: RunData
    b: RunData
    pairs: int
    only_a: int
    only_b: int
    scored_pairs: int
    both_pass: int
    both_fail: int
    flips: list[Flip]
    mcnemar_p: float
    reward: dict[str, Any]
    tokens: dict[str, Any]
    context: dict[str, Any]
    calls: dict[str, Any]
    pass_rate: dict[str, float | None]
    other_changes: list[str] = field(default_factory=list)

    @property
    def pass_to_fail(self) -> int:
        """Pairs that passed in A and not in B."""
        return sum(1 for f in self.flips if f.direction == PASS_TO_FAIL)

    @property
    def fail_to_pass(self) -> int:
        """Pairs that passed in B and not in A."""
        return sum(1 for f in self.flips if f.direction == FAIL_TO_PASS)

    def to_json(self) -> dict[str, Any]:
        """The numbers as one JSON object (flips as ``[row, run, direction]``)."""
        return {
            "a": {"name": self.a.name, "path": str(self.a.path)},
            "b": {"name": self.b.name, "path": str(self.b.path)},
            "other_changes": self.other_changes,
            "pairs": self.pairs,
            "only_a": self.only_a,
            "only_b": self.only_b,
            "scored_pairs": self.scored_pairs,
            "pass_rate": self.pass_rate,
            "both_pass": self.both_pass,
            "both_fail": self.both_fail,
            "pass_to_fail": self.pass_to_fail,
            "fail_to_pass": self.fail_to_pass,
            "mcnemar_p": self.mcnemar_p,
            "reward": self.reward,
            "tokens": self.tokens,
            "context": self.context,
            "calls": self.calls,
            "flips": [[f.key[0], f.key[1], f.direction] for f in self.flips],
        }


def _dataset_group(run: RunData) -> dict[str, Any]:
    return {"dataset": run.inputs.get("dataset")}


def check_pairable(a: RunData, b: RunData) -> None:
    """Raise :class:`RowsMismatch` unless both manifests lock the same dataset and rows."""
    for run in (a, b):
        if not run.inputs:
            raise RowsMismatch(
                f"run '{run.name}' has no readable manifest.json, so it cannot be shown to have "
                "evaluated the same dataset and rows as the other run"
            )
    groups = changed_groups(_dataset_group(a), _dataset_group(b))
    if not groups:
        return
    da, db = a.inputs.get("dataset") or {}, b.inputs.get("dataset") or {}
    what = [
        f"{key} {da.get(key)!s} vs {db.get(key)!s}"
        for key in sorted(set(da) | set(db))
        if da.get(key) != db.get(key)
    ]
    raise RowsMismatch(
        f"runs '{a.name}' and '{b.name}' were created with different resolved inputs, so their "
        f"items cannot be paired. Changed: {', '.join(groups)} ({'; '.join(what)}). Compare "
        "two runs of the same dataset and --rows.",
        details={"changed": groups},
    )


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _all_totals(a: RunData, b: RunData, attr: str, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with each run's total of ``attr`` over all of its items, paired or not."""
    for side, run in (("a", a), ("b", b)):
        values = [getattr(item, attr) for item in run.items]
        out[f"all_total_{side}"] = sum(v for v in values if v is not None)
        out[f"all_items_{side}"] = sum(1 for v in values if v is not None)
    return out


def _paired(pairs: list[tuple[ReportItem, ReportItem]], attr: str) -> dict[str, Any]:
    both = [
        (getattr(x, attr), getattr(y, attr))
        for x, y in pairs
        if getattr(x, attr) is not None and getattr(y, attr) is not None
    ]
    a_vals = [float(u) for u, _ in both]
    b_vals = [float(v) for _, v in both]
    return {
        "pairs": len(both),
        "mean_a": _mean(a_vals),
        "mean_b": _mean(b_vals),
        "mean_delta": _mean([v - u for u, v in zip(a_vals, b_vals, strict=True)]),
        "total_a": sum(a_vals),
        "total_b": sum(b_vals),
        "p95_a": percentile(a_vals, 95),
        "p95_b": percentile(b_vals, 95),
        "max_a": max(a_vals, default=None),
        "max_b": max(b_vals, default=None),
    }


def diff_runs(a: RunData, b: RunData) -> DiffResult:
    """Compare ``b`` against ``a`` (deltas are B − A). Raises :class:`RowsMismatch`."""
    check_pairable(a, b)
    by_key_b = {item.key: item for item in b.items}
    keys_a = {item.key for item in a.items}
    pairs = [
        (x, by_key_b[x.key]) for x in sorted(a.items, key=lambda i: i.key) if x.key in by_key_b
    ]
    ta, tb = a.pass_threshold, b.pass_threshold
    flips: list[Flip] = []
    both_pass = both_fail = scored = 0
    for x, y in pairs:
        px, py = x.passed(ta), y.passed(tb)
        if px is None or py is None:
            continue
        scored += 1
        if px and py:
            both_pass += 1
        elif not px and not py:
            both_fail += 1
        else:
            flips.append(Flip(x, y, PASS_TO_FAIL if px else FAIL_TO_PASS))
    b_count = sum(1 for f in flips if f.direction == PASS_TO_FAIL)
    c_count = len(flips) - b_count
    graded = [(x, y) for x, y in pairs if x.status != "skipped" and y.status != "skipped"]
    reward = _paired(graded, "reward")
    deltas = [
        y.reward - x.reward for x, y in graded if x.reward is not None and y.reward is not None
    ]
    ci = paired_bootstrap_ci(deltas)
    reward["ci95"] = list(ci) if ci is not None else None
    return DiffResult(
        a=a,
        b=b,
        pairs=len(pairs),
        only_a=len(keys_a - by_key_b.keys()),
        only_b=len(by_key_b.keys() - keys_a),
        scored_pairs=scored,
        both_pass=both_pass,
        both_fail=both_fail,
        flips=flips,
        mcnemar_p=mcnemar_exact_p(b_count, c_count),
        reward=reward,
        tokens=_all_totals(a, b, "tokens", _paired(pairs, "tokens")),
        context=_paired(pairs, "max_context_tokens"),
        calls=_all_totals(a, b, "call_count", _paired(pairs, "call_count")),
        pass_rate={
            "a": (both_pass + b_count) / scored if scored else None,
            "b": (both_pass + c_count) / scored if scored else None,
        },
        other_changes=[g for g in changed_groups(a.inputs, b.inputs) if g != "dataset"],
    )
