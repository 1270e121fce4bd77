"""The direct path's httpx half: the pooled client of streamed calls, and the streamed call.

Kept apart from :mod:`bridge.upstreams.direct` so that a bridge whose calls are not streamed
never imports httpx (~0.1 s of CPU and 130 modules at start-up, its CLI's click and rich
included): :class:`~bridge.upstreams.direct.LazyClient` makes this client at the first
streamed call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from functools import lru_cache
from typing import Any

import httpx

from bridge.codec import parse_provider_json
from bridge.errors import UpstreamError, answer_kind, with_request_id
from bridge.retry import ProviderFault, status_fault
from rollout_server.net.httpclient import ShardedTransport, skip_empty_cookies
from rollout_server.net.wire import WirePool

# httpcore's pool bookkeeping costs O(connections²) per request: at 64 concurrent calls it was
# a fifth of the bridge's CPU. Split over small pools it is noise (256 idle connections kept
# in all, as before).
_SHARDS = 16
_LIMITS = httpx.Limits(
    max_connections=None, max_keepalive_connections=256 // _SHARDS, keepalive_expiry=60
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

    def __init__(self, wire: WirePool, timeout: httpx.Timeout) -> None:
        self.wire = wire
        super().__init__(timeout=timeout, transport=_Transport(wire), follow_redirects=False)


def new_client(wire: WirePool, timeout: httpx.Timeout) -> httpx.AsyncClient:
    """A :class:`BridgeClient` on ``wire``. It never retries by itself (httpx does not by
    default): which faults are retried is :mod:`bridge.retry`'s decision."""
    return skip_empty_cookies(BridgeClient(wire, timeout))


@lru_cache(maxsize=8)
def _url(url: str) -> httpx.URL:
    # Parsing the URL was a tenth of the client's CPU per call. The route is still resolved
    # per call (the environment may change); only the parse is reused.
    return httpx.URL(url)


async def open_stream(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], content: bytes
) -> httpx.Response:
    """POST ``content`` asking for an event stream: the provider's 2xx response, its body not
    read yet (the caller closes it); any other status or a failed exchange raised as the
    provider's error (:class:`ProviderFault` where the call may be made again)."""
    request = client.build_request(
        "POST", _url(url), content=content, headers={**headers, "Accept": "text/event-stream"}
    )
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        raise _transport_error(exc) from exc
    if 200 <= response.status_code < 300:
        return response
    try:
        await response.aread()
    except httpx.TransportError as exc:
        raise _transport_error(exc, answering=True) from exc
    finally:
        await response.aclose()
    raise _status_error(response)


async def stream_chunks(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], content: bytes
) -> AsyncGenerator[dict[str, Any], None]:
    """Stream raw chunks as the provider sends them (a whole completion if it did not stream)."""
    response = await open_stream(client, url, headers, content)
    try:
        if "event-stream" not in response.headers.get("content-type", ""):
            await response.aread()
            data = parse_provider_json(response.text)
            if not isinstance(data, dict):
                raise UpstreamError(502, "provider returned a JSON value that is not an object")
            yield data
            return
        finished = False
        async for event, data in _sse_events(response):
            if data == "[DONE]":
                return
            parsed = parse_provider_json(data)
            # A chunk's `"error": null` is no error (some OpenAI-compatible servers always
            # write the field; openai-python also looks only at a truthy one).
            if event == "error" or (isinstance(parsed, dict) and parsed.get("error")):
                raise _stream_error(parsed)
            if isinstance(parsed, dict):
                finished = finished or _has_finish_reason(parsed)
                yield parsed
        if not finished:
            # The body closed cleanly but the answer did not end: no choice said why it stopped
            # and no `[DONE]` came. Relaying it as complete would score a cut-off answer.
            raise UpstreamError(502, TRUNCATED_STREAM_MESSAGE, kind="APIConnectionError")
    except httpx.TransportError as exc:
        raise with_request_id(_transport_error(exc, answering=True), response.headers) from exc
    except UpstreamError as exc:
        with_request_id(exc, response.headers)
        raise
    finally:
        await response.aclose()


TRUNCATED_STREAM_MESSAGE = (
    "the provider's stream ended before its answer did (no finish_reason and no [DONE])"
)


def _has_finish_reason(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    return isinstance(choices, list) and any(
        isinstance(choice, dict) and choice.get("finish_reason") for choice in choices
    )


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
    if answering:
        return UpstreamError(
            502, f"the provider's answer broke off: {detail}", kind="APIConnectionError"
        )
    message = f"could not reach the provider: {detail}"
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return ProviderFault(502, message, kind="APIConnectionError")
    return UpstreamError(502, message, kind="APIConnectionError")


def _status_error(response: httpx.Response) -> UpstreamError:
    status, text = response.status_code, response.text
    message = text.strip() or f"provider answered HTTP {status}"
    return status_fault(status, message, response.headers)


def _stream_error(parsed: Any) -> UpstreamError:
    """The provider's own error event: it answered (the kind is an answer's, never "could not
    reach"), with the status its error names, or 502."""
    error = parsed.get("error") if isinstance(parsed, dict) else None
    status = 502
    if isinstance(error, dict):
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool):
            status = code
    return UpstreamError(status, json.dumps(parsed, ensure_ascii=False), kind=answer_kind(status))


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
