"""``rollbridge eval diff``: flips equal the ones read off the two index.jsonl files, McNemar's
p-value equals the hand-computed binomial tail, runs over different rows are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from launcher.reporting import RowsMismatch, diff_runs, load_run
from launcher.reporting.diff_page import render_diff
from tests.launcher.e2e.helpers import base_env, run_cli
from tests.reporting.conftest import ExampleRuns
from tests.reporting.pageparse import external_references, parse_page
from tests.reporting.rundirs import synthetic_items, write_run


def _outcomes(run: Path) -> dict[tuple[int, int], bool | None]:
    """Pass/fail per item straight from index.jsonl (threshold 1.0; skipped = None)."""
    out: dict[tuple[int, int], bool | None] = {}
    for line in (run / "index.jsonl").read_text().splitlines():
        row = json.loads(line)
        key = (row["row_index"], row["run_index"])
        out[key] = None if row["status"] == "skipped" else row.get("reward", -1) >= 1.0
    return out


def _expected_flips(a: Path, b: Path) -> list[list[object]]:
    oa, ob = _outcomes(a), _outcomes(b)
    flips: list[list[object]] = []
    for key in sorted(oa.keys() & ob.keys()):
        x, y = oa[key], ob[key]
        if x is None or y is None or x == y:
            continue
        flips.append([key[0], key[1], "pass→fail" if x else "fail→pass"])
    return flips


@pytest.mark.slow
async def test_diff_of_the_example_and_an_inverted_grader(example_runs: ExampleRuns) -> None:
    out = example_runs.workspace / "d.html"
    result = await run_cli(
        ["--json", "eval", "diff", "a", "b", "-o", str(out)],
        cwd=example_runs.workspace,
        env=base_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    numbers = result.envelope()["result"]
    expected = _expected_flips(example_runs.a, example_runs.b)
    assert numbers["flips"] == expected
    b = sum(1 for f in expected if f[2] == "pass→fail")
    c = len(expected) - b
    assert (numbers["pass_to_fail"], numbers["fail_to_pass"]) == (b, c) == (16, 3)
    # two-sided exact McNemar: 2 * P(X <= 3), X ~ Bin(19, 1/2) = 2 * (1+19+171+969) / 2**19
    assert numbers["mcnemar_p"] == 2 * (1 + 19 + 171 + 969) / 2**19
    assert numbers["other_changes"] == ["rollout"]
    low, high = numbers["reward"]["ci95"]
    assert low <= numbers["reward"]["mean_delta"] <= high < 0
    page = out.read_text()
    assert external_references(page) == []
    flips = parse_page(page).data["flips"]
    assert [[f["a"]["row"], f["a"]["run"], f["direction"]] for f in flips] == expected
    assert all(f["a"]["transcript"] and f["b"]["transcript"] for f in flips)


@pytest.mark.slow
async def test_diff_of_runs_over_different_rows_is_refused(example_runs: ExampleRuns) -> None:
    result = await run_cli(
        ["eval", "diff", "a", "c"], cwd=example_runs.workspace, env=base_env(), timeout=60
    )
    assert result.returncode == 1
    line = result.stderr.strip()
    assert line.startswith("Error: ") and "\n" not in line
    assert "Changed: dataset" in line and "selected_source_rows 0-20 vs 0-9" in line
    assert not list(example_runs.workspace.glob("diff-*.html"))


def test_diff_counts_and_refusal_on_constructed_runs(tmp_path: Path) -> None:
    items_a = synthetic_items(40)
    items_b = [dict(i) for i in synthetic_items(40)]
    for i in (0, 1, 2):  # three more passes in B ...
        items_b[i]["reward"], items_b[i]["status"] = 1.0, "success"
    for i in range(10, 40):  # ... and B fails every graded item from 10 on
        if items_b[i].get("reward") == 1.0:
            items_b[i]["reward"] = 0.0
    a = load_run(write_run(tmp_path / "a", items_a))
    b = load_run(write_run(tmp_path / "b", items_b))
    result = diff_runs(a, b)
    expected = _expected_flips(tmp_path / "a", tmp_path / "b")
    assert [[f.key[0], f.key[1], f.direction] for f in result.flips] == expected
    assert result.pairs == 40 and result.only_a == result.only_b == 0
    assert result.tokens["mean_delta"] == 0.0
    assert external_references(render_diff(result)) == []
    other = load_run(write_run(tmp_path / "x", items_a, sha256="ef" * 32))
    with pytest.raises(RowsMismatch, match=r"Changed: dataset \(sha256 "):
        diff_runs(a, other)


async def test_diff_cli_names_the_missing_run(tmp_path: Path) -> None:
    write_run(tmp_path / "a", synthetic_items(3))
    with trio.fail_after(60):
        result = await run_cli(
            ["eval", "diff", "a", "zzz", "--output-root", "."], cwd=tmp_path, env=base_env()
        )
    assert result.returncode == 1
    assert result.stderr.startswith("Error: no run 'zzz'")
