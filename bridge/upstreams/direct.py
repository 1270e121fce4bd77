"""The direct path: calls to an OpenAI-chat-speaking provider.

Non-streaming calls go through the lean pool (:mod:`rollout_server.net.wire`); streamed ones
through httpx (:mod:`bridge.upstreams.streamed`), which is imported at the first streamed call.
With HTTP/2 on (``[bridge] upstream_http2``), non-streamed calls go through
:mod:`bridge.upstreams.h2wire` and streamed ones through :mod:`bridge.upstreams.h2pool` instead:
many calls share each connection, one socket per call fewer in the bridge. A provider that
speaks only HTTP/1.1 (ALPN's choice over https; over http, an answer to the HTTP/2 preface
that is not HTTP/2, found by :mod:`bridge.upstreams.h2wire`) gets both kinds over HTTP/1.1.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Final

import trio

from bridge.codec import dumps, parse_provider_json
from bridge.errors import UpstreamError, with_request_id
from bridge.policy import PreparedRequest
from bridge.retry import ProviderFault, status_fault
from bridge.upstreams.routing import DirectRoute, resolve_direct
from rollout_server.net.wire import (
    CheckedHeaders,
    ConnectTimeout,
    Origin,
    ReadTimeout,
    WireError,
    WirePool,
    WireResponse,
)

if TYPE_CHECKING:
    import httpx

    from bridge.upstreams.h2pool import H2Clients
    from bridge.upstreams.h2wire import H2Response, H2Wire

# The bridge sets no deadline of its own on a model call; these match the OpenAI SDK's
# defaults that LiteLLM would apply (10 minutes), so a wedged provider still ends eventually.
_CONNECT_TIMEOUT = 30.0
_READ_TIMEOUT = 600.0
# How long a provider answer whose headers have arrived may take to finish arriving once the
# rollout has gone away (see DirectUpstream.complete).
_DELIVERY_GRACE = 30.0
_KEEPALIVE_EXPIRY = 60.0
# What httpx would add to a request: the lean client decodes these codings as httpx does.
_WIRE_HEADERS: Final = ((b"accept-encoding", b"gzip, deflate"), (b"user-agent", b"rollbridge"))


def _new_pool() -> WirePool:
    return WirePool(
        connect_timeout=_CONNECT_TIMEOUT,
        timeout=_READ_TIMEOUT,
        keepalive_expiry=_KEEPALIVE_EXPIRY,
        max_idle=256,
    )


def _http(wire: WirePool) -> httpx.AsyncClient:
    import httpx

    from bridge.upstreams.streamed import new_client as streamed_client

    return streamed_client(wire, httpx.Timeout(_READ_TIMEOUT, connect=_CONNECT_TIMEOUT))


def new_client() -> httpx.AsyncClient:
    """A pooled httpx client for the direct path (and its lean pool, closed with it). It never
    retries by itself (httpx does not by default): which faults are retried is
    :mod:`bridge.retry`'s decision."""
    return _http(_new_pool())


class LazyClient:
    """The bridge's clients of the direct path: the lean pool at once, httpx's at the first
    streamed call (a bridge whose calls are not streamed never imports httpx). With ``http2``
    the direct path's calls go over HTTP/2 instead (:attr:`h2wire`, :attr:`h2`).

    :meth:`aclose` closes them all.
    """

    def __init__(self, *, http2: bool = False) -> None:
        self.wire = _new_pool()
        self._http: httpx.AsyncClient | None = None
        self.h2: H2Clients | None = None
        self.h2wire: H2Wire | None = None
        if http2:
            import httpx

            from bridge.upstreams.h2pool import H2Clients
            from bridge.upstreams.h2wire import H2Wire

            self.h2 = H2Clients(httpx.Timeout(_READ_TIMEOUT, connect=_CONNECT_TIMEOUT))
            self.h2wire = H2Wire(
                connect_timeout=_CONNECT_TIMEOUT,
                timeout=_READ_TIMEOUT,
                keepalive_expiry=_KEEPALIVE_EXPIRY,
            )

    def http(self) -> httpx.AsyncClient:
        """The httpx client, made at the first call."""
        if self._http is None:
            self._http = _http(self.wire)
        return self._http

    async def aclose(self) -> None:
        """Close the pool, the httpx client if it was made, and the HTTP/2 clients."""
        try:
            if self._http is not None:
                await self._http.aclose()  # its transport closes the pool
            else:
                await self.wire.aclose()
        finally:
            if self.h2 is not None:
                await self.h2.aclose()
            if self.h2wire is not None:
                await self.h2wire.aclose()


