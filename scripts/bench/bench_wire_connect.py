"""Microbenchmark: the CPU cost of opening and closing one loopback connection.

A run with many rollouts in flight opens a new connection per rollout on every hop
(supervisor -> rollout server, rollout -> bridge, bridge -> provider): HTTP/1.1 carries one
request at a time, so a thousand concurrent calls need a thousand connections. Two figures,
each CPU time (``time.process_time``, both ends of the connection in this process), measured
in this run:

* connect + accept: :meth:`rollout_server.net.wire.WirePool.connect` to ``127.0.0.1``
  through ``trio.open_tcp_stream`` (what the pool used for every origin) against its
  numeric-address path (one non-blocking ``connect``, no resolver call, no happy-eyeballs
  nursery);
* a cold exchange: :meth:`WirePool.request` on a pool with no idle connection (connect, one
  request, one small answer, close), the same two ways;
* closing a connected TCP stream: ``trio.aclose_forcefully`` (what the lean server and the
  pool's ``aclose`` used, once or twice per connection), ``stream.aclose()``, and the
  socket's ``close()`` alone (what they use now: a thousand connections closed at shutdown).

Run: ``.venv/bin/python scripts/bench/bench_wire_connect.py [--connections N]``.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
import trio.testing  # noqa: E402

from rollout_server.net import wire  # noqa: E402

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"


def _origin(port: int, *, by_address: bool) -> wire.Origin:
    """The pool's origin for ``port``; ``by_address=False`` takes the resolver's path."""
    origin = wire.Origin("http", "127.0.0.1", port)
    if not by_address:
        origin.address = None
    return origin


async def connects(
    port: int, accepted: list[trio.SocketStream], n: int, *, by_address: bool
) -> float:
    """CPU microseconds per connection :meth:`WirePool.connect` opens (and the listener
    accepts)."""
    pool = wire.WirePool()
    origin = _origin(port, by_address=by_address)
    connections = []
    start = time.process_time()
    for _ in range(n):
        connections.append(await pool.connect(origin, math.inf))
    await trio.testing.wait_all_tasks_blocked()
    spent = time.process_time() - start
    for stream in [c.stream for c in connections] + accepted:
        await stream.aclose()
    accepted.clear()
    return spent / n * 1e6


async def cold_exchanges(port: int, n: int, *, by_address: bool) -> float:
    """CPU microseconds per request on a pool that keeps no connection."""
    pool = wire.WirePool(max_idle=0)
    origin = _origin(port, by_address=by_address)
    headers = [(b"content-type", b"application/json")]
    start = time.process_time()
    for _ in range(n):
        response = await pool.request(origin, headers, b"{}")
        assert response.status == 200
        await response.read()
    return (time.process_time() - start) / n * 1e6


async def closes(n: int, how: str) -> float:
    """CPU microseconds per close of a connected TCP stream, three ways."""
    pairs = []
    for _ in range(n):
        a, b = socket.socketpair()
        pairs.append((trio.SocketStream(trio.socket.from_stdlib_socket(a)), b))
    start = time.process_time()
    for stream, _ in pairs:
        if how == "trio.aclose_forcefully":
            await trio.aclose_forcefully(stream)
        elif how == "stream.aclose":
            await stream.aclose()
        else:
            stream.socket.close()
    spent = time.process_time() - start
    for _, peer in pairs:
        peer.close()
    return spent / n * 1e6


async def main(n: int) -> None:
    accepted: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        await trio.sleep_forever()

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            await stream.send_all(ANSWER)
            await stream.receive_some(65536)  # until the pool closes it

    async with trio.open_nursery() as nursery:
        holding = (await nursery.start(partial(trio.serve_tcp, hold, 0, host="127.0.0.1")))[0]
        answering = (await nursery.start(partial(trio.serve_tcp, answer, 0, host="127.0.0.1")))[0]
        hold_port = holding.socket.getsockname()[1]
        answer_port = answering.socket.getsockname()[1]
        rows: dict[str, list[float]] = {}
        for _ in range(3):  # interleaved rounds: drift in the host's speed hits both alike
            for name, by_address in (("open_tcp_stream", False), ("numeric address", True)):
                rows.setdefault(f"connect + accept, {name}", []).append(
                    await connects(hold_port, accepted, n, by_address=by_address)
                )
            for name, by_address in (("numeric address", True), ("open_tcp_stream", False)):
                rows.setdefault(f"cold exchange, {name}", []).append(
                    await cold_exchanges(answer_port, n // 2, by_address=by_address)
                )
            for how in ("trio.aclose_forcefully", "stream.aclose", "socket.close"):
                rows.setdefault(f"close, {how}", []).append(await closes(n, how))
        nursery.cancel_scope.cancel()
    best = {name: min(values) for name, values in rows.items()}
    for name, value in best.items():
        print(f"{name:<40}{value:>9.1f} us CPU (best of 3)")
    for what in ("connect + accept", "cold exchange"):
        new, old = best[f"{what}, numeric address"], best[f"{what}, open_tcp_stream"]
        print(f"{what}: numeric address / open_tcp_stream = {new / old:.2f}x "
              f"({old - new:.0f} us less per connection)")  # fmt: skip
    forceful = best["close, trio.aclose_forcefully"]
    for how in ("stream.aclose", "socket.close"):
        print(f"close: {how} / trio.aclose_forcefully = {best[f'close, {how}'] / forceful:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=1000)
    trio.run(main, parser.parse_args().connections)
