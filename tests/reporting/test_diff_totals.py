"""``eval diff`` says what its token and call numbers count (issue 27 item 7): the pairs with
the number on both sides, and separately every item of each run."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.reporting import diff_runs, load_run
from launcher.reporting.diff_page import diff_rows
from tests.reporting.rundirs import synthetic_items, write_run


def _with_calls(run: Path, calls: dict[int, int]) -> Path:
    rows = [json.loads(x) for x in (run / "index.jsonl").read_text().splitlines()]
    for row in rows:
        if row["row_index"] in calls:
            row["calls"] = calls[row["row_index"]]
    (run / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_token_totals_name_the_pairs_and_count_every_item_too(tmp_path: Path) -> None:
    items_a = synthetic_items(20)
    items_b = [dict(i) for i in items_a]
    for i in (0, 1, 2):  # B's bridge saw no usage for these: unpaired token counts
        items_b[i]["tokens"] = None
    a = load_run(_with_calls(write_run(tmp_path / "a", items_a), {i: 2 for i in range(20)}))
    b = load_run(_with_calls(write_run(tmp_path / "b", items_b), {i: 3 for i in range(10)}))
    result = diff_runs(a, b)
    tokens = result.tokens
    assert tokens["pairs"] == 17
    assert tokens["total_a"] == sum(i["tokens"] for i in items_a[3:])
    assert tokens["all_total_a"] == sum(i["tokens"] for i in items_a)
    assert tokens["all_total_b"] == sum(i["tokens"] for i in items_b[3:])
    calls = result.to_json()["calls"]
    assert (calls["pairs"], calls["mean_a"], calls["mean_b"]) == (10, 2.0, 3.0)
    assert (calls["all_total_a"], calls["all_total_b"]) == (40, 30)
    labels = {row[0]: row for row in diff_rows(result)}
    assert "total tokens of those 17 pairs" in labels
    every = labels["total tokens, every item of each run"]
    assert every[1] == f"{tokens['all_total_a']:,}" and every[2] == f"{tokens['all_total_b']:,}"
    assert labels["total model calls, every item of each run"][1:3] == ("40", "30")
