"""``eval report`` of a run with nothing scored (no index rows): the pass rate is shown as
missing, not as ``0.0%`` (which would claim every item failed), while ``--json`` and the page's
``data-value`` keep ``metrics.json``'s value, the integer 0 the reference writes then."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.reporting import load_run, render_report
from launcher.reporting.summary import summarize
from tests.reporting.rundirs import synthetic_items, write_run

EMPTY_SUMMARY = {
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


@pytest.fixture
def unscored(tmp_path: Path) -> Path:
    """A run stopped after its model check: manifest and metrics, no result yet."""
    run = tmp_path / "early"
    write_run(run, synthetic_items(3), metrics_summary=EMPTY_SUMMARY, status="running")
    for name in ("index.jsonl", "events.jsonl"):
        (run / name).write_bytes(b"")
    (run / "progress.json").write_text(json.dumps({"total_runs": 21}))
    return run


def _pass_rate_card(page: str) -> tuple[str, str]:
    found = re.search(
        r'data-metric="pass_rate" data-value="([^"]*)"><div class="stat-v">([^<]*)<', page
    )
    assert found is not None
    return found.group(1), found.group(2)


def test_the_page_shows_no_pass_rate_and_keeps_the_metrics_value(unscored: Path) -> None:
    value, text = _pass_rate_card(render_report(load_run(unscored)))
    assert value == "0" and text == "–"  # the page's mark for a missing number


def test_the_summary_text_is_a_dash_like_eval_list(unscored: Path) -> None:
    summary = summarize(load_run(unscored))
    assert summary.pass_rate is None and summary.pass_rate_text == "-"
    assert summary.metrics["pass_rate"] == 0


def test_a_scored_run_still_shows_its_rate(tmp_path: Path) -> None:
    run = write_run(tmp_path / "scored", synthetic_items(20))
    summary = summarize(load_run(run))
    metrics = json.loads((run / "metrics.json").read_text())["summary"]
    rate, passed, scored = metrics["pass_rate"], metrics["passed"], metrics["completed_samples"]
    assert summary.pass_rate_text == f"{rate:.1%} ({passed}/{scored})"
    assert _pass_rate_card(render_report(load_run(run)))[1] == f"{rate * 100:.1f}%"


def test_json_keeps_the_reference_zero(unscored: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "report", str(unscored), "--json"])
    out, _ = capsys.readouterr()
    assert exc.value.code in (0, None)
    assert json.loads(out)["result"]["summary"]["pass_rate"] == 0
