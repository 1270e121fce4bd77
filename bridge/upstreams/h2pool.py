"""HTTP/2 to the provider on the direct path: many calls over few connections.

With one HTTP/1.1 connection per outstanding call the bridge holds two sockets per call (the
rollout's call in, the provider call out), so 10,000 calls in flight need the whole 20,000
open-file limit of a process (:mod:`launcher.fdbudget`). Over HTTP/2 the provider calls share
connections, about one per hundred calls.

The protocol is httpx's (httpcore on the ``h2`` package). httpcore's pool alone does not fit
this load, as read in httpcore 1.0.9 and measured against hypercorn and the lean fake:

- it gives every request to the first connection that is open (an HTTP/2 connection counts as
  available whatever its streams), so a pool holds ONE connection per origin, and that
  connection runs at most min(100, the server's ``SETTINGS_MAX_CONCURRENT_STREAMS``) streams
  (100 is httpcore's own advertised limit): the rest wait on it in turn (500 calls held 0.5 s
  took 3.3 s, five waves of 100);
- the requests waiting on that connection fail with ``RemoteProtocolError(ConnectionTerminated)``
  when the server closes it gracefully (GOAWAY) instead of moving to a new connection: the
  "h2c test broke at 2,000 concurrent streams" was hypercorn's ``keep_alive_max_requests``
  (1,000 per connection) closing the one connection with 1,066 requests still queued on it.

So :class:`H2Clients` keeps several httpx clients, each given at most as many calls at once
as its connection has streams (first fit, so calls pack onto as few connections as hold
them), and opens another client when all are full. No request then waits on a connection's
streams, and a GOAWAY only affects the streams already sent, which httpcore moves to a new
connection itself when the server did not process them.

With ``https://`` providers the connection is offered ``h2`` and ``http/1.1`` by ALPN and
falls back to HTTP/1.1 (one connection per call, as without this module) when the provider
does not take ``h2``. With ``http://`` there is no negotiation: HTTP/2 with prior knowledge
(h2c), and httpx fails each call to a provider that does not speak it; the direct path
(:mod:`bridge.upstreams.direct`) therefore sends a streamed call here only once the lean
client (:mod:`bridge.upstreams.h2wire`) found the provider speaks h2c, and over HTTP/1.1
otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Final

import httpx
import trio

from bridge.errors import UpstreamError
from bridge.retry import ProviderFault
from bridge.upstreams.streamed import _url, stream_chunks
from rollout_server.net.httpclient import skip_empty_cookies

__all__ = ["STREAMS_PER_CONNECTION", "H2Clients"]

#: httpcore's own ``SETTINGS_MAX_CONCURRENT_STREAMS``: no connection of its runs more streams.
STREAMS_PER_CONNECTION: Final = 100
_KEEPALIVE_EXPIRY: Final = 60.0


class _Slot:
    __slots__ = ("client", "idle_since", "in_flight", "learned", "streams")

    def __init__(self, client: httpx.AsyncClient, streams: int) -> None:
        self.client = client
        self.in_flight = 0
        self.streams = streams
        self.learned = False
        self.idle_since = 0.0

    def learn(self) -> None:
        """Take the server's stream limit at the first answer (a server's SETTINGS frame comes
        before any answer of its; none on a connection that fell back to HTTP/1.1)."""
        if not self.learned:
            self.learned = True
            server = _server_streams(self.client)
            if server is not None:
                self.streams = max(1, min(self.streams, server))


def _server_streams(client: httpx.AsyncClient) -> int | None:
    """The ``SETTINGS_MAX_CONCURRENT_STREAMS`` of the client's HTTP/2 connection, once known.

    Read from httpcore's private state (no public accessor), defensively: None when the layout
    differs, when the connection is HTTP/1.1, or before the server's settings arrived.
    """
    pool = getattr(client._transport, "_pool", None)
    for connection in getattr(pool, "connections", ()):
        state = getattr(getattr(connection, "_connection", None), "_h2_state", None)
        remote = getattr(state, "remote_settings", None)
        value = getattr(remote, "max_concurrent_streams", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class H2Clients:
    """httpx clients speaking HTTP/2 to the provider, each given at most one connection's
    streams of calls at a time (see the module's docstring for why not one client)."""

    def __init__(self, timeout: httpx.Timeout) -> None:
        self._timeout = timeout
        self._slots: dict[bool, list[_Slot]] = {True: [], False: []}
        self._h2c_answered: set[str] = set()
        self._closed = False

    @property
    def connections(self) -> int:
        """The clients made so far (each holds one HTTP/2 connection per origin it called)."""
        return sum(len(slots) for slots in self._slots.values())

    def _new_client(self, tls: bool) -> httpx.AsyncClient:
        # h2c has no negotiation: with HTTP/1.1 allowed too, httpx would speak HTTP/1.1 to an
        # http:// origin.
        transport = httpx.AsyncHTTPTransport(
            http2=True,
            http1=tls,
            limits=httpx.Limits(
                max_connections=None,
                max_keepalive_connections=STREAMS_PER_CONNECTION,
                keepalive_expiry=_KEEPALIVE_EXPIRY,
            ),
        )
        client = httpx.AsyncClient(
            timeout=self._timeout, transport=transport, follow_redirects=False
        )
        return skip_empty_cookies(client)

    @contextlib.asynccontextmanager
    async def lease(self, tls: bool) -> AsyncIterator[_Slot]:
        """A client with a stream free for one call, held until the block ends."""
        if self._closed:
            raise UpstreamError(502, "the bridge is stopping")
        slots = self._slots[tls]
        slot = next((s for s in slots if s.in_flight < s.streams), None)
        if slot is None:
            # The server's limit learned on the first connection holds for the next ones
            # (one provider per bridge), so a new client is not handed more calls than it has
            # streams for before its own first answer.
            streams = slots[0].streams if slots else STREAMS_PER_CONNECTION
            slot = _Slot(self._new_client(tls), streams)
            slots.append(slot)
        slot.in_flight += 1
        try:
            yield slot
        finally:
            slot.in_flight -= 1
            if slot.in_flight == 0:
                slot.idle_since = trio.current_time()
            await self._drop_idle(slots)

    async def _drop_idle(self, slots: list[_Slot]) -> None:
        # First fit leaves the last clients idle once the calls in flight fall: close the last
        # one when it has been idle longer than a connection is kept alive (its connection
        # would expire unused, a socket held meanwhile).
        last = slots[-1] if len(slots) > 1 else None
        if last is None or last.in_flight:
            return
        if trio.current_time() - last.idle_since > _KEEPALIVE_EXPIRY:
            slots.pop()
            with trio.CancelScope(shield=True):
                await last.client.aclose()

    def _hinted(self, error: UpstreamError, url: httpx.URL) -> UpstreamError:
        """``error``, its message saying what h2c needs when HTTP/2 to ``url``, an ``http://``
        origin that never answered over HTTP/2, timed out (its status, kind and retry decision
        unchanged); as :func:`bridge.upstreams.direct._h2c_hint` says it."""
        origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
        if url.scheme != "http" or origin in self._h2c_answered or error.kind != "Timeout":
            return error
        message = (
            f"{error.message} (HTTP/2 without TLS, h2c, to {origin}, which never answered "
            'over HTTP/2: if it speaks only HTTP/1.1, set upstream_http2 = "off" in [bridge])'
        )
        if isinstance(error, ProviderFault):
            return ProviderFault(
                error.status, message, kind=error.kind, retry_after=error.retry_after
            )
        return UpstreamError(error.status, message, kind=error.kind)

    def _answered(self, url: httpx.URL) -> None:
        if url.scheme == "http":
            self._h2c_answered.add(f"http://{url.netloc.decode('ascii')}")

    async def stream(
        self, url: str, headers: dict[str, str], content: bytes
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Stream raw chunks as the provider sends them (a whole completion if it did not
        stream), the stream's slot held until the last chunk."""
        target = _url(url)
        async with self.lease(target.scheme == "https") as slot:
            chunks = stream_chunks(slot.client, url, headers, content)
            async with aclosing(chunks):
                try:
                    async for chunk in chunks:
                        self._answered(target)
                        slot.learn()
                        yield chunk
                except UpstreamError as exc:
                    if isinstance(exc.__cause__, httpx.TransportError):
                        raise self._hinted(exc, target) from exc.__cause__
                    raise

    async def aclose(self) -> None:
        """Close every client (and its connections)."""
        self._closed = True
        slots = [slot for group in self._slots.values() for slot in group]
        for group in self._slots.values():
            group.clear()
        for slot in slots:
            await slot.client.aclose()
