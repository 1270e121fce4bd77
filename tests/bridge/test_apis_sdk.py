"""The official ``openai`` (Responses) and ``anthropic`` (Messages) clients, unmodified, against
the bridge: on the echo model (through the translators), on the native fakes, and against
``rollbridge bridge serve`` on a real port."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from bridge import BridgeHandle
from bridge.apis import ApiOptions
from tests.bridge.conftest import TOKEN, StartBridge
from tests.bridge.test_apis_native import FAST
from tests.bridge.test_apis_native import fake as fake  # a fixture, used by name
from tests.bridge.test_serve_daemon import _serve, _stop
from tests.fakes.api_upstream import ApiUpstream

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

BASH_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
OPENAI_TOOLS = [
    {"type": "function", "name": "bash", "description": "Run a command", "parameters": BASH_SCHEMA}
]
ANTHROPIC_TOOLS = [{"name": "bash", "description": "Run a command", "input_schema": BASH_SCHEMA}]


def _responses_round(
    base_url: str, extra_headers: dict[str, str] | None = None, token: str = TOKEN
) -> dict[str, Any]:
    """What an Agents-SDK-style loop does: a tool call, the tool's result, the final answer."""
    client = openai.OpenAI(
        base_url=base_url, api_key=token, max_retries=0, timeout=20, default_headers=extra_headers
    )
    plain = client.responses.create(model="gpt-sdk", input="hello world")
    first = client.responses.create(
        model="gpt-sdk", input='call bash {"command": "ls"}', tools=OPENAI_TOOLS
    )
    call = first.output[0]
    turn = [
        {"role": "user", "content": 'call bash {"command": "ls"}'},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt b.txt"},
    ]
    with client.responses.stream(model="gpt-sdk", input=turn, tools=OPENAI_TOOLS) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    with client.responses.stream(
        model="gpt-sdk", input='call bash {"command": "pwd"}', tools=OPENAI_TOOLS
    ) as stream:
        streamed_call = stream.get_final_response().output[0]
    schema = {
        "type": "json_schema",
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": False,
        },
    }
    structured = client.responses.create(
        model="gpt-sdk", input="json please", text={"format": schema}
    )
    with_logprobs = client.responses.create(
        model="gpt-sdk", input="two words", include=["message.output_text.logprobs"], top_logprobs=2
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-sdk", input="x", previous_response_id="resp_1")
    return {
        "plain": plain.output_text,
        "model": plain.model,
        "call": (call.type, call.name, json.loads(call.arguments)),
        "final": final.output_text,
        "deltas": "".join(deltas),
        "streamed_call": (streamed_call.name, json.loads(streamed_call.arguments)),
        "structured": json.loads(structured.output_text),
        "logprobs": [len(lp.top_logprobs) for lp in with_logprobs.output[0].content[0].logprobs],
        "usage": final.usage.total_tokens if final.usage else 0,
        "refused": refused.value.message,
    }


def _messages_round(base_url: str, *, api_key: bool = True, token: str = TOKEN) -> dict[str, Any]:
    """What a Claude-Code-style loop does, with ``api_key`` or ``auth_token``."""
    if api_key:
        client = anthropic.Anthropic(base_url=base_url, api_key=token, max_retries=0, timeout=20)
    else:
        client = anthropic.Anthropic(base_url=base_url, auth_token=token, max_retries=0, timeout=20)
    plain = client.messages.create(
        model="claude-sdk", max_tokens=64, messages=[{"role": "user", "content": "hi claude"}]
    )
    ask = {"role": "user", "content": 'call bash {"command": "ls"}'}
    first = client.messages.create(
        model="claude-sdk", max_tokens=64, tools=ANTHROPIC_TOOLS, messages=[ask]
    )
    use = first.content[0]
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}],
    }
    history = [ask, {"role": "assistant", "content": first.content}, result]
    with client.messages.stream(
        model="claude-sdk", max_tokens=64, tools=ANTHROPIC_TOOLS, messages=history
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    with client.messages.stream(
        model="claude-sdk", max_tokens=64, tools=ANTHROPIC_TOOLS, messages=[ask]
    ) as stream:
        streamed_use = stream.get_final_message().content[0]
    counted = client.messages.count_tokens(
        model="claude-sdk", messages=[{"role": "user", "content": "hi claude"}]
    )
    beta = client.beta.messages.create(
        model="claude-sdk",
        max_tokens=8,
        messages=[{"role": "user", "content": "beta"}],
        betas=["token-efficient-tools-2025-02-19"],
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="claude-sdk",
            max_tokens=8,
            service_tier="auto",
            messages=[{"role": "user", "content": "x"}],
        )
    return {
        "plain": plain.content[0].text if plain.content[0].type == "text" else None,
        "model": plain.model,
        "plain_input": plain.usage.input_tokens,
        "use": (first.stop_reason, use.type, use.name, use.input),
        "final": (text, final.stop_reason, final.usage.output_tokens > 0),
        "streamed_use": (streamed_use.type, streamed_use.input),
        "counted": counted.input_tokens,
        "beta": beta.content[0].text,
        "refused": refused.value.message,
    }


def _check_responses(got: dict[str, Any]) -> None:
    assert got["plain"] == "hello world" and got["model"] == "gpt-sdk"
    assert got["call"] == ("function_call", "bash", {"command": "ls"})
    assert got["final"] == got["deltas"] == "tool result: a.txt b.txt"
    assert got["streamed_call"] == ("bash", {"command": "pwd"})
    assert got["structured"] == {"a": "json please"}
    assert got["logprobs"] == [2, 2] and got["usage"] > 0
    assert "previous_response_id" in got["refused"]


def _check_messages(got: dict[str, Any]) -> None:
    assert got["plain"] == "hi claude" and got["model"] == "claude-sdk"
    assert got["use"] == ("tool_use", "tool_use", "bash", {"command": "ls"})
    assert got["final"] == ("tool result: a.txt", "end_turn", True)
    assert got["streamed_use"] == ("tool_use", {"command": "ls"})
    assert got["counted"] == got["plain_input"]
    assert got["beta"] == "beta"
    assert "service_tier" in got["refused"]


async def test_official_clients_on_the_echo_model(start_bridge: StartBridge) -> None:
    handle = await start_bridge(model="rollbridge/echo")
    url = handle.rollout_url("sdk")
    with trio.fail_after(60):
        _check_responses(await trio.to_thread.run_sync(_responses_round, url))
        _check_messages(await trio.to_thread.run_sync(_messages_round, url))
        _check_messages(await trio.to_thread.run_sync(lambda: _messages_round(url, api_key=False)))
    usage = handle.ledger.get("sdk")
    # 6 Responses calls, 5 Messages calls per round (refusals and count_tokens add nothing).
    assert usage is not None and usage.calls == 6 + 2 * 5


def _native_responses(base_url: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    plain = client.responses.create(model="gpt-sdk", input="hi")
    with client.responses.stream(model="gpt-sdk", input="hi") as stream:
        streamed = stream.get_final_response()
    return plain.output_text, streamed.output_text


def _native_messages(base_url: str) -> tuple[str, str, int]:
    claude = anthropic.Anthropic(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    hi = [{"role": "user", "content": "hi"}]
    with claude.messages.stream(model="claude-sdk", max_tokens=8, messages=hi) as stream:
        message = stream.get_final_message()
    counted = claude.messages.count_tokens(model="claude-sdk", messages=hi)
    return message.content[0].text, message.model, counted.input_tokens


async def test_official_clients_on_native_upstreams(
    start_bridge: StartBridge, fake: ApiUpstream
) -> None:
    openai_bridge = await start_bridge(
        model="openai/gpt-native", retry=FAST, apis=ApiOptions(responses="native")
    )
    claude_bridge = await start_bridge(model="anthropic/claude-native", retry=FAST)
    with trio.fail_after(60):
        plain, streamed = await trio.to_thread.run_sync(
            _native_responses, openai_bridge.rollout_url("o")
        )
        text, model, counted = await trio.to_thread.run_sync(
            _native_messages, claude_bridge.rollout_url("o")
        )
    assert plain == streamed == "native: hi"
    assert (text, model, counted) == ("native: hi", "claude-sdk", 42)
    usage = claude_bridge.ledger.get("o")
    assert usage is not None and (usage.calls, usage.total_tokens) == (1, 105)
    # Mid-stream provider errors (after retries could no longer help) raise in each SDK.
    fake.faults.extend(["midstream", "midstream"])
    bridges: dict[str, BridgeHandle] = {"openai": openai_bridge, "anthropic": claude_bridge}

    def both() -> tuple[str, str]:
        first, _ = _mid_stream_errors_one(bridges["openai"].rollout_url("e"), "openai")
        _, second = _mid_stream_errors_one(bridges["anthropic"].rollout_url("e"), "anthropic")
        return first, second

    with trio.fail_after(60):
        openai_message, anthropic_message = await trio.to_thread.run_sync(both)
    assert "boom" in openai_message and "Overloaded" in anthropic_message


def _mid_stream_errors_one(base_url: str, which: str) -> tuple[str, str]:
    if which == "openai":
        client = openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
        with (
            pytest.raises(openai.APIError) as caught,
            client.responses.stream(model="gpt-sdk", input="hi") as stream,
        ):
            stream.get_final_response()
        return caught.value.message, ""
    claude = anthropic.Anthropic(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    hi = [{"role": "user", "content": "hi"}]
    with (
        pytest.raises(anthropic.APIStatusError) as error,
        claude.messages.stream(model="claude-sdk", max_tokens=8, messages=hi) as stream,
    ):
        stream.get_final_message()
    return "", error.value.message


@pytest.mark.timeout(90)
def test_official_clients_against_bridge_serve() -> None:
    """``rollbridge bridge serve`` on a real port: the rollout URL and the plain daemon paths."""
    proc = _serve("--model", "rollbridge/echo", "--json")
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        url, token = ready["url"], ready["token"]
        _check_responses(_responses_round(f"{url}/v1/rollouts/ide", token=token))
        _check_messages(_messages_round(f"{url}/v1/rollouts/ide", token=token))
        # The daemon's plain paths: the usage bucket named by a header.
        header = {"X-Rollbridge-Rollout-Id": "plain"}
        _check_responses(_responses_round(f"{url}/v1", header, token=token))

        usage = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {token}"}).json()
        assert usage["rollouts"]["ide"]["calls"] == 6 + 5
        assert usage["rollouts"]["plain"]["calls"] == 6
    finally:
        _stop(proc)


def _chat_echo_round(base_url: str) -> dict[str, Any]:
    """The echo model on the chat route: tool calls (streamed and not), JSON, logprobs."""
    client = openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": BASH_SCHEMA}}]
    ask = [{"role": "user", "content": 'call bash {"command": "ls"}'}]
    called = client.chat.completions.create(model="m", messages=ask, tools=tools)
    stream = client.chat.completions.create(model="m", messages=ask, tools=tools, stream=True)
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in stream
        if c.choices and c.choices[0].delta.tool_calls
    )
    as_json = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_object"},
    )
    scored = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "two words"}],
        logprobs=True,
        top_logprobs=3,
    )
    call = (called.choices[0].message.tool_calls or [])[0]
    logprobs = scored.choices[0].logprobs
    return {
        "call": (called.choices[0].finish_reason, call.function.name, call.function.arguments),
        "streamed": json.loads(arguments),
        "json": json.loads(as_json.choices[0].message.content or ""),
        "logprobs": [len(t.top_logprobs) for t in (logprobs.content or [])] if logprobs else [],
    }


