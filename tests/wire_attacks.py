"""Raw-socket clients that attack our HTTP listeners, shared by the tests of each listener.

Each reads what the server answers until the server closes the connection, so a test using
them fails (by its ``fail_after``) when a server waits for a body it should have refused.
"""

from __future__ import annotations

import contextlib

import psutil
import trio

DECLARED = 60_000_000
"""The body length the attack declares (the issue's 60 MB)."""
SENT = 64 * 1024
"""The bytes of body it actually sends before stalling."""


def rss() -> int:
    """This process's resident set size, in bytes (the servers under test run in it)."""
    return int(psutil.Process().memory_info().rss)


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes (a reset after its answer counts as a close)."""
    data = bytearray()
    while True:
        try:
            chunk = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk


async def stalled_body(port: int, head: bytes) -> bytes:
    """Send ``head`` (which declares :data:`DECLARED` bytes), :data:`SENT` bytes of body, then
    nothing more; return what the server answers before it closes the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head)
        # The server may have answered and closed already.
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(b"x" * SENT)
        return await read_to_eof(stream)


def post_head(path: str, host: str = "127.0.0.1", extra: bytes = b"") -> bytes:
    """A POST head declaring :data:`DECLARED` bytes of JSON body and carrying no token."""
    return (
        b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n" % (path.encode(), host.encode(), DECLARED, extra)
    )


async def eight_stalled(port: int, head: bytes) -> list[bytes]:
    """The issue's attack: eight connections at once, each :func:`stalled_body`."""
    answers: list[bytes] = []

    async def one() -> None:
        answers.append(await stalled_body(port, head))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(one)
    return answers
