"""CPU per chat call of the two fake upstreams, each in a process of its own, same client.

The fakes: tests/fakes/upstream.py's ``FakeUpstream`` (hypercorn's trio worker; the one the
test suite uses) and tests/fakes/lean_upstream.py (the one the end-to-end benchmark uses, so
that the fake takes as little of the machine as possible from the processes it measures).
Both are driven by the same client in this process (``H1Pool``, keep-alive), with non-streaming
calls at 1 and at 64 in flight and streamed calls at 64, in interleaved rounds (best round of
each kept); the figure is the server process's CPU (user + system) over the calls it answered.
Prints ms of CPU per call for each and the ratio lean / in-process fake.

Run: ``.venv/bin/python scripts/bench/bench_upstreams.py`` (about 20 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rollout_server.net.h1client import H1Pool  # noqa: E402

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Repeat after me: word7"}]}
STREAM_BODY = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
TARGET_MS = 0.25
"""The lean fake's budget per non-streaming call."""


def serve_fake() -> None:
    """``--serve-fake``: FakeUpstream alone in this process (its port printed on stdout)."""
    from tests.fakes.upstream import run_fake_upstream

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            upstream = await nursery.start(run_fake_upstream)
            print(upstream.base_url.rsplit(":", 1)[1], flush=True)

    trio.run(main)


def spawn(*argv: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def drive(port: int, body: bytes, calls: int, in_flight: int) -> None:
    pool = H1Pool("127.0.0.1", port)
    headers = [(b"content-type", b"application/json")]
    remaining = calls

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            reply = await pool.request(b"POST", b"/v1/chat/completions", headers, body)
            assert reply.status == 200, reply.status

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for _ in range(in_flight):
                    nursery.start_soon(client)
    finally:
        await pool.aclose()


def measure(port: int, process: psutil.Process, body: bytes, calls: int, in_flight: int) -> float:
    """Server CPU ms per call over ``calls`` calls (after a short warm-up)."""
    trio.run(drive, port, body, 200, in_flight)
    before = cpu_seconds(process)
    started = time.perf_counter()
    trio.run(drive, port, body, calls, in_flight)
    wall = time.perf_counter() - started
    used = cpu_seconds(process) - before
    print(f"      {calls} calls in {wall:.2f} s ({calls / wall:.0f}/s), server CPU {used:.3f} s")
    return used / calls * 1000


def main(calls: int, rounds: int) -> None:
    print(f"load average at start: {os.getloadavg()}")
    fake, fake_port = spawn(__file__, "--serve-fake")
    lean, lean_port = spawn("-m", "tests.fakes.lean_upstream", "--until-stdin-closes")
    servers = {
        "in-process fake (hypercorn)": (fake_port, psutil.Process(fake.pid)),
        "lean fake": (lean_port, psutil.Process(lean.pid)),
    }
    shapes = {
        "non-streaming, 1 in flight": (json.dumps(BODY).encode(), 1),
        "non-streaming, 64 in flight": (json.dumps(BODY).encode(), 64),
        "streaming (7 events), 64 in flight": (json.dumps(STREAM_BODY).encode(), 64),
    }
    try:
        results: dict[tuple[str, str], float] = {}
        for shape, (body, in_flight) in shapes.items():
            print(f"{shape}:")
            for round_ in range(rounds):
                for name, (port, process) in servers.items():
                    print(f"   round {round_ + 1}, {name}")
                    ms = measure(port, process, body, calls, in_flight)
                    key = (shape, name)
                    results[key] = min(results.get(key, ms), ms)
        print("server CPU per call, best round:")
        for shape in shapes:
            fake_ms = results[(shape, "in-process fake (hypercorn)")]
            lean_ms = results[(shape, "lean fake")]
            print(
                f"   {shape:36} in-process fake {fake_ms:.3f} ms, lean fake {lean_ms:.3f} ms, "
                f"ratio {lean_ms / fake_ms:.2f}"
            )
        worst = max(results[(shape, "lean fake")] for shape in list(shapes)[:2])
        verdict = "met" if worst <= TARGET_MS else "not met"
        print(
            f"   target lean fake CPU per non-streaming call (<= {TARGET_MS} ms): measured "
            f"{worst:.3f} ms, ratio {worst / TARGET_MS:.2f}, {verdict}"
        )
    finally:
        for child in (fake, lean):
            child.kill()
            child.wait()
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake()
    else:
        main(args.calls, args.rounds)
