"""RL-scale concurrency (issue 29, item 1): ``rollbridge eval run`` with 10,000 rows, a fake
provider holding every call 30 s and ``--max-in-flight 10000``, against the ideal.

The ideal is rows / in flight x latency + the fixed cost of a 1-row run at the same latency in
the same invocation (its wall minus the latency: start-up, one round trip, exit). Printed: the
run's outcome (finished, its rows by status, the exit code), wall against the ideal, the
rollouts in flight it actually ran (the supervisor caps them to what the open-file limit
holds, ``launcher.fdbudget``), peak RSS and CPU per item of every process (the supervisor, its
bridge process, the rollout server, the fake provider), and one ``target`` line each for
issue 29's bounds (<= 1.3x ideal, supervisor RSS <= 300 MB, 0 errors). Then (``--reference
run``, the default) the reference's own CLI (osmosis-ai 0.3.8, ``reference_eval.py``) runs the
same rows at the same in-flight against the same provider, stopped after
``--reference-timeout`` seconds (default 900), and what it did is printed: finished, failed or
stopped, its rows by outcome, wall and CPU per row. Uses
``bench_eval.py``'s workspace set-up, lean fake provider and CLI runner; its own work
directory is ``.bench/inflight``.

``--http2 auto`` (the default) or ``on`` writes ``[bridge] upstream_http2`` into both runs'
config: with ``auto`` the run itself calls the fake provider over h2c (100 streams per
connection, what real providers advertise) when the in-flight asked for does not fit two
sockets per call in the bridge, one socket per rollout instead of two; ``off`` keeps
HTTP/1.1 (and the cap). Likewise the run chooses the rollout server's batched result wait when
one long-poll per rollout does not fit (``ROLLBRIDGE_BATCHED_WAIT=1``/``0`` in the environment
force it on/off).

Run: .venv/bin/python scripts/bench/bench_inflight.py [--rows 10000] [--in-flight 10000]
[--latency 30] [--http2 off|on|auto] [--py-spy DIR] [--reference run|skip]
[--reference-timeout 900]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_eval
from bench_eval import REPO, dataset, run_eval, serve_upstream, setup, target
from reference_eval import ReferenceUnavailable, run_reference_eval

from launcher.fdbudget import raise_descriptor_limit


def _role(proc: psutil.Process) -> str | None:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return None
    if "bridge.child" in argv:
        return "bridge"
    if "launcher" in argv and "eval" in argv:
        return "supervisor"
    if any(arg.endswith("bench.py") for arg in argv):
        return "rollout server"
    if "tests.fakes.lean_upstream" in argv:
        return "fake provider"
    return None


async def sample(peaks: dict[str, float], cpu: dict[str, float]) -> None:
    """Peak RSS (MB) and CPU seconds of each role among this process's descendants; the CPU
    of a process already running (the fake provider) counts from now."""
    me = psutil.Process()
    roles: dict[int, str | None] = {}
    for child in me.children(recursive=True):
        roles[child.pid] = _role(child)
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            cpu[f"{roles[child.pid]}:{child.pid}:start"] = -(times.user + times.system)
    while True:
        for child in me.children(recursive=True):
            if child.pid not in roles:
                roles[child.pid] = _role(child)
            role = roles[child.pid]
            if role is None:
                continue
            with contextlib.suppress(psutil.Error):
                peaks[role] = max(peaks.get(role, 0.0), child.memory_info().rss / 1e6)
                times = child.cpu_times()
                cpu[f"{role}:{child.pid}"] = times.user + times.system
        await trio.sleep(0.25)


def outcomes(ws: Path, name: str) -> Counter[str]:
    path = ws / ".osmosis" / "evals" / name / "events.jsonl"
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["status"] for line in path.open() if line.strip())


def notices(ws: Path, name: str) -> list[str]:
    path = ws / ".osmosis" / "evals" / name / "logs.txt"
    if not path.exists():
        return []
    keep = (
        "open-file limit",
        "halting dispatch",
        "file descriptors",
        "Too many open files",
        "HTTP/2",
    )
    return [line[:400] for line in path.read_text().splitlines() if any(k in line for k in keep)]


async def measured(
    ws: Path, config: str, name: str, upstream: Any, in_flight: int
) -> tuple[dict[str, Any] | None, dict[str, float], dict[str, float], str | None]:
    peaks: dict[str, float] = {}
    cpu: dict[str, float] = {}
    result: dict[str, Any] | None = None
    failure: str | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample, peaks, cpu)
        try:
            result = await run_eval(ws, config, name, upstream, in_flight, backlog=4096)
        except AssertionError as exc:
            failure = str(exc)
        nursery.cancel_scope.cancel()
    by_role: dict[str, float] = {}
    for key, seconds in cpu.items():
        role = key.split(":", 1)[0]
        by_role[role] = by_role.get(role, 0.0) + seconds
    return result, peaks, by_role, failure


#: ``--server-gc``: the rollout server's entrypoint sets these collector thresholds when
#: ``BENCH_SERVER_GC`` is set (an experiment on what the collector costs at this scale).
ENTRY_GC = """
import gc
import os

