"""Benchmark ``rollbridge eval report``: generation time and page size at 1,000 and 10,000
items, and load-to-interactive of the 10,000-item page in headless Chromium.

Run from the repository root: ``python scripts/bench/bench_report.py``. The run directories
are synthetic (written file by file, as a real run leaves them: each item has a trajectory).
Ratios are against baselines measured in the same run: generation against only reading the
run directory (``load_run``), the 10,000-item page load against the 1,000-item one.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.reporting import load_run, render_report
from tests.reporting.cdp import chromium_path, file_url, open_browser
from tests.reporting.rundirs import synthetic_items, write_run

SIZES = (1_000, 10_000)


def _best(fn: object, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best


async def _load_ms(binary: str, page: Path) -> tuple[float, float]:
    """(ms from navigation to the page's ready flag, ms of a status filter + redraw)."""
    with trio.fail_after(120):
        async with open_browser(binary) as browser:
            timings = []
            for _ in range(3):
                await browser.navigate(file_url(page))
                await browser.wait_for("document.body && document.body.dataset.ready === '1'")
                timings.append(await browser.evaluate("window.rbReadyMs"))
            filter_ms = await browser.evaluate(
                "(() => { const s = document.getElementById('status-filter'); const t0 = "
                "performance.now(); s.value = 'failed'; s.dispatchEvent(new Event('change')); "
                "return performance.now() - t0; })()"
            )
            return min(timings), filter_ms


def main() -> None:
    binary = chromium_path()
    with tempfile.TemporaryDirectory() as tmp:
        pages: dict[int, Path] = {}
        for size in SIZES:
            run = write_run(Path(tmp) / f"run{size}", synthetic_items(size))
            read_s = _best(lambda run=run: load_run(run))
            gen_s = _best(lambda run=run: render_report(load_run(run)))
            page = Path(tmp) / f"report{size}.html"
            page.write_text(render_report(load_run(run)), encoding="utf-8")
            pages[size] = page
            mib = page.stat().st_size / 2**20
            print(
                f"{size:>6} items: generate {gen_s * 1000:7.0f} ms (read alone {read_s * 1000:6.0f} ms,"
                f" ratio {gen_s / read_s:4.2f}x), page {mib:5.2f} MiB"
            )
        if binary is None:
            print("chromium not installed (apt-get install -y chromium): page load not measured")
            return
        small, _ = trio.run(_load_ms, binary, pages[SIZES[0]])
        big, filter_ms = trio.run(_load_ms, binary, pages[SIZES[-1]])
        print(
            f"chromium load-to-interactive: {SIZES[-1]:,} items {big:.0f} ms, {SIZES[0]:,} items"
            f" {small:.0f} ms (ratio {big / small:.2f}x); status filter at {SIZES[-1]:,}:"
            f" {filter_ms:.1f} ms"
        )


if __name__ == "__main__":
    main()
