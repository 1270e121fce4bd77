"""Benchmark: our rollout server against osmosis-ai 0.3.8's (FastAPI + uvicorn), two drivers.

    .venv/bin/python scripts/bench/bench_rollout_server.py [--rollouts 2000] [--in-flight 200]

Each server runs as its own process with a trivial LocalBackend workflow (echo) and grader
(reward 1.0, records ``time.monotonic()`` as it finishes in the sample's metrics). Two drivers
load each server in turn, the same way for both servers:

* ``ours``: our trio :class:`~rollout_server.client.RolloutClient`, in this process;
* ``ref``: osmosis-ai 0.3.8's own asyncio ``RolloutClient`` (its defaults: one
  ``httpx.AsyncClient()``), in a subprocess of the cached Python 3.12 environment of the
  interop test (``~/.cache/rollbridge/interop-osmosis-0.3.8-py312``, built on first use). It
  costs 5-6 ms of CPU per rollout at 8 in flight and about 20 ms at 200 (httpx's default pool
  keeps 20 connections alive), so its load runs at ``--ref-in-flight`` (8), where it is fastest.

Measured per server and driver:

* throughput: rollouts/s with ``--in-flight`` rollouts admitted and long-polled at once
  (admission to terminal result), and the server process's CPU time per rollout over the same
  window (read from ``/proc``: robust to other load on the machine, unlike rollouts/s);
* concurrency 1: one rollout at a time; ``admission -> result`` is from the 202 in the
  driver's hands to the terminal result decoded (the long-poll, including the rollout's own
  execution and its ``trajectory.json``), ``admit -> result`` adds the admission round trip;
* with our driver only: wake-up latency from the grader finishing (server process) to the
  long-poll's result decoded in the driver (CLOCK_MONOTONIC is system-wide), under the full load
  and "light" (10 in flight, 0.2 s workflows, no queueing); server RSS after the run and RSS
  growth per retained result (results are retained 900 s; a warm-up pass is taken first).

Rounds are interleaved (ours, reference, ours, ...); the best figure of each kind over the rounds
is kept, as the least disturbed by other work on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
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

# osmosis-ai's own client as a driver: prints "ready", waits for a line on stdin, runs, prints
# one JSON line of figures.
REFERENCE_DRIVER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from osmosis_ai.rollout.client import RolloutClient

    URL, PREFIX, COUNT, IN_FLIGHT = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    CHAT = "http://127.0.0.1:9/v1"

    async def main():
        client = RolloutClient(url=URL)
        await client.health()
        queue = asyncio.Queue()
        for index in range(COUNT):
            queue.put_nowait(index)
        full, after_admission = [], []

        async def worker():
            while not queue.empty():
                index = queue.get_nowait()
                started = time.monotonic()
                handle = await client.run_rollout_async(
                    initial_messages=[{"role": "user", "content": f"hello {index}"}],
                    chat_completions_url=CHAT, rollout_id=f"{PREFIX}{index}", label="L")
                admitted = time.monotonic()
                result = await handle
                done = time.monotonic()
                if result.status.value != "success":
                    raise RuntimeError(f"rollout {index} ended {result.status}")
                full.append(done - started)
                after_admission.append(done - admitted)

        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        cpu, start = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        elapsed, cpu = time.monotonic() - start, time.process_time() - cpu
        print(json.dumps({"elapsed": elapsed, "cpu": cpu, "full": full,
                          "after_admission": after_admission}), flush=True)
        await client.aclose()

    asyncio.run(main())
    """
)

DRIVERS = ("ours", "ref")
SERVERS = ("rollbridge", "osmosis-ai 0.3.8")


@dataclass
class Load:
    """One throughput pass."""

    rollouts_per_s: float
    server_cpu_ms: float
    driver_cpu_ms: float


@dataclass
class Serial:
    """One concurrency-1 pass: latencies in seconds."""

    full: list[float]
    after_admission: list[float]
    server_cpu_ms: float = math.nan


