"""httpx plumbing shared by the rollout client, the rollout server and the model bridge.

:class:`ShardedTransport` and :func:`skip_empty_cookies` fix per-request costs measured on
this stack: httpcore's single pool scans all of its connections on every request (O(n^2) at
hundreds of concurrent calls), and httpx runs every response through :mod:`http.cookiejar`
even when it sets no cookie. :func:`send_whole` makes one call the way the lean client does:
a :class:`~.reply.Reply`, or a :mod:`~.wireerrors` failure.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Callable

import httpx

from .reply import Reply
from .wireerrors import (
    BadAnswer,
    ConnectFailed,
    ConnectTimeout,
    LocalFailure,
    ReadFailed,
    ReadTimeout,
    WireError,
    WriteFailed,
)

__all__ = ["ShardedTransport", "send_whole", "shared_tls", "skip_empty_cookies"]

_UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)


class _SkipEmptyCookies(httpx.Cookies):
    """httpx's cookie jar, without parsing answers that set no cookie.

    httpx runs every response through :mod:`http.cookiejar`, about a tenth of a client's CPU
    per small call; the jar only ever reads ``Set-Cookie``/``Set-Cookie2``, so skipping
    answers without those headers changes nothing.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


def skip_empty_cookies(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Give ``client`` a cookie jar that skips answers setting no cookie; returns ``client``.

    (The public ``cookies`` setter would convert the jar back to a plain one.)
    """
    client._cookies = _SkipEmptyCookies(client.cookies)
    return client


class _ReleasingStream(httpx.AsyncByteStream):
    """A response body that marks its pool shard one call less busy when it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._release is not None:
                self._release()
                self._release = None


class ShardedTransport(httpx.AsyncBaseTransport):
    """Several small httpcore pools; each call goes to the least busy one.

    Least busy, not round-robin, so a lone caller keeps reusing one connection (one TLS
    handshake with a real provider) while concurrent callers spread out.
    """

    def __init__(self, shards: int, limits: httpx.Limits = _UNLIMITED) -> None:
        # One TLS context for all shards: building one loads the CA bundle.
        tls = shared_tls()
        self._pools = [httpx.AsyncHTTPTransport(limits=limits, verify=tls) for _ in range(shards)]
        self._busy = [0] * shards

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        busy = self._busy
        index = busy.index(min(busy))
        busy[index] += 1

        def release() -> None:
            busy[index] -= 1

        try:
            response = await self._pools[index].handle_async_request(request)
        except BaseException:
            release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _ReleasingStream(response.stream, release)
        return response

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


@functools.cache
def shared_tls() -> ssl.SSLContext:
    """One verifying TLS context per process: building one loads the CA bundle (~0.1 s CPU)."""
    return httpx.create_ssl_context()


async def send_whole(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes | None,
    limits: httpx.Timeout,
) -> Reply:
    """One request through ``client``, its answer read whole; httpx's failures are raised as
    the :mod:`~.wireerrors` type of the same failure (:func:`wire_error`)."""
    try:
        response = await client.request(method, url, headers=headers, content=body, timeout=limits)
    except httpx.RequestError as exc:
        raise wire_error(exc) from exc
    return Reply(
        response.status_code, [(k.lower(), v) for k, v in response.headers.raw], response.content
    )


def wire_error(exc: httpx.RequestError) -> WireError:
    """The :mod:`~.wireerrors` failure for one of httpx's; only a failure to connect is
    :class:`~.wireerrors.NotSent`."""
    shown = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return ConnectTimeout(shown, before_answer=True)
    if isinstance(exc, httpx.ConnectError):
        return ConnectFailed(shown, before_answer=True)
    if isinstance(exc, httpx.TimeoutException):  # read, write, or a free connection
        return ReadTimeout(shown, before_answer=False)
    if isinstance(exc, httpx.WriteError):
        return WriteFailed(shown, before_answer=True)
    if isinstance(exc, httpx.NetworkError):  # reading or closing
        return ReadFailed(shown, before_answer=False)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.DecodingError):
        return BadAnswer(shown, before_answer=False)
    # A local protocol error, an unsupported scheme, a proxy failure, too many redirects.
    return LocalFailure(shown, before_answer=True)
