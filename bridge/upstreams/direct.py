"""The direct upstream path: one pooled httpx client to an OpenAI-chat-speaking provider."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncGenerator, Callable
from typing import Any

import httpx
import trio

from bridge.codec import dumps, loads
from bridge.errors import UpstreamError
from bridge.policy import PreparedRequest
from bridge.retry import ProviderFault, status_fault
from bridge.upstreams.routing import DirectRoute, resolve_direct
from rollout_server.net.httpclient import ShardedTransport, skip_empty_cookies
from rollout_server.net.wire import (
    ConnectTimeout,
    Origin,
    ReadTimeout,
    WireError,
    WirePool,
    WireResponse,
)

# The bridge sets no deadline of its own on a model call; these match the OpenAI SDK's
# defaults that LiteLLM would apply (10 minutes), so a wedged provider still ends eventually.
_TIMEOUT = httpx.Timeout(600.0, connect=30.0)
# How long a provider answer whose headers have arrived may take to finish arriving once the
# rollout has gone away (see DirectUpstream.complete).
_DELIVERY_GRACE = 30.0
# httpcore's pool bookkeeping costs O(connections²) per request: at 64 concurrent calls it was
# a fifth of the bridge's CPU. Split over small pools it is noise (256 idle connections kept
# in all, as before).
_SHARDS = 16
# What httpx would add to a request: the lean client decodes these codings as httpx does.
_WIRE_HEADERS = [(b"accept-encoding", b"gzip, deflate"), (b"user-agent", b"rollbridge")]
_LIMITS = httpx.Limits(
    max_connections=None, max_keepalive_connections=256 // _SHARDS, keepalive_expiry=60
)


def _new_pool() -> WirePool:
    return WirePool(
        connect_timeout=_TIMEOUT.connect or math.inf,
        timeout=_TIMEOUT.read or math.inf,
        keepalive_expiry=_LIMITS.keepalive_expiry or 60.0,
        max_idle=256,
    )


class _Transport(httpx.AsyncBaseTransport):
    """httpx's pooled transport, closing the lean pool (:mod:`rollout_server.net.wire`) with it."""

    def __init__(self, wire: WirePool) -> None:
        # Made at the first request that needs httpx (a streamed call): its 16 pools and the
        # TLS context cost ~60 ms, which the model preflight (one non-streaming call, on the
        # lean pool) and a run that never streams should not pay.
        self._inner: ShardedTransport | None = None
        self._wire = wire

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._inner is None:
            self._inner = ShardedTransport(_SHARDS, _LIMITS)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        try:
            await self._wire.aclose()
        finally:
            if self._inner is not None:
                await self._inner.aclose()


class BridgeClient(httpx.AsyncClient):
    """The bridge's httpx client, carrying the lean pool that non-streaming calls use.

    Closing the client (``aclose`` or ``async with``) closes both.
    """

    def __init__(self) -> None:
        self.wire = _new_pool()
        super().__init__(timeout=_TIMEOUT, transport=_Transport(self.wire), follow_redirects=False)


def new_client() -> httpx.AsyncClient:
    """The bridge's one pooled client. It never retries by itself (httpx does not by default):
    which faults are retried is :mod:`bridge.retry`'s decision."""
    return skip_empty_cookies(BridgeClient())


