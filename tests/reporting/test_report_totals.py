"""``eval report`` of an incomplete run says how many items are missing, and ``--plain``
prints only the page's path (docs/report.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.launcher.test_runs import _run
from tests.reporting.rundirs import synthetic_items, write_run


@pytest.fixture
def partial(tmp_path: Path) -> Path:
    run = write_run(tmp_path / "half", synthetic_items(1265), rows="0-4999", status="incomplete")
    return run


def test_an_incomplete_run_says_how_many_items_are_pending(
    partial: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "--json", "eval", "report", str(partial))
    result = json.loads(out)["result"]
    assert code == 0
    assert (result["done"], result["total"], result["pending"]) == (1265, 5000, 3735)
    assert result["progress"] == "1,265 of 5,000 (3,735 pending)"
    page = (partial / "report.html").read_text()
    assert "1,265 of 5,000 (3,735 pending)" in page
    # progress.json, when there, is the total.
    (partial / "progress.json").write_text(json.dumps({"total_runs": 2000}))
    code, out, _ = _run(capsys, "--json", "eval", "report", str(partial))
    assert json.loads(out)["result"]["progress"] == "1,265 of 2,000 (735 pending)"


def test_a_complete_run_shows_its_count_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "full", synthetic_items(12))
    code, out, _ = _run(capsys, "--json", "eval", "report", str(run))
    result = json.loads(out)["result"]
    assert code == 0 and (result["pending"], result["progress"]) == (0, "12")


def test_plain_prints_only_the_path(partial: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "eval", "report", str(partial), "--plain")
    assert (code, err) == (0, "")
    assert out == f"{partial / 'report.html'}\n"
    assert not re.search("Report written", out)
