"""Benchmark: what the tunnel adds, measured with the fake cloudflared (tests/fakes/cloudflared.py).

1. Latency per bridge call (the real bridge, offline echo model), p50 and p90, sent directly to
   the bridge's loopback URL (baseline) and through the fake tunnel's "public" URL.
2. Time from starting the managed tunnel to the first advertised (ready) URL, against the time
   until the binary itself printed its URL (baseline: what the binary needs; the difference is
   what our readiness check adds, mostly the 0.1 s registration stability window).

Run: .venv/bin/python scripts/bench/bench_tunnel.py [--calls N] [--starts N]
The fake adds one HTTP hop on loopback; a real quick tunnel adds a round trip to Cloudflare's edge
(tens of ms), which no local benchmark can show.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx  # noqa: E402
import trio  # noqa: E402

from bridge import OFFLINE_MODEL, BridgeConfig, run_bridge  # noqa: E402
from tests.fakes.cloudflared_support import (  # noqa: E402
    FakeTunnelTransport,
    install_fake_cloudflared,
)
from tunnel import TunnelOptions, run_cloudflared_tunnel  # noqa: E402

TOKEN = "bench-token-0123456789abcdef0123"
BODY = {"model": "osmosis-rollout", "messages": [{"role": "user", "content": "hello bench"}]}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _latencies(client: httpx.AsyncClient, url: str, calls: int) -> list[float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(20):  # warm the connection pool and both servers
        (await client.post(url, json=BODY, headers=headers)).raise_for_status()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        response = await client.post(url, json=BODY, headers=headers)
        samples.append(time.perf_counter() - start)
        response.raise_for_status()
    return samples


async def main(calls: int, starts: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-tunnel-") as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir()
        os.environ["FAKE_CLOUDFLARED_STATE"] = str(state)
        binary = install_fake_cloudflared(root / "bin")
        async with trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, BridgeConfig(model=OFFLINE_MODEL, token=TOKEN))
            url_seen: list[float] = []

            def log(level: str, step: str, message: str, details: object = None) -> None:
                if step == "cloudflared" and ".trycloudflare.com" in message and not url_seen:
                    url_seen.append(time.perf_counter())

            options = TunnelOptions(binary, bridge.port, log=log)

            startup: list[float] = []
            baseline_start: list[float] = []
            for _ in range(starts):
                url_seen.clear()
                start = time.perf_counter()
                handle = await nursery.start(run_cloudflared_tunnel, options)
                startup.append(time.perf_counter() - start)
                baseline_start.append(url_seen[0] - start)
                handle.stop()
                await handle.wait_closed()

            handle = await nursery.start(run_cloudflared_tunnel, options)
            async with (
                httpx.AsyncClient(timeout=30, trust_env=False) as direct_client,
                httpx.AsyncClient(
                    timeout=30, transport=FakeTunnelTransport(state)
                ) as tunnel_client,
            ):
                direct = await _latencies(
                    direct_client, bridge.rollout_url("bench") + "/chat/completions", calls
                )
                tunneled = await _latencies(
                    tunnel_client,
                    bridge.rollout_url("bench", handle.public_url) + "/chat/completions",
                    calls,
                )
            handle.stop()
            await handle.wait_closed()
            nursery.cancel_scope.cancel()

    d50, t50 = _quantile(direct, 0.5) * 1000, _quantile(tunneled, 0.5) * 1000
    d90, t90 = _quantile(direct, 0.9) * 1000, _quantile(tunneled, 0.9) * 1000
    print(f"bridge call latency over {calls} sequential keep-alive calls (offline echo model):")
    print(f"  direct to 127.0.0.1 : p50 {d50:7.2f} ms   p90 {d90:7.2f} ms")
    print(f"  via fake tunnel     : p50 {t50:7.2f} ms   p90 {t90:7.2f} ms")
    print(f"  added by the tunnel : p50 {t50 - d50:+7.2f} ms   ratio p50 {t50 / d50:.2f}x")
    s50 = statistics.median(startup) * 1000
    b50 = statistics.median(baseline_start) * 1000
    print(f"tunnel start to first ready URL over {starts} starts (fake binary):")
    print(
        f"  median {s50:7.1f} ms   (min {min(startup) * 1000:.1f}, max {max(startup) * 1000:.1f})"
    )
    print(f"  baseline: spawn to the binary printing its URL, median {b50:7.1f} ms")
    print(f"  added by readiness: {s50 - b50:+.1f} ms   ratio {s50 / b50:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--starts", type=int, default=8)
    args = parser.parse_args()
    trio.run(main, args.calls, args.starts)