@dataclass
class Figures:
    """The best of every pass of one server with one driver."""

    loads: list[Load] = field(default_factory=list)
    serials: list[Serial] = field(default_factory=list)
    wake: list[list[float]] = field(default_factory=list)
    light: list[list[float]] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)

    @property
    def rollouts_per_s(self) -> float:
        return max(load.rollouts_per_s for load in self.loads)

    @property
    def server_cpu_ms(self) -> float:
        return min(load.server_cpu_ms for load in self.loads)

    @property
    def driver_cpu_ms(self) -> float:
        return min(load.driver_cpu_ms for load in self.loads)

    def serial(self, kind: str, quantile: float) -> float:
        return min(_quantile(getattr(s, kind), quantile) for s in self.serials) * 1000


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if q == 0.5:
        return statistics.median(ordered)
    return ordered[max(int(len(ordered) * q) - 1, 0)]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _request(prefix: str, index: int, sleep: float = 0.0) -> RolloutInitRequest:
    return RolloutInitRequest(
        initial_messages=[{"role": "user", "content": f"hello {index}"}],
        rollout_id=f"{prefix}{index}",
        chat_completions_url="http://127.0.0.1:9/v1",
        label="L",
        metadata={"sleep": sleep} if sleep else None,
    )


async def _drive_ours(
    url: str, prefix: str, count: int, in_flight: int, sleep: float = 0.0
) -> tuple[float, list[float], Serial]:
    """Our client: elapsed, wake-up latencies, and per-rollout latencies."""
    wake: list[float] = []
    serial = Serial([], [])
    send, receive = trio.open_memory_channel[int](count)
    for index in range(count):
        send.send_nowait(index)
    send.close()
    async with RolloutClient(url) as client:

        async def worker() -> None:
            async for index in receive:
                request = _request(prefix, index, sleep)
                started = time.monotonic()
                admission = await client.admit(request)
                admitted = time.monotonic()
                result = await client.wait_for_result(admission)
                received = time.monotonic()
                if result.status != RolloutStatus.SUCCESS or result.sample is None:
                    raise RuntimeError(f"rollout {request.rollout_id} ended {result.status}")
                wake.append(received - result.sample.metrics["finished_at"])
                serial.full.append(received - started)
                serial.after_admission.append(received - admitted)

        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            for _ in range(in_flight):
                nursery.start_soon(worker)
        elapsed = time.monotonic() - start
    return elapsed, wake, serial


async def _read_line(stream: trio.abc.ReceiveStream, buffer: bytearray) -> bytes:
    while b"\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise RuntimeError("reference driver exited early")
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


