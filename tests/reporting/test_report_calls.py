"""The report's model calls: each item's calls as a timeline in the page data, and the run's
call, cached and reasoning totals beside its tokens (docs/calls.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.reporting import load_run, render_report
from tests.reporting.pageparse import parse_page
from tests.reporting.rundirs import synthetic_items, write_run


def _call(rollout_id: str, index: int, start: str, **kw: Any) -> dict[str, Any]:
    return {
        "kind": "rollout",
        "rollout_id": rollout_id,
        "index": index,
        "api": "chat.completions",
        "model": "m",
        "stream": False,
        "started_at": start,
        "ttfb_ms": 50.0,
        "duration_ms": 200.0,
        "status": 200,
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "total_tokens": 110,
        "cached_tokens": 80,
        "reasoning_tokens": 4,
        "finish_reason": "stop",
        "logprobs": {"token": ["a"], "logprob": [-1.0]},
        **kw,
    }


def test_each_item_shows_its_calls_and_the_run_its_totals(tmp_path: Path) -> None:
    items = synthetic_items(4)
    run = write_run(tmp_path / "r", items)
    rows = [json.loads(x) for x in (run / "index.jsonl").read_text().splitlines()]
    first = rows[0]["rollout_id"]
    rows[0].update(calls=2, cached_tokens=160, reasoning_tokens=8, retries=1, metrics={"t": 2})
    rows[1].update(calls=1, cached_tokens=5)
    (run / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = [
        _call(first, 0, "2026-12-02T00:00:00.000000Z"),
        _call(
            first,
            1,
            "2026-12-02T00:00:00.500000Z",
            retries=[{"status": 429, "kind": "RateLimitError"}],
        ),
        _call("someone-else", 0, "2026-12-02T00:00:00.000000Z"),
    ]
    (run / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    page = parse_page(render_report(load_run(run)))
    assert float(page.metrics["calls"]) == 3
    assert float(page.metrics["cached_tokens"]) == 165
    assert float(page.metrics["reasoning_tokens"]) == 8
    assert float(page.metrics["retries"]) == 1
    shown = {i["id"]: i for i in page.data["items"]}
    timeline = shown[first]["calls"]
    assert [c["start_ms"] for c in timeline] == [0.0, 500.0]
    assert timeline[1]["retries"] == 1 and timeline[1]["retry_causes"] == ["RateLimitError (429)"]
    assert timeline[0]["cached_tokens"] == 80 and "logprobs" not in timeline[0]
    assert shown[first]["usage"] == {
        "calls": 2,
        "cached_tokens": 160,
        "reasoning_tokens": 8,
        "retries": 1,
        "metrics": {"t": 2},
    }
    assert "calls" not in shown[rows[2]["rollout_id"]]  # no records: no timeline
