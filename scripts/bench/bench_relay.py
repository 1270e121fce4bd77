"""CPU of a TLS relay in front of the bridge per model call (docs/scale-out.md "Cost of the
replica path"): the supervisor's relay until 2026-12-03, when the bridge began serving the
cluster's connections itself (bridge/tls.py); kept to measure that design against.

Run: ``.venv/bin/python scripts/bench/bench_relay.py [CALLS]`` (default 4000; under a minute).
The path of a node 2 rollout's model call, on loopback: a lean keep-alive client (the SDK's
``chat()`` pool) -> a node agent's relay (:func:`launcher.cluster.relay.relay_to` over TLS with
the pinned run certificate) -> the supervisor's relay (:func:`serve_relay`, TLS, the peer
filter) -> the fake provider (tests/fakes/lean_upstream.py, standing in for the bridge). The
supervisor's relay runs in a process of its own, and its CPU (all threads) over the calls,
per call, is the figure; 25 calls in flight, as node 2 has at 50 in flight across two nodes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import psutil
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from launcher.cluster.relay import pinned_client, relay_to  # noqa: E402
from rollout_server.net.h1client import H1Pool  # noqa: E402
from tests.fakes.lean_upstream import run_lean_upstream  # noqa: E402

IN_FLIGHT = 25
BODY = (
    b'{"model":"osmosis-rollout","messages":[{"role":"user","content":"Repeat after me: word1"}]}'
)

#: The supervisor's side, in its own process: serve the relay to ``argv[1]``'s port, print
#: the relay's port and the certificate's PEM, serve until stdin closes.
SUPERVISOR = """
import sys, trio, json
sys.path.insert(0, {repo!r})
from bridge.tls import run_certificate
from launcher.cluster.relay import AllowedPeers, relay_to, serve_relay

async def main():
    cert = run_certificate("127.0.0.1")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            serve_relay, relay_to("127.0.0.1", int(sys.argv[1])), "127.0.0.1", cert.server,
            AllowedPeers("127.0.0.1"),
        )
        print(json.dumps({{"port": port, "pem": cert.pem}}), flush=True)
        await trio.wrap_file(sys.stdin).read()
        nursery.cancel_scope.cancel()

trio.run(main)
"""


async def main(calls: int) -> None:
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(run_lean_upstream)
        port = int(upstream.v1.split(":")[2].split("/")[0])
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", SUPERVISOR.format(repo=str(REPO)), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stdin is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await proc.stdout.receive_some()
        import json

        facts = json.loads(line)
        agent = relay_to("127.0.0.1", facts["port"], tls=pinned_client(facts["pem"]))
        listeners = await nursery.start(partial(trio.serve_tcp, agent, 0, host="127.0.0.1"))
        pool = H1Pool("127.0.0.1", int(listeners[0].socket.getsockname()[1]))
        head = [(b"content-type", b"application/json"), (b"authorization", b"Bearer x")]

        async def worker(count: int) -> None:
            for _ in range(count):
                reply = await pool.request(
                    b"POST", b"/v1/chat/completions", head, BODY, total_sec=60, connect_sec=10
                )
                assert reply.status == 200, reply.status

        async def batch(count: int) -> None:
            async with trio.open_nursery() as workers:
                for _ in range(IN_FLIGHT):
                    workers.start_soon(worker, count // IN_FLIGHT)

        await batch(IN_FLIGHT * 8)  # warm: connections open, TLS done
        ps = psutil.Process(proc.pid)
        before, started = sum(ps.cpu_times()[:2]), time.perf_counter()
        await batch(calls)
        cpu, wall = sum(ps.cpu_times()[:2]) - before, time.perf_counter() - started
        done = calls // IN_FLIGHT * IN_FLIGHT
        print(
            f"supervisor relay: {cpu / done * 1000:.3f} ms CPU per call "
            f"({done} calls, {IN_FLIGHT} in flight, {wall:.1f} s; load {psutil.getloadavg()[0]:.2f})"
        )
        await proc.stdin.aclose()
        await proc.wait()
        await pool.aclose()
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
