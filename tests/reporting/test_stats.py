"""The statistics behind the report and the diff, against values worked out by hand."""

from __future__ import annotations

import math
import statistics

import pytest

from launcher.reporting.stats import histogram, mcnemar_exact_p, paired_bootstrap_ci, percentile


def test_mcnemar_exact_matches_hand_computed_binomial_tails() -> None:
    # b=1, c=5: n=6, P(X<=1) = (1 + 6) / 64, two-sided 14/64.
    assert mcnemar_exact_p(1, 5) == pytest.approx(14 / 64, abs=0, rel=1e-15)
    assert mcnemar_exact_p(5, 1) == mcnemar_exact_p(1, 5)
    # b=16, c=3: n=19, 2 * (1 + 19 + 171 + 969) / 2**19.
    assert mcnemar_exact_p(16, 3) == 2320 / 524288
    # balanced flips cap at 1; no flip at all is no evidence.
    assert mcnemar_exact_p(4, 4) == 1.0
    assert mcnemar_exact_p(0, 0) == 1.0
    # thousands of flips stay finite and tiny, not an overflow.
    assert 0.0 <= mcnemar_exact_p(4000, 1000) < 1e-100


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([7], 95) == 7.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 95) == pytest.approx(48.0)
    assert percentile([5, 1, 3], 100) == 5.0


@pytest.mark.parametrize(
    "values",
    [
        [19, 28, 28, 30, 32, None],
        [0.5, 1.25, 1.25, 9.75],
        [3, 3, 3],
        list(range(1000)),
        [None, None],
    ],
)
def test_histogram_bins_count_every_value_once(values: list[float | None]) -> None:
    h = histogram(values)
    assert h.total + h.missing == len(values)
    assert h.missing == sum(1 for v in values if v is None)
    if h.counts:
        assert len(h.edges) == len(h.counts) + 1
        assert h.edges == sorted(h.edges)
        present = [v for v in values if v is not None]
        assert h.edges[0] <= min(present) and max(present) <= h.edges[-1]


def test_histogram_integer_bins_hold_whole_values() -> None:
    h = histogram([1, 2, 2, 3, 10])
    # unit-wide bins [1,2), [2,3), ...: each integer lands in exactly the bin starting at it
    assert h.edges[:3] == [1.0, 2.0, 3.0]
    assert h.counts[0] == 1 and h.counts[1] == 2 and h.counts[2] == 1 and h.counts[-1] == 1


def test_paired_bootstrap_is_reproducible_and_brackets_the_mean() -> None:
    deltas = [(-1.0) ** i * (i % 7) / 7 + 0.1 for i in range(200)]
    first = paired_bootstrap_ci(deltas)
    assert first is not None
    assert first == paired_bootstrap_ci(deltas)
    low, high = first
    mean = statistics.fmean(deltas)
    assert low < mean < high
    # roughly mean ± 1.96 standard errors
    se = statistics.stdev(deltas) / math.sqrt(len(deltas))
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert paired_bootstrap_ci([]) is None
    assert paired_bootstrap_ci([0.25, 0.25]) == (0.25, 0.25)
