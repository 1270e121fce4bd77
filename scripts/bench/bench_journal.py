"""Benchmark the run directory's data layer.

1. Resume replay of a 100,000- and a 1,000,000-record ``events.jsonl`` (issue 15's target:
   <= 0.05 s at 100,000; issue 29's: <= 1 s at 1,000,000 with the supervisor's RSS <= 500 MB
   during replay, printed as ``target ...: measured X, ratio Y, met/not met``),
   against a naive ``json.loads`` per line replay measured in the same run, and against the
   floor: msgspec's typed decode of the same bytes alone (no validation, no latest-record map),
   which no validated replay of JSON lines can beat. The RSS and CPU figures come from a
   fresh interpreter that imports the supervisor's modules and opens the journal as a resume
   does (``Journal.open``), so nothing else the benchmark holds counts against them.
2. Per-item cost of ``RunDirectory.record_result`` (journal append + fsync, counters, index
   line, projections, throttled metrics) for a 200-item run and inside a 10,000-item run
   (first and last 200 items), with real fsync and with fsync stubbed out (CPU cost only),
   to show the cost does not grow with the run. As a contrast,
   the reference's strategy (rewrite index/summary/metrics in full after every item) is
   measured at 200 and 1,000 items.
3. Per-item CPU (all threads, ``time.process_time``) of ``record_result`` with each result's
   call records (``calls.jsonl``, three calls per item, docs/calls.md) against the same items
   without, in the same run, sequential and 50 at once (fsync stubbed out).

Run: .venv/bin/python scripts/bench/bench_journal.py [--records N ...] [--items 10000]
[--calls-only] (section 3 alone) [--replay-only] (section 1 alone)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.dataset import select_rows
from launcher.redact import Redactor
from launcher.rundir import RunDirectory, RunMeta
from launcher.rundir.atomic import atomic_write_bytes, atomic_write_json
from launcher.rundir.journal import Journal, TerminalRecord, replay_journal
from launcher.rundir.metrics import aggregate_metrics
from launcher.rundir.projections import index_line, index_row


def make_record(i: int, n: int = 1) -> TerminalRecord:
    return TerminalRecord(
        row_index=i // n,
        run_index=i % n,
        rollout_id=f"{i:032x}",
        status=("success", "failed", "skipped")[i % 3],
        source_row_index=i // n,
        reward=(i % 5) / 4,
        tokens=100 + i % 50,
        max_context_tokens=60 + i % 20,
        duration_ms=12.5 + i % 7,
        error_type="timeout" if i % 3 == 1 else None,
    )


_FLOOR_DECODER = msgspec.json.Decoder(TerminalRecord)


def naive_replay(path: Path) -> int:
    latest = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            obj = json.loads(line)
            latest[(obj["row_index"], obj["run_index"])] = obj
    return len(latest)


def best_of(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


#: Replay targets, records -> seconds: issue 15's at 100,000, issue 29's at 1,000,000.
REPLAY_TARGETS = {100_000: 0.05, 1_000_000: 1.0}
#: Issue 29: the supervisor's peak RSS while it replays 1,000,000 records.
REPLAY_RSS_TARGET_MB = 500.0

_RESUME_PROBE = """
import sys, time
from pathlib import Path
import launcher.supervisor
from launcher.rundir.journal import Journal

def peak_kib():
    # VmHWM, not ru_maxrss: that one keeps the parent's peak across fork and exec.
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))

