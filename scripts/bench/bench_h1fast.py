"""Microbenchmark: the lean HTTP/1.1 loop's per-request cost, fast path against h11.

Two figures, both CPU time per request (``time.process_time``), both measured in this run:

* protocol only: reading one keep-alive request (head and body) and writing its answer, with
  h11 (``receive_data``, ``next_event`` up to the end of the request, ``send`` of the head, the
  body and the end, ``start_next_cycle``) against :mod:`rollout_server.net.fastparse`;
* the whole loop: :class:`rollout_server.net.h1._Connection` serving a stream of keep-alive
  requests (one per read) to a trivial ASGI app, with the fast path and with it declining
  every request (h11 serves them, as before the fast path).

The request is shaped like an httpx admission POST to the rollout server. Run:
``.venv/bin/python scripts/bench/bench_h1fast.py [--requests N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import h11  # noqa: E402
import trio  # noqa: E402
from hypercorn.config import Config  # noqa: E402

from rollout_server.net import h1  # noqa: E402
from rollout_server.net.fastparse import DECLINED, Body, parse_request, response_head  # noqa: E402

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


def _fast(count: int) -> float:
    buffer = bytearray()
    start = time.process_time()
    for _ in range(count):
        buffer += REQUEST
        request = parse_request(buffer, 16384)
        assert not isinstance(request, int)
        body = bytes(buffer[: request.length])
        del buffer[: len(body)]
        head = response_head(200, HEADERS, request.keep_alive)
        assert head is not None
        framer = Body(head[1])
        assert head[0] + framer.data(ANSWER) + framer.end()
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


async def _app(scope: Any, receive: Any, send: Any, *_: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS[:2]})
    await send({"type": "http.response.body", "body": ANSWER})


def _loop(count: int) -> float:
    config = Config()
    config.keep_alive_max_requests = count + 1

    async def nothing() -> None:
        pass

    async def main() -> float:
        connection = h1._Connection(config, _Stream(count), nothing, nothing)  # type: ignore[arg-type]
        start = time.process_time()
        await connection.serve(_app, None, None, {})
        return (time.process_time() - start) / count

    return trio.run(main)


def _best(measure: Any, count: int, rounds: int) -> float:
    return min(measure(count) for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    count, rounds = args.requests, args.rounds
    slow, fast = _best(_h11, count, rounds), _best(_fast, count, rounds)
    loop_fast = _best(_loop, count, rounds)
    with mock.patch.object(h1, "parse_request", lambda buffer, limit: DECLINED):
        loop_slow = _best(_loop, count, rounds)
    print(f"CPU µs per request (best of {rounds} x {count} requests, {len(REQUEST)} B request)")
    print(
        f"  protocol only: h11 {slow * 1e6:7.1f}   fast path {fast * 1e6:7.1f}   "
        f"saved {(slow - fast) * 1e6:6.1f}   ratio {slow / fast:5.1f}x"
    )
    print(
        f"  whole loop:    h11 {loop_slow * 1e6:7.1f}   fast path {loop_fast * 1e6:7.1f}   "
        f"saved {(loop_slow - loop_fast) * 1e6:6.1f}   ratio {loop_slow / loop_fast:5.1f}x"
    )


if __name__ == "__main__":
    main()
