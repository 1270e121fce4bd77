"""Benchmark: the rollout client's own CPU per rollout (admission + long-poll), our server only.

    .venv/bin/python scripts/bench/bench_rollout_client.py [--rollouts 1000] [--in-flight 50]

The quick half of ``bench_rollout_server.py`` (no osmosis-ai environment): our rollout server
in a process of its own with the same echo workflow, driven by
:class:`~rollout_server.client.RolloutClient` in this process, first at ``--in-flight``
rollouts at once, then one at a time. Printed per round: rollouts/s, this process's CPU per
rollout (the client: the figure a change to the client moves), the server's, and the
concurrency-1 admit -> result p50. The best figure of each kind over ``--repeat`` rounds is
kept, as the least disturbed by other work on a shared machine. To compare two trees, run
this file from each (it imports the tree it sits in), interleaved.
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

from bench_rollout_server import (
    OURS,
    REPO,
    _cpu_seconds,
    _drive_ours,
    _free_port,
    _quantile,
    _stop,
    _wait_healthy,
)


async def _round(script: Path, args: argparse.Namespace) -> tuple[float, float, float, float]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    with tempfile.TemporaryDirectory(prefix="bench-trials-") as trials:
        env |= {
            "PYTHONPATH": str(REPO),
            "_OSMOSIS_ROLLOUT_PORT": str(port),
            "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": trials,
            "_OSMOSIS_ROLLOUT_INSTANCE_ID": "bench-client",
        }
        argv = [sys.executable, str(script)]
        process = await trio.lowlevel.open_process(argv, env=env, stdout=subprocess.DEVNULL)
        try:
            await _wait_healthy(url, process)
            await _drive_ours(url, "warm-", args.in_flight, args.in_flight)
            server_before, client_before = _cpu_seconds(process.pid), time.process_time()
            elapsed, _, _ = await _drive_ours(url, "r-", args.rollouts, args.in_flight)
            client_ms = (time.process_time() - client_before) / args.rollouts * 1000
            server_ms = (_cpu_seconds(process.pid) - server_before) / args.rollouts * 1000
            _, _, serial = await _drive_ours(url, "s-", args.serial_rollouts, 1)
        finally:
            await _stop(process)
    return args.rollouts / elapsed, client_ms, server_ms, _quantile(serial.full, 0.5) * 1000


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-rollout-client-") as work:
        script = Path(work) / "ours.py"
        script.write_text(OURS)
        rounds = []
        for index in range(args.repeat):
            figures = await _round(script, args)
            rounds.append(figures)
            print(
                f"  round {index + 1}: {figures[0]:.1f} rollouts/s, client CPU "
                f"{figures[1]:.3f} ms/rollout, server CPU {figures[2]:.3f} ms/rollout, "
                f"c1 admit -> result p50 {figures[3]:.3f} ms",
                flush=True,
            )
    load = os.getloadavg()
    print(
        f"best of {args.repeat}: {max(r[0] for r in rounds):.1f} rollouts/s, client CPU "
        f"{min(r[1] for r in rounds):.3f} ms/rollout, server CPU "
        f"{min(r[2] for r in rounds):.3f} ms/rollout, c1 p50 {min(r[3] for r in rounds):.3f} ms "
        f"({args.rollouts} rollouts, {args.in_flight} in flight; load average {load[0]:.1f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=50)
    parser.add_argument("--serial-rollouts", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    trio.run(main, parser.parse_args())