before = peak_kib()
cpu0 = time.process_time()
journal = Journal.open(Path(sys.argv[1]))
cpu = time.process_time() - cpu0
print(len(journal.latest), cpu, before, peak_kib())
"""


def resume_probe(path: Path) -> tuple[float, float, float]:
    """(CPU seconds of ``Journal.open``, peak RSS MB before it, peak RSS MB after it), from a
    fresh interpreter that imported the supervisor (Linux: reads ``/proc/self/status``)."""
    out = subprocess.run(
        [sys.executable, "-c", _RESUME_PROBE, str(path)],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout.split()
    return float(out[1]), float(out[2]) / 1024.0, float(out[3]) / 1024.0


def bench_replay(tmp: Path, count: int) -> None:
    path = tmp / "events.jsonl"
    with open(path, "wb") as fh:
        for start in range(0, count, 100_000):
            fh.write(
                b"".join(
                    make_record(i).to_line() for i in range(start, min(count, start + 100_000))
                )
            )
    size_mb = path.stat().st_size / 1e6
    repeat = 5 if count <= 200_000 else 3
    ours = best_of(lambda: replay_journal(path), repeat)
    naive = best_of(lambda: naive_replay(path), repeat)
    data = path.read_bytes()
    floor = best_of(lambda: _FLOOR_DECODER.decode_lines(data), repeat)

    def open_close() -> None:
        Journal.open(path).close()

    opened = best_of(open_close, repeat)
    probes = [resume_probe(path) for _ in range(repeat)]
    probe_cpu = min(p[0] for p in probes)
    rss_before, rss_peak = probes[0][1], max(p[2] for p in probes)
    print(f"replay of {count:,} records ({size_mb:.1f} MB), best of {repeat}")
    print(f"  baseline json.loads per line : {naive * 1000:8.1f} ms")
    print(
        f"  replay_journal (validated)   : {ours * 1000:8.1f} ms   ratio {ours / naive:.2f}x baseline"
    )
    print(f"  Journal.open (replay + open) : {opened * 1000:8.1f} ms")
    print(
        f"  fresh supervisor process     : Journal.open {probe_cpu * 1000:8.1f} ms of CPU "
        f"(baseline's wall {probe_cpu / naive:.2f}x), peak RSS {rss_peak:.0f} MB "
        f"({rss_before:.0f} MB after the imports)"
    )
    print(
        f"  floor: typed decode alone    : {floor * 1000:8.1f} ms   "
        f"({floor / count * 1e6:.2f} us per record; replay is {ours / floor:.2f}x the floor)"
    )
    limit = REPLAY_TARGETS.get(count)
    if limit is not None:
        print(
            f"  target replay of {count:,} records (<= {limit:g} s): measured {ours:.3f} s, "
            f"ratio {ours / limit:.2f}, {'met' if ours <= limit else 'not met'}"
        )
        if count >= 1_000_000:
            print(
                f"  target replay of {count:,} records, CPU time (<= {limit:g} s): measured "
                f"{probe_cpu:.3f} s, ratio {probe_cpu / limit:.2f}, "
                f"{'met' if probe_cpu <= limit else 'not met'}"
            )
            print(
                f"  target supervisor RSS during replay of {count:,} records "
                f"(<= {REPLAY_RSS_TARGET_MB:g} MB): measured {rss_peak:.0f} MB, ratio "
                f"{rss_peak / REPLAY_RSS_TARGET_MB:.2f}, "
                f"{'met' if rss_peak <= REPLAY_RSS_TARGET_MB else 'not met'}"
            )
        print(
            f"  bound: the decode alone takes {floor:.3f} s, ratio {floor / limit:.2f} of the "
            f"target ({'within' if floor <= limit else 'over'} it before any validation)"
        )
    path.unlink()


def make_dataset(tmp: Path, rows: int) -> Path:
    data = tmp / f"data-{rows}.jsonl"
    data.write_text(
        "".join(
            json.dumps({"user_prompt": f"q{i}", "ground_truth": "a"}) + "\n" for i in range(rows)
        )
    )
    return data


def _call(rollout_id: str, index: int) -> dict[str, object]:
    """A call record as the bridge reports one (bridge.calls), about 350 bytes."""
    return {
        "kind": "rollout",
        "rollout_id": rollout_id,
        "api": "chat.completions",
        "model": "fake-model",
        "stream": False,
        "started_at": "2026-12-02T00:00:00.000000Z",
        "ttfb_ms": 12.5,
        "duration_ms": 20.25,
        "status": 200,
        "prompt_tokens": 120 + index,
        "completion_tokens": 30,
        "total_tokens": 150 + index,
        "cached_tokens": 64,
        "finish_reason": "stop",
    }


async def calls_cpu(tmp: Path, name: str, rows: int, calls: int, at_once: int) -> float:
    """CPU seconds per item of ``record_result`` with ``calls`` call records each."""
    sel = select_rows(make_dataset(tmp, rows))
    meta = RunMeta(1, 1.0, rows, rows, "d", "m", "r")
    rd = RunDirectory.open(
        output_root=tmp / "out",
        name=name,
        inputs={"x": rows},
        provenance={},
        fresh=False,
        meta=meta,
        selected_rows=sel.rows,
        redactor=Redactor(["s3cret"]),
    )
    records = [make_record(i) for i in range(rows)]
    pending = iter(records)

    async def worker() -> None:
        for record in pending:
            made = [_call(record.rollout_id, k) for k in range(calls)]
            await rd.record_result(record, calls=made or None)

    t0 = time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(at_once):
            nursery.start_soon(worker)
    spent = time.process_time() - t0
    rd.close()
    return spent / rows


def section_calls(tmp: Path) -> None:
    for at_once in (1, 50):
        off, on = [], []
        for k in range(3):  # interleaved, so machine load falls on both alike
            off.append(trio.run(calls_cpu, tmp, f"calls-off-{at_once}-{k}", 2000, 0, at_once))
            on.append(trio.run(calls_cpu, tmp, f"calls-on-{at_once}-{k}", 2000, 3, at_once))
        a, b = statistics.median(off), statistics.median(on)
        print(
            f"  {at_once:>2} at once: without calls {a * 1000:.3f} ms/item, with 3 calls "
            f"{b * 1000:.3f} ms/item: {b / a:.2f}x"
        )


async def run_items(tmp: Path, name: str, rows: int) -> list[float]:
    sel = select_rows(make_dataset(tmp, rows))
    meta = RunMeta(
        n=1,
        pass_threshold=1.0,
        sampled_rows=rows,
        total_dataset_rows=rows,
        dataset_name="d",
        model_name="m",
        rollout_name="r",
    )
    rd = RunDirectory.open(
        output_root=tmp / "out",
        name=name,
        inputs={"x": rows},
        provenance={},
        fresh=False,
        meta=meta,
        selected_rows=sel.rows,
        redactor=Redactor(["s3cret"]),
    )
    costs = []
    for i in range(rows):
        t0 = time.perf_counter()
        await rd.record_result(make_record(i))
        costs.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    rd.finalize(cancelled=False)
    final = time.perf_counter() - t0
    rd.close()
    print(f"  {name}: {rows:,} items, finalize (full rebuild) {final * 1000:.0f} ms")
    return costs


def full_rewrite_costs(tmp: Path, rows: int) -> list[float]:
    """The reference's per-item strategy: append + fsync, then rewrite every snapshot in full."""
    run = tmp / f"full-{rows}"
    run.mkdir()
    journal = Journal.open(run / "events.jsonl")
    costs = []
    for i in range(rows):
        t0 = time.perf_counter()
        journal.append_sync(make_record(i))
        index = [index_row(r, None, resumed=False) for _, r in sorted(journal.latest.items())]
        data = b"".join(index_line(r) for r in index)
        atomic_write_bytes(run / "index.jsonl", data)
        atomic_write_bytes(run / "summary.jsonl", data)
        atomic_write_json(run / "progress.json", {"total_runs": rows})
        atomic_write_json(run / "metrics.json", {"summary": aggregate_metrics(index, 1.0)})
        costs.append(time.perf_counter() - t0)
    journal.close()
    return costs


