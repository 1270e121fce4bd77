"""Native pass-through: Responses to OpenAI's ``/responses``, Messages to Anthropic's ``/v1/messages``.

Lossless where translation is not (prompt caching marks, encrypted reasoning, thinking
signatures): the request is forwarded after the policy with only the bridge's fields rewritten
(the configured model, ``store: false`` on Responses), headers built from scratch (the
provider key from the bridge's environment, plus the policy's allowlist of client headers), and
the answer relayed with only ``model`` rewritten to what the client asked for (and an
``error`` object added to a Responses error event, so that openai-python raises on it). Streams are
parsed frame by frame and relayed as they arrive; the usage comes from the terminal frames.
A transient fault before the first frame is retried (:mod:`bridge.retry`); after it, the
provider's own error event reaches the client unchanged.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.apis import Api
from bridge.apis.policy import POLICIES, forwarded_headers
from bridge.apis.usage import StreamedMessagesUsage, normalize
from bridge.codec import dumps, loads
from bridge.errors import UpstreamError, answer_kind, provider_request_id, with_request_id
from bridge.upstreams.routing import OFFICIAL_OPENAI_BASE, openai_base, resolve_direct

if TYPE_CHECKING:
    import httpx

    from bridge.usage import CallUsage

ANTHROPIC_BASE = "https://api.anthropic.com"
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_ENDS: dict[str, tuple[str, ...]] = {
    "responses": (*_TERMINAL, "error"),
    "messages": ("message_stop", "error"),
}


@dataclass(frozen=True)
class NativeRoute:
    """Where one native call goes."""

    url: str
    headers: dict[str, str]
    model: str
    """The provider's model name (the configured one, without its prefix)."""
    secret: str


def native_api(model: str, api: Api, mode: str) -> bool:
    """Whether ``model``'s calls on ``api`` are passed through natively.

    ``mode`` is the eval config's ``[bridge] responses`` / ``messages`` switch: ``"native"``,
    ``"translate"`` or ``"auto"`` (native where the upstream is known to speak the API:
    ``openai/…`` on OpenAI's own base for Responses, ``anthropic/…`` for Messages).
    """
    if mode == "translate":
        return False
    if api == "responses":
        if not model.startswith("openai/"):
            return False
        return mode == "native" or openai_base() == OFFICIAL_OPENAI_BASE
    if api == "messages":
        return model.startswith("anthropic/")
    return False


def anthropic_base() -> str:
    """Anthropic's base URL (no ``/v1``): ``ANTHROPIC_API_BASE`` or ``ANTHROPIC_BASE_URL``."""
    for name in ("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"):
        value = os.environ.get(name)
        if value:
            return value.rstrip("/").removesuffix("/v1")
    return ANTHROPIC_BASE


def native_route(
    model: str, api: Api, client_headers: dict[str, str], path: str = ""
) -> NativeRoute:
    """The URL and headers of a native call; raises :class:`UpstreamError` without a key."""
    if api == "responses":
        direct = resolve_direct(model)
        url = direct.url.removesuffix("/chat/completions") + "/responses" + path
        return NativeRoute(url, dict(direct.headers), direct.upstream_model, direct.api_key or "")
    key = os.environ.get("ANTHROPIC_API_KEY")
    if not key:
        raise UpstreamError(
            500,
            f"ANTHROPIC_API_KEY is not set; export it or put it in --secrets-file to use '{model}'",
            kind="AuthenticationError",
        )
    headers = {"Content-Type": "application/json", "Accept": "application/json", "x-api-key": key}
    headers["anthropic-version"] = DEFAULT_ANTHROPIC_VERSION
    headers.update(forwarded_headers(POLICIES["messages"], client_headers))
    url = anthropic_base() + "/v1/messages" + path
    return NativeRoute(url, headers, model.split("/", 1)[1], key)


def native_body(
    api: Api, body: dict[str, Any], route: NativeRoute, memory: Recall | None = None
) -> bytes:
    """The request forwarded upstream: the client's, with the bridge's fields set.

    Responses are stateless (``store: false``), so a reasoning item the client replays by id
    alone would be unknown upstream: with ``reasoning`` set, the bridge asks for the items'
    encrypted content and ``memory`` fills it into replayed items that lack it.
    """
    out = {**body, "model": route.model}
    if api == "responses":
        out["store"] = False
        if body.get("reasoning") is not None:
            given = body.get("include")
            include: list[Any] = given if isinstance(given, list) else []
            if ENCRYPTED_REASONING not in include:
                out["include"] = [*include, ENCRYPTED_REASONING]
        if memory is not None and isinstance(body.get("input"), list):
            out["input"] = [_replayed(item, memory) for item in body["input"]]
    return dumps(out)


