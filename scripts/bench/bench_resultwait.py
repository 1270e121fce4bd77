"""The batched result wait against the per-id long-poll, at the protocol level (issue 29, item 1).

Our rollout server runs as its own process with a trivial echo workflow (bench_rollout_server's
``OURS``; ``--sleep`` seconds in the workflow); this process admits ``--rollouts`` rollouts,
``--in-flight`` at a time (at most 64 admissions at once, as the dispatcher), and waits for each result either with one long-poll per rollout
(``RolloutClient.wait_for_result``, the baseline) or through one ``ResultWaiter``
(``launcher.resultwait``, the rollouts registered by their admission). Rounds alternate,
per-id first; each prints the wall, the server's and this process's CPU per rollout, the
wake-up latency (grader finished in the server -> result in this process; CLOCK_MONOTONIC is
system-wide) and the requests that carried the results, then the batched/per-id ratios of the
best round of each. Compare CPU rather than wall on a busy machine; the load average is printed.

Run: .venv/bin/python scripts/bench/bench_resultwait.py [--rollouts 3000] [--in-flight 3000]
[--sleep 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_rollout_server as base

from launcher.dispatch import MAX_CONCURRENT_ADMISSIONS
from launcher.resultwait import ResultWaiter
from rollout_server.client import RolloutClient


async def drive(url: str, prefix: str, args: argparse.Namespace, batched: bool) -> dict[str, float]:
    """One round: admit and wait for every rollout; its figures."""
    wake: list[float] = []
    async with RolloutClient(url) as client:
        waiter = ResultWaiter(url) if batched else None
        if waiter is not None:
            client.admission_headers.update(waiter.admission_headers)
        slots = trio.Semaphore(args.in_flight)
        admissions = trio.Semaphore(MAX_CONCURRENT_ADMISSIONS)  # as the dispatcher does

        async def one(index: int) -> None:
            async with slots:
                async with admissions:
                    admission = await client.admit(base._request(prefix, index, args.sleep))
                if waiter is not None:
                    result = await waiter.wait(admission, registered=True)
                else:
                    result = await client.wait_for_result(admission)
            assert result.sample is not None, result
            wake.append(time.monotonic() - result.sample.metrics["finished_at"])

        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            for index in range(args.rollouts):
                nursery.start_soon(one, index)
        wall = time.monotonic() - started
    wake.sort()
    return {
        "wall": wall,
        "wake_p50_ms": wake[len(wake) // 2] * 1000,
        "wake_p99_ms": wake[int(len(wake) * 0.99)] * 1000,
        "requests": float(waiter.requests if waiter is not None else args.rollouts),
    }


async def main(args: argparse.Namespace) -> None:
    port = base._free_port()
    url = f"http://127.0.0.1:{port}"
    best: dict[bool, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-resultwait-") as trials:
        env = {
            **os.environ,
            "_OSMOSIS_ROLLOUT_PORT": str(port),
            "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": trials,
            "_OSMOSIS_ROLLOUT_INSTANCE_ID": "bench-resultwait",
        }
        argv = [sys.executable, "-c", base.OURS]
        process = await trio.lowlevel.open_process(argv, env=env, stdout=subprocess.DEVNULL)
        try:
            await base._wait_healthy(url, process)
            await drive(url, "warm-", args, batched=False)
            for round_index in range(args.rounds):
                for batched in (False, True):
                    server_before, mine_before = base._cpu_seconds(process.pid), time.process_time()
                    figures = await drive(url, f"r{round_index}{int(batched)}-", args, batched)
                    figures["server_ms"] = (
                        (base._cpu_seconds(process.pid) - server_before) / args.rollouts * 1000
                    )
                    figures["client_ms"] = (
                        (time.process_time() - mine_before) / args.rollouts * 1000
                    )
                    print(
                        f"{'batched' if batched else 'per-id '}: wall {figures['wall']:.2f} s, "
                        f"CPU per rollout: server {figures['server_ms']:.2f} ms, client "
                        f"{figures['client_ms']:.2f} ms; wake-up p50 {figures['wake_p50_ms']:.0f}"
                        f" ms, p99 {figures['wake_p99_ms']:.0f} ms; {figures['requests']:.0f} "
                        f"result requests; load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
                    kept = best.setdefault(batched, dict(figures))
                    for key, value in figures.items():
                        kept[key] = min(kept[key], value)
        finally:
            process.kill()
            await process.wait()
    for key in ("server_ms", "client_ms", "wall"):
        print(f"   batched / per-id, best {key}: {best[True][key] / best[False][key]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rollouts", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=3000, dest="in_flight")
    parser.add_argument("--sleep", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    trio.run(main, arguments)
    print(f"load average at end: {os.getloadavg()}")
