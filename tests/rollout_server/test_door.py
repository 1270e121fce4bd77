"""The rollout server's admission refuses from the head (token, route, method), without reading
the body, so an exposed server holds nothing for a caller without its key."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.rollout_server.helpers import start
from tests.wire_attacks import eight_stalled, post_head, rss, stalled_body

MIB = 1024 * 1024


async def test_tokenless_admissions_are_refused_unread(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        running, _ = await start(nursery, tmp_path, api_key="sekrit")
        await stalled_body(running.port, post_head("/rollout"))
        before = rss()
        answers = await eight_stalled(running.port, post_head("/rollout"))
        after = rss()
        auth = b"authorization: Bearer sekrit\r\n"
        unknown = await stalled_body(running.port, post_head("/elsewhere", extra=auth))
        wrong = await stalled_body(running.port, post_head("/health", extra=auth))
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:80]
        assert b"connection: close" in answer.lower()
    assert after - before < 10 * MIB
    assert unknown.startswith(b"HTTP/1.1 404 ")
    assert wrong.startswith(b"HTTP/1.1 405 ")


async def test_malformed_chunked_admissions_get_400_not_500(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    from tests.wire_attacks import read_to_eof

    with trio.fail_after(30):
        running, _ = await start(nursery, tmp_path)
        head = (
            b"POST /rollout HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
            b"content-type: application/json\r\n\r\n"
        )
        for body in (b"f" * 40 + b"\r\n{}\r\n0\r\n\r\n", b"0x2\r\n{}\r\n0\r\n\r\n"):
            stream = await trio.open_tcp_stream("127.0.0.1", running.port)
            async with stream:
                await stream.send_all(head + body)
                answer = await read_to_eof(stream)
            assert answer.startswith(b"HTTP/1.1 400 "), (body, answer[:60])
