"""Benchmark: what each way from a podman sandbox to the bridge adds to a model call.

The real bridge (offline echo model) runs on 127.0.0.1 in this process. The same stdlib client
(http.client, one keep-alive connection, 20 warm-up calls, then N sequential calls and M
streamed calls) runs from each place:

1. host-side: the client on the host, to 127.0.0.1 (the baseline);
2. slirp direct: a container on ``slirp4netns:allow_host_loopback=true``, to 10.0.2.2;
3. relay: a ``--network none`` container, to 127.0.0.1:13131 in the container, carried by
   ``rollbridge_relay.py host`` over one ``podman exec -i`` pipe;
4. fake tunnel: the slirp container through one extra TCP forwarding hop on the host. It is a
   stand-in for cloudflared only: a real quick tunnel adds a round trip to Cloudflare's edge
   (tens of ms), which no local benchmark can show;
5. relay, local exec: the relay with its inside end as a plain local process and the client on
   the host, which separates the relay's own cost from podman exec's stdio plumbing.

Per path: call latency p50/p99 and streamed time to first body byte (the first SSE event) p50,
with what each adds over the host-side baseline measured in the same run. The machine's load
average is printed before and after (other work on the machine inflates every path).

Run: .venv/bin/python scripts/bench/bench_sandbox_paths.py [--calls 300] [--streams 30] [--rounds 2]
Needs the sandbox test bed (scripts/sandbox-testbed); containers are labelled and removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import trio  # noqa: E402

from bridge import OFFLINE_MODEL, BridgeConfig, run_bridge  # noqa: E402

RELAY = REPO_ROOT / "rollout_server" / "harbor" / "agent_path" / "rollbridge_relay.py"
IMAGE = "local/bookworm-harbor"
LABEL = "io.rollbridge.test=bench-sandbox-paths"
RELAY_PORT = 13131
SLIRP = "slirp4netns:allow_host_loopback=true"
TOKEN = "bench-token-0123456789abcdef0123"
HOST = "host-side (client on the host)"

#: The client, run by python3 on the host and in the containers (stdlib only).
CLIENT = r"""
import http.client, json, sys, time
host, port, path, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
calls, streams = int(sys.argv[5]), int(sys.argv[6])
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
def body(stream):
    messages = [{"role": "user", "content": "hello bench, one two three"}]
    return json.dumps({"model": "osmosis-rollout", "messages": messages, "stream": stream}).encode()
plain, streamed = body(False), body(True)
conn = http.client.HTTPConnection(host, port, timeout=30)
def check(response, data):
    if response.status != 200:
        raise SystemExit("HTTP %d: %r" % (response.status, data[:200]))
def call():
    conn.request("POST", path, body=plain, headers=headers)
    response = conn.getresponse()
    check(response, response.read())
for _ in range(20):
    call()
latency = []
for _ in range(calls):
    start = time.perf_counter()
    call()
    latency.append((time.perf_counter() - start) * 1000)
ttfb = []
for _ in range(streams):
    start = time.perf_counter()
    conn.request("POST", path, body=streamed, headers=headers)
    response = conn.getresponse()
    first = response.read1(1)
    ttfb.append((time.perf_counter() - start) * 1000)
    rest = response.read()
    check(response, first + rest)
    if b"[DONE]" not in first + rest:
        raise SystemExit("streamed response without [DONE]")