def _payload(route: DirectRoute, prepared: PreparedRequest, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": route.upstream_model, "messages": prepared.messages}
    body.update(prepared.params)
    body.update(route.extra_params)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return dumps(body)


def _transport_error(exc: httpx.TransportError, *, answering: bool = False) -> UpstreamError:
    """The error for a failed exchange; ``answering`` when the provider's answer had begun.

    A connection that failed or was reset before any answer is a :class:`ProviderFault` (the
    call may be made again); once an answer is arriving it is billed, so it is not.
    """
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return ProviderFault(408, f"provider request timed out: {detail}", kind="Timeout")
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError(408, f"provider request timed out: {detail}", kind="Timeout")
    message = f"could not reach the provider: {detail}"
    if not answering and isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return ProviderFault(502, message, kind="APIConnectionError")
    return UpstreamError(502, message, kind="APIConnectionError")


def _wire_error(exc: WireError) -> UpstreamError:
    """:func:`_transport_error` for the lean client's failures (same statuses and kinds)."""
    detail = str(exc)
    if isinstance(exc, ConnectTimeout):
        return ProviderFault(408, f"provider request timed out: {detail}", kind="Timeout")
    if isinstance(exc, ReadTimeout):
        return UpstreamError(408, f"provider request timed out: {detail}", kind="Timeout")
    message = f"could not reach the provider: {detail}"
    if exc.before_answer:
        return ProviderFault(502, message, kind="APIConnectionError")
    return UpstreamError(502, message, kind="APIConnectionError")


def _status_error(response: httpx.Response) -> UpstreamError:
    return _status_fault(response.status_code, response.text, response.headers.get("retry-after"))


def _status_fault(status: int, text: str, retry_after: str | None) -> UpstreamError:
    return status_fault(status, text.strip() or f"provider answered HTTP {status}", retry_after)


def _wire_answer(response: WireResponse, raw: bytes) -> dict[str, Any]:
    """:func:`_answer` for a lean-client answer whose body is ``raw``."""
    text = raw.decode("utf-8", "replace")
    if not 200 <= response.status < 300:
        raise _status_fault(response.status, text, response.headers.get("retry-after"))
    data = _parse(text)
    if not isinstance(data, dict):
        raise UpstreamError(502, "provider returned a JSON value that is not an object")
    return data


def _parse(text: str) -> Any:
    try:
        return loads(text)
    except ValueError as exc:
        raise UpstreamError(502, f"provider returned invalid JSON: {text[:200]}") from exc


class DirectUpstream:
    """Calls ``<base>/chat/completions`` of the configured provider with one shared client."""

    def __init__(self, model: str, client: httpx.AsyncClient) -> None:
        self.model = model
        self._client = client
        # Any other client (none in rollbridge) gets a pool of its own, closed with the process.
        self._wire = client.wire if isinstance(client, BridgeClient) else _new_pool()
        self._parsed: tuple[str, httpx.URL] | None = None
        self._origin: tuple[str, Origin] | None = None

    def _wire_origin(self, url: str) -> Origin:
        if self._origin is None or self._origin[0] != url:
            self._origin = (url, Origin.parse(url))
        return self._origin[1]

    def _url(self, url: str) -> httpx.URL:
        # Parsing the URL was a tenth of the client's CPU per call. The route is still
        # resolved per call (the environment may change); only the parse is reused.
        if self._parsed is None or self._parsed[0] != url:
            self._parsed = (url, httpx.URL(url))
        return self._parsed[1]

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
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in route.headers.items()]
        headers += _WIRE_HEADERS
        try:
            # Cancellable while the provider works: a rollout that goes away stops the call.
            response = await self._wire.request(origin, headers, _payload(route, prepared, False))
        except WireError as exc:
            raise _wire_error(exc) from exc
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
            raise _wire_error(exc) from exc
        finally:
            await response.aclose()
        data = _wire_answer(response, raw)
        record(data.get("usage"))
        return data

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Stream raw chunks as the provider sends them (a whole completion if it did not stream)."""
        route = resolve_direct(self.model)
        request = self._client.build_request(
            "POST",
            self._url(route.url),
            content=_payload(route, prepared, True),
            headers={**route.headers, "Accept": "text/event-stream"},
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise _transport_error(exc) from exc
        try:
            if not 200 <= response.status_code < 300:
                await response.aread()
                raise _status_error(response)
            if "event-stream" not in response.headers.get("content-type", ""):
                await response.aread()
                data = _parse(response.text)
                if not isinstance(data, dict):
                    raise UpstreamError(502, "provider returned a JSON value that is not an object")
                yield data
                return
            async for event, data in _sse_events(response):
                if data == "[DONE]":
                    return
                parsed = _parse(data)
                if event == "error" or (isinstance(parsed, dict) and "error" in parsed):
                    raise _stream_error(parsed)
                if isinstance(parsed, dict):
                    yield parsed
        except httpx.TransportError as exc:
            raise _transport_error(exc, answering=True) from exc
        finally:
            await response.aclose()


def _stream_error(parsed: Any) -> UpstreamError:
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        status = code if isinstance(code, int) and not isinstance(code, bool) else 502
        return UpstreamError(status, json.dumps(parsed, ensure_ascii=False))
    return UpstreamError(502, json.dumps(parsed, ensure_ascii=False))


async def _sse_events(response: httpx.Response) -> AsyncGenerator[tuple[str, str], None]:
    """(event name, data) pairs of a server-sent-events body."""
    event = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
    if data:
        yield event, "\n".join(data)
