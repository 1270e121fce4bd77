"""The direct upstream path: one pooled httpx client to an OpenAI-chat-speaking provider."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

import httpx
import trio

from bridge.errors import UpstreamError
from bridge.policy import PreparedRequest
from bridge.retry import ProviderFault, status_fault
from bridge.upstreams.routing import DirectRoute, resolve_direct
from rollout_server.net.httpclient import ShardedTransport, skip_empty_cookies

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
_LIMITS = httpx.Limits(
    max_connections=None, max_keepalive_connections=256 // _SHARDS, keepalive_expiry=60
)


def new_client() -> httpx.AsyncClient:
    """The bridge's one pooled client. It never retries by itself (httpx does not by default):
    which faults are retried is :mod:`bridge.retry`'s decision."""
    return skip_empty_cookies(
        httpx.AsyncClient(
            timeout=_TIMEOUT, transport=ShardedTransport(_SHARDS, _LIMITS), follow_redirects=False
        )
    )


def _payload(route: DirectRoute, prepared: PreparedRequest, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": route.upstream_model, "messages": prepared.messages}
    body.update(prepared.params)
    body.update(route.extra_params)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


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


def _status_error(response: httpx.Response) -> UpstreamError:
    text = response.text.strip() or f"provider answered HTTP {response.status_code}"
    return status_fault(response.status_code, text, response.headers.get("retry-after"))


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UpstreamError(502, f"provider returned invalid JSON: {text[:200]}") from exc


class DirectUpstream:
    """Calls ``<base>/chat/completions`` of the configured provider with one shared client."""

    def __init__(self, model: str, client: httpx.AsyncClient) -> None:
        self.model = model
        self._client = client
        self._parsed: tuple[str, httpx.URL] | None = None

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
        request = self._client.build_request(
            "POST",
            self._url(route.url),
            content=_payload(route, prepared, False),
            headers=route.headers,
        )
        try:
            # Cancellable while the provider works: a rollout that goes away stops the call.
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise _transport_error(exc) from exc
        # Once the answer is arriving it is paid for: finish reading it (within a grace
        # period) even if the rollout goes away now, so that its usage is counted.
        delivery = trio.CancelScope(shield=True)
        # Stays this when the grace period runs out before the answer has arrived.
        outcome: dict[str, Any] | Exception = UpstreamError(
            408, "the provider's answer did not finish arriving", kind="Timeout"
        )
        try:
            async with trio.open_nursery() as watcher:
                watcher.start_soon(_limit_when_cancelled, delivery)
                with delivery:
                    try:
                        await response.aread()
                        outcome = _answer(response)
                        record(outcome.get("usage"))
                    except (httpx.TransportError, UpstreamError) as exc:
                        outcome = exc
                watcher.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()
        if isinstance(outcome, httpx.TransportError):
            raise _transport_error(outcome, answering=True) from outcome
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

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


async def _limit_when_cancelled(delivery: trio.CancelScope) -> None:
    """Give a shielded delivery a deadline as soon as the surrounding scope is cancelled."""
    try:
        await trio.sleep_forever()
    finally:
        delivery.deadline = min(delivery.deadline, trio.current_time() + _DELIVERY_GRACE)


def _answer(response: httpx.Response) -> dict[str, Any]:
    if not 200 <= response.status_code < 300:
        raise _status_error(response)
    data = _parse(response.text)
    if not isinstance(data, dict):
        raise UpstreamError(502, "provider returned a JSON value that is not an object")
    return data


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
