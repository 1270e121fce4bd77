"""The report and diff pages in headless Chromium (driven over the DevTools protocol): the
page draws, shows the pass rate and every failed item's error text, loads nothing, and the
status filter and the search change the visible rows. Skipped when Chromium is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from launcher.reporting import load_run, render_report
from tests.reporting.cdp import Browser, decode_png, file_url, open_browser
from tests.reporting.conftest import ExampleRuns
from tests.reporting.rundirs import synthetic_items, write_run

ROWS = "[...document.querySelectorAll('#item-rows tr')]"


def _expected_error_text(row: dict[str, Any]) -> str:
    error = row.get("error")
    if isinstance(error, dict) and error.get("message"):
        head = ": ".join(x for x in (error.get("phase"), error.get("type")) if x)
        return f"{head}: {error['message']}" if head else error["message"]
    return str(row.get("error_type", ""))


async def _visible(browser: Browser) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = await browser.evaluate(
        f"{ROWS}.map(tr => ({{id: tr.dataset.id, status: tr.dataset.status, "
        "error: tr.querySelector('.error-text').textContent}))"
    )
    return rows


async def _set_status(browser: Browser, value: str) -> None:
    await browser.evaluate(
        "(() => { const s = document.getElementById('status-filter'); "
        f"s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()"
    )


async def _check_report(browser: Browser, page: Path, run: Path, shot: Path) -> None:
    rows = [json.loads(x) for x in (run / "index.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((run / "metrics.json").read_text())["summary"]
    await browser.navigate(file_url(page))
    await browser.wait_for("document.body && document.body.dataset.ready === '1'")
    assert await browser.evaluate("performance.getEntriesByType('resource').length") == 0
    shown_rate = await browser.evaluate(
        "document.querySelector('[data-metric=pass_rate] .stat-v').textContent"
    )
    assert shown_rate == f"{summary['pass_rate'] * 100:.1f}%"
    assert len(await _visible(browser)) == min(len(rows), 100)

    await _set_status(browser, "failed")
    failed = {r["rollout_id"]: r for r in rows if r["status"] == "failed"}
    visible = await _visible(browser)
    assert failed and {v["id"] for v in visible} == set(failed)
    for v in visible:
        assert v["error"] == _expected_error_text(failed[v["id"]])

    await _set_status(browser, "")
    dataset = {
        d["row_index"]: d
        for d in map(json.loads, (run / "dataset_rows.jsonl").read_text().splitlines())
    }
    query = max((d.get("label", "") for d in dataset.values()), key=len)
    haystacks = {
        r["rollout_id"]: "\n".join(
            [
                dataset[r["row_index"]].get("prompt", ""),
                dataset[r["row_index"]].get("label", ""),
                r["rollout_id"],
                _expected_error_text(r),
            ]
        ).lower()
        for r in rows
    }
    expected = {rid for rid, text in haystacks.items() if query.lower() in text}
    assert 0 < len(expected) < min(len(rows), 100)
    await browser.type_text("#search", query)
    await browser.wait_for(f"{ROWS}.length === {len(expected)}")
    assert {v["id"] for v in await _visible(browser)} == expected

    await browser.evaluate(f"{ROWS}[0].click()")
    steps = await browser.evaluate("document.querySelectorAll('#detail li.step').length")
    assert steps >= 1

    png = await browser.screenshot()
    await trio.Path(shot).write_bytes(png)
    width, height, pixels = decode_png(png)
    assert (width, height) == (1400, 1000)
    colors = {row[i : i + 3] for row in pixels[::10] for i in range(0, len(row), 40)}
    assert len(colors) > 20, "the screenshot is (nearly) one colour"


async def test_report_of_a_run_with_failures_in_chromium(chromium: str, tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", synthetic_items(150))
    page = tmp_path / "report.html"
    page.write_text(render_report(load_run(run)))
    with trio.fail_after(60):
        async with open_browser(chromium) as browser:
            await _check_report(browser, page, run, tmp_path / "shot.png")


@pytest.mark.parametrize(
    ("fragment", "first_page"),
    [
        ("sort=rubric%3Agpt-4o&dir=desc", True),  # a column this page does not have
        ("q=%E0%A4%A&status=failed", False),  # a malformed escape: the rest still applies
        ("page=abc", True),
        ("page=99", False),  # past the end: the last page
    ],
)
async def test_a_stale_or_malformed_address_still_draws_the_table(
    chromium: str, tmp_path: Path, fragment: str, first_page: bool
) -> None:
    """The view lives in the address's ``#`` part, which outlives the page it was made on
    (a re-render without a rubric column, a truncated link): the page draws and is ready."""
    run = write_run(tmp_path / "r", synthetic_items(150))
    page = tmp_path / "report.html"
    page.write_text(render_report(load_run(run)))
    with trio.fail_after(60):
        async with open_browser(chromium) as browser:
            await browser.navigate(file_url(page) + "#" + fragment)
            await browser.wait_for("document.body && document.body.dataset.ready === '1'")
            rows = await _visible(browser)
            info = await browser.evaluate("document.getElementById('pager-info').textContent")
    assert rows and "NaN" not in info, info
    if first_page:
        assert info.startswith("1–100 of 150"), info
    if fragment.startswith("q="):
        assert {r["status"] for r in rows} == {"failed"}
    if fragment == "page=99":
        assert info.startswith("101–150 of 150"), info


@pytest.mark.slow
async def test_report_of_the_example_run_in_chromium(
    chromium: str, example_runs: ExampleRuns, tmp_path: Path
) -> None:
    page = tmp_path / "example.html"
    page.write_text(render_report(load_run(example_runs.a)))
    with trio.fail_after(60):
        async with open_browser(chromium) as browser:
            await _check_report(browser, page, example_runs.a, tmp_path / "shot.png")
