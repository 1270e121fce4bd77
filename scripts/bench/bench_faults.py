"""Benchmark of transient provider faults through ``rollbridge eval run`` (the real CLI).

Run: ``.venv/bin/python scripts/bench/bench_faults.py`` (about a minute on 2 cores).

The provider is the test suite's fake upstream in this process, behind its resetting relay,
answering each call after 200 ms; 32 rollouts in flight. Measured in one run:

1. 1000 rows with no faults (the baseline) and 1000 rows with 10% of calls answered 500,
   429 (``Retry-After: 1``) or reset: dispatch wall time, their ratio, failed rows (must be 0)
   and the retries counted in ``index.jsonl``.
2. 1000 rows with every call answered 429 for 3 s once dispatch has begun: when the in-flight
   limit was first lowered, how low it went, and the seconds from the end of the storm until
   the milestone ``in flight back to 32``.

Expect noisy figures on a shared 2-core machine; compare within one run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_eval  # noqa: E402

from tests.fakes.upstream import FakeUpstream, run_fake_upstream  # noqa: E402

bench_eval.BENCH = REPO / ".bench" / "faults"
IN_FLIGHT = 32
LATENCY_S = 0.2
STORM_S = 3.0


async def serve_upstream(*, task_status: trio.TaskStatus[FakeUpstream]) -> None:
    await run_fake_upstream(backlog=4096, resets=True, task_status=task_status)


def _rows(ws: Path, name: str) -> list[dict[str, Any]]:
    text = (ws / ".osmosis" / "evals" / name / "index.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _log_times(ws: Path, name: str, needle: str) -> list[tuple[float, str]]:
    log = (ws / ".osmosis" / "evals" / name / "logs.txt").read_text()
    return [(bench_eval._ts(line), line) for line in log.splitlines() if needle in line]


async def run(ws: Path, config: str, name: str, upstream: FakeUpstream) -> dict[str, Any]:
    figures = await bench_eval.run_eval(ws, config, name, upstream, IN_FLIGHT)
    rows = _rows(ws, name)
    return {
        "dispatch_wall_s": round(figures["dispatch_wall_s"], 3),
        "rows": len(rows),
        "failed_rows": sum(r["status"] != "success" for r in rows),
        "retries_in_index": sum(r.get("retries", 0) for r in rows),
        "faults_injected": dict(upstream.faults),
    }


def _reset(upstream: FakeUpstream, *, fault_rate: float) -> None:
    upstream.faults.clear()
    upstream.requests.clear()
    upstream.fault_rate = fault_rate


async def main() -> None:
    ws = bench_eval.setup()
    config = bench_eval.dataset(ws, 1000)
    out: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        upstream: FakeUpstream = await nursery.start(serve_upstream)
        upstream.delay = LATENCY_S
        upstream.retry_after = "1"
        await bench_eval.run_eval(ws, bench_eval.dataset(ws, 200), "warmup", upstream, IN_FLIGHT)

        _reset(upstream, fault_rate=0.0)
        out["no_faults"] = await run(ws, config, "clean", upstream)
        _reset(upstream, fault_rate=0.1)
        out["ten_percent_faults"] = await run(ws, config, "faults", upstream)
        out["faults_over_clean_wall"] = round(
            out["ten_percent_faults"]["dispatch_wall_s"] / out["no_faults"]["dispatch_wall_s"], 3
        )
        print(json.dumps(out, indent=2), flush=True)

        _reset(upstream, fault_rate=0.0)
        storm: dict[str, float] = {}

        async def storm_once_dispatching() -> None:
            # The preflight, then the first rollout's call (the fake has no event for it).
            while len(upstream.requests) < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
            storm["start"] = time.time()
            upstream.rate_limit_for(STORM_S)

        nursery.start_soon(storm_once_dispatching)
        out["storm"] = await run(ws, config, "storm", upstream)
        lowered = _log_times(ws, "storm", "in flight lowered to")
        back = _log_times(ws, "storm", f"in flight back to {IN_FLIGHT}")
        storm_end = storm["start"] + STORM_S
        out["storm"].update(
            {
                "first_lowered_after_storm_start_s": round(lowered[0][0] - storm["start"], 3),
                "lowest_limit": min(
                    int(line.split("lowered to ")[1].split()[0]) for _, line in lowered
                ),
                "back_to_full_after_storm_end_s": round(back[-1][0] - storm_end, 3),
            }
        )
        nursery.cancel_scope.cancel()
    print(json.dumps(out, indent=2))
    (bench_eval.BENCH / "results.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    trio.run(main)
