"""metrics.json summary values against hand-computed numbers (docs/spec/supervisor.md §6.2)."""

from __future__ import annotations

import pytest

from launcher.rundir.metrics import LiveCounters, aggregate_metrics, pass_at_k, pass_at_k_estimate


def row(
    r: int, k: int, status: str, reward: float | None = None, tokens: int | None = None
) -> dict:
    out: dict = {"row_index": r, "run_index": k, "status": status}
    if reward is not None:
        out["reward"] = reward
    if tokens is not None:
        out["tokens"] = tokens
    return out


def test_empty() -> None:
    assert aggregate_metrics([], 1.0) == {
        "total_samples": 0,
        "completed_samples": 0,
        "graded": 0,
        "passed": 0,
        "failed": 0,
        "skipped": 0,
        "pass_rate": 0,
        "pass_threshold": 1.0,
        "tokens_used": 0,
    }


def test_skipped_excluded_failed_scored() -> None:
    rows = [
        row(0, 0, "success", 1.0, tokens=10),
        row(1, 0, "success", 0.4, tokens=5),
        row(2, 0, "failed", None, tokens=7),
        row(3, 0, "skipped", None, tokens=3),
        row(4, 0, "failed", 0.9),  # a failure whose reward meets the threshold passes
        row(5, 0, "success"),  # ungraded success
    ]
    m = aggregate_metrics(rows, 0.5)
    assert m["total_samples"] == 6
    assert m["completed_samples"] == 5
    assert m["graded"] == 3
    assert m["passed"] == 2
    assert m["failed"] == 2
    assert m["skipped"] == 1
    assert m["pass_rate"] == pytest.approx(2 / 5)
    assert m["pass_threshold"] == 0.5
    assert m["tokens_used"] == 25  # skipped rows' tokens count too
    assert m["reward_stats"] == {
        "mean": pytest.approx((1.0 + 0.4 + 0.9) / 3),
        "median": 0.9,
        "std": pytest.approx(0.26246692913372704),
        "min": 0.4,
        "max": 1.0,
    }
    assert "n_runs" not in m and "pass_at_k" not in m
    assert list(m) == [
        "total_samples",
        "completed_samples",
        "graded",
        "passed",
        "failed",
        "skipped",
        "pass_rate",
        "pass_threshold",
        "tokens_used",
        "reward_stats",
    ]


def test_single_reward_std_is_zero() -> None:
    assert aggregate_metrics([row(0, 0, "success", 0.3)], 1.0)["reward_stats"]["std"] == 0.0


def test_pass_at_k_example_from_spec() -> None:
    # rows with (3 attempts, 1 pass) and (2 attempts, 2 passes)
    rows = [
        row(0, 0, "success", 1.0),
        row(0, 1, "success", 0.0),
        row(0, 2, "failed"),
        row(1, 0, "success", 1.0),
        row(1, 1, "success", 1.0),
    ]
    m = aggregate_metrics(rows, 1.0)
    assert m["n_runs"] == 3
    assert m["pass_at_k"] == [
        {"k": 1, "value": pytest.approx((1 / 3 + 1.0) / 2)},
        {"k": 2, "value": pytest.approx((2 / 3 + 1.0) / 2)},
    ]
    assert round(m["pass_at_k"][0]["value"], 4) == 0.6667
    assert round(m["pass_at_k"][1]["value"], 4) == 0.8333


def test_pass_at_k_drops_ineligible_k_and_needs_two_points() -> None:
    # n_runs = 2, but with every second run skipped only k=1 has eligible rows -> no list.
    rows = [row(0, 0, "success", 1.0), row(0, 1, "skipped")]
    m = aggregate_metrics(rows, 1.0)
    assert m["n_runs"] == 2 and "pass_at_k" not in m
    assert pass_at_k({0: (1, 1)}, 4) == [{"k": 1, "value": 1.0}]


def test_estimator() -> None:
    assert pass_at_k_estimate(5, 0, 1) == 0.0
    assert pass_at_k_estimate(5, 5, 4) == 1.0
    assert pass_at_k_estimate(4, 1, 2) == pytest.approx(1 - (3 / 4) * (2 / 3))


def test_live_counters_match_aggregate_and_handle_supersede() -> None:
    live = LiveCounters(pass_threshold=0.5)
    live.apply("failed", None)
    live.apply("success", 1.0)
    live.apply("skipped", None)
    assert (live.completed, live.failed, live.passed, live.skipped) == (3, 1, 1, 1)
    assert live.pass_rate == 0.5
    # --retry-failed: the failure is superseded by a pass, the skip by a low success.
    live.apply("success", 0.9, previous=("failed", None))
    live.apply("success", 0.1, previous=("skipped", None))
    assert (live.completed, live.failed, live.succeeded, live.passed, live.skipped) == (
        3,
        0,
        3,
        2,
        0,
    )
    assert live.pass_rate == pytest.approx(2 / 3)
    rows = [row(0, 0, "success", 0.9), row(1, 0, "success", 1.0), row(2, 0, "success", 0.1)]
    assert aggregate_metrics(rows, 0.5)["pass_rate"] == pytest.approx(live.pass_rate)


def test_live_rate_is_zero_when_nothing_scored() -> None:
    live = LiveCounters()
    live.apply("skipped", None)
    assert live.pass_rate == 0.0


def test_compact_rows_give_the_same_summary_and_lines() -> None:
    # The supervisor keeps each index row as a tuple (index_values) and aggregates those; the
    # summary and every index line must be byte-identical to the dict form's.
    import json
    import random

    from launcher.rundir.journal import TerminalRecord
    from launcher.rundir.metrics import aggregate_index_values
    from launcher.rundir.projections import (
        index_line,
        index_row,
        index_values,
        index_values_line,
    )

    rng = random.Random(15)
    records = []
    for r in range(300):
        for k in range(rng.choice([4, 4, 3])):  # some rows with fewer attempts
            status = rng.choice(["success", "success", "failed", "skipped"])
            reward = rng.choice([None, 0, 1, 0.1, 0.7, rng.random()])
            records.append(
                TerminalRecord(
                    row_index=r,
                    run_index=k,
                    rollout_id=f"r{r}-{k}",
                    status=status,
                    reward=reward,
                    tokens=rng.choice([None, 0, rng.randrange(10_000)]),
                    duration_ms=rng.choice([None, 12.5]),
                    error_type="timeout" if status == "failed" else None,
                )
            )
    traj = {"final_metrics": {"total_prompt_tokens": 3}}
    values = [
        index_values(rec, traj if i % 3 else None, resumed=i % 5 == 0)
        for i, rec in enumerate(records)
    ]
    rows = [
        index_row(rec, traj if i % 3 else None, resumed=i % 5 == 0) for i, rec in enumerate(records)
    ]
    assert [index_values_line(v) for v in values] == [index_line(r) for r in rows]
    for threshold in (0.5, 1.0):
        compact = aggregate_index_values(values, threshold)
        assert json.dumps(compact) == json.dumps(aggregate_metrics(rows, threshold))
        assert "pass_at_k" in compact and compact["reward_stats"]["std"] > 0
    assert aggregate_index_values([], 1.0) == aggregate_metrics([], 1.0)
    with pytest.raises(ValueError, match="order"):
        aggregate_index_values(values[::-1], 1.0)
