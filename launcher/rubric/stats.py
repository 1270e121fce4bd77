"""Statistics of judge scores, and how several judges are combined (pure functions).

Per record and overall the population statistics of the reference tool (spec Part D.5). With
several judges (``--judges``) each judge's score for a record is the mean of its runs; the
record's combined scores are their **mean** and their **majority**: the score that more than
half of the judges gave (scores compared to six decimals), or none when no score has a
majority. **Agreement** is measured over the records every judge scored: the share where all
judges gave the same score (``unanimous``), the share of agreeing judge pairs (``pairwise``),
and the mean absolute difference between two judges' scores (``mean_abs_diff``).
"""

from __future__ import annotations

import statistics as pystats
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

__all__ = ["Agreement", "JudgeRuns", "agreement", "majority", "mean", "score_statistics"]

_PLACES = 6


def score_statistics(scores: Sequence[float]) -> dict[str, float]:
    """``{average, variance, stdev, min, max}`` (population); all 0.0 without scores."""
    if not scores:
        return {"average": 0.0, "variance": 0.0, "stdev": 0.0, "min": 0.0, "max": 0.0}
    return {
        "average": float(pystats.fmean(scores)),
        "variance": float(pystats.pvariance(scores)),
        "stdev": float(pystats.pstdev(scores)),
        "min": float(min(scores)),
        "max": float(max(scores)),
    }


@dataclass
class JudgeRuns:
    """The runs of one judge on one record, in run order."""

    scores: list[float] = field(default_factory=list)
    explanations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def score(self) -> float | None:
        """The judge's score for the record: the mean of its runs, None without any."""
        return float(pystats.fmean(self.scores)) if self.scores else None

    def payload(self) -> dict[str, Any]:
        """``{scores, explanations, errors, statistics}``."""
        return {
            "scores": list(self.scores),
            "explanations": list(self.explanations),
            "errors": list(self.errors),
            "statistics": score_statistics(self.scores),
        }


def mean(scores: Sequence[float | None]) -> float | None:
    """The mean of the scores present, None when there is none."""
    present = [s for s in scores if s is not None]
    return float(pystats.fmean(present)) if present else None


def majority(scores: Sequence[float | None]) -> float | None:
    """The score more than half of ``scores`` (one per judge, None = no score) agree on."""
    counts = Counter(round(s, _PLACES) for s in scores if s is not None)
    if not counts:
        return None
    value, count = counts.most_common(1)[0]
    return float(value) if count * 2 > len(scores) else None


@dataclass(frozen=True)
class Agreement:
    """How often the judges agree (see the module docstring)."""

    records: int
    unanimous: float
    pairwise: float
    mean_abs_diff: float

    def payload(self) -> dict[str, Any]:
        """The report's ``agreement`` object."""
        return {
            "records": self.records,
            "unanimous": self.unanimous,
            "pairwise": self.pairwise,
            "mean_abs_diff": self.mean_abs_diff,
        }


def agreement(per_record: Sequence[Sequence[float | None]]) -> Agreement:
    """Agreement over the records (each a list of one score per judge) that every judge scored."""
    complete = [
        [round(s, _PLACES) for s in scores if s is not None]
        for scores in per_record
        if len(scores) > 1 and all(s is not None for s in scores)
    ]
    if not complete:
        return Agreement(0, 0.0, 0.0, 0.0)
    unanimous = sum(1 for scores in complete if len(set(scores)) == 1) / len(complete)
    pair_shares, pair_diffs = [], []
    for scores in complete:
        pairs = list(combinations(scores, 2))
        pair_shares.append(sum(1 for a, b in pairs if a == b) / len(pairs))
        pair_diffs.append(sum(abs(a - b) for a, b in pairs) / len(pairs))
    return Agreement(
        records=len(complete),
        unanimous=unanimous,
        pairwise=float(pystats.fmean(pair_shares)),
        mean_abs_diff=float(pystats.fmean(pair_diffs)),
    )