if os.environ.get("BENCH_SERVER_GC"):
    gc.set_threshold(*(int(v) for v in os.environ["BENCH_SERVER_GC"].split(",")))
"""


def with_http2(config: Path, mode: str) -> None:
    """Add ``[bridge] upstream_http2 = mode`` to an eval config."""
    with open(config, "a") as fh:
        fh.write(f'\n[bridge]\nupstream_http2 = "{mode}"\n')


async def reference(upstream_v1: str, rows: int, in_flight: int, timeout_s: float) -> None:
    """The reference's CLI on the same work, and what it did."""
    print(f"reference (osmosis-ai 0.3.8): {rows} rows, --max-in-flight {in_flight}, same provider")
    try:
        ref = await run_reference_eval(
            upstream_v1,
            rows,
            in_flight,
            work=bench_eval.BENCH / "reference",
            warm_up=False,
            timeout_s=timeout_s,
            check=False,
        )
    except ReferenceUnavailable as exc:
        print(f"   reference not run: {exc}")
        return
    if ref.timed_out:
        outcome = f"stopped after {timeout_s:g} s (not finished)"
    elif ref.exit_code == 0 and ref.rewarded == rows:
        outcome = "finished"
    else:
        outcome = f"FAILED (exit code {ref.exit_code})"
    done = ref.succeeded + ref.failed + ref.skipped
    print(
        f"   {outcome}: {ref.succeeded} success ({ref.rewarded} with reward 1.0), {ref.failed} "
        f"failed, {ref.skipped} skipped of {rows}; wall {ref.wall_s:.1f} s "
        f"({done / ref.wall_s:.1f} rows/s), CPU of its process tree {ref.cpu_s:.0f} s "
        f"({ref.cpu_s / max(done, 1) * 1000:.1f} ms per row done); run directory {ref.run_dir}"
    )
    tail = (ref.run_dir.parent / f"{ref.name}.out").read_text(errors="replace").splitlines()[-2:]
    for line in tail:
        print(f"   output: {line[:300]}")


