"""The Responses and Messages routes as raw ASGI, beside :class:`bridge.app.ChatRoutes`.

Order of checks, as on the chat route: auth (before the rollout id and the body), rollout id,
body, then the API's policy and translation, all before a status is committed, so a refused
request gets a real 4xx in the caller's shape. A streamed answer waits for its first event up to
one heartbeat interval, so that an upstream failure before it (after retries) is still a real
status; after that the 200 is committed and ``: ping`` comments keep the connection alive.

Why one module of this size: the order of checks above and the three ways an answer leaves
(whole, kept alive, streamed), each ending in the call's record, are one contract per request;
the translators, the policy and the native client are already modules of their own.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from bridge.apis import Api, ApiOptions, translate
from bridge.apis import native as nat
from bridge.apis.errors import dialect_error, sse_error
from bridge.apis.policy import POLICIES, check, without_defaults
from bridge.bearers import Bearers
from bridge.calls import CallTrace
from bridge.codec import dumps, loads
from bridge.door import Route
from bridge.errors import BridgeError, BridgeRequestError, UpstreamError
from bridge.handler import PING, Bridge
from bridge.policy import (
    check_auth,
    is_stream,
    response_model,
)
from bridge.preamble import admitted_body, header_text
from bridge.retry import retrying, retrying_stream
from bridge.upstreams.routing import OFFLINE_MODEL
from bridge.watch import DisconnectWatch
from rollout_server.net.asgi import header, send_json

if TYPE_CHECKING:
    import httpx

    from bridge.usage import CallUsage
    from rollout_server.net.asgi import ASGIReceiveCallable, ASGISendCallable, HTTPScope

Work = Callable[[Callable[[bytes], Awaitable[None]], "translate.StreamStarted"], Awaitable[Any]]
"""One call's producer: given an emitter and a started flag, the answer (or None once streamed)."""

#: The routes of the two APIs: path pattern (the rollout id in group 1) -> (API, action).
#: Anthropic clients append ``/v1/messages`` to a base URL without ``/v1``, so the rollout URL
#: serves ``…/<id>/v1/messages``; ``…/<id>/messages`` is for a base given with ``/v1``. The
#: query string (``?beta=true`` of older Anthropic SDKs) is not part of the path.
ROUTES: tuple[tuple[re.Pattern[str], Api, str], ...] = (
    (re.compile(r"/v1/rollouts/([^/]+)/responses"), "responses", "create"),
    (re.compile(r"/v1/rollouts/([^/]+)/responses/compact"), "responses", "compact"),
    (re.compile(r"/v1/rollouts/([^/]+)(?:/v1)?/messages"), "messages", "create"),
    (re.compile(r"/v1/rollouts/([^/]+)(?:/v1)?/messages/count_tokens"), "messages", "count"),
)
#: Daemon mode (``bridge serve``): the plain paths, the rollout id from a header.
PLAIN_ROUTES: dict[str, tuple[Api, str]] = {
    "/v1/responses": ("responses", "create"),
    "/v1/responses/compact": ("responses", "compact"),
    "/v1/messages": ("messages", "create"),
    "/v1/messages/count_tokens": ("messages", "count"),
}


def api_routes(*, plain_route: bool) -> list[Route]:
    """The bridge door's entries (bridge.door) for these routes, POST only; the plain paths
    only where they are served (``bridge serve``)."""
    routes = [Route.post(pattern.pattern) for pattern, _, _ in ROUTES]
    if plain_route:
        routes += [Route.post(re.escape(path)) for path in PLAIN_ROUTES]
    return routes


_JSON = (b"content-type", b"application/json")
_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass(frozen=True)
class Match:
    """A request for one of the two APIs."""

    api: Api
    action: str
    rollout_id: str


def messages_auth(authorization: str | None, api_key: str | None, token: str) -> bool:
    """Messages auth: a non-empty ``Authorization`` decides, else a non-empty ``x-api-key``."""
    if authorization:
        return check_auth(authorization, token)
    if api_key:
        return secrets.compare_digest(api_key.encode("utf-8"), token.encode("utf-8"))
    return False