async def _drive_reference(
    driver: list[str], url: str, prefix: str, count: int, in_flight: int, server_pid: int
) -> tuple[Load, Serial]:
    """osmosis-ai's client in its own process; the server's CPU is read around its run only."""
    process = await trio.lowlevel.open_process(
        [*driver, url, prefix, str(count), str(in_flight)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    buffer = bytearray()
    try:
        with trio.fail_after(300):
            if await _read_line(process.stdout, buffer) != b"ready":
                raise RuntimeError("reference driver did not start")
            cpu_before = _cpu_seconds(server_pid)
            await process.stdin.send_all(b"go\n")
            figures = json.loads(await _read_line(process.stdout, buffer))
            cpu_used = _cpu_seconds(server_pid) - cpu_before
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    load = Load(
        rollouts_per_s=count / figures["elapsed"],
        server_cpu_ms=cpu_used / count * 1000,
        driver_cpu_ms=figures["cpu"] / count * 1000,
    )
    return load, Serial(figures["full"], figures["after_admission"], cpu_used / count * 1000)


async def _stop(process: trio.Process) -> None:
    """SIGTERM the server, then SIGKILL it if it has not exited within 30 s."""
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(30):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


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
    name: str,
    argv: list[str],
    env: dict[str, str],
    driver: list[str],
    args: argparse.Namespace,
    figures: dict[str, Figures],
    round_index: int,
) -> None:
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
        pid = process.pid
        try:
            await _wait_healthy(url, process)
            await _drive_ours(url, "warm-", args.in_flight, args.in_flight)
            # Our driver, full load.
            baseline = _rss_kb(pid)
            cpu_before, driver_before = _cpu_seconds(pid), time.process_time()
            elapsed, wake, _ = await _drive_ours(url, "r-", args.rollouts, args.in_flight)
            driver_used = time.process_time() - driver_before
            cpu_used = _cpu_seconds(pid) - cpu_before
            after = _rss_kb(pid)
            ours = figures["ours"]
            ours.loads.append(
                Load(
                    args.rollouts / elapsed,
                    cpu_used / args.rollouts * 1000,
                    driver_used / args.rollouts * 1000,
                )
            )
            ours.wake.append(wake)
            ours.rss.append((after / 1024, (after - baseline) / args.rollouts))
            # The reference driver, full load.
            load, _ = await _drive_reference(
                driver, url, "q-", args.ref_rollouts, args.ref_in_flight, pid
            )
            figures["ref"].loads.append(load)
            # Concurrency 1, both drivers.
            cpu_before = _cpu_seconds(pid)
            _, _, serial = await _drive_ours(url, "s-", args.serial_rollouts, 1)
            serial.server_cpu_ms = (_cpu_seconds(pid) - cpu_before) / args.serial_rollouts * 1000
            ours.serials.append(serial)
            _, serial = await _drive_reference(driver, url, "t-", args.serial_rollouts, 1, pid)
            figures["ref"].serials.append(serial)
            # Wake-up path without queueing: few rollouts in flight, each busy for 0.2 s.
            _, light, _ = await _drive_ours(url, "light-", args.light_rollouts, 10, sleep=0.2)
            ours.light.append(light)
        finally:
            await _stop(process)
    print(
        f"  round {round_index + 1} {name}: "
        + ", ".join(
            f"{d} driver {figures[d].loads[-1].rollouts_per_s:.1f} rollouts/s" for d in DRIVERS
        ),
        flush=True,
    )


def _ms(values: list[list[float]], q: float) -> float:
    return min(_quantile(v, q) for v in values) * 1000


def _verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def _report(results: dict[str, dict[str, Figures]], args: argparse.Namespace) -> None:
    print()
    print(
        f"{'server':<18}{'driver':<8}{'rollouts/s':>11}{'srv CPU ms':>11}{'drv CPU ms':>11}"
        f"{'c1 adm>res p50':>15}{'p99':>7}{'c1 full p50':>12}{'p99':>7}{'c1 srv CPU':>11}"
    )
    for server in SERVERS:
        for driver in DRIVERS:
            f = results[server][driver]
            print(
                f"{server:<18}{driver:<8}{f.rollouts_per_s:>11.1f}{f.server_cpu_ms:>11.3f}"
                f"{f.driver_cpu_ms:>11.3f}{f.serial('after_admission', 0.5):>15.3f}"
                f"{f.serial('after_admission', 0.99):>7.2f}{f.serial('full', 0.5):>12.3f}"
                f"{f.serial('full', 0.99):>7.2f}"
                f"{min(s.server_cpu_ms for s in f.serials):>11.3f}"
            )
    print(
        f"(load: our driver {args.rollouts} rollouts, {args.in_flight} in flight; the reference "
        f"driver {args.ref_rollouts} rollouts, {args.ref_in_flight} in flight; c1 = "
        f"{args.serial_rollouts} rollouts one at a time, latencies in ms; 'adm>res' = from the "
        "202 in the driver's hands to the terminal result, 'full' = from sending the admission;"
    )
    print(
        " srv CPU = server process CPU per rollout under the load; drv CPU = the driver's. On 2 "
        "cores server + driver CPU bound rollouts/s, so a server much cheaper than the driver "
        "cannot show its full throughput ratio: the CPU ratio is the load-robust figure)"
    )
    print()
    print(
        f"{'server':<18}{'wake p50':>10}{'wake p99':>10}{'light p50':>11}{'light p99':>11}"
        f"{'RSS MB':>8}{'KB/result':>11}   (our driver)"
    )
    for server in SERVERS:
        f = results[server]["ours"]
        rss, per_result = min(f.rss, key=lambda pair: pair[1])
        print(
            f"{server:<18}{_ms(f.wake, 0.5):>10.2f}{_ms(f.wake, 0.99):>10.2f}"
            f"{_ms(f.light, 0.5):>11.2f}{_ms(f.light, 0.99):>11.2f}{rss:>8.1f}{per_result:>11.2f}"
        )
    print()
    ours, ref = results[SERVERS[0]], results[SERVERS[1]]
    for driver in DRIVERS:
        ratio = ours[driver].rollouts_per_s / ref[driver].rollouts_per_s
        cpu_ratio = ref[driver].server_cpu_ms / ours[driver].server_cpu_ms
        print(
            f"target: rollouts/s >= 2x the reference server ({driver} driver): measured "
            f"{ours[driver].rollouts_per_s:.1f} vs {ref[driver].rollouts_per_s:.1f}, "
            f"ratio {ratio:.2f}x, {_verdict(ratio >= 2)}  "
            f"(server CPU per rollout: {ours[driver].server_cpu_ms:.3f} vs "
            f"{ref[driver].server_cpu_ms:.3f} ms, ratio {cpu_ratio:.2f}x)"
        )
    for driver in DRIVERS:
        p50 = ours[driver].serial("after_admission", 0.5)
        ref_p50 = ref[driver].serial("after_admission", 0.5)
        print(
            f"target: admission -> result p50 <= 0.5 ms at concurrency 1 ({driver} driver): "
            f"measured {p50:.3f} ms, ratio {p50 / 0.5:.2f} of the bound "
            f"(reference server {ref_p50:.3f} ms, {ref_p50 / p50:.2f}x ours), {_verdict(p50 <= 0.5)}"
        )
    load = os.getloadavg()
    print(f"(load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores)")


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-server-"))
    ours_script = work / "ours.py"
    ours_script.write_text(OURS)
    reference_script = work / "reference.py"
    reference_script.write_text(REFERENCE)
    driver_script = work / "reference_driver.py"
    driver_script.write_text(REFERENCE_DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    print("preparing the osmosis-ai 0.3.8 environment (cached after the first run)...", flush=True)
    reference_python = await trio.to_thread.run_sync(interop_python, ("server",))
    driver = [reference_python, str(driver_script)]
    load = os.getloadavg()
    print(
        f"load: our driver {args.rollouts} rollouts, {args.in_flight} in flight; the reference "
        f"driver {args.ref_rollouts}, {args.ref_in_flight} in flight; "
        f"{args.repeat} interleaved round(s) per server (load average {load[0]:.1f})\n",
        flush=True,
    )
    servers = {
        SERVERS[0]: ([sys.executable, str(ours_script)], {**env, "PYTHONPATH": str(REPO)}),
        SERVERS[1]: ([reference_python, str(reference_script)], env),
    }
    results = {name: {d: Figures() for d in DRIVERS} for name in SERVERS}
    try:
        for round_index in range(args.repeat):
            for name, (argv, server_env) in servers.items():
                await _measure(name, argv, server_env, driver, args, results[name], round_index)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(results, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument(
        "--ref-rollouts", type=int, default=600, help="rollouts of the reference driver's load"
    )
    parser.add_argument(
        "--ref-in-flight",
        type=int,
        default=8,
        help="in flight for the reference driver (its client is fastest at about 8)",
    )
    parser.add_argument("--serial-rollouts", type=int, default=300)
    parser.add_argument("--light-rollouts", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    trio.run(main, parser.parse_args())