async def main(
    rows: int,
    in_flight: int,
    latency: float,
    server_gc: str | None,
    run_reference: bool = False,
    reference_timeout: float = 900.0,
    http2: str = "auto",
) -> None:
    bench_eval.BENCH = REPO / ".bench" / "inflight"
    bench_eval.ENTRY = ENTRY_GC + bench_eval.ENTRY
    ws = setup()
    configs = {n: dataset(ws, n) for n in {1, rows}}
    if http2 != "off":
        for config in configs.values():
            with_http2(ws / config, http2)
    print(
        f"upstream_http2 = {http2!r}, "
        f"ROLLBRIDGE_BATCHED_WAIT={os.environ.get('ROLLBRIDGE_BATCHED_WAIT', '')!r}"
    )
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_upstream)
        await upstream.set_delay(0.0)
        await run_eval(ws, configs[1], "warmup", upstream, 1)
        await upstream.set_delay(latency)
        one, _, _, one_failure = await measured(ws, configs[1], "one-row", upstream, 1)
        assert one is not None, one_failure
        fixed = one["wall_s"] - latency
        ideal = rows / in_flight * latency + fixed
        print(f"1 row at {latency:g} s: wall {one['wall_s']:.2f} s, fixed cost {fixed:.2f} s")
        name = f"inflight-{rows}"
        if server_gc:
            os.environ["BENCH_SERVER_GC"] = server_gc
            print(f"rollout server's collector thresholds: {server_gc}")
        big, peaks, cpu, failure = await measured(ws, configs[rows], name, upstream, in_flight)
        os.environ.pop("BENCH_SERVER_GC", None)
        counts = outcomes(ws, name)
        print(
            f"{rows} rows at {latency:g} s, --max-in-flight {in_flight} (ideal {ideal:.2f} s): "
            f"{'finished' if big is not None else 'FAILED: ' + str(failure)}; journaled "
            f"{dict(counts)} of {rows}"
        )
        for line in notices(ws, name):
            print(f"   log: {line}")
        seen = await upstream.counters()
        print(
            f"   fake provider: {seen['connections']:.0f} connections accepted in all, "
            f"{seen['h2_connections']:.0f} of them HTTP/2"
        )
        for role in ("supervisor", "bridge", "rollout server", "fake provider"):
            print(
                f"   {role:15} peak RSS {peaks.get(role, 0):7.1f} MB, CPU "
                f"{cpu.get(role, 0) / rows * 1000:6.2f} ms per item"
            )
        errors = rows - counts.get("success", 0)
        if big is not None:
            print(
                f"   wall {big['wall_s']:.2f} s (dispatch {big['dispatch_wall_s']:.2f} s); "
                f"median item {big['median_item_ms'] / 1000:.2f} s"
            )
            target(f"{rows} in flight wall / ideal", big["wall_s"] / ideal, 1.3, unit="x")
        target("supervisor peak RSS", peaks.get("supervisor", 0.0), 300, unit=" MB")
        print(
            f"   target rows not journaled as success (<= 0): measured {errors}, "
            f"{'met' if errors == 0 else 'not met'}"
        )
        if run_reference:
            await reference(upstream.v1, rows, in_flight, reference_timeout)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=10_000, dest="in_flight")
    parser.add_argument("--latency", type=float, default=30.0)
    parser.add_argument(
        "--py-spy", type=Path, default=None, dest="py_spy", help="as bench_eval.py's --py-spy"
    )
    parser.add_argument(
        "--server-gc",
        default=None,
        dest="server_gc",
        help="collector thresholds for the rollout server, e.g. 20000,20,20 (an experiment)",
    )
    parser.add_argument("--reference", choices=("run", "skip"), default="run")
    parser.add_argument("--reference-timeout", type=float, default=900.0, dest="reference_timeout")
    parser.add_argument(
        "--http2",
        choices=("off", "on", "auto"),
        default="auto",
        help="[bridge] upstream_http2 in the runs' config (default auto)",
    )
    args = parser.parse_args()
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
        bench_eval.PYSPY_DIR = args.py_spy.resolve()
    limit = raise_descriptor_limit()  # the fake provider (a child) holds a socket per call
    print(
        f"load average at start: {os.getloadavg()}; open-file limit {limit.soft} "
        f"(hard {limit.hard})"
    )
    trio.run(
        main,
        args.rows,
        args.in_flight,
        args.latency,
        args.server_gc,
        args.reference == "run",
        args.reference_timeout,
        args.http2,
    )
    print(f"load average at end: {os.getloadavg()}")
