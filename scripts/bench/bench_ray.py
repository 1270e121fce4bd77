"""Dispatch across a two-node Ray cluster against a one-machine run of the same work.

Run (root: it starts ``scripts/ray-testbed``): ``.venv/bin/python scripts/bench/bench_ray.py``
(about 6 minutes on 2 cores; it waits for the test bed's lock, as ``tests/cluster`` do). Each
case runs the same invocation on this machine alone and with ``--ray`` on the test bed (the head
on this machine, node 2 in a network namespace: both on the same 2 cores, so this measures the
overhead of the replica path, not a speed-up), through ``bench_eval.run_eval`` (the real CLI,
the fake provider ``tests/fakes/lean_upstream.py``, the unbounded echo rollout):

1. 1000 rows at 0 ms upstream, 50 in flight: supervisor + bridge CPU per work item during
   dispatch, ``--ray`` over local (target <= 1.2x), with a node agent's items in batched actor
   calls (the default) and with one actor call per item (``ROLLBRIDGE_RAY_BATCH=0``, the
   baseline): the medians of ``BENCH_ROUNDS`` (default 3) interleaved rounds. The node agent's
   and its server's CPU are not the supervisor's and are not counted.
2. 1000 rows at a 1 s upstream, 200 in flight (each node's replica gets about half): dispatch
   wall (first dispatch -> last result), ``--ray`` over local (target <= 1.2x).

Each line prints the two figures and their ratio; nothing here is a pass/fail test.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_eval import REPO, dataset, run_eval, serve_upstream, setup, target

TESTBED = REPO / "scripts" / "ray-testbed"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
LOCK = "/tmp/rollbridge-ray-testbed.lock"  # as tests/cluster/conftest.py: one test bed at a time


def _testbed(command: str, directory: Path) -> None:
    subprocess.run(
        [str(TESTBED), command, str(directory)],
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
        timeout=240,
    )


def _read_env(directory: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in (directory / "env").read_text().splitlines():
        for pair in line.removeprefix("export ").split():
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def _line(what: str, local: dict[str, Any], ray: dict[str, Any], key: str, unit: str) -> None:
    print(
        f"   {what}: local {local[key]:.3f}{unit}, --ray {ray[key]:.3f}{unit}, "
        f"ratio {ray[key] / local[key]:.2f}"
    )


def _remote(ws: Path, name: str) -> int:
    """How many of run ``name``'s rollouts ran on node 2."""
    log = (ws / ".osmosis" / "evals" / name / "logs.txt").read_text()
    return log.count("rollout finished on replica")


async def main(directory: Path) -> None:
    ws = setup()
    # The workspace lives under the repo's ignored .bench/: its own git repository, so the
    # rollout's files are shipped to node 2 (the bundle lists a checkout's files through git).
    await trio.run_process(["git", "init", "-q", str(ws)])
    config = dataset(ws, 1000)
    warm = dataset(ws, 200)
    address = _read_env(directory)["RB_ADDRESS"]
    os.environ.update(_read_env(directory))
    ray = ("--ray", address)
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_upstream)
        await run_eval(ws, warm, "warmup", upstream, 50)
        await run_eval(ws, warm, "warmup-ray", upstream, 50, extra=ray)

        await upstream.set_delay(0.0)
        key = "dispatch_cpu_ms_per_item"
        runs: dict[str, list[float]] = {"local": [], "per-item": [], "batched": []}
        for n in range(ROUNDS):  # interleaved, so the host's drift hits all three alike
            run = await run_eval(ws, config, f"fast-local-{n}", upstream, 50)
            runs["local"].append(run[key])
            os.environ["ROLLBRIDGE_RAY_BATCH"] = "0"
            run = await run_eval(ws, config, f"fast-ray-per-item-{n}", upstream, 50, extra=ray)
            runs["per-item"].append(run[key])
            remote = [_remote(ws, f"fast-ray-per-item-{n}")]
            del os.environ["ROLLBRIDGE_RAY_BATCH"]
            run = await run_eval(ws, config, f"fast-ray-{n}", upstream, 50, extra=ray)
            runs["batched"].append(run[key])
            remote.append(_remote(ws, f"fast-ray-{n}"))
            print(
                f"   round {n + 1}: "
                + ", ".join(f"{k} {v[-1]:.3f} ms" for k, v in runs.items())
                + f" (on node 2: per-item {remote[0]}, batched {remote[1]} items)"
            )
        local, per_item, spread = ({key: statistics.median(v)} for v in runs.values())
        print(f"1) 1000 rows, 0 ms upstream, 50 in flight (median of {ROUNDS} rounds)")
        _line("supervisor CPU per item, dispatch, one call per item", local, per_item, key, "ms")
        _line("supervisor CPU per item, dispatch, batched calls", local, spread, key, "ms")
        target(
            "supervisor CPU per item, --ray / local",
            spread["dispatch_cpu_ms_per_item"] / local["dispatch_cpu_ms_per_item"],
            1.2,
            "x",
        )

        await upstream.set_delay(1.0)
        local = await run_eval(ws, config, "latency-local", upstream, 200)
        spread = await run_eval(ws, config, "latency-ray", upstream, 200, extra=ray)
        print(f"2) 1000 rows, 1 s upstream, 200 in flight ({_remote(ws, 'latency-ray')} on node 2)")
        _line("dispatch wall", local, spread, "dispatch_wall_s", "s")
        target(
            "latency-bound dispatch wall, --ray / local",
            spread["dispatch_wall_s"] / local["dispatch_wall_s"],
            1.2,
            "x",
        )
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("bench_ray needs root (it starts scripts/ray-testbed)")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Short: Ray's unix sockets live under it.
    bed = Path(tempfile.mkdtemp(prefix="rtb-", dir="/tmp"))
    lock = open(LOCK, "w")  # noqa: SIM115 - held for the benchmark, closed at exit
    fcntl.flock(lock, fcntl.LOCK_EX)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    try:
        _testbed("up", bed)
        trio.run(main, bed)
    finally:
        _testbed("down", bed)
        shutil.rmtree(bed, ignore_errors=True)
        print(f"load average {os.getloadavg()[0]:.2f}")
        lock.close()
