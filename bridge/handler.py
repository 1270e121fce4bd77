"""The bridge's request handling, independent of the HTTP framework.

``Bridge.respond`` answers a non-streaming request (in keepalive mode, a slow one with a
trickled body); ``Bridge.sse`` produces the body of a streaming one. Every provider failure
becomes the JSON error object of docs/spec/bridge.md §12, redacted.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import trio

from bridge.calls import CallBook, CallObserver, CallTrace
from bridge.codec import dumps
from bridge.errors import BridgeError, UpstreamError, error_body, final_status
from bridge.policy import prepare, response_model
from bridge.reasoning import ReasoningMemory, StreamedMessage
from bridge.retry import OnFault, ProviderFault, RetryPolicy, retrying, retrying_stream
from bridge.revoke import Revocations
from bridge.scrub import ErrorScrubber
from bridge.shaping import (
    NO_CHOICES_MESSAGE,
    OWNED_ENVELOPE,
    completion_to_chunk,
    passed_through,
    shape_chunk,
    shape_completion,
)
from bridge.upstreams import Upstream
from bridge.usage import CallUsage, UsageLedger, UsageObserver

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"


def _sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def _sse_error(payload: dict[str, Any]) -> bytes:
    return b"event: error\ndata: " + dumps(payload) + b"\n\n"


@dataclass
class Timing:
    """Intervals of the bridge's keep-the-connection-alive behaviour (seconds)."""

    heartbeat: float = 15.0
    """Between ``: ping`` comments while a stream's provider is silent."""
    keepalive_grace: float = 90.0
    """How long a slow non-streaming call may take before the bridge commits a 200."""
    keepalive_interval: float = 30.0
    """Between the spaces trickled after that commit."""


