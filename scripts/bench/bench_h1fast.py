"""Microbenchmark: the lean HTTP/1.1 server's per-request CPU, httptools against h11.

Figures, all CPU time per request (``time.process_time``), all measured in this run:

* protocol only: reading one keep-alive request (head and body) and writing its answer, with
  h11 (``receive_data``, ``next_event`` up to the end of the request, ``send`` of the head, the
  body and the end, ``start_next_cycle``) against ``httptools.HttpRequestParser`` feeding the
  same callbacks the server uses and :mod:`rollout_server.net.wirebytes` writing the answer;
* the whole loop: :class:`rollout_server.net.h1._Connection` serving a stream of keep-alive
  requests (one per read) to a trivial ASGI app;
* with ``--against DIR`` (a source tree of an earlier commit, e.g. ``git archive fea00b6``
  unpacked), that tree's own ``scripts/bench/bench_h1fast.py`` is run in a subprocess between
  rounds of ours, and its whole-loop figure is printed beside ours with the ratio (same
  interpreter, same machine, same minutes).

The request is shaped like an httpx admission POST to the rollout server. Run:
``.venv/bin/python scripts/bench/bench_h1fast.py [--requests N] [--against DIR]``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import h11  # noqa: E402
import trio  # noqa: E402
from hypercorn.config import Config  # noqa: E402

from rollout_server.net import h1  # noqa: E402
from rollout_server.net.wirebytes import Body, response_head  # noqa: E402

BODY = (
    b'{"rollout_id": "r-000123", "server_url": "http://127.0.0.1:9000", ' + b'"x": 1, ' * 30 + b"}"
)
REQUEST = (
    b"POST /v1/rollout/init HTTP/1.1\r\nHost: 127.0.0.1:8123\r\nAccept: */*\r\n"
    b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
    b"User-Agent: python-httpx/0.28.1\r\nAuthorization: Bearer 0123456789abcdef\r\n"
    b"Content-Length: %d\r\nContent-Type: application/json\r\n\r\n" % len(BODY)
) + BODY
ANSWER = b'{"status": "accepted"}'
HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", b"%d" % len(ANSWER)),
    (b"date", b"Thu, 01 Jan 1970 00:00:00 GMT"),
]


def _h11(count: int) -> float:
    conn = h11.Connection(h11.SERVER)
    start = time.process_time()
    for _ in range(count):
        conn.receive_data(REQUEST)
        event = conn.next_event()
        assert type(event) is h11.Request
        list(event.headers)
        while type(event := conn.next_event()) is not h11.EndOfMessage:
            pass
        out = conn.send(h11.Response(status_code=200, headers=HEADERS))
        out += conn.send(h11.Data(data=ANSWER))
        out += conn.send(h11.EndOfMessage())
        assert out
        conn.start_next_cycle()
    return (time.process_time() - start) / count


class _Stream:
    def __init__(self, count: int) -> None:
        self.left = count

    async def receive_some(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.left:
            self.left -= 1
            return REQUEST
        return b""

    async def send_all(self, data: Any) -> None:
        await trio.lowlevel.checkpoint()


def _config(count: int) -> Config:
    config = Config()
    config.keep_alive_max_requests = count + 1
    return config


async def _nothing() -> None:
    pass


def _httptools(count: int) -> float:
    """The server's parser and callbacks (no socket, no app), then the answer's bytes."""
    connection = h1._Connection(_config(count), _Stream(0), _nothing, _nothing)  # type: ignore[arg-type]
    events = connection.events
    start = time.process_time()
    for _ in range(count):
        connection._feed(REQUEST)
        request = events.popleft()
        assert type(request) is h1.Request
        while events.popleft() is not h1._END:
            pass
        data, length, _ = response_head(200, HEADERS, request.keep_alive)
        body = Body(length)
        assert data + body.data(ANSWER) + body.end()
    return (time.process_time() - start) / count


async def _app(scope: Any, receive: Any, send: Any, *_: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS[:2]})
    await send({"type": "http.response.body", "body": ANSWER})


def _loop(count: int) -> float:
    async def main() -> float:
        stream = _Stream(count)
        connection = h1._Connection(_config(count), stream, _nothing, _nothing)  # type: ignore[arg-type]
        start = time.process_time()
        await connection.serve(_app, None, None, {})
        return (time.process_time() - start) / count

    return trio.run(main)


def _best(measure: Any, count: int, rounds: int) -> float:
    return min(measure(count) for _ in range(rounds))


_BASE_LOOP = re.compile(r"whole loop:.*fast path\s+([0-9.]+)")


def _baseline(tree: Path, count: int) -> float:
    """The earlier tree's whole-loop figure (its fast path), in seconds per request."""
    script = tree / "scripts" / "bench" / "bench_h1fast.py"
    out = subprocess.run(
        [sys.executable, str(script), "--requests", str(count), "--rounds", "1"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
    ).stdout
    found = _BASE_LOOP.search(out)
    if found is None:
        raise SystemExit(f"no whole-loop figure in {script}'s output:\n{out}")
    return float(found.group(1)) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, help="an earlier source tree to compare with")
    args = parser.parse_args()
    count, rounds = args.requests, args.rounds
    slow, parse = _best(_h11, count, rounds), _best(_httptools, count, rounds)
    loops: list[float] = []
    bases: list[float] = []
    for _ in range(rounds):
        loops.append(_loop(count))
        if args.against is not None:
            bases.append(_baseline(args.against, count))
    loop = min(loops)
    print(f"CPU µs per request (best of {rounds} x {count} requests, {len(REQUEST)} B request)")
    print(
        f"  protocol only: h11 {slow * 1e6:7.1f}   httptools {parse * 1e6:7.1f}   "
        f"saved {(slow - parse) * 1e6:6.1f}   ratio {slow / parse:5.1f}x"
    )
    print(f"  whole loop:    httptools {loop * 1e6:7.1f}")
    if bases:
        base = min(bases)
        print(
            f"  whole loop, {args.against} (its fast path): {base * 1e6:7.1f}   "
            f"this tree / that tree {loop / base:5.2f}x"
        )


if __name__ == "__main__":
    main()
