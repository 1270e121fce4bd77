"""End-to-end benchmark of ``rollbridge eval run`` (the real CLI, uv env, rollout server, bridge).

Run: ``.venv/bin/python scripts/bench/bench_eval.py`` (about 2-3 minutes on 2 cores).

The model is ``openai/fake-model`` served by the test suite's fake OpenAI-compatible upstream
(in this process), so upstream latency is a knob. The rollout is the example echo workflow on
an unbounded LocalBackend. Measured, each against a baseline from the same run:

1. 1000 rows at 0 ms: rows/s, and the fixed cost from process start to the first dispatch on a
   warm environment (target <= 1.5 s).
2. 1000 rows at 500 ms, 200 in flight: dispatch wall time against the ideal
   rows / in-flight x latency (target <= 1.15x).
3. Supervisor RSS with 1000 rollouts in flight (target <= 200 MB).
4. 200 vs 10,000 rows at 0 ms: supervisor CPU and wall time per item (target: flat).

The fake provider is served with a deep listen backlog (a real provider does not drop SYNs).
Case 2 runs twice: with the rollout server's default hypercorn backlog (100) and with 4096
(``BENCH_BACKLOG``, patched in by the bench entrypoint only), to show what the backlog costs.
Expect noisy figures on a shared 2-core machine; compare ratios within one run.

Supervisor CPU is reported in all and "during dispatch" (first dispatch to last result, from
50 ms psutil samples, all threads and the main thread alone): the per-item cost without start-up.

``--case N`` (repeatable) runs only the given cases (the warm-up always runs);
``--profile DIR`` runs each supervisor under cProfile (timed by its main thread's CPU clock),
writing ``DIR/<name>.prof`` (figures are then inflated: use it to find hot spots, not to measure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.fakes.upstream import FakeUpstream, run_fake_upstream  # noqa: E402

BENCH = REPO / ".bench" / "eval"
PROFILE_DIR: Path | None = None
# The CLI under cProfile timed by the main thread's CPU clock: wall-clock timing would charge
# a loopback send() with the time the woken peer process ran, on a loaded 2-core machine.
PROFILED_CLI = """
import cProfile, time
from launcher.cli import main
profiler = cProfile.Profile(time.thread_time)
try:
    profiler.runcall(main)
except SystemExit:
    pass
finally:
    profiler.dump_stats({out!r})
"""
UV = Path(sys.executable).parent / "uv"

ENTRY = """
import os

import hypercorn.config

from main import EchoGrader, EchoWorkflow
from rollout_server import LocalBackend, serve

if os.environ.get("BENCH_BACKLOG"):
    # hypercorn's default listen backlog (100) drops SYNs when hundreds of rollouts connect at
    # once; each dropped SYN costs a 1 s retransmit. See the report in the module docstring.
    hypercorn.config.Config.backlog = int(os.environ["BENCH_BACKLOG"])

serve(LocalBackend(workflow=EchoWorkflow, grader=EchoGrader, max_concurrent=None))
"""

CONFIG = """
[experiment]
rollout = "echo"
entrypoint = "bench.py"
model_path = "openai/fake-model"
dataset = "{dataset}"

[evaluation]
agent_workflow_timeout_s = 600
grader_timeout_s = 60

