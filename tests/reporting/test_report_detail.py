"""The report page's item detail and wall time (issue 27 item 8), in headless Chromium: the
detail opens right under the clicked row (not far below the table), shows no stray ``null``,
and the wall time is the run's total over its invocations, each of them listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from launcher.reporting import load_run, render_report
from tests.reporting.cdp import Browser, file_url, open_browser
from tests.reporting.conftest import ExampleRuns
from tests.reporting.rundirs import synthetic_items, write_run

TWO_INVOCATIONS = (
    "2026-01-01T00:00:00Z INFO [run] r: 150 of 150 work items pending\n"
    "2026-01-01T00:00:05Z INFO [schedule] running 150 work items, up to 4 in flight\n"
    "2026-01-01T00:00:09Z WARNING [cancel] supervisor cancellation requested\n"
    '2026-01-01T00:00:10Z INFO [finalize] invocation ended {"duration_ms":10000.0,'
    '"started_at":"2026-01-01T00:00:00.000000Z","status":"incomplete"}\n'
    "2026-01-01T01:00:00Z INFO [run] r: 80 of 150 work items pending, 70 already recorded\n"
    '2026-01-01T01:00:30Z INFO [finalize] invocation ended {"duration_ms":30500.0,'
    '"started_at":"2026-01-01T01:00:00.000000Z","status":"finished"}\n'
)

DETAIL_TEXT = (
    "(() => { const d = document.getElementById('detail');"
    " const c = d.cloneNode(true); c.querySelectorAll('.diagnostics').forEach(n => n.remove());"
    " return c.innerText; })()"
)


async def _open(browser: Browser, page: Path) -> None:
    await browser.navigate(file_url(page))
    await browser.wait_for("document.body && document.body.dataset.ready === '1'")


async def _click_row(browser: Browser, index: int) -> dict[str, float]:
    """Click the ``index``-th visible row; the gap (px) between its bottom and the detail's
    top, and whether the detail sits in the row right after it."""
    doc: dict[str, float] = await browser.evaluate(
        f"(() => {{ const tr = document.querySelectorAll('#item-rows tr.item')[{index}];"
        " tr.click(); const d = document.getElementById('detail');"
        " const a = tr.getBoundingClientRect(), b = d.getBoundingClientRect();"
        " return {gap: b.top - a.bottom, next: tr.nextElementSibling && "
        "tr.nextElementSibling.contains(d) ? 1 : 0, hidden: d.hidden ? 1 : 0}; })()"
    )
    return doc


async def test_detail_opens_under_the_row_without_null_and_wall_time_sums(
    chromium: str, tmp_path: Path
) -> None:
    items = synthetic_items(150)
    for item in items[::7]:
        item["diagnostics"] = {"failure": None, "note": "kept as written"}
    run = write_run(tmp_path / "r", items, log=TWO_INVOCATIONS)
    page = tmp_path / "report.html"
    page.write_text(render_report(load_run(run)))
    with trio.fail_after(60):
        async with open_browser(chromium) as browser:
            await _open(browser, page)
            for index in (0, 40, 99, 3):
                where = await _click_row(browser, index)
                assert where["hidden"] == 0 and where["next"] == 1, where
                assert 0 <= where["gap"] < 5, where
                text = await browser.evaluate(DETAIL_TEXT)
                assert "null" not in text and "undefined" not in text, text
            # Paging redraws the rows; the detail follows its row, or waits below the table.
            await browser.evaluate("document.getElementById('next-page').click()")
            assert await browser.evaluate("document.getElementById('detail').hidden") is False
            wall = await browser.evaluate(
                "document.querySelector('[data-metric=wall_ms]').dataset.value"
            )
            assert float(wall) == 40500.0
            label = await browser.evaluate(
                "document.querySelector('[data-metric=wall_ms] .stat-k').textContent"
            )
            assert label == "wall time (s), 2 invocations"
            rows = await browser.evaluate(
                "[...document.querySelectorAll('#invocations tbody tr')].map(tr => tr.innerText)"
            )
            assert [r.split("\t")[2:] for r in rows] == [["10", "incomplete"], ["30.5", "finished"]]


@pytest.mark.slow
async def test_the_example_runs_details_show_no_null(
    chromium: str, example_runs: ExampleRuns, tmp_path: Path
) -> None:
    run = example_runs.a
    logs = (run / "logs.txt").read_text()
    ended = [line for line in logs.splitlines() if "INFO [finalize] invocation ended" in line]
    assert len(ended) == 1
    duration = json.loads(ended[0].split("invocation ended ", 1)[1])["duration_ms"]
    page = tmp_path / "example.html"
    page.write_text(render_report(load_run(run)))
    count = len((run / "index.jsonl").read_text().splitlines())
    with trio.fail_after(90):
        async with open_browser(chromium) as browser:
            await _open(browser, page)
            wall = await browser.evaluate(
                "document.querySelector('[data-metric=wall_ms]').dataset.value"
            )
            assert float(wall) == duration
            for index in range(min(count, 100)):
                where = await _click_row(browser, index)
                assert where["next"] == 1 and 0 <= where["gap"] < 5, where
                text = await browser.evaluate(DETAIL_TEXT)
                assert "null" not in text, text