def ms(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:6.3f} ms  "
        f"mean {statistics.fmean(values) * 1000:6.3f} ms"
    )


def compare(label: str, small: list[float], large_tail: list[float], large_n: int) -> None:
    ratio = statistics.median(large_tail) / statistics.median(small)
    print(f"  200-item run(s)               : {ms(small)}")
    print(f"  {large_n:,}-item run, last 200     : {ms(large_tail)}")
    print(
        f"  {label}: last 200 of {large_n:,} vs 200-item run (medians): {ratio:.2f}x (flat = ~1.0)"
    )


def section_record_result(tmp: Path, items: int, tag: str) -> None:
    # The 200-item run is measured before and after the large one so that load from other
    # processes during the large run shows up as a difference between the two.
    before = trio.run(run_items, tmp, f"small-before-{tag}", 200)
    large = trio.run(run_items, tmp, f"large-{tag}", items)
    after = trio.run(run_items, tmp, f"small-after-{tag}", 200)
    step = max(items // 5, 1)
    windows = ", ".join(
        f"{i:,}: {statistics.median(large[i : i + 200]) * 1000:.3f}" for i in range(0, items, step)
    )
    print(f"  {items:,}-item run, median ms of 200 items starting at  {windows}")
    compare("record_result", before + after, large[-200:], items)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--records", type=int, action="append", help="replay sizes (default 100,000 and 1,000,000)"
    )
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--calls-only", action="store_true", dest="calls_only")
    parser.add_argument("--replay-only", action="store_true", help="skip the record_result part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp_name:
        tmp = Path(tmp_name)
        print(f"load average at start: {os.getloadavg()}")
        if args.calls_only:
            real_fsync = os.fsync
            os.fsync = lambda fd: None
            try:
                print("record_result CPU (all threads) with call records, fsync stubbed")
                section_calls(tmp)
            finally:
                os.fsync = real_fsync
            print(f"load average at end: {os.getloadavg()}")
            return
        for count in args.records or sorted(REPLAY_TARGETS):
            bench_replay(tmp, count)
        if args.replay_only:
            print(f"load average at end: {os.getloadavg()}")
            return
        print()
        print("per-item record_result cost, real fsync (journal append+fsync, counters,")
        print(
            "index line, projections, throttled metrics); disk noise from other processes shows here"
        )
        section_record_result(tmp, args.items, "fsync")
        # Without fsync the disk's latency (shared, noisy) drops out and what is left is the
        # work the supervisor does per item, which is what must not grow with the run.
        real_fsync = os.fsync
        os.fsync = lambda fd: None
        try:
            print()
            print("same, fsync stubbed out (CPU and page-cache cost only)")
            section_record_result(tmp, args.items, "nofsync")
            print()
            print(
                "contrast, fsync stubbed: rewrite index/summary/progress/metrics after every item"
            )
            ref_small = full_rewrite_costs(tmp, 200)
            ref_large = full_rewrite_costs(tmp, 1000)
            compare("full rewrite", ref_small, ref_large[-200:], 1000)
            print()
            print("record_result CPU (all threads) with each result's call records, fsync stubbed")
            section_calls(tmp)
        finally:
            os.fsync = real_fsync
        print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
