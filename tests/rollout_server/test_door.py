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
