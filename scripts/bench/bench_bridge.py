"""Benchmark the model bridge against the fake upstream, in one run.

Measures, with the fake OpenAI-compatible upstream (tests/fakes/upstream.py) in its own
process and the bridge in another:

* added latency per call: sequential keep-alive calls through the bridge vs straight to the
  upstream (p50/p99, non-streaming and streaming);
* sustained calls/s at 64 concurrent clients, through the bridge vs straight to the upstream;
* the same for the floor: a bare keep-alive h11 proxy on trio (:func:`serve_floor`), whose CPU
  per call is what the bridge's is held against (issue 15's targets are printed last);

for the direct path (``openai/…`` with ``OPENAI_BASE_URL``) and the LiteLLM path (the same
model forced through LiteLLM), plus LiteLLM alone (``litellm.acompletion`` on one asyncio
loop, no bridge) as the LiteLLM path's own baseline.

Run: ``.venv/bin/python scripts/bench/bench_bridge.py`` (about two minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-token-0123456789"
MODEL = "openai/bench-model"
BODY = {"model": "m", "messages": [{"role": "user", "content": "say something short please"}]}
CONCURRENCY = 64
ROUNDS = 3


# Child processes -----------------------------------------------------------------------------


def serve_upstream() -> None:
    import trio

    from tests.fakes.upstream import run_fake_upstream

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            upstream = await nursery.start(run_fake_upstream)
            print(upstream.base_url, flush=True)

    trio.run(main)


def serve_bridge(via_litellm: bool) -> None:
    import trio

    from bridge import BridgeConfig, run_bridge

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(
                run_bridge, BridgeConfig(model=MODEL, token=TOKEN, via_litellm=via_litellm)
            )
            if via_litellm:  # wait for LiteLLM's import before reporting ready
                from bridge.upstreams._loop import worker

                await worker().call(lambda litellm: None)
            print(handle.base_url, flush=True)

    trio.run(main)


def serve_floor(upstream_base: str) -> None:
    """The floor: a bare keep-alive h11 proxy on trio, nothing but HTTP in and HTTP out.

    Each client connection gets its own persistent upstream connection; a request's body is
    forwarded as it is, and the answer is relayed as it arrives (bytes already parsed leave in
    one write, so a small answer leaves in one). No routing, auth, JSON or accounting: what a
    Python proxy on this stack cannot go below.
    """
    from urllib.parse import urlsplit

    import h11
    import trio

    where = urlsplit(upstream_base)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    relayed = (b"content-type", b"content-length", b"cache-control")

    async def next_event(conn: h11.Connection, stream: trio.SocketStream) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await stream.receive_some(65536))

    async def exchange(
        client: h11.Connection, inbound: trio.SocketStream,
        up: h11.Connection, outbound: trio.SocketStream, request: h11.Request,
    ) -> None:  # fmt: skip
        body = []
        while type(event := await next_event(client, inbound)) is h11.Data:
            body.append(event.data)
        data = b"".join(body)
        head = [(b"host", b"%s:%d" % (host.encode(), port)), (b"content-length", b"%d" % len(data))]
        head += [(k, v) for k, v in request.headers if k == b"content-type"]
        await outbound.send_all(
            up.send(h11.Request(method=request.method, target=request.target, headers=head))
            + up.send(h11.Data(data=data)) + up.send(h11.EndOfMessage())
        )  # fmt: skip
        out = bytearray()
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                if out:
                    await inbound.send_all(bytes(out))
                    out.clear()
                up.receive_data(await outbound.receive_some(65536))
            elif type(event) is h11.Response:
                kept = [(k, v) for k, v in event.headers if k in relayed]
                out += client.send(h11.Response(status_code=event.status_code, headers=kept))
            elif type(event) is h11.Data:
                out += client.send(h11.Data(data=event.data))
            elif type(event) is h11.EndOfMessage:
                out += client.send(h11.EndOfMessage())
                await inbound.send_all(bytes(out))
                return
            else:
                raise RuntimeError(f"upstream: unexpected {event!r}")

    async def handle(inbound: trio.SocketStream) -> None:
        outbound = await trio.open_tcp_stream(host, port)
        client, up = h11.Connection(h11.SERVER), h11.Connection(h11.CLIENT)
        try:
            while type(request := await next_event(client, inbound)) is h11.Request:
                await exchange(client, inbound, up, outbound, request)
                client.start_next_cycle()
                up.start_next_cycle()
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            pass
        finally:
            await outbound.aclose()
            await inbound.aclose()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=1024)
        print(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


def litellm_alone(base: str, calls: int, seconds: float) -> None:
    """LiteLLM's own cost: acompletion straight to the upstream on one asyncio loop."""
    import asyncio

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": BODY["messages"],
        "api_base": base + "/v1",
        "api_key": "sk-bench",
        "max_retries": 0,
    }

    async def main() -> dict[str, Any]:
        for _ in range(20):
            await litellm.acompletion(**kw)
        latencies = []
        for _ in range(calls):
            start = time.perf_counter()
            await litellm.acompletion(**kw)
            latencies.append(time.perf_counter() - start)
        done = 0
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await litellm.acompletion(**kw)
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
        return {"latencies": latencies, "rps": done / (time.perf_counter() - start)}

    print(json.dumps(asyncio.run(main())), flush=True)


