"""Responses and Messages calls served by a chat upstream, through the translators.

The chat request a translator builds goes through the chat route's own policy
(:func:`bridge.policy.prepare`: the blocked list, ``n``, ``extra_body``), then to the bridge's
upstream under its retry policy; the usage is recorded in the ledger the moment the upstream
answers, exactly as on the chat route.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import trio

from bridge.apis import Api, messages, responses
from bridge.apis.responses_stream import ResponsesStream
from bridge.calls import CallTrace
from bridge.errors import UpstreamError
from bridge.handler import Bridge
from bridge.policy import PreparedRequest, prepare, response_model
from bridge.retry import OnFault, ProviderFault, retrying, retrying_stream
from bridge.shaping import NO_CHOICES_MESSAGE, completion_to_chunk
from bridge.usage import CallUsage

Emit = Callable[[bytes], Any]


def on_fault(bridge: Bridge, rollout_id: str, trace: CallTrace | None = None) -> OnFault:
    """Counts a transient provider fault (and its retry) for ``rollout_id``, as the chat route
    does, and keeps its cause in the call's ``trace``."""

    def told(fault: ProviderFault, retried: bool) -> None:
        bridge.ledger.fault(rollout_id, fault.status, retried=retried)
        if retried and trace is not None:
            trace.fault(fault.status, fault.kind, fault.request_id)
        if retried:
            bridge.log("info", f"retrying a call after a provider fault: {fault.kind}")

    return told


def prepared_for(api: Api, body: dict[str, Any]) -> PreparedRequest:
    """The chat request carrying ``body`` (raises a 400 for what cannot be carried)."""
    chat = responses.to_chat(body) if api == "responses" else messages.to_chat(body)
    return prepare(chat)


async def complete(
    bridge: Bridge,
    api: Api,
    rollout_id: str,
    body: dict[str, Any],
    prepared: PreparedRequest,
    trace: CallTrace,
) -> dict[str, Any]:
    """One non-streaming call, answered as ``api``'s object."""
    calls: list[CallUsage] = []

    def record(usage: Any) -> None:
        call = CallUsage.from_json(usage)
        bridge.ledger.record(rollout_id, call)
        calls[:] = [call]
        trace.billed = call

    data = await retrying(
        lambda: bridge.upstream.complete(prepared, record),
        bridge.retry,
        on_fault(bridge, rollout_id, trace),
    )
    trace.answered(data)
    if not data.get("choices"):
        raise UpstreamError(502, NO_CHOICES_MESSAGE)
    call = calls[0] if calls else CallUsage.from_json(data.get("usage"))
    model = response_model(body, bridge.model)
    if api == "responses":
        return responses.to_response(body, data, model, call)
    return messages.to_message(data, model, call)


class StreamStarted:
    """Set once the first event has been emitted (a failure after it is an SSE error event)."""

    def __init__(self) -> None:
        self.started = False
        self.translator: ResponsesStream | messages.MessagesStream | None = None


async def stream(
    bridge: Bridge,
    api: Api,
    rollout_id: str,
    body: dict[str, Any],
    prepared: PreparedRequest,
    emit: Callable[[bytes], Any],
    state: StreamStarted,
    trace: CallTrace,
) -> None:
    """One streaming call: the chat chunks as ``api``'s events, passed to ``emit`` (awaited).

    Raises on failure; ``state.started`` says whether any event was emitted before it.
    """
    model = response_model(body, bridge.model)
    seed = f"{rollout_id}:{trio.current_time()}"
    translator: ResponsesStream | messages.MessagesStream
    if api == "responses":
        translator = ResponsesStream(body, model, seed)
    else:
        translator = messages.MessagesStream(model, seed)
    state.translator = translator
    usage: Any = None
    answered = False
    any_choices = False
    chunks = retrying_stream(
        lambda: bridge.upstream.stream(prepared), bridge.retry, on_fault(bridge, rollout_id, trace)
    )
    try:
        async for raw in chunks:
            if not answered:
                answered = True
                for frame in translator.start():
                    await emit(frame)
                state.started = True
            for chunk in _chunks(raw):
                trace.chunk(chunk)
                if chunk.get("usage") is not None:
                    usage = chunk["usage"]
                any_choices = any_choices or bool(chunk.get("choices"))
                for frame in translator.chunk(chunk):
                    await emit(frame)
    finally:
        await chunks.aclose()
        # As on the chat route: a call the provider started serving is counted, even when
        # this task is being cancelled.
        if answered:
            trace.billed = CallUsage.from_json(usage)
            bridge.ledger.record(rollout_id, trace.billed)
    if not any_choices:
        raise UpstreamError(502, NO_CHOICES_MESSAGE)
    for frame in translator.end(CallUsage.from_json(usage)):
        await emit(frame)


def _chunks(raw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A raw item of the upstream stream as chunks (a whole completion becomes one)."""
    choices = raw.get("choices")
    whole = raw.get("object") == "chat.completion" or (
        isinstance(choices, list) and any(isinstance(c, dict) and "message" in c for c in choices)
    )
    if not whole:
        yield raw
        return
    if choices:
        yield completion_to_chunk({**raw, "choices": [c for c in choices if isinstance(c, dict)]})
    if raw.get("usage") is not None:
        yield {"choices": [], "usage": raw["usage"]}