class _Failure:
    def __init__(self, api: Api, status: int, body: bytes) -> None:
        self.api, self.status, self.body = api, status, body

    def event(self, sequence: int = 0) -> bytes:
        """The failure as an SSE ``error`` event, for a stream whose 200 has left."""
        return sse_error(self.api, self.body, self.status, sequence)

    def message(self) -> str:
        parsed = loads(self.body)
        inner = parsed.get("error") if isinstance(parsed, dict) else None
        return str(inner.get("message")) if isinstance(inner, dict) else "bridge error"


class ApiRoutes:
    """Serves ``/responses`` and ``/messages`` (and ``count_tokens``) for every rollout."""

    def __init__(
        self,
        bridge: Bridge,
        *,
        bearers: Bearers,
        plain_route: bool,
        options: ApiOptions | None = None,
        http: Callable[[], httpx.AsyncClient] | None = None,
    ) -> None:
        self.bridge = bridge
        self.bearers = bearers
        self.plain_route = plain_route
        self.options = options or ApiOptions()
        self._http = http
        self.watch = DisconnectWatch(bridge.nursery)

    def match(self, scope: HTTPScope) -> Match | None:
        """The API call a request is, or ``None``."""
        if scope["method"] != "POST":
            return None
        path: str = scope["path"]
        for pattern, api, action in ROUTES:
            found = pattern.fullmatch(path)
            if found is not None:
                return Match(api, action, found.group(1))
        if self.plain_route and path in PLAIN_ROUTES:
            api, action = PLAIN_ROUTES[path]
            rollout_id = header(scope, b"x-rollbridge-rollout-id")
            return Match(api, action, rollout_id.decode("latin-1") if rollout_id else "default")
        return None

    def authorized(self, scope: HTTPScope, match: Match) -> bool:
        """The door check of a matched request (headers only, so it can run before the body is
        read): the run's bearer in ``Authorization``, or on Messages in ``x-api-key``."""
        authorization = header_text(scope, b"authorization")
        token = self.bearers.expected(scope["path"])
        if match.api == "messages":
            return messages_auth(authorization, header_text(scope, b"x-api-key"), token)
        return check_auth(authorization, token)

    @staticmethod
    def unauthorized(match: Match) -> bytes:
        """The 401 body, in the caller's API's shape."""
        return dialect_error(match.api, 401, "Unauthorized")

    async def serve(
        self,
        scope: HTTPScope,
        match: Match,
        raw: bytes,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
    ) -> None:
        """Answer one call whose whole body has been read (cancelled if the client leaves)."""
        await self.watch.run(receive, lambda: self._answer(scope, match, raw, send))

    def _fail(self, api: Api, exc: BaseException) -> _Failure:
        status, payload = self.bridge.error(exc)
        error = payload["error"]
        return _Failure(
            api, status, dialect_error(api, status, error["message"], error.get("upstream_status"))
        )

    async def _answer(
        self, scope: HTTPScope, match: Match, raw: bytes, send: ASGISendCallable
    ) -> None:
        api = match.api
        body = await admitted_body(
            send,
            authorized=self.authorized(scope, match),
            rollout_id=match.rollout_id,
            raw=raw,
            error=functools.partial(dialect_error, api),
        )
        if body is None:
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = without_defaults(POLICIES[api], body)
            check(POLICIES[api], body, self.options.hosted_tools)
            native = nat.native_api(self.bridge.model, api, getattr(self.options, api))
            if match.action == "count":
                status, answer = await self._count(native, body, headers)
                await send_json(send, status, answer)
                return
            if match.action == "compact" and not native:
                # Codex's compaction returns an encrypted item only OpenAI can read back;
                # refused, Codex compacts with ordinary turns instead.
                raise BridgeRequestError(
                    "responses/compact needs OpenAI's Responses API; this model's calls are "
                    "translated to its chat API"
                )
            if native:
                path = "/compact" if match.action == "compact" else ""
                route = nat.native_route(self.bridge.model, api, headers, path)
                memory = self.bridge.memory
                rid = match.rollout_id
                content = nat.native_body(api, body, route, lambda key: memory.recall(rid, key))
                if match.action == "compact":
                    # Only the model is the bridge's: compaction stores nothing to refuse.
                    content = dumps({**body, "model": route.model})
                trace = self._trace(api, match.rollout_id, body)
                work = self._native(api, match.rollout_id, body, route, content, trace)
            else:
                prepared = translate.prepared_for(api, body)
                trace = self._trace(api, match.rollout_id, body)
                work = self._translated(api, match.rollout_id, body, prepared, trace)
        except Exception as exc:
            failure = self._fail(api, exc)
            await send_json(send, failure.status, failure.body)
            return
        await self._deliver(api, send, work, streamed=is_stream(body))

    # What each kind of call does, as a producer of frames or one JSON answer -----------

    def _trace(self, api: Api, rollout_id: str, body: dict[str, Any]) -> CallTrace:
        return CallTrace(rollout_id, api=api, model=self.bridge.model, stream=is_stream(body))

    def _recorded(self, trace: CallTrace, work: Work) -> Work:
        """``work`` whose end, however it comes, leaves the call's record (bridge.calls)."""

        async def run(
            emit: Callable[[bytes], Awaitable[None]], state: translate.StreamStarted
        ) -> Any:
            async def first(frame: bytes) -> None:
                trace.first_byte()
                await emit(frame)

            failure: BaseException | None = None
            try:
                return await work(first, state)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                self.bridge.calls.add(trace.finish(None, failure or trace.error))

        return run

    def _translated(
        self, api: Api, rollout_id: str, body: dict[str, Any], prepared: Any, trace: CallTrace
    ) -> Work:
        async def run(
            emit: Callable[[bytes], Awaitable[None]], state: translate.StreamStarted
        ) -> Any:
            if not is_stream(body):
                return await translate.complete(self.bridge, api, rollout_id, body, prepared, trace)
            await translate.stream(self.bridge, api, rollout_id, body, prepared, emit, state, trace)
            return None

        return self._recorded(trace, run)

    def _native(
        self,
        api: Api,
        rollout_id: str,
        body: dict[str, Any],
        route: nat.NativeRoute,
        content: bytes,
        trace: CallTrace,
    ) -> Work:
        model = response_model(body, self.bridge.model)
        on_fault = translate.on_fault(self.bridge, rollout_id, trace)

        def record(call: CallUsage) -> None:
            self.bridge.ledger.record(rollout_id, call)
            trace.billed = call

        def keep(item_id: str, fields: dict[str, Any]) -> None:
            self.bridge.memory.keep(rollout_id, item_id, fields)

        async def run(
            emit: Callable[[bytes], Awaitable[None]], state: translate.StreamStarted
        ) -> Any:
            client = self._client()
            if not is_stream(body):
                data = await retrying(
                    lambda: nat.call(client, api, route, content, model, record, trace.answered_as),
                    self.bridge.retry,
                    on_fault,
                )
                for item_id, fields in nat.reasoning_items(data.get("output")):
                    keep(item_id, fields)
                return data
            relay = nat.NativeStream(api, model, keep)
            frames = retrying_stream(
                lambda: nat.stream(client, route, content, relay), self.bridge.retry, on_fault
            )
            try:
                async for frame in frames:
                    state.started = True
                    await emit(frame)
            finally:
                await frames.aclose()
                if state.started:
                    # A stream the provider began is billed, however it ended (docs/bridge.md).
                    record(relay.usage())
                    trace.answered_as(relay.answered)
                    if relay.failed is not None:
                        trace.error = nat.relayed_error(api, relay.failed)
                        trace.error.request_id = relay.request_id
            if not state.started:
                raise UpstreamError(502, "the provider's stream ended before any event")
            return None

        return self._recorded(trace, run)

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            raise BridgeError(500, "the native path has no HTTP client")
        return self._http()

    async def _count(
        self, native: bool, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """``count_tokens``: relayed natively; the echo model counts with its own tokenizer;
        any other translated upstream has no such endpoint (a 404, which Claude Code takes)."""
        if native:
            route = nat.native_route(self.bridge.model, "messages", headers, "/count_tokens")
            return await nat.count_tokens(
                self._client(), route, nat.native_body("messages", body, route)
            )
        if self.bridge.model == OFFLINE_MODEL:
            from bridge.upstreams.echo import prompt_tokens

            count = dict(body, max_tokens=body.get("max_tokens") or 1)
            prepared = translate.prepared_for("messages", count)
            return 200, dumps({"input_tokens": prompt_tokens(prepared)})
        message = "count_tokens is not available for this model"
        return 404, dialect_error("messages", 404, message)

    async def _deliver(
        self,
        api: Api,
        send: ASGISendCallable,
        work: Callable[
            [Callable[[bytes], Awaitable[None]], translate.StreamStarted], Awaitable[Any]
        ],
        *,
        streamed: bool,
    ) -> None:
        if not streamed:
            if self.bridge.keepalive:
                await self._kept_alive(api, work, send)
                return
            await send_json(send, *await self._whole(api, work))
            return
        out, frames = trio.open_memory_channel[bytes | _Failure](64)
        scope = trio.CancelScope()
        self.bridge.nursery.start_soon(self._produce, api, work, out, scope)
        try:
            await self._relay(send, frames)
        finally:
            scope.cancel()
            frames.close()

    async def _whole(self, api: Api, work: Any) -> tuple[int, bytes]:
        """A non-streaming call's status and JSON body, errors included."""
        try:
            return 200, dumps(await work(_no_emit, translate.StreamStarted()))
        except Exception as exc:
            failure = self._fail(api, exc)
            return failure.status, failure.body

    async def _kept_alive(self, api: Api, work: Any, send: ASGISendCallable) -> None:
        """Keepalive mode (a public URL): as on the chat route, a call still running after the
        grace period commits a 200 and trickles spaces until its JSON (errors included) is
        ready; both SDKs read JSON with leading whitespace."""
        timing = self.bridge.timing
        result: list[tuple[int, bytes]] = []
        done = trio.Event()
        scope = trio.CancelScope()

        async def call() -> None:
            with scope:
                result.append(await self._whole(api, work))
            done.set()

        self.bridge.nursery.start_soon(call)
        try:
            with trio.move_on_after(timing.keepalive_grace):
                await done.wait()
            if result:
                await send_json(send, *result[0])
                return
            await send({"type": "http.response.start", "status": 200, "headers": [_JSON]})
            await _body(send, b" ")
            while not done.is_set():
                with trio.move_on_after(timing.keepalive_interval):
                    await done.wait()
                if not done.is_set():
                    await _body(send, b" ")
            last = result[0][1] if result else b""
            await send({"type": "http.response.body", "body": last, "more_body": False})
        finally:
            scope.cancel()

    async def _produce(
        self,
        api: Api,
        work: Any,
        out: trio.MemorySendChannel[bytes | _Failure],
        scope: trio.CancelScope,
    ) -> None:
        state = translate.StreamStarted()
        with scope, out:
            try:
                await work(out.send, state)
            except Exception as exc:
                failure = self._fail(api, exc)
                if not state.started:
                    await out.send(failure)
                    return
                await out.send(failure.event(getattr(state.translator, "sequence", 0)))
                translator = state.translator
                if api == "responses" and translator is not None and hasattr(translator, "failed"):
                    await out.send(translator.failed(failure.message()))

    async def _relay(
        self, send: ASGISendCallable, frames: trio.MemoryReceiveChannel[bytes | _Failure]
    ) -> None:
        heartbeat = self.bridge.timing.heartbeat
        first: bytes | _Failure | None = None
        ended = False
        with trio.move_on_after(heartbeat):
            try:
                first = await frames.receive()
            except trio.EndOfChannel:
                ended = True
        if isinstance(first, _Failure):
            await send_json(send, first.status, first.body)
            return
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        await _body(send, first if first is not None else PING)
        while not ended:
            item: bytes | _Failure | None = None
            with trio.move_on_after(heartbeat):
                try:
                    item = await frames.receive()
                except trio.EndOfChannel:
                    break
            if item is None:
                await _body(send, PING)
            elif isinstance(item, _Failure):
                # Failed before any event but after the 200 left: an error event instead.
                await _body(send, item.event())
            else:
                await _body(send, item)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _no_emit(_: bytes) -> None:
    raise AssertionError("a non-streaming call emits no frames")


async def _body(send: ASGISendCallable, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})
