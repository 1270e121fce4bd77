"""Benchmark: our rollout server against osmosis-ai 0.3.8's (FastAPI + uvicorn), same load.

    .venv/bin/python scripts/bench/bench_rollout_server.py [--rollouts 2000] [--in-flight 200]

Each server runs as its own process with a trivial LocalBackend workflow (echo) and grader
(reward 1.0, records ``time.monotonic()`` as it finishes in the sample's metrics). One driver —
our trio client, the same for both servers — keeps ``--in-flight`` rollouts admitted and
long-polled. Measured per server:

* throughput: rollouts/s over the whole run (admission to terminal result);
* wake-up latency: from the grader finishing (server process) to the waiting long-poll's
  result being decoded in the driver (CLOCK_MONOTONIC is system-wide, so the two processes
  share it). It includes writing ``trajectory.json``, which both servers do before publishing;
* server RSS after the run and RSS growth per retained result (results are retained 900 s,
  so every one of them is still held when RSS is read; a warm-up pass at the same concurrency
  is taken first so connection and pool memory are in the baseline).

The reference runs in the cached Python 3.12 environment of the interop test
(``~/.cache/rollbridge/interop-osmosis-0.3.8-py312``, built on first use).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rollout_server.client import RolloutClient  # noqa: E402
from rollout_server.protocol import RolloutInitRequest, RolloutStatus  # noqa: E402
from tests.rollout_server.interop_env import interop_python  # noqa: E402

OURS = textwrap.dedent(
    """
    import time
    import trio
    from rollout_server import AgentWorkflow, Grader, LocalBackend, serve

    class Echo(AgentWorkflow):
        async def run(self, ctx):
            if ctx.metadata and ctx.metadata.get("sleep"):
                await trio.sleep(ctx.metadata["sleep"])
            return [*ctx.prompt, {"role": "assistant", "content": "ok"}]

    class Mark(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)
            ctx.sample.metrics["finished_at"] = time.monotonic()

    serve(LocalBackend(Echo, Mark, max_concurrent=None), configure_logging=False)
    """
)

REFERENCE = textwrap.dedent(
    """
    import asyncio, os, time, uvicorn
    from osmosis_ai.rollout import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig,
                                    Grader, LocalBackend)
    from osmosis_ai.rollout.server import create_rollout_server

    class Echo(AgentWorkflow):
        async def run(self, ctx):
            if ctx.metadata and ctx.metadata.get("sleep"):
                await asyncio.sleep(ctx.metadata["sleep"])
            return [*ctx.prompt, {"role": "assistant", "content": "ok"}]

    class Mark(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)
            ctx.sample.metrics["finished_at"] = time.monotonic()

    config = AgentWorkflowConfig(name="bench", concurrency=ConcurrencyConfig(max_concurrent=None))
    backend = LocalBackend(workflow=Echo, workflow_config=config, grader=Mark)
    app = create_rollout_server(backend=backend, configure_logging=False)
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                timeout_keep_alive=2160, log_level="warning")
    """
)


@dataclass
class Figures:
    name: str
    rollouts_per_s: float
    server_cpu_ms: float
    driver_cpu_ms: float
    wake_p50_ms: float
    wake_p99_ms: float
    light_p50_ms: float
    light_p99_ms: float
    rss_mb: float
    rss_per_result_kb: float


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return statistics.median(values) * 1000, values[max(int(len(values) * 0.99) - 1, 0)] * 1000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def _drive(
    url: str, prefix: str, count: int, in_flight: int, sleep: float = 0.0
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    send, receive = trio.open_memory_channel[int](count)
    for index in range(count):
        send.send_nowait(index)
    send.close()
    async with RolloutClient(url) as client:

        async def worker() -> None:
            async for index in receive:
                request = RolloutInitRequest(
                    initial_messages=[{"role": "user", "content": f"hello {index}"}],
                    rollout_id=f"{prefix}{index}",
                    chat_completions_url="http://127.0.0.1:9/v1",
                    label="L",
                    metadata={"sleep": sleep} if sleep else None,
                )
                admission = await client.admit(request)
                result = await client.wait_for_result(admission)
                received = time.monotonic()
                if result.status != RolloutStatus.SUCCESS or result.sample is None:
                    raise RuntimeError(f"rollout {request.rollout_id} ended {result.status}")
                latencies.append(received - result.sample.metrics["finished_at"])

        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            for _ in range(in_flight):
                nursery.start_soon(worker)
        elapsed = time.monotonic() - start
    return elapsed, latencies


async def _wait_healthy(url: str, process: trio.Process) -> None:
    async with RolloutClient(url) as client:
        with trio.fail_after(60):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"server exited with {process.returncode}")
                try:
                    await client.health()
                    return
                except Exception:
                    await trio.sleep(0.1)


async def _measure(
    name: str, argv: list[str], env: dict[str, str], args: argparse.Namespace
) -> Figures:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bench-trials-") as trials:
        full_env = {
            **env,
            "_OSMOSIS_ROLLOUT_PORT": str(port),
            "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": trials,
            "_OSMOSIS_ROLLOUT_INSTANCE_ID": f"bench-{name}",
        }
        process = await trio.lowlevel.open_process(argv, env=full_env, stdout=subprocess.DEVNULL)
        try:
            await _wait_healthy(url, process)
            await _drive(url, "warm-", args.in_flight, args.in_flight)
            baseline = _rss_kb(process.pid)
            cpu_before = _cpu_seconds(process.pid)
            driver_before = time.process_time()
            elapsed, latencies = await _drive(url, "r-", args.rollouts, args.in_flight)
            driver_used = time.process_time() - driver_before
            cpu_used = _cpu_seconds(process.pid) - cpu_before
            after = _rss_kb(process.pid)
            # Wake-up path without queueing: few rollouts in flight, each busy for 0.2 s.
            _, light = await _drive(url, "light-", args.light_rollouts, 10, sleep=0.2)
        finally:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(30):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
    wake_p50, wake_p99 = _percentiles(latencies)
    light_p50, light_p99 = _percentiles(light)
    return Figures(
        name=name,
        rollouts_per_s=args.rollouts / elapsed,
        server_cpu_ms=cpu_used / args.rollouts * 1000,
        driver_cpu_ms=driver_used / args.rollouts * 1000,
        wake_p50_ms=wake_p50,
        wake_p99_ms=wake_p99,
        light_p50_ms=light_p50,
        light_p99_ms=light_p99,
        rss_mb=after / 1024,
        rss_per_result_kb=(after - baseline) / args.rollouts,
    )


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-server-"))
    ours_script = work / "ours.py"
    ours_script.write_text(OURS)
    reference_script = work / "reference.py"
    reference_script.write_text(REFERENCE)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    print("preparing the osmosis-ai 0.3.8 environment (cached after the first run)...", flush=True)
    reference_python = await trio.to_thread.run_sync(interop_python, ("server",))
    print(
        f"load: {args.rollouts} rollouts, {args.in_flight} in flight; "
        f"{args.repeat} interleaved pass(es) per server, best pass kept\n",
        flush=True,
    )
    servers = [
        ("rollbridge", [sys.executable, str(ours_script)], {**env, "PYTHONPATH": str(REPO)}),
        ("osmosis-ai 0.3.8", [reference_python, str(reference_script)], env),
    ]
    passes: dict[str, list[Figures]] = {name: [] for name, _, _ in servers}
    for round_index in range(args.repeat):
        for name, argv, server_env in servers:
            figures = await _measure(name, argv, server_env, args)
            passes[name].append(figures)
            print(
                f"  pass {round_index + 1} {name}: {figures.rollouts_per_s:.1f} rollouts/s",
                flush=True,
            )
    # On a shared machine the best pass is the one least disturbed by other work.
    results = [max(passes[name], key=lambda f: f.rollouts_per_s) for name, _, _ in servers]
    print()
    print(
        f"{'server':<18}{'rollouts/s':>11}{'srv CPU ms':>11}{'drv CPU ms':>11}{'wake p50':>10}{'wake p99':>10}"
        f"{'light p50':>11}{'light p99':>11}{'RSS MB':>8}{'KB/result':>11}"
    )
    for f in results:
        print(
            f"{f.name:<18}{f.rollouts_per_s:>11.1f}{f.server_cpu_ms:>11.2f}{f.driver_cpu_ms:>11.2f}"
            f"{f.wake_p50_ms:>10.2f}"
            f"{f.wake_p99_ms:>10.2f}{f.light_p50_ms:>11.2f}{f.light_p99_ms:>11.2f}"
            f"{f.rss_mb:>8.1f}{f.rss_per_result_kb:>11.2f}"
        )
    ours, ref = results
    print("(wake-up latencies in ms; 'light' = 10 in flight, 0.2 s workflows, no queueing;")
    print(" srv CPU = server process CPU time per rollout under the full load; drv CPU = the")
    print(" driver's (this process's) CPU per rollout: on 2 cores, server + driver CPU bounds")
    print(" rollouts/s, so a server much cheaper than the driver cannot show its full ratio)")
    print()
    print(f"throughput ratio (ours / reference): {ours.rollouts_per_s / ref.rollouts_per_s:.2f}x")
    print(
        f"server CPU per rollout ratio (reference / ours): {ref.server_cpu_ms / ours.server_cpu_ms:.2f}x"
    )
    print(
        f"wake-up p50 under load ratio (reference / ours): {ref.wake_p50_ms / ours.wake_p50_ms:.2f}x"
    )
    print(
        f"wake-up p50 light ratio (reference / ours): {ref.light_p50_ms / ours.light_p50_ms:.2f}x"
    )
    print(f"RSS ratio (reference / ours): {ref.rss_mb / ours.rss_mb:.2f}x")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(
        "targets: wake-up p50 <= 2 ms: "
        f"{'met' if ours.wake_p50_ms <= 2 else 'NOT met'} under load, "
        f"{'met' if ours.light_p50_ms <= 2 else 'NOT met'} light; throughput >= 3x: "
        f"{'met' if ours.rollouts_per_s >= 3 * ref.rollouts_per_s else 'NOT met'}; "
        f"RSS per retained result <= 20 KB: {'met' if ours.rss_per_result_kb <= 20 else 'NOT met'}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--light-rollouts", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    trio.run(main, parser.parse_args())