async def test_echo_model_on_the_chat_route(start_bridge: StartBridge) -> None:
    handle = await start_bridge(model="rollbridge/echo")
    with trio.fail_after(60):
        got = await trio.to_thread.run_sync(_chat_echo_round, handle.rollout_url("chat"))
    assert got["call"] == ("tool_calls", "bash", '{"command": "ls"}')
    assert got["streamed"] == {"command": "ls"}
    assert got["json"] == {"echo": "hi"}
    assert got["logprobs"] == [3, 3]


def _lists_and_lookups(base_url: str) -> dict[str, Any]:
    """The calls besides a model call: both SDKs' model lists, and what openai's stored-response
    methods get from a stateless bridge (a 404 saying why, in OpenAI's shape)."""
    client = openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    claude = anthropic.Anthropic(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    found: dict[str, Any] = {
        "openai": [m.id for m in client.models.list()],
        "anthropic": [m.id for m in claude.models.list()],
    }
    for name, call in (
        ("retrieve", lambda: client.responses.retrieve("resp_1")),
        ("cancel", lambda: client.responses.cancel("resp_1")),
        ("delete", lambda: client.responses.delete("resp_1")),
        ("input_items", lambda: list(client.responses.input_items.list("resp_1"))),
    ):
        try:
            call()
        except openai.NotFoundError as exc:
            found[name] = exc.message
    wrong = openai.OpenAI(base_url=base_url, api_key="wrong-token", max_retries=0, timeout=20)
    try:
        wrong.models.list()
    except openai.AuthenticationError:
        found["wrong token"] = 401
    return found


async def test_model_lists_and_stored_response_lookups(start_bridge: StartBridge) -> None:
    handle = await start_bridge(model="rollbridge/echo")
    with trio.fail_after(60):
        found = await trio.to_thread.run_sync(_lists_and_lookups, handle.rollout_url("sdk"))
    assert found.pop("openai") == found.pop("anthropic") == ["rollbridge/echo"]
    assert found.pop("wrong token") == 401
    assert set(found) == {"retrieve", "cancel", "delete", "input_items"}
    assert all("The bridge is stateless" in message for message in found.values()), found
    usage = handle.ledger.get("sdk")
    assert usage is None or usage.calls == 0