print(json.dumps({"latency": latency, "ttfb": ttfb}))
"""


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _forward(bridge_port: int, client: trio.SocketStream) -> None:
    """One connection of the fake tunnel: bytes both ways to the bridge."""
    async with client, await trio.open_tcp_stream("127.0.0.1", bridge_port) as upstream:

        async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
            try:
                while data := await src.receive_some(65536):
                    await dst.send_all(data)
                await dst.send_eof()
            except trio.BrokenResourceError:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, upstream)
            nursery.start_soon(pump, upstream, client)


async def _client(
    argv_prefix: list[str], host: str, port: int, path: str, calls: int, streams: int
) -> dict[str, list[float]]:
    argv = [*argv_prefix, "-c", CLIENT, host, str(port), path, TOKEN, str(calls), str(streams)]
    result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"client {argv_prefix} failed: {result.stderr.decode().strip()[-300:]}")
    return json.loads(result.stdout)  # type: ignore[no-any-return]


async def _start_relay(bridge_port: int, exec_argv: list[str]) -> tuple[trio.Process, int, float]:
    """The relay CLI to the bridge: (process, port it listens on inside, ms to READY)."""
    argv = [sys.executable, str(RELAY), "host", "--target", f"127.0.0.1:{bridge_port}"]
    argv += ["--print-port", "--", *exec_argv]
    start = time.perf_counter()
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        data = await process.stdout.receive_some(1)
        if not data:
            raise SystemExit("the relay did not start (see its stderr above)")
        line += data
    _ready, port = line.decode().split()
    return process, int(port), (time.perf_counter() - start) * 1000


async def _stop_relay(process: trio.Process) -> None:
    assert process.stdin is not None
    await process.stdin.aclose()
    await process.wait()


async def _measure(
    slirp_ctr: str, none_ctr: str, calls: int, streams: int, rounds: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, float]]:
    samples: dict[str, dict[str, list[float]]] = {}
    async with trio.open_nursery() as nursery:
        bridge = await nursery.start(run_bridge, BridgeConfig(model=OFFLINE_MODEL, token=TOKEN))
        path = bridge.rollout_url("bench").split(bridge.base_url, 1)[1] + "/chat/completions"
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        fake_port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, lambda s: _forward(bridge.port, s), listeners)
        source = RELAY.read_text()
        podman_relay, _, podman_ready = await _start_relay(
            bridge.port,
            ["podman", "exec", "-i", none_ctr, "python3", "-u", "-c", source, str(RELAY_PORT)],
        )
        local_relay, local_port, local_ready = await _start_relay(
            bridge.port, ["python3", "-u", "-c", source, "0"]
        )
        in_slirp = ["podman", "exec", slirp_ctr, "python3"]
        paths = {
            HOST: (["python3"], "127.0.0.1", bridge.port),
            "slirp direct (10.0.2.2)": (in_slirp, "10.0.2.2", bridge.port),
            "relay (--network none)": (
                ["podman", "exec", none_ctr, "python3"],
                "127.0.0.1",
                RELAY_PORT,
            ),
            "fake tunnel (stand-in)": (in_slirp, "10.0.2.2", fake_port),
            "relay, local exec (no podman)": (["python3"], "127.0.0.1", local_port),
        }
        for _ in range(rounds):
            for label, (prefix, host, port) in paths.items():
                got = await _client(prefix, host, port, path, calls, streams)
                into = samples.setdefault(label, {"latency": [], "ttfb": []})
                into["latency"] += got["latency"]
                into["ttfb"] += got["ttfb"]
        await _stop_relay(podman_relay)
        await _stop_relay(local_relay)
        nursery.cancel_scope.cancel()
    return samples, {"podman exec": podman_ready, "local exec": local_ready}


async def main(calls: int, streams: int, rounds: int) -> None:
    load_before = os.getloadavg()
    tag = uuid.uuid4().hex[:8]
    slirp_ctr, none_ctr = f"bench-paths-slirp-{tag}", f"bench-paths-none-{tag}"
    try:
        run = ["podman", "run", "-d", "--name"]
        for name, network in ((slirp_ctr, SLIRP), (none_ctr, "none")):
            await trio.run_process(
                [*run, name, "--network", network, "--label", LABEL, IMAGE, "sleep", "600"],
                capture_stdout=True,
            )
        samples, ready = await _measure(slirp_ctr, none_ctr, calls, streams, rounds)
    finally:
        with trio.CancelScope(shield=True):
            await trio.run_process(
                ["podman", "rm", "-f", "-t", "0", slirp_ctr, none_ctr],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )

    base = samples[HOST]
    b50, b99 = _quantile(base["latency"], 0.5), _quantile(base["latency"], 0.99)
    t50 = _quantile(base["ttfb"], 0.5)
    print(
        f"bridge call from a podman sandbox, offline echo model: {rounds} round(s) x {calls} "
        f"sequential keep-alive calls and {streams} streamed calls per path"
    )
    print(
        f"{'path':32} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>8} {'+p99':>8} {'x p50':>6}   {'TTFB p50':>8} {'+TTFB':>7}"
    )
    for label, got in samples.items():
        p50, p99 = _quantile(got["latency"], 0.5), _quantile(got["latency"], 0.99)
        f50 = _quantile(got["ttfb"], 0.5)
        print(
            f"{label:32} {p50:8.2f} {p99:8.2f} {p50 - b50:+8.2f} {p99 - b99:+8.2f} "
            f"{p50 / b50:6.2f}   {f50:8.2f} {f50 - t50:+7.2f}"
        )
    print(
        "relay start, spawn to READY: {:.0f} ms through podman exec, {:.0f} ms as a local "
        "process".format(ready["podman exec"], ready["local exec"])
    )
    print("fake tunnel = one extra local TCP hop standing in for cloudflared (no edge round trip)")
    print(
        "load average before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} {:.2f} (2 cores)".format(
            *load_before, *os.getloadavg()
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trio.run(main, args.calls, args.streams, args.rounds)