class Bridge:
    """Serves chat completions for rollouts through one upstream."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        token: str,
        nursery: trio.Nursery,
        redact: Callable[[str], str] | None = None,
        log: Callable[[str, str], None] | None = None,
        timing: Timing | None = None,
        keepalive: bool = False,
        retry: RetryPolicy | None = None,
        usage_observer: UsageObserver | None = None,
        call_observer: CallObserver | None = None,
        keep_calls: bool = False,
    ) -> None:
        self.upstream = upstream
        self.model = upstream.model
        self.memory = ReasoningMemory()
        self.ledger = UsageLedger(on_forget=self.memory.forget, observer=usage_observer)
        self.calls = CallBook(keep=keep_calls, observer=call_observer)
        """Each call's record (bridge.calls), kept per rollout when ``keep_calls``."""
        self.scrubber = ErrorScrubber([token, *upstream.secrets()], extra=redact)
        self.timing = timing or Timing()
        self.retry = retry or RetryPolicy()
        """Which transient provider faults are retried, and for how long."""
        self.keepalive = keepalive
        """Keepalive mode (behind a public URL): may be switched while serving; a request
        follows the mode it started in."""
        self._nursery = nursery
        self._log = log
        self.revoked = Revocations(self.log)
        """Rollout ids whose calls are refused (bridge.revoke), checked by every route."""

    @property
    def nursery(self) -> trio.Nursery:
        """The bridge's own nursery: tasks that outlive a request's handler run there."""
        return self._nursery

    def log(self, level: str, message: str) -> None:
        """Send a redacted line to the log sink, if there is one."""
        if self._log is not None:
            self._log(level, self.scrubber.scrub(message))

    def error(self, exc: BaseException) -> tuple[int, dict[str, Any]]:
        """The status and JSON body a failure is answered with (docs/spec/bridge.md §12)."""
        upstream: int | None = None
        if isinstance(exc, BridgeError):
            status, message = exc.status, exc.message
            if isinstance(exc, UpstreamError) and exc.kind not in ("APIConnectionError", "Timeout"):
                upstream = exc.status  # what the provider itself answered
        else:
            status, message = 500, f"{type(exc).__name__}: {exc}"
        status = final_status(status)
        message = self.scrubber(message)
        where = (
            f" (provider answered {upstream})"
            if upstream is not None and upstream != status
            else ""
        )
        if isinstance(exc, UpstreamError) and exc.request_id is not None:
            where += f" (request id {exc.request_id})"
        self.log("warning", f"LLM bridge error{where}: {message}")
        return status, error_body(status, message, upstream)

    def _recorder(
        self, rollout_id: str, last: list[tuple[Any, CallUsage]] | None = None
    ) -> Callable[[Any], None]:
        """Records one call's usage; ``last`` keeps the latest (raw usage, its normalized form)."""

        def record(usage: Any) -> None:
            call = CallUsage.from_json(usage)
            self.ledger.record(rollout_id, call)
            if last is not None:
                last[:] = [(usage, call)]

        return record

    def _on_fault(self, rollout_id: str, trace: CallTrace | None = None) -> OnFault:
        def on_fault(fault: ProviderFault, retrying: bool) -> None:
            self.ledger.fault(rollout_id, fault.status, retried=retrying)
            if retrying:
                if trace is not None:
                    trace.fault(fault.status, fault.kind, fault.request_id)
                self.log("info", f"retrying a call after a provider fault: {fault.kind}")

        return on_fault

    async def complete(self, rollout_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one non-streaming request; raises on any failure (see :meth:`error`)."""
        prepared = self.memory.replay(rollout_id, prepare(body))
        last: list[tuple[Any, CallUsage]] = []
        record = self._recorder(rollout_id, last)
        trace = CallTrace(rollout_id, api="chat.completions", model=self.model, stream=False)
        failure: BaseException | None = None
        try:
            data = await retrying(
                lambda: self.upstream.complete(prepared, record),
                self.retry,
                self._on_fault(rollout_id, trace),
            )
            trace.answered(data)
            if not data.get("choices"):
                raise UpstreamError(502, NO_CHOICES_MESSAGE)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            # Before the answer leaves: the call's record reaches the supervisor first.
            self.calls.add(trace.finish(last[0][1] if last else None, failure))
        usage = data.get("usage")
        # The answer's usage was normalized when it was recorded (the same object, unchanged).
        call = last[0][1] if last and last[0][0] is usage else CallUsage.from_json(usage)
        out = shape_completion(data, response_model(body, self.model), call)
        for choice in out["choices"]:
            self.memory.remember(rollout_id, choice["message"])
        return out

    async def respond(
        self, rollout_id: str, body: dict[str, Any]
    ) -> tuple[int, bytes] | AsyncGenerator[bytes, None]:
        """Answer one non-streaming request: ``(status, JSON body)``, errors included.

        In keepalive mode a call still running after the grace period is answered with an
        iterator instead: the body of a 200 (spaces, then the JSON; see :meth:`_kept_alive`).
        """
        if self.keepalive:
            return await self._kept_alive(rollout_id, body)
        return await self._answer(rollout_id, body)

    async def _answer(self, rollout_id: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """:meth:`complete` as a status and a JSON body, errors included."""
        try:
            return 200, dumps(await self.complete(rollout_id, body))
        except Exception as exc:
            status, payload = self.error(exc)
            return status, dumps(payload)

    # Streaming -------------------------------------------------------------------------

    async def sse(self, rollout_id: str, body: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        """The SSE body of a streaming request: relayed chunks, heartbeats, errors, ``[DONE]``.

        The provider is read by a task in the bridge's nursery so that heartbeats can be sent
        while it is silent; closing this iterator (the client went away) cancels that task.
        """
        send, receive = trio.open_memory_channel[bytes](64)
        scope = trio.CancelScope()
        self._nursery.start_soon(self._produce, rollout_id, body, send, scope)
        try:
            yield PING
            while True:
                frame: bytes | None = None
                with trio.move_on_after(self.timing.heartbeat):
                    try:
                        frame = await receive.receive()
                    except trio.EndOfChannel:
                        return
                if frame is None:
                    yield PING
                    continue
                # Frames that are already waiting leave in one write: fewer sends, same order.
                frames = [frame]
                while True:
                    try:
                        frames.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                yield b"".join(frames)
        finally:
            scope.cancel()
            receive.close()

    async def _produce(
        self,
        rollout_id: str,
        body: dict[str, Any],
        send: trio.MemorySendChannel[bytes],
        scope: trio.CancelScope,
    ) -> None:
        with scope, send:
            try:
                await self._relay(rollout_id, body, send)
            except Exception as exc:
                _, payload = self.error(exc)
                await send.send(_sse_error(payload))
            await send.send(DONE)

    async def _relay(
        self, rollout_id: str, body: dict[str, Any], send: trio.MemorySendChannel[bytes]
    ) -> None:
        prepared = self.memory.replay(rollout_id, prepare(body))
        model = response_model(body, self.model)
        streamed = StreamedMessage()
        usage: Any = None
        started = False
        any_choices = False
        held: dict[str, Any] | None = None
        trace = CallTrace(rollout_id, api="chat.completions", model=self.model, stream=True)
        failure: BaseException | None = None
        chunks = retrying_stream(
            lambda: self.upstream.stream(prepared), self.retry, self._on_fault(rollout_id, trace)
        )
        try:
            async for raw in chunks:
                started = True
                trace.chunk(raw)
                if _is_completion(raw):
                    usage = raw.get("usage")
                    trace.answered(raw)
                    if not raw.get("choices"):
                        break
                    any_choices = True
                    whole = shape_completion(raw, model, CallUsage.from_json(usage))
                    for choice in whole["choices"]:
                        self.memory.remember(rollout_id, choice["message"])
                    await send.send(_sse(completion_to_chunk(whole)))
                    continue
                if raw.get("usage") is not None:
                    usage = raw["usage"]
                chunk = shape_chunk(raw, model)
                streamed.add(chunk)
                if not chunk["choices"]:
                    if held is None and raw.get("usage") is not None:
                        chunk["usage"] = CallUsage.from_json(usage).to_json()
                        await send.send(_sse(chunk))
                    elif held is None and passed_through(raw, OWNED_ENVELOPE):
                        # Provider fields without a choice (Azure's prompt_filter_results
                        # come first, alone): relayed like any other field.
                        await send.send(_sse(chunk))
                    continue
                any_choices = True
                if held is not None:
                    await send.send(_sse(held))
                    held = None
                if any(c["finish_reason"] for c in chunk["choices"]):
                    # Held back so the usage chunk that follows can ride with it (docs/spec/bridge.md §7).
                    held = chunk
                else:
                    await send.send(_sse(chunk))
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await chunks.aclose()
            # Synchronous, so it happens even when this task is being cancelled: a call the
            # provider started serving is counted (with whatever usage it reported).
            counted = CallUsage.from_json(usage) if started else None
            if counted is not None:
                self.ledger.record(rollout_id, counted)
            if failure is None and not any_choices:
                failure = UpstreamError(502, NO_CHOICES_MESSAGE)
            self.calls.add(trace.finish(counted, failure))
        if not any_choices:
            raise UpstreamError(502, NO_CHOICES_MESSAGE)
        if held is not None:
            held["usage"] = CallUsage.from_json(usage).to_json()
            await send.send(_sse(held))
        self.memory.remember(rollout_id, streamed.message())

    # Keepalive mode (public URLs) ------------------------------------------------------

    async def _kept_alive(
        self, rollout_id: str, body: dict[str, Any]
    ) -> tuple[int, bytes] | AsyncGenerator[bytes, None]:
        """A non-streaming answer that survives proxies with idle timeouts (docs/spec/bridge.md §9).

        Returns ``(status, body)`` when the call ends within the grace period; otherwise an
        iterator for a 200 body of spaces (one at once, one per interval) then the JSON.
        """
        result: list[tuple[int, bytes]] = []
        done = trio.Event()
        scope = trio.CancelScope()

        async def call() -> None:
            with scope:
                result.append(await self._answer(rollout_id, body))
            done.set()

        self._nursery.start_soon(call)
        try:
            with trio.move_on_after(self.timing.keepalive_grace):
                await done.wait()
        except BaseException:
            scope.cancel()
            raise
        if result:
            return result[0]
        return self._trickle(result, done, scope)

    async def _trickle(
        self, result: list[tuple[int, bytes]], done: trio.Event, scope: trio.CancelScope
    ) -> AsyncGenerator[bytes, None]:
        try:
            yield b" "
            while not done.is_set():
                with trio.move_on_after(self.timing.keepalive_interval):
                    await done.wait()
                if not done.is_set():
                    yield b" "
            if result:
                yield result[0][1]
        finally:
            scope.cancel()


def _is_completion(raw: dict[str, Any]) -> bool:
    if raw.get("object") == "chat.completion":
        return True
    choices = raw.get("choices")
    return isinstance(choices, list) and any(
        isinstance(c, dict) and "message" in c for c in choices
    )
