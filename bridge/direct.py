"""The direct upstream path: one pooled httpx client to an OpenAI-chat-speaking provider."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpcore
import httpx

from bridge.errors import UpstreamError
from bridge.policy import PreparedRequest
from bridge.routing import DirectRoute, resolve_direct

# The bridge sets no deadline of its own on a model call; these match the OpenAI SDK's
# defaults that LiteLLM would apply (10 minutes), so a wedged provider still ends eventually.
_TIMEOUT = httpx.Timeout(600.0, connect=30.0)
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=60)


class _CoalescingStream(httpcore.AsyncNetworkStream):
    """Holds writes until the next read, so a request leaves in one send instead of two.

    httpcore writes a request's head and body separately; on loopback each send costs a
    wake-up of the other side, which is a measurable part of the bridge's added latency.
    A request is always written completely before its response is read, so nothing waits.
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._pending: list[bytes] = []

    async def _flush(self, timeout: float | None) -> None:  # noqa: ASYNC109 (httpcore interface)
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            await self._inner.write(data, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 (httpcore interface)
        if buffer:
            self._pending.append(buffer)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 (httpcore interface)
        await self._flush(timeout)
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._pending.clear()
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore interface)
    ) -> httpcore.AsyncNetworkStream:
        await self._flush(timeout)
        return _CoalescingStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _CoalescingBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._inner = _auto_backend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore interface)
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _CoalescingStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore interface)
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        return _CoalescingStream(
            await self._inner.connect_unix_socket(path, timeout, socket_options)
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _auto_backend() -> httpcore.AsyncNetworkBackend:
    from httpcore._backends.auto import AutoBackend

    return AutoBackend()


class _Transport(httpx.AsyncHTTPTransport):
    """httpx's transport with the coalescing network backend (and no retries)."""

    def __init__(self) -> None:
        super().__init__(limits=_LIMITS)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=_LIMITS.max_connections,
            max_keepalive_connections=_LIMITS.max_keepalive_connections,
            keepalive_expiry=_LIMITS.keepalive_expiry,
            network_backend=_CoalescingBackend(),
        )


def new_client() -> httpx.AsyncClient:
    """The bridge's one pooled client. It never retries (httpx does not by default).

    Proxies from the environment (``HTTPS_PROXY`` …) still apply: httpx mounts its own proxy
    transports for them next to this one.
    """
    return httpx.AsyncClient(timeout=_TIMEOUT, transport=_Transport(), follow_redirects=False)


def _payload(route: DirectRoute, prepared: PreparedRequest, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": route.upstream_model, "messages": prepared.messages}
    body.update(prepared.params)
    body.update(route.extra_params)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _transport_error(exc: httpx.TransportError) -> UpstreamError:
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError(408, f"provider request timed out: {detail}", kind="Timeout")
    return UpstreamError(502, f"could not reach the provider: {detail}", kind="APIConnectionError")


def _status_error(response: httpx.Response) -> UpstreamError:
    text = response.text.strip() or f"provider answered HTTP {response.status_code}"
    return UpstreamError(response.status_code, text)


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
        try:
            response = await self._client.post(
                route.url, content=_payload(route, prepared, False), headers=route.headers
            )
        except httpx.TransportError as exc:
            raise _transport_error(exc) from exc
        if not 200 <= response.status_code < 300:
            raise _status_error(response)
        data = _parse(response.text)
        if not isinstance(data, dict):
            raise UpstreamError(502, "provider returned a JSON value that is not an object")
        record(data.get("usage"))
        return data

    async def stream(self, prepared: PreparedRequest) -> AsyncIterator[dict[str, Any]]:
        """Stream raw chunks as the provider sends them (a whole completion if it did not stream)."""
        route = resolve_direct(self.model)
        request = self._client.build_request(
            "POST",
            route.url,
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
            raise _transport_error(exc) from exc
        finally:
            await response.aclose()


def _stream_error(parsed: Any) -> UpstreamError:
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        status = code if isinstance(code, int) and not isinstance(code, bool) else 502
        return UpstreamError(status, json.dumps(parsed, ensure_ascii=False))
    return UpstreamError(502, json.dumps(parsed, ensure_ascii=False))


async def _sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
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
