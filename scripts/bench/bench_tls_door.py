"""The server side of the bridge's cluster door: TLS on a non-blocking ``ssl.SSLSocket``
(:class:`bridge.tls.TLSStream`) against ``trio.SSLStream``, CPU per exchange.

Run: ``.venv/bin/python scripts/bench/bench_tls_door.py`` (about 20 s). A server process per
kind echoes each 700-byte request with a 900-byte answer (a model call's size on the echo
model) over TLS 1.3 with a run certificate; this process's clients make 20,000 exchanges over 25
kept-alive connections (node 2's count in bench_ray), and the server's CPU time (user + system)
is read before and after. Prints the two figures per exchange and their ratio, interleaved over
3 rounds (medians).
"""

from __future__ import annotations

import json
import socket
import ssl
import statistics
import subprocess
import sys
from pathlib import Path

import psutil
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bridge.tls import TLSStream, run_certificate  # noqa: E402
from launcher.cluster.relay import pinned_client  # noqa: E402

EXCHANGES = 60_000
CONNECTIONS = 25
REQUEST = b"q" * 700
ANSWER = b"a" * 900


async def _serve(kind: str) -> None:
    cert = run_certificate("127.0.0.1")
    assert cert is not None
    cert.server.minimum_version = ssl.TLSVersion.TLSv1_3
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    print(json.dumps({"port": listener.getsockname()[1], "pem": cert.pem}), flush=True)

    async def handle(sock: socket.socket) -> None:
        stream: trio.abc.Stream
        if kind == "sslsocket":
            tls = cert.server.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            tls.setblocking(False)
            stream = TLSStream(tls)
        else:
            raw = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
            stream = trio.SSLStream(raw, cert.server, server_side=True)
        got = 0
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                got += len(data)
                while got >= len(REQUEST):
                    got -= len(REQUEST)
                    await stream.send_all(ANSWER)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    tsock = trio.socket.from_stdlib_socket(listener)
    async with trio.open_nursery() as nursery:
        while True:
            conn, _ = await tsock.accept()
            nursery.start_soon(handle, socket.socket(fileno=conn.detach()))


async def _client(port: int, pem: str) -> None:
    context = pinned_client(pem)

    async def one(count: int) -> None:
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        stream = trio.SSLStream(tcp, context, server_hostname="127.0.0.1")
        async with stream:
            for _ in range(count):
                await stream.send_all(REQUEST)
                got = 0
                while got < len(ANSWER):
                    got += len(await stream.receive_some(65536))

    async with trio.open_nursery() as nursery:
        for _ in range(CONNECTIONS):
            nursery.start_soon(one, EXCHANGES // CONNECTIONS)


def _measure(kind: str) -> float:
    server = subprocess.Popen(
        [sys.executable, __file__, "serve", kind], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        facts = json.loads(server.stdout.readline())
        ps = psutil.Process(server.pid)
        trio.run(_client, facts["port"], facts["pem"])  # warm: handshakes, first calls
        before = sum(ps.cpu_times()[:2])
        trio.run(_client, facts["port"], facts["pem"])
        after = sum(ps.cpu_times()[:2])
        return (after - before) / EXCHANGES * 1e6
    finally:
        server.kill()
        server.wait()


def main() -> None:
    results: dict[str, list[float]] = {"sslsocket": [], "sslstream": []}
    for _ in range(3):
        for kind in results:
            results[kind].append(_measure(kind))
    print(results)
    mine, trios = (statistics.median(v) for v in results.values())
    print(f"server CPU per exchange: ssl.SSLSocket (TLSStream) {mine:.1f} us, ", end="")
    print(f"trio.SSLStream {trios:.1f} us, ratio {mine / trios:.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        trio.run(_serve, sys.argv[2])
    else:
        main()