Recall = Callable[[str], "dict[str, Any] | None"]
"""Reasoning item id -> its remembered fields (``encrypted_content``), or None."""
ENCRYPTED_REASONING = "reasoning.encrypted_content"


def _replayed(item: Any, memory: Recall) -> Any:
    if (
        not isinstance(item, dict)
        or item.get("type") != "reasoning"
        or item.get("encrypted_content")
    ):
        return item
    remembered = memory(str(item.get("id")))
    return {**item, **remembered} if remembered else item


def reasoning_items(output: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(id, {"encrypted_content": …})`` of the reasoning items in a Responses ``output``."""
    found = []
    for item in output if isinstance(output, list) else []:
        if isinstance(item, dict) and item.get("type") == "reasoning":
            content, ident = item.get("encrypted_content"), item.get("id")
            if isinstance(content, str) and content and isinstance(ident, str):
                found.append((ident, {"encrypted_content": content}))
    return found


async def call(
    client: httpx.AsyncClient,
    api: Api,
    route: NativeRoute,
    content: bytes,
    model: str,
    record: Callable[[CallUsage], None],
    answered: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One non-streaming native call: the provider's object with ``model`` echoed.

    ``answered`` sees the provider's object before the model is rewritten (the call record
    names the model the provider says answered). A failure while the answer's body arrives
    is not retried: the provider has billed it (docs/bridge.md, "Retries").
    """
    from bridge.upstreams.streamed import _status_error

    response = await _exchange(client, route, content)
    if not 200 <= response.status_code < 300:
        raise _status_error(response)
    try:
        data = loads(response.content)
    except ValueError as exc:
        raise UpstreamError(502, "provider returned invalid JSON") from exc
    if not isinstance(data, dict):
        raise UpstreamError(502, "provider returned a JSON value that is not an object")
    record(normalize(api, data.get("usage")))
    if answered is not None:
        answered(data)
    data["model"] = model
    return data


async def _exchange(
    client: httpx.AsyncClient, route: NativeRoute, content: bytes
) -> httpx.Response:
    """POST ``content`` and read the whole answer, whatever its status.

    The head and the body are read apart so that a connection lost before any answer (which
    may be retried) is told from an answer that broke off (which may not, unless its status
    already said to try again).
    """
    import httpx

    from bridge.retry import status_fault
    from bridge.upstreams.streamed import _transport_error

    request = client.build_request("POST", route.url, content=content, headers=route.headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        raise _transport_error(exc) from exc
    try:
        await response.aread()
    except httpx.TransportError as exc:
        status = response.status_code
        if 200 <= status < 300:
            raise _transport_error(exc, answering=True) from exc
        message = f"provider answered HTTP {status} (its body broke off)"
        raise status_fault(status, message, response.headers) from exc
    finally:
        await response.aclose()
    return response


Keep = Callable[[str, "dict[str, Any]"], None]
"""Remembers a reasoning item's fields under its id (for :func:`native_body`'s replay)."""


async def count_tokens(
    client: httpx.AsyncClient, route: NativeRoute, content: bytes
) -> tuple[int, bytes]:
    """Anthropic's ``count_tokens``, relayed as is (free: nothing is counted in the ledger)."""
    response = await _exchange(client, route, content)
    return response.status_code, response.content


# The status each provider error type stands for, as its own HTTP answers give it (Anthropic's
# error types; OpenAI's Responses error codes for the few that name one).
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "api_error": 500,
    "server_error": 500,
    "overloaded_error": 529,
}


def relayed_error(api: Api, data: str) -> UpstreamError:
    """The provider's error frame (as relayed) as the error its call record names."""
    parsed = loads(data)
    error: Any = parsed
    if api == "responses" and isinstance(parsed.get("response"), dict):
        error = parsed["response"].get("error")
    elif isinstance(parsed.get("error"), dict):
        error = parsed["error"]
    error = error if isinstance(error, dict) else {}
    name = error.get("type") if api == "messages" else error.get("code")
    status = _ERROR_STATUS.get(name, 502) if isinstance(name, str) else 502
    message = error.get("message")
    text = message if isinstance(message, str) and message else data
    return UpstreamError(status, text, kind=answer_kind(status))


class NativeStream:
    """The frames of one streamed native call, ``model`` rewritten, usage collected."""

    def __init__(self, api: Api, model: str, keep: Keep | None = None) -> None:
        self.api = api
        self.model = model
        self._keep = keep
        self._messages = StreamedMessagesUsage()
        self._responses: Any = None
        self.ended = False
        """Whether a frame that ends the answer came (a terminal event or an error)."""
        self.answered: dict[str, Any] = {}
        """What the frames said of the answer, as a whole object would (for the call record):
        the ``model`` and ``id`` the provider named, and ``stop_reason`` (Messages) or
        ``status`` (Responses)."""
        self.failed: str | None = None
        """The provider's own error frame (``error``, ``response.failed``), as relayed."""
        self.request_id: str | None = None
        """The provider's id of the request (:func:`bridge.errors.provider_request_id`)."""

    def usage(self) -> CallUsage:
        """The usage reported so far, normalized."""
        if self.api == "messages":
            return self._messages.call()
        return normalize("responses", self._responses)

    def _take(self, source: dict[str, Any], key: str) -> None:
        value = source.get(key)
        if isinstance(value, str) and value:
            self.answered[key] = value

    def frame(self, event: str, data: str) -> bytes:
        """One frame to relay (rewritten only when it carries the model)."""
        try:
            parsed = loads(data)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            kind = parsed.get("type", event)
            self.ended = self.ended or kind in _ENDS[self.api]
            if kind in ("error", "response.failed") and self.failed is None:
                self.failed = data
            if self.api == "messages":
                self._messages.event(parsed)
                message = parsed.get("message")
                if kind == "message_start" and isinstance(message, dict):
                    self._take(message, "model")
                    self._take(message, "id")
                    message["model"] = self.model
                    data = dumps(parsed).decode()
                elif kind == "message_delta" and isinstance(parsed.get("delta"), dict):
                    self._take(parsed["delta"], "stop_reason")
            else:
                item = parsed.get("item")
                if kind == "response.output_item.done" and self._keep is not None:
                    for ident, fields in reasoning_items([item]):
                        self._keep(ident, fields)
                response = parsed.get("response")
                if isinstance(response, dict) and "model" in response:
                    self._take(response, "model")
                    self._take(response, "id")
                    response["model"] = self.model
                    if kind in _TERMINAL:
                        self._responses = response.get("usage")
                        self._take(response, "status")
                    data = dumps(parsed).decode()
                elif kind == "error" and "error" not in parsed:
                    # openai-python raises APIError on an error event only when its data has an
                    # `error` object; OpenAI's own carries code and message at the top level.
                    parsed["error"] = {k: parsed.get(k) for k in ("code", "message", "param")}
                    data = dumps(parsed).decode()
        head = f"event: {event}\n" if event != "message" else ""
        return (head + "data: " + data + "\n\n").encode()


async def stream(
    client: httpx.AsyncClient, route: NativeRoute, content: bytes, relay: NativeStream
) -> AsyncGenerator[bytes, None]:
    """The relayed frames of one streamed native call; raises a :class:`ProviderFault` for a
    transient failure before the first frame."""
    import httpx

    from bridge.upstreams.streamed import _sse_events, _transport_error, open_stream

    response = await open_stream(client, route.url, route.headers, content)
    try:
        kind = response.headers.get("content-type", "")
        if "event-stream" not in kind:
            # A 2xx that is not a stream (a proxy's HTML page, a JSON answer): say what came.
            excerpt = (await response.aread())[:200].decode("utf-8", "replace")
            raise UpstreamError(
                502,
                f"the provider answered a streamed call with {kind or 'no content type'}, "
                f"not an event stream: {' '.join(excerpt.split())}",
            )
        async for event, data in _sse_events(response):
            yield relay.frame(event, data)
        if not relay.ended:
            # The body closed cleanly without the event that ends an answer: cut off, not done.
            end = "message_stop" if relay.api == "messages" else "response.completed"
            raise UpstreamError(
                502, f"the provider's stream ended before its answer did (no {end})"
            )
    except httpx.TransportError as exc:
        raise with_request_id(_transport_error(exc, answering=True), response.headers) from exc
    except UpstreamError as exc:
        with_request_id(exc, response.headers)
        raise
    finally:
        relay.request_id = provider_request_id(response.headers)
        await response.aclose()
