"""``rollbridge eval report``: every number on the page equals its source file, histograms
count every item, the page loads nothing from anywhere, failures show their reasons."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import NotFoundError
from launcher.reporting import load_run, render_report, resolve_run_dir
from tests.reporting.conftest import ExampleRuns
from tests.reporting.pageparse import ParsedPage, external_references, parse_page
from tests.reporting.rundirs import synthetic_items, write_run


def _index(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "index.jsonl").read_text().splitlines() if x.strip()]


def _check_against_sources(page: ParsedPage, run: Path) -> None:
    summary = json.loads((run / "metrics.json").read_text())["summary"]
    rows = _index(run)
    for key in (
        "pass_rate",
        "total_samples",
        "passed",
        "failed",
        "skipped",
        "graded",
        "tokens_used",
    ):
        assert float(page.metrics[key]) == summary[key], key
    for key, value in summary.get("reward_stats", {}).items():
        assert float(page.metrics[f"reward_{key}"]) == pytest.approx(value, rel=1e-12), key
    for point in summary.get("pass_at_k", []):
        assert float(page.metrics[f"pass_at_{point['k']}"]) == point["value"]
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    assert page.status_counts == statuses
    for field, key in (("tokens", "tokens"), ("max_context_tokens", "max_context_tokens")):
        assert sum(page.bars[field]) + page.missing[field] == len(rows)
        assert page.missing[field] == sum(1 for r in rows if r.get(key) is None)
        values = [r[key] for r in rows if r.get(key) is not None]
        assert float(page.metrics[f"{field}_max"]) == max(values)
    # the table's data: one entry per index row, same numbers
    table = {(i["row"], i["run"]): i for i in page.data["items"]}
    assert len(table) == len(rows)
    for row in rows:
        item = table[(row["row_index"], row["run_index"])]
        assert item["id"] == row["rollout_id"] and item["status"] == row["status"]
        for src, dst in (
            ("reward", "reward"),
            ("tokens", "tokens"),
            ("max_context_tokens", "context"),
            ("duration_ms", "duration_ms"),
        ):
            assert item.get(dst) == row.get(src), (row, src)


@pytest.mark.slow
def test_report_of_the_example_run_equals_its_files(example_runs: ExampleRuns) -> None:
    run = example_runs.a
    text = render_report(load_run(run))
    page = parse_page(text)
    _check_against_sources(page, run)
    assert page.metrics["status"] == "finished"
    assert external_references(text) == []
    failed = [i for i in page.data["items"] if i["status"] == "failed"]
    assert failed and all(i["error"]["category"] == "validation_error" for i in failed)
    assert page.error_counts == {"validation_error": len(failed)}
    # transcripts and dataset rows are joined in
    first = next(i for i in page.data["items"] if i["row"] == 0)
    assert first["prompt"] == "Repeat after me: apple" and first["label"] == "apple"
    trajectory = json.loads((run / "rollout_trials" / first["id"] / "trajectory.json").read_text())
    assert [(s["source"], s["message"]) for s in first["transcript"]] == [
        (s["source"], s["message"]) for s in trajectory["steps"]
    ]
    assert first["transcript"][-1]["source"] == "agent"


def test_report_of_a_run_with_failures_errors_and_missing_values(tmp_path: Path) -> None:
    items = synthetic_items(60)
    items[7]["tokens"] = None
    items[7]["max_context_tokens"] = None
    items[12]["diagnostics"] = {"backend": "local", "attempts": 2}
    # an older row with only error_type, no error object
    legacy = next(i for i in items if i["status"] == "failed")
    legacy.pop("error")
    run = write_run(tmp_path / "r1", items)  # metrics.json: counted by hand_summary
    text = render_report(load_run(run))
    page = parse_page(text)
    _check_against_sources(page, run)
    assert external_references(text) == []
    by_id = {i["id"]: i for i in page.data["items"]}
    for item in items:
        shown = by_id[item["rollout_id"]]
        if "error" in item:
            assert shown["error"] == {"category": item["error_type"], **item["error"]}
        elif item["status"] == "failed":
            assert shown["error"] == {"category": item["error_type"]}
        else:
            assert "error" not in shown
    assert by_id[items[12]["rollout_id"]]["diagnostics"] == {"backend": "local", "attempts": 2}
    assert by_id[items[5]["rollout_id"]]["transcript"][1]["tool_calls"][0]["name"] == "lookup"


def test_page_data_cannot_close_its_script_element(tmp_path: Path) -> None:
    items = synthetic_items(3)
    items[0]["prompt"] = "</script><script>alert(1)</script><!--"
    items[0]["reply"] = "see https://example.com/x and <img src=x onerror=alert(1)>"
    run = write_run(tmp_path / "evil", items)
    text = render_report(load_run(run))
    assert "alert(1)</script>" not in text and "<img src=x" not in text
    assert external_references(text) == []
    assert parse_page(text).data["items"][0]["prompt"] == items[0]["prompt"]


def test_run_names_resolve_under_the_workspace_or_output_root(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "configs" / "eval").mkdir(parents=True)
    run = write_run(ws / ".osmosis" / "evals" / "calm-fox-1", synthetic_items(2))
    nested = ws / "data" / "deep"
    nested.mkdir(parents=True)
    assert resolve_run_dir("calm-fox-1", cwd=nested) == run
    assert resolve_run_dir(str(run), cwd=tmp_path) == run
    assert resolve_run_dir("calm-fox-1", cwd=tmp_path, workspace=str(ws)) == run
    other = write_run(tmp_path / "out" / "r", synthetic_items(2))
    assert resolve_run_dir("r", cwd=tmp_path, output_root="out") == other
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        resolve_run_dir("nope", cwd=nested)
    with pytest.raises(NotFoundError, match="no workspace was found"):
        resolve_run_dir("calm-fox-1", cwd=tmp_path)
    with pytest.raises(NotFoundError, match="not a run directory"):
        load_run(tmp_path)


def test_rubric_scores_stand_beside_the_rewards(tmp_path: Path) -> None:
    """Verdicts of ``eval rubric --run`` (one file per judge) become one column per judge."""
    items = synthetic_items(4)
    run = write_run(tmp_path / "judged", items)
    rubric = run / "rubric"
    rubric.mkdir()
    (rubric / "abc.json").write_text(json.dumps({"digest": "abc", "model": "openai/judge"}))
    first, second = items[0]["rollout_id"], items[1]["rollout_id"]
    lines = [
        {"rollout_id": first, "judge_run": 0, "score": 0.5},
        {"rollout_id": first, "judge_run": 1, "score": 1.0},
        {"rollout_id": second, "judge_run": 0, "score": None, "error": "bad JSON"},
    ]
    (rubric / "abc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = parse_page(render_report(load_run(run)))
    assert page.data["rubrics"] == ["openai/judge"]
    by_id = {i["id"]: i for i in page.data["items"]}
    assert by_id[first]["rubric"] == {"openai/judge": 0.75}
    assert "rubric" not in by_id[second]  # a failed verdict has no score


def test_a_running_run_without_its_supervisor_is_shown_incomplete_and_watch_ends(
    tmp_path: Path,
) -> None:
    """``metrics.json`` says ``running`` until the supervisor's last word; after a ``kill -9``
    (or in a copy) nobody holds the run's lock, so the run is incomplete and ``--watch`` ends
    instead of waiting for ever. While the lock is held it is running."""
    from launcher.reporting.commands import RunLocator, report_command
    from launcher.rundir.lock import RunLock
    from launcher.ui import UI

    root = tmp_path / "evals"
    run = write_run(root / "dead", synthetic_items(6), status="running")
    assert load_run(run).eval_run["status"] == "incomplete"
    lock = RunLock.acquire(root, "dead")
    try:
        assert load_run(run).eval_run["status"] == "running"
    finally:
        lock.release()
    sleeps: list[float] = []
    ui = UI(mode="plain")
    locator = RunLocator(cwd=tmp_path, output_root=str(root))
    code = report_command(
        ui, locator, "dead", output=None, open_browser=False, watch=True, sleep=sleeps.append
    )
    assert code == 0 and sleeps == []
    assert (run / "report.html").is_file()