def _payload(route: DirectRoute, prepared: PreparedRequest, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": route.upstream_model, "messages": prepared.messages}
    body.update(prepared.params)
    body.update(route.extra_params)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return dumps(body)


def _wire_error(exc: WireError) -> UpstreamError:
    """The error for a failed exchange of the lean client (the statuses and kinds of httpx's
    failures in :mod:`bridge.upstreams.streamed`)."""
    detail = str(exc)
    if isinstance(exc, ConnectTimeout):
        return ProviderFault(408, f"provider request timed out: {detail}", kind="Timeout")
    if isinstance(exc, ReadTimeout):
        return UpstreamError(408, f"provider request timed out: {detail}", kind="Timeout")
    if exc.before_answer:
        message = f"could not reach the provider: {detail}"
        return ProviderFault(502, message, kind="APIConnectionError")
    return UpstreamError(
        502, f"the provider's answer broke off: {detail}", kind="APIConnectionError"
    )


def _h2c_hint(error: UpstreamError, origin: Origin, h2wire: H2Wire | None) -> UpstreamError:
    """``error``, saying what h2c needs when HTTP/2 to an ``http://`` origin that never
    answered over it timed out (status, kind and retry decision unchanged): a server that
    answers the preface, or closes, is called over HTTP/1.1 instead (:mod:`.h2wire`), one that
    holds the connection silently cannot be told from a slow one."""
    if h2wire is None or origin.scheme != "http" or h2wire.answered(origin):
        return error
    if error.kind != "Timeout":
        return error
    message = (
        f"{error.message} (HTTP/2 without TLS, h2c, to {origin.key}, which never answered "
        'over HTTP/2: if it speaks only HTTP/1.1, set upstream_http2 = "off" in [bridge])'
    )
    if isinstance(error, ProviderFault):
        return ProviderFault(error.status, message, kind=error.kind, retry_after=error.retry_after)
    return UpstreamError(error.status, message, kind=error.kind)


def _wire_answer(response: WireResponse | H2Response, raw: bytes) -> dict[str, Any]:
    """The JSON object of a lean-client answer whose body is ``raw``; raises for any other
    (naming the provider's request id)."""
    text = raw.decode("utf-8", "replace")
    if not 200 <= response.status < 300:
        status = response.status
        message = text.strip() or f"provider answered HTTP {status}"
        raise status_fault(status, message, response.headers)
    try:
        data = parse_provider_json(text)
    except UpstreamError as exc:
        raise with_request_id(exc, response.headers) from exc.__cause__
    if not isinstance(data, dict):
        error = UpstreamError(502, "provider returned a JSON value that is not an object")
        raise with_request_id(error, response.headers)
    return data


class DirectUpstream:
    """Calls ``<base>/chat/completions`` of the configured provider with shared clients.

    ``client`` is the bridge's :class:`LazyClient`, or any httpx client (the lean pool is then
    its own when it is not :func:`new_client`'s).
    """

    def __init__(self, model: str, client: LazyClient | httpx.AsyncClient) -> None:
        self.model = model
        self._http: Callable[[], httpx.AsyncClient]
        self._h2: H2Clients | None = None
        self._h2wire: H2Wire | None = None
        if isinstance(client, LazyClient):
            self._wire, self._http, self._h2 = client.wire, client.http, client.h2
            self._h2wire = client.h2wire
        else:
            from bridge.upstreams.streamed import BridgeClient

            # Any other client (none in rollbridge) gets a pool of its own, closed with the
            # process.
            self._wire = client.wire if isinstance(client, BridgeClient) else _new_pool()
            self._http = lambda: client
        self._origin: tuple[str, Origin] | None = None
        self._headers: tuple[dict[str, str], CheckedHeaders] | None = None
        self._h2_fields: tuple[dict[str, str], list[tuple[bytes, bytes]]] | None = None

    def _wire_origin(self, url: str) -> Origin:
        if self._origin is None or self._origin[0] != url:
            self._origin = (url, Origin.parse(url))
        return self._origin[1]

    def _h2_headers(self, headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
        # HTTP/2 field names are lower case; no accept-encoding: answers come unencoded.
        if self._h2_fields is None or self._h2_fields[0] != headers:
            encoded = [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
            ]
            self._h2_fields = (headers, [*encoded, (b"user-agent", b"rollbridge")])
        return self._h2_fields[1]

    def _wire_headers(self, headers: dict[str, str]) -> CheckedHeaders:
        # The route is resolved per call (the environment may change); its headers are
        # encoded and checked again only when they changed.
        if self._headers is None or self._headers[0] != headers:
            encoded = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
            self._headers = (headers, CheckedHeaders([*encoded, *_WIRE_HEADERS]))
        return self._headers[1]

    def secrets(self) -> list[str]:
        """The credential this path would send, for redaction."""
        try:
            key = resolve_direct(self.model).api_key
        except UpstreamError:
            return []
        return [key] if key else []

    async def complete(
        self, prepared: PreparedRequest, record: Callable[[Any], None]
    ) -> dict[str, Any]:
        """One non-streaming call; ``record`` gets the usage the moment the answer is parsed."""
        route = resolve_direct(self.model)
        origin = self._wire_origin(route.url)
        content = _payload(route, prepared, False)
        response: WireResponse | H2Response | None = None
        try:
            # Cancellable while the provider works: a rollout that goes away stops the call.
            if self._h2wire is not None:
                fields = self._h2_headers(route.headers)
                response = await self._h2wire.request(origin, fields, content)
            if response is None:  # HTTP/1.1: not asked for, or all the provider speaks
                headers = self._wire_headers(route.headers)
                response = await self._wire.request(origin, headers, content)
        except WireError as exc:
            raise _h2c_hint(_wire_error(exc), origin, self._h2wire) from exc
        try:
            try:
                raw = await response.read()
            except trio.Cancelled:
                # The answer is arriving, so it is paid for: finish reading it within a grace
                # period, count its usage, then let the cancellation go on.
                with trio.CancelScope(shield=True) as delivery:
                    delivery.deadline = trio.current_time() + _DELIVERY_GRACE
                    with contextlib.suppress(WireError, UpstreamError):
                        record(_wire_answer(response, await response.read()).get("usage"))
                raise
        except WireError as exc:
            raise with_request_id(_wire_error(exc), response.headers) from exc
        finally:
            await response.aclose()
        data = _wire_answer(response, raw)
        record(data.get("usage"))
        return data

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Stream raw chunks as the provider sends them (a whole completion if it did not stream)."""
        route = resolve_direct(self.model)
        from bridge.upstreams.streamed import stream_chunks

        content = _payload(route, prepared, True)
        if self._h2 is not None and await self._streams_over_h2(route.url):
            chunks = self._h2.stream(route.url, route.headers, content)
        else:
            chunks = stream_chunks(self._http(), route.url, route.headers, content)
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk

    async def _streams_over_h2(self, url: str) -> bool:
        """Whether a streamed call to ``url`` goes over HTTP/2: over http (h2c, no negotiation)
        only once the provider is known to speak it, which the lean HTTP/2 client finds out
        (httpx's h2c would fail the call on an HTTP/1.1-only provider instead)."""
        origin = self._wire_origin(url)
        if self._h2wire is None or origin.scheme != "http":
            return True
        try:
            return await self._h2wire.speaks_http2(origin)
        except WireError as exc:
            raise _h2c_hint(_wire_error(exc), origin, self._h2wire) from exc


async def h2c_refused(model: str, *, connect_timeout: float = 10.0) -> str | None:
    """The ``http://`` origin of ``model``'s direct path when it does not speak HTTP/2 without
    TLS (h2c), asked once on a connection of its own (:meth:`H2Wire.speaks_http2`); None when
    it does, when the model is not on the direct path or its provider is ``https://`` (ALPN
    decides there), or when it cannot be reached within ``connect_timeout`` (the preflight
    says why).

    The run asks before it budgets descriptors: the bridge would fall back to HTTP/1.1 for
    such a provider, at two open files per call instead of one per rollout."""
    from bridge.upstreams.h2wire import H2Wire
    from bridge.upstreams.routing import path_kind

    if path_kind(model) != "direct":
        return None
    try:
        origin = Origin.parse(resolve_direct(model).url)
    except (UpstreamError, ValueError):
        return None
    if origin.scheme != "http":
        return None
    wire = H2Wire(connect_timeout=connect_timeout, timeout=connect_timeout, keepalive_expiry=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(wire.serve)
        try:
            speaks = await wire.speaks_http2(origin)
        except WireError:
            speaks = True  # not known; the bridge finds out at its first call
        nursery.cancel_scope.cancel()
    return None if speaks else origin.key
