"""Statistics for the report and the diff, on the standard library only: percentiles,
fixed-width histograms, a paired bootstrap interval with a fixed seed, and McNemar's exact test.

All functions are pure; the bootstrap is reproducible (same input, same interval) because its
generator is seeded.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "Histogram",
    "histogram",
    "mcnemar_exact_p",
    "paired_bootstrap_ci",
    "percentile",
]

BOOTSTRAP_SEED = 20240601
BOOTSTRAP_RESAMPLES = 2000


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks
    (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


@dataclass(frozen=True)
class Histogram:
    """Bins ``[edges[i], edges[i+1])`` (the last one closed) with their counts; ``missing``
    counts items without a value, so ``sum(counts) + missing`` is the item count."""

    edges: list[float]
    counts: list[int]
    missing: int

    @property
    def total(self) -> int:
        """Items with a value."""
        return sum(self.counts)


def histogram(values: Sequence[float | None], bins: int = 20) -> Histogram:
    """A histogram of ``values`` with at most ``bins`` equal-width bins over [min, max].

    Integer data (token counts) get integer-aligned edges so no bin straddles a value; a
    single distinct value is one bin.
    """
    present = [float(v) for v in values if v is not None]
    missing = len(values) - len(present)
    if not present:
        return Histogram(edges=[], counts=[], missing=missing)
    lo, hi = min(present), max(present)
    if lo == hi:
        return Histogram(edges=[lo, hi], counts=[len(present)], missing=missing)
    width = (hi - lo) / bins
    if all(v.is_integer() for v in present):
        width = max(1.0, math.ceil(width))
        bins = max(1, math.ceil((hi - lo + 1) / width))
    edges = [lo + i * width for i in range(bins)] + [max(hi, lo + bins * width)]
    counts = [0] * bins
    for value in present:
        index = min(int((value - lo) / width), bins - 1)
        counts[index] += 1
    return Histogram(edges=edges, counts=counts, missing=missing)


def paired_bootstrap_ci(
    deltas: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval for the mean of paired differences ``deltas``.

    Pairs are resampled whole (so the correlation between the two runs is kept); None when
    there are no pairs.
    """
    n = len(deltas)
    if n == 0:
        return None
    rng = random.Random(seed)
    population = list(deltas)
    means = sorted(math.fsum(rng.choices(population, k=n)) / n for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = percentile(means, tail), percentile(means, 100.0 - tail)
    assert low is not None and high is not None
    return low, high


def mcnemar_exact_p(pass_to_fail: int, fail_to_pass: int) -> float:
    """McNemar's exact two-sided p-value for ``b`` and ``c`` discordant pairs:
    ``min(1, 2 * P(X <= min(b, c)))`` with ``X ~ Binomial(b + c, 1/2)``; 1.0 without any flip.

    Computed with exact integers, so it stays right for thousands of pairs.
    """
    n = pass_to_fail + fail_to_pass
    if n == 0:
        return 1.0
    k = min(pass_to_fail, fail_to_pass)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / (1 << n))