# Measuring -----------------------------------------------------------------------------------


def spawn(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        raise SystemExit(f"child {args} did not start")
    return proc, line


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def latencies(
    targets: list[tuple[str, dict[str, str]]], body: dict[str, Any], n: int
) -> list[list[float]]:
    """Sequential keep-alive latency of each target (url, headers), ``n`` calls each.

    The calls take turns, one to each target in order, each target on its own keep-alive
    connection: the host's speed on this VM drifts by tens of percent within a minute, and
    taking turns call by call makes that drift hit every target alike, so the differences
    between their medians (the added latency) are stable where the medians themselves move.
    """
    import httpx

    out: list[list[float]] = [[] for _ in targets]
    clients = [httpx.AsyncClient(timeout=60) for _ in targets]
    try:
        for _ in range(5):
            for client, (url, headers) in zip(clients, targets, strict=True):
                (await client.post(url, json=body, headers=headers)).raise_for_status()
        for _ in range(n):
            for client, (url, headers), seen in zip(clients, targets, out, strict=True):
                start = time.perf_counter()
                response = await client.post(url, json=body, headers=headers)
                await response.aread()
                seen.append(time.perf_counter() - start)
                response.raise_for_status()
    finally:
        for client in clients:
            await client.aclose()
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    url: str, headers: dict[str, str], seconds: float, pid: int
) -> tuple[float, float]:
    """Calls/s at CONCURRENCY clients, and CPU ms per call of process ``pid`` (the server)."""
    import httpx
    import trio

    done = 0
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for _ in range(10):
            await client.post(url, json=BODY, headers=headers)
        deadline = trio.current_time() + seconds

        async def one() -> None:
            nonlocal done
            while trio.current_time() < deadline:
                response = await client.post(url, json=BODY, headers=headers)
                response.raise_for_status()
                done += 1

        start = time.perf_counter()
        cpu_start = cpu_seconds(pid)
        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(one)
        cpu_ms = (cpu_seconds(pid) - cpu_start) / done * 1000
        return done / (time.perf_counter() - start), cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per latency run")
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="throughput time per target (split in rounds)"
    )
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "upstream":
            serve_upstream()
        elif kind == "bridge":
            serve_bridge(rest[0] == "litellm")
        elif kind == "floor":
            serve_floor(rest[0])
        else:
            litellm_alone(rest[0], args.calls, args.seconds)
        return

    import trio

    upstream, base = spawn("--child", "upstream")
    env = {
        "OPENAI_BASE_URL": base + "/v1",
        "OPENAI_API_KEY": "sk-bench",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    children = [upstream]
    try:
        direct_bridge, direct_url = spawn("--child", "bridge", "direct", env=env)
        children.append(direct_bridge)
        litellm_bridge, litellm_url = spawn("--child", "bridge", "litellm", env=env)
        children.append(litellm_bridge)
        floor, floor_url = spawn("--child", "floor", base)
        children.append(floor)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        upstream_url = base + "/v1/chat/completions"
        rows: list[tuple[str, list[float], list[float], float, float]] = []

        async def run_all() -> None:
            stream_body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
            chat = "/v1/rollouts/r/chat/completions"
            targets = [
                ("upstream alone", upstream_url, {}, upstream.pid),
                ("floor: bare h11 proxy", floor_url + "/v1/chat/completions", {}, floor.pid),
                ("bridge, direct path", direct_url + chat, auth, direct_bridge.pid),
                ("bridge, LiteLLM path", litellm_url + chat, auth, litellm_bridge.pid),
            ]
            results: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {
                name: ([], [], [], []) for name, _, _, _ in targets
            }
            addresses = [(url, headers) for _, url, headers, _ in targets]
            # Rounds interleave the targets, so drift in the machine's load hits all alike
            # (and the latency calls take turns call by call, see latencies()).
            for _ in range(ROUNDS):
                for kind, body in ((0, BODY), (1, stream_body)):
                    per_target = await latencies(addresses, body, args.calls // ROUNDS)
                    for (name, _, _, _), seen in zip(targets, per_target, strict=True):
                        results[name][kind].extend(seen)
                for name, url, headers, pid in targets:
                    rate, cpu_ms = await throughput(url, headers, args.seconds / ROUNDS, pid)
                    results[name][2].append(rate)
                    results[name][3].append(cpu_ms)
            for name, (plain, streamed, rps, cpu) in results.items():
                rows.append((name, plain, streamed, statistics.median(rps), statistics.median(cpu)))

        trio.run(run_all)
        alone_proc = subprocess.run(
            [sys.executable, __file__, "--calls", str(args.calls), "--seconds", str(args.seconds),
             "--child", "litellm", base],
            capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT, check=True,
        )  # fmt: skip
        alone = json.loads(alone_proc.stdout.strip().splitlines()[-1])
    finally:
        for child in children:
            child.terminate()
            child.wait()

    base_plain, base_stream, base_rps = rows[0][1], rows[0][2], rows[0][3]
    print(f"{'target':<24}{'p50 ms':>9}{'p99 ms':>9}{'+p50':>8}{'stream p50':>12}{'+p50':>8}"
          f"{'calls/s@64':>12}{'ratio':>8}{'srv CPU ms':>12}")  # fmt: skip
    for name, plain, streamed, rps, cpu in rows:
        print(
            f"{name:<24}{pct(plain, 0.5):>9.2f}{pct(plain, 0.99):>9.2f}"
            f"{pct(plain, 0.5) - pct(base_plain, 0.5):>8.2f}{pct(streamed, 0.5):>12.2f}"
            f"{pct(streamed, 0.5) - pct(base_stream, 0.5):>8.2f}{rps:>12.0f}{rps / base_rps:>8.2f}"
            f"{cpu:>12.2f}"
        )
    lat = alone["latencies"]
    print(
        f"{'LiteLLM alone':<24}{pct(lat, 0.5):>9.2f}{pct(lat, 0.99):>9.2f}"
        f"{pct(lat, 0.5) - pct(base_plain, 0.5):>8.2f}{'':>12}{'':>8}{alone['rps']:>12.0f}"
        f"{alone['rps'] / base_rps:>8.2f}"
    )
    litellm_row = rows[3]
    print()
    print(f"LiteLLM path: {litellm_row[3] / alone['rps']:.0%} of LiteLLM-alone calls/s, "
          f"p50 {pct(litellm_row[1], .5):.2f} ms vs {pct(lat, .5):.2f} ms for LiteLLM alone")  # fmt: skip
    _, floor_plain, _, floor_rps, floor_cpu = rows[1]
    _, bridge_plain, _, bridge_rps, bridge_cpu = rows[2]
    added = pct(bridge_plain, 0.5) - pct(base_plain, 0.5)
    floor_added = pct(floor_plain, 0.5) - pct(base_plain, 0.5)
    for what, measured, ratio, limit, met in (
        ("bridge CPU per call <= 2 x floor's", f"{bridge_cpu:.3f} ms vs floor {floor_cpu:.3f} ms",
         bridge_cpu / floor_cpu, "<= 2.00", bridge_cpu <= 2 * floor_cpu),
        ("added latency p50 <= 0.5 ms (sequential keep-alive)",
         f"{added:.3f} ms (floor adds {floor_added:.3f} ms)", added / 0.5, "<= 1.00 of the bound",
         added <= 0.5),
        ("calls/s at 64 clients >= 60% of upstream's", f"{bridge_rps:.0f} vs {base_rps:.0f} "
         f"(floor {floor_rps / base_rps:.0%})", bridge_rps / base_rps, ">= 0.60",
         bridge_rps >= 0.6 * base_rps),
    ):  # fmt: skip
        print(f"target: {what}: measured {measured} (ratio {ratio:.2f}, {limit}) "
              f"{'met' if met else 'not met'}")  # fmt: skip
    print("(srv CPU = CPU time per call, at 64 clients, of the process serving that target: the")
    print(" upstream for 'upstream alone', the proxy's or the bridge's process for the others.")
    print(" A proxy serves one call and makes one, so on 2 shared cores its CPU per call, not")
    print(" wall time, is the figure that is stable from run to run; hence the CPU target.)")
    print(f"({args.calls} sequential keep-alive calls and {CONCURRENCY} clients for "
          f"{args.seconds:.0f} s per target, in {ROUNDS} interleaved rounds; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")  # fmt: skip


if __name__ == "__main__":
    main()