[secrets]
required = []
"""


def setup() -> Path:
    """A workspace copy with an absolute path source, a bench entrypoint and a warm env."""
    if BENCH.exists():
        shutil.rmtree(BENCH)
    ws = BENCH / "ws"
    shutil.copytree(
        REPO / "examples" / "workspace",
        ws,
        ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__"),
    )
    pyproject = ws / "rollouts" / "echo" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('path = "../../../.."', f'path = "{REPO}"'))
    (ws / "rollouts" / "echo" / "bench.py").write_text(ENTRY)
    subprocess.run(
        [str(UV), "sync", "--project", str(ws / "rollouts" / "echo")],
        check=True,
        capture_output=True,
    )
    return ws


def dataset(ws: Path, rows: int) -> str:
    name = f"bench-{rows}.jsonl"
    with open(ws / "data" / name, "w") as fh:
        for i in range(rows):
            word = f"word{i}"
            fh.write(
                json.dumps({"user_prompt": f"Repeat after me: {word}", "ground_truth": word}) + "\n"
            )
    (ws / "configs" / "eval" / f"bench-{rows}.toml").write_text(CONFIG.format(dataset=name))
    return f"configs/eval/bench-{rows}.toml"


def _ts(line: str) -> float:
    return (
        datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        .replace(tzinfo=__import__("datetime").UTC)
        .timestamp()
    )


def parse_log(path: Path) -> dict[str, float]:
    first_dispatch = last_finish = None
    finished = 0
    for line in path.read_text().splitlines():
        if "[dispatch] dispatching rollout" in line and first_dispatch is None:
            first_dispatch = _ts(line)
        elif "[result] work item finished" in line:
            last_finish = _ts(line)
            finished += 1
    assert first_dispatch is not None and last_finish is not None
    return {"first_dispatch": first_dispatch, "last_finish": last_finish, "finished": finished}


async def serve_upstream(*, task_status: trio.TaskStatus[FakeUpstream]) -> None:
    """The fake provider with a deep listen backlog: a real provider does not drop SYNs."""
    await run_fake_upstream(backlog=4096, task_status=task_status)


async def run_eval(
    ws: Path,
    config: str,
    name: str,
    upstream: FakeUpstream,
    in_flight: int,
    backlog: int | None = None,
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV" and not k.endswith("_API_KEY")}
    env.update(
        OPENAI_BASE_URL=upstream.v1,
        OPENAI_API_KEY="sk-bench-key",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    if backlog is not None:
        env["BENCH_BACKLOG"] = str(backlog)
    if PROFILE_DIR is not None:
        entry = ["-c", PROFILED_CLI.format(out=str(PROFILE_DIR / f"{name}.prof"))]
    else:
        entry = ["-m", "launcher"]
    argv = [
        sys.executable,
        *entry,
        "eval",
        "run",
        config,
        "--name",
        name,
        "--yes",
        "--json",
        "--max-in-flight",
        str(in_flight),
    ]
    started = time.time()
    proc = await trio.lowlevel.open_process(
        argv, cwd=str(ws), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ps = psutil.Process(proc.pid)
    peak_rss = 0
    cpu = main_cpu = 0.0
    samples: list[tuple[float, float, float]] = []
    while proc.poll() is None:
        try:
            peak_rss = max(peak_rss, ps.memory_info().rss)
            times = ps.cpu_times()
            cpu = times.user + times.system
            main_cpu = next(
                (t.user_time + t.system_time for t in ps.threads() if t.id == proc.pid), main_cpu
            )
            samples.append((time.time(), cpu, main_cpu))
        except psutil.Error:
            break
        await trio.sleep(0.05)
    rc = await proc.wait()
    assert rc == 0, f"{name} exited {rc}"
    log = parse_log(ws / ".osmosis" / "evals" / name / "logs.txt")
    # CPU spent between the first dispatch and the last result: the per-item cost without
    # start-up and shutdown (samples are 50 ms apart, so this is a close bracket).
    before = [s for s in samples if s[0] <= log["first_dispatch"]] or samples[:1]
    after = [s for s in samples if s[0] >= log["last_finish"]] or samples[-1:]
    dispatch_cpu = after[0][1] - before[-1][1]
    dispatch_main = after[0][2] - before[-1][2]
    return {
        "start_to_first_dispatch_s": log["first_dispatch"] - started,
        "dispatch_wall_s": log["last_finish"] - log["first_dispatch"],
        "finished": log["finished"],
        "peak_rss_mb": peak_rss / 1e6,
        "cpu_s": cpu,
        "main_thread_cpu_s": main_cpu,
        "dispatch_cpu_ms_per_item": dispatch_cpu / log["finished"] * 1000,
        "dispatch_main_thread_cpu_ms_per_item": dispatch_main / log["finished"] * 1000,
    }


async def main(cases: set[int]) -> None:
    ws = setup()
    configs = {n: dataset(ws, n) for n in (200, 1000, 10_000)}
    async with trio.open_nursery() as nursery:
        upstream: FakeUpstream = await nursery.start(serve_upstream)
        out: dict[str, Any] = {}

        # Warm-up run (also primes OS caches for the rollout env and the CLI's imports).
        await run_eval(ws, configs[200], "warmup", upstream, 50)

        if 1 in cases:
            await case_fast(ws, configs, upstream, out)
        if 2 in cases:
            await case_latency(ws, configs, upstream, out)
        if 3 in cases:
            await case_rss(ws, configs, upstream, out)
        if 4 in cases:
            await case_scale(ws, configs, upstream, out)
        nursery.cancel_scope.cancel()
    (BENCH / "results.json").write_text(json.dumps(out, indent=2))


async def case_fast(
    ws: Path, configs: dict[int, str], upstream: FakeUpstream, out: dict[str, Any]
) -> None:
    """Case 1: 1000 rows at 0 ms upstream."""
    upstream.delay = 0.0
    fast = await run_eval(ws, configs[1000], "fast-1000", upstream, 50)
    rows_per_s = fast["finished"] / fast["dispatch_wall_s"]
    print("1) 1000 rows, 0 ms upstream, 50 in flight")
    print(f"   rows/s: {rows_per_s:.0f}")
    print(
        f"   start -> first dispatch: {fast['start_to_first_dispatch_s']:.2f} s "
        f"(target 1.5 s; ratio {fast['start_to_first_dispatch_s'] / 1.5:.2f})"
    )
    print(
        f"   supervisor CPU {fast['cpu_s']:.2f} s in all; during dispatch "
        f"{fast['dispatch_cpu_ms_per_item']:.2f} ms/item "
        f"(main thread {fast['dispatch_main_thread_cpu_ms_per_item']:.2f} ms/item)"
    )
    out["fast"] = fast


async def case_latency(
    ws: Path, configs: dict[int, str], upstream: FakeUpstream, out: dict[str, Any]
) -> None:
    """Case 2: 1000 rows at 500 ms upstream, 200 in flight."""
    upstream.delay = 0.5
    ideal = 1000 / 200 * 0.5
    print("2) 1000 rows, 500 ms upstream, 200 in flight")
    for label, backlog in (("default backlog", None), ("backlog 4096", 4096)):
        slow = await run_eval(
            ws, configs[1000], f"latency-{backlog}", upstream, 200, backlog=backlog
        )
        print(
            f"   rollout server {label}: dispatch wall {slow['dispatch_wall_s']:.2f} s vs "
            f"ideal {ideal:.2f} s: {slow['dispatch_wall_s'] / ideal:.3f}x (target <= 1.15x); "
            f"supervisor CPU during dispatch {slow['dispatch_cpu_ms_per_item']:.2f} ms/item "
            f"(main thread {slow['dispatch_main_thread_cpu_ms_per_item']:.2f})"
        )
        out[f"latency-{backlog}"] = slow


async def case_rss(
    ws: Path, configs: dict[int, str], upstream: FakeUpstream, out: dict[str, Any]
) -> None:
    """Case 3: supervisor RSS with 1000 rollouts in flight."""
    upstream.delay = 3.0
    wide = await run_eval(ws, configs[1000], "rss-1000", upstream, 1000, backlog=4096)
    print("3) 1000 rollouts in flight (3 s upstream, rollout server backlog 4096)")
    print(
        f"   supervisor peak RSS {wide['peak_rss_mb']:.0f} MB (target 200 MB; "
        f"ratio {wide['peak_rss_mb'] / 200:.2f}); dispatch wall {wide['dispatch_wall_s']:.2f} s "
        f"vs ideal 3.00 s"
    )
    out["rss"] = wide


async def case_scale(
    ws: Path, configs: dict[int, str], upstream: FakeUpstream, out: dict[str, Any]
) -> None:
    """Case 4: per-item cost at 200 vs 10,000 rows."""
    upstream.delay = 0.0
    small = await run_eval(ws, configs[200], "scale-200", upstream, 50)
    large = await run_eval(ws, configs[10_000], "scale-10000", upstream, 50)
    print("4) per-item cost, 0 ms upstream, 50 in flight")
    for label, r, n in (("200", small, 200), ("10000", large, 10_000)):
        print(
            f"   {label:>5} rows: {r['dispatch_wall_s'] / n * 1000:.2f} ms wall/item, "
            f"{r['cpu_s'] / n * 1000:.2f} ms supervisor CPU/item (incl. start-up; "
            f"{r['dispatch_cpu_ms_per_item']:.2f} during dispatch), "
            f"{n / r['dispatch_wall_s']:.0f} rows/s"
        )
    ratio = (large["dispatch_wall_s"] / 10_000) / (small["dispatch_wall_s"] / 200)
    print(f"   wall/item 10000 vs 200: {ratio:.2f}x (target: flat, ~1.0x)")
    out["scale"] = {"200": small, "10000": large}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--case", type=int, action="append", choices=(1, 2, 3, 4))
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        PROFILE_DIR = args.profile.resolve()
    print(f"load average at start: {os.getloadavg()}")
    trio.run(main, set(args.case or (1, 2, 3, 4)))
