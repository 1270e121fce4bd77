"""Byte relays on the bridge's path across nodes.

The supervisor serves one on the head's cluster address in front of the bridge's loopback
listener; each node agent serves one on its own loopback in front of the supervisor's, so a
rollout on any node keeps a loopback ``chat_completions_url``. The relays read nothing: the
bridge checks the route and the per-run bearer of every request itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

__all__ = ["pump", "relay_to"]


async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    """Copy ``source`` to ``sink`` until end of stream, then half-close ``sink``."""
    try:
        async for chunk in source:
            await sink.send_all(chunk)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def relay_to(host: str, port: int) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A ``trio.serve_tcp`` handler that relays each connection to ``host:port``."""

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                upstream = await trio.open_tcp_stream(host, port)
            except OSError:
                return
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(pump, stream, upstream)
                nursery.start_soon(pump, upstream, stream)

    return handler
