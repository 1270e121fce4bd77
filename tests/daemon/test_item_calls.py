"""The daemon's item view (``GET /v1/runs/{name}/items/{row}/{run}``) returns the item's model
calls and its usage totals from the run directory (docs/calls.md)."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.daemon.api import _item


def test_the_item_view_returns_its_calls(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    index = {
        "row_index": 0,
        "run_index": 0,
        "rollout_id": "r1",
        "status": "success",
        "tokens": 90,
        "calls": 3,
        "cached_tokens": 12,
        "reasoning_tokens": 4,
        "metrics": {"turns": 3},
    }
    (run / "index.jsonl").write_text(json.dumps(index) + "\n")
    calls = [
        {"kind": "rollout", "rollout_id": "r1", "index": i, "status": 200, "total_tokens": 30}
        for i in range(3)
    ]
    calls.insert(1, {"kind": "rollout", "rollout_id": "r0-superseded", "index": 0})
    calls.insert(0, {"kind": "preflight", "rollout_id": None, "status": 200})
    (run / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    view = _item(run, "0", "0")
    assert view["usage"]["calls"] == 3  # the row's calls, not the trajectory's step count
    assert (view["usage"]["cached_tokens"], view["usage"]["reasoning_tokens"]) == (12, 4)
    assert view["metrics"] == {"turns": 3}
    assert [c["index"] for c in view["calls"]] == [0, 1, 2]
    assert {c["rollout_id"] for c in view["calls"]} == {"r1"}
