"""The Responses and Messages translators, policies and usage normalization, as pure functions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.apis import messages, responses
from bridge.apis.errors import dialect_error
from bridge.apis.policy import MESSAGES, RESPONSES, check, without_defaults
from bridge.apis.usage import StreamedMessagesUsage, from_messages, normalize
from bridge.errors import BridgeRequestError
from bridge.policy import PreparedRequest, prepare
from bridge.upstreams.echo_plan import minimal, plan
from bridge.usage import CallUsage, RolloutUsage


def refusal(policy: Any, body: dict[str, Any], hosted: tuple[str, ...] = ()) -> str:
    with pytest.raises(BridgeRequestError) as caught:
        check(policy, body, hosted)
    assert caught.value.status == 400
    return caught.value.message


@pytest.mark.parametrize(
    "field", ["previous_response_id", "conversation", "background", "prompt", "service_tier"]
)
def test_responses_refuses_stateful_and_billing_fields(field: str) -> None:
    assert f"'{field}'" in refusal(RESPONSES, {"input": "x", field: "v"})


def test_responses_store_must_be_false() -> None:
    assert "'store' must be false" in refusal(RESPONSES, {"input": "x", "store": True})
    check(RESPONSES, {"input": "x", "store": False})


@pytest.mark.parametrize("field", ["container", "mcp_servers", "service_tier", "inference_geo"])
def test_messages_refuses_egress_and_billing_fields(field: str) -> None:
    assert f"'{field}'" in refusal(MESSAGES, {"messages": [], field: {}})


def test_core_fields_are_not_blocked_on_their_own_route() -> None:
    # `input` and `system` are in the chat-shaped blocked list; here they are the prompt.
    check(RESPONSES, {"input": "x", "instructions": "be brief", "text": {}, "include": []})
    check(MESSAGES, {"system": "be brief", "messages": [], "metadata": {"user_id": "u"}})
    assert "api_key" in refusal(RESPONSES, {"input": "x", "api_key": "k"})
    assert "system" in refusal(RESPONSES, {"input": "x", "system": "s"})
    assert "input" in refusal(MESSAGES, {"messages": [], "input": "s"})


@pytest.mark.parametrize(
    ("policy", "tool"),
    [
        (RESPONSES, {"type": "web_search"}),
        (RESPONSES, {"type": "web_search_preview"}),
        (RESPONSES, {"type": "file_search"}),
        (RESPONSES, {"type": "code_interpreter"}),
        (RESPONSES, {"type": "mcp", "server_url": "https://x"}),
        (RESPONSES, {"type": "a_hosted_tool_invented_tomorrow"}),
        (MESSAGES, {"type": "web_search_20250305", "name": "web_search"}),
        (MESSAGES, {"type": "web_fetch_20250910", "name": "web_fetch"}),
        (MESSAGES, {"type": "code_execution_20250825", "name": "code_execution"}),
    ],
)
def test_hosted_tools_are_refused_unless_granted(policy: Any, tool: dict[str, Any]) -> None:
    assert f"'{tool['type']}'" in refusal(policy, {"tools": [tool]})
    granted = tool["type"].split("_20")[0]
    check(policy, {"tools": [tool]}, (granted,))


def test_client_tools_pass() -> None:
    check(
        RESPONSES,
        {
            "tools": [
                {"type": "function", "name": "f"},
                {"type": "custom", "name": "c"},
                {"type": "local_shell"},
                {"type": "computer_use_preview"},
            ]
        },
    )
    check(
        MESSAGES,
        {
            "tools": [
                {"name": "f", "input_schema": {}},
                {"type": "bash_20250124"},
                {"type": "text_editor_20250728", "name": "e"},
            ]
        },
    )


def test_chat_route_refuses_service_tier() -> None:
    with pytest.raises(BridgeRequestError, match="service_tier"):
        prepare({"messages": [], "service_tier": "priority"})


def test_responses_request_to_chat() -> None:
    body = {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "dev"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "max_output_tokens": 50,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "custom_param": 1,
    }
    chat = responses.to_chat(body)
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    assert [c["id"] for c in chat["messages"][3]["tool_calls"]] == ["c1", "c2"]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["max_completion_tokens"] == 50
    assert chat["response_format"]["json_schema"]["name"] == "s"
    assert chat["reasoning_effort"] == "low"
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2
    assert chat["custom_param"] == 1
    assert "input" not in chat and "include" not in chat


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
        ({"input": "x", "tools": [{"type": "custom", "name": "c"}]}, "custom"),
        ({"input": "x", "include": ["file_search_call.results"]}, "file_search_call.results"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "max_tool_calls": 3}, "max_tool_calls"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input_file"),
    ],
)
def test_responses_what_cannot_be_carried_is_named(body: dict[str, Any], named: str) -> None:
    with pytest.raises(BridgeRequestError, match=named):
        responses.to_chat(body)


def test_messages_request_to_chat() -> None:
    body = {
        "model": "claude",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "ok"}],
                    },
                    {"type": "text", "text": "next"},
                ],
            },
        ],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u1"},
        "top_k": 5,
    }
    chat = messages.to_chat(body)
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert chat["messages"][2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "ok"}
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"] and chat["user"] == "u1" and chat["top_k"] == 5
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}


def test_a_failed_tool_result_says_so_to_a_chat_upstream() -> None:
    """``is_error: true`` has no chat field: it is carried in the tool message's text."""

    def result(**fields: Any) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": "t1", **fields}
        return {"max_tokens": 8, "messages": [{"role": "user", "content": [block]}]}

    def tool_text(**fields: Any) -> Any:
        return messages.to_chat(result(**fields))["messages"][0]["content"]

    assert tool_text(content="exit 1", is_error=True) == "Error: exit 1"
    assert tool_text(content=[{"type": "text", "text": "boom"}], is_error=True) == "Error: boom"
    assert tool_text(is_error=True) == "Error"
    assert tool_text(content="fine", is_error=False) == "fine"
    assert tool_text(content="fine") == "fine"


def test_messages_needs_max_tokens_and_refuses_uncarried_tools() -> None:
    with pytest.raises(BridgeRequestError, match="max_tokens"):
        messages.to_chat({"messages": []})
    with pytest.raises(BridgeRequestError, match="bash_20250124"):
        messages.to_chat({"max_tokens": 1, "messages": [], "tools": [{"type": "bash_20250124"}]})


def test_anthropic_usage_counts_the_cache_in_the_prompt() -> None:
    usage = {
        "input_tokens": 10,
        "cache_read_input_tokens": 60,
        "cache_creation_input_tokens": 30,
        "output_tokens": 5,
    }
    call = from_messages(usage)
    assert call == CallUsage(
        prompt_tokens=100,
        completion_tokens=5,
        total_tokens=105,
        cached_tokens=60,
        cache_write_tokens=30,
    )
    # The same numbers synthesized back in the dialect.
    assert messages.usage_json(call) == usage
    total = RolloutUsage(0, 0, 0, 0, None, None, 0).plus(call)
    assert total.max_context_tokens == 105 and total.to_json()["cache_write_tokens"] == 30


def test_responses_usage_and_chat_usage_normalize_alike() -> None:
    responses_usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 5},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 107,
    }
    chat_usage = {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "total_tokens": 107,
        "prompt_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 5},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    expected = CallUsage(100, 7, 107, cached_tokens=40, reasoning_tokens=2, cache_write_tokens=5)
    assert normalize("responses", responses_usage) == normalize("chat", chat_usage) == expected


def test_streamed_anthropic_usage_is_a_running_total() -> None:
    tally = StreamedMessagesUsage()
    tally.event(
        {
            "type": "message_start",
            "message": {
                "usage": {"input_tokens": 10, "cache_read_input_tokens": 60, "output_tokens": 1}
            },
        }
    )
    tally.event({"type": "message_delta", "usage": {"output_tokens": 3}})
    tally.event({"type": "message_delta", "usage": {"output_tokens": 5}})
    assert tally.call() == CallUsage(70, 5, 75, cached_tokens=60)


def _echo(messages_: list[dict[str, Any]], **params: Any) -> Any:
    return plan(messages_, params)


BASH = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def test_echo_tool_calls_follow_directives() -> None:
    asked = [{"role": "user", "content": 'please\ncall bash {"command": "ls"}\ncall bash'}]
    answer = _echo(asked, tools=BASH)
    assert [(n, json.loads(a)) for _, n, a in answer.calls] == [
        ("bash", {"command": "ls"}),
        ("bash", {"command": ""}),
    ]
    assert answer.finish_reason == "tool_calls" and answer.text == ""
    assert _echo(asked).calls == []  # no tools offered: the text is echoed
    assert _echo(asked, tools=BASH, tool_choice="none").calls == []
    forced = _echo([{"role": "user", "content": "hi"}], tools=BASH, tool_choice="required")
    assert [n for _, n, _ in forced.calls] == ["bash"]
    result = _echo([*asked, {"role": "tool", "tool_call_id": "x", "content": "a.txt"}], tools=BASH)
    assert result.text == "tool result: a.txt" and result.calls == []


def test_echo_json_modes() -> None:
    hi = [{"role": "user", "content": "hi"}]
    assert json.loads(_echo(hi, response_format={"type": "json_object"}).text) == {"echo": "hi"}
    schema = {
        "type": "object",
        "required": ["name", "n", "kind", "tags"],
        "properties": {
            "name": {"type": "string"},
            "n": {"type": "integer", "minimum": 3},
            "kind": {"enum": ["a", "b"]},
            "tags": {"type": "array"},
        },
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    assert json.loads(_echo(hi, response_format=fmt).text) == {
        "name": "hi",
        "n": 3,
        "kind": "a",
        "tags": [],
    }
    assert minimal({"anyOf": [{"type": "boolean"}]}) is False


def test_prepared_request_reaches_the_echo_plan() -> None:
    prepared = PreparedRequest([{"role": "user", "content": "x"}], {"logprobs": True})
    assert plan(prepared.messages, prepared.params).text == "x"


def test_tool_outputs_carry_text_parts_and_refuse_the_rest() -> None:
    def output(value: Any) -> dict[str, Any]:
        return {"input": [{"type": "function_call_output", "call_id": "c", "output": value}]}

    parts = [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]
    assert responses.to_chat(output(parts))["messages"][0]["content"] == "ab"
    with pytest.raises(BridgeRequestError, match="input_image"):
        responses.to_chat(output([{"type": "input_image", "image_url": "data:x"}]))


def test_tool_settings_without_tools_are_not_sent_to_a_chat_api() -> None:
    chat = responses.to_chat({"input": "x", "tool_choice": "auto", "parallel_tool_calls": True})
    assert "tool_choice" not in chat and "parallel_tool_calls" not in chat
    chat = messages.to_chat({"max_tokens": 1, "messages": [], "tool_choice": {"type": "auto"}})
    assert "tool_choice" not in chat


def test_chat_carried_over_responses_with_tools() -> None:
    from bridge.apis.chat_responses import ChunkStream, to_completion, to_responses

    prepared = PreparedRequest(
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "reasoning_effort": "high",
            "response_format": {"type": "json_object"},
        },
    )
    body = to_responses(prepared, "o1-pro", stream=False)
    assert body["instructions"] == "sys" and body["store"] is False
    assert [i.get("type", "message") for i in body["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert body["tools"] == [{"type": "function", "name": "f", "parameters": {}}]
    assert body["tool_choice"] == {"type": "function", "name": "f"}
    assert body["reasoning"] == {"effort": "high"}
    assert body["text"] == {"format": {"type": "json_object"}}
    call = {"type": "function_call", "id": "fc_1", "call_id": "c2", "name": "f", "arguments": "{}"}
    response = {"id": "r", "status": "completed", "output": [call], "usage": {"input_tokens": 3}}
    completion = to_completion(response)
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert completion["choices"][0]["message"]["tool_calls"][0]["id"] == "c2"
    stream = ChunkStream()
    events = [
        {"type": "response.created", "response": {"id": "r"}},
        {"type": "response.output_item.added", "item": {**call, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": "{}"},
        {"type": "response.completed", "response": response},
    ]
    chunks = [c for e in events for c in stream.event(e)]
    assert chunks[0]["choices"][0]["delta"]["tool_calls"][0]["id"] == "c2"
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert chunks[2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[3]["usage"] == {"input_tokens": 3}
    with pytest.raises(BridgeRequestError, match="'seed'"):
        to_responses(PreparedRequest([], {"seed": 1}), "o1-pro", stream=False)


def test_fields_set_to_their_default_are_dropped_not_refused() -> None:
    body = {
        "input": "hi",
        "background": False,
        "service_tier": None,
        "prompt": None,
        "previous_response_id": None,
        "temperature": None,
    }
    kept = without_defaults(RESPONSES, body)
    assert kept == {"input": "hi", "temperature": None}
    check(RESPONSES, kept)
    assert "background" in refusal(RESPONSES, {"input": "hi", "background": True})
    assert "service_tier" in refusal(RESPONSES, {"input": "hi", "service_tier": "priority"})
    msg = {"messages": [], "max_tokens": 5, "service_tier": None, "inference_geo": None}
    assert without_defaults(MESSAGES, msg) == {"messages": [], "max_tokens": 5}
    plain = {"input": "hi"}
    assert without_defaults(RESPONSES, plain) is plain


def test_messages_errors_keep_only_anthropic_s_own_types() -> None:
    # A translated call's OpenAI-shaped provider: the type follows the status.
    openai_429 = '{"error": {"type": "requests", "message": "slow down"}}'
    assert json.loads(dialect_error("messages", 429, openai_429)) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    openai_500 = '{"error": {"type": "server_error", "message": "oops"}}'
    assert json.loads(dialect_error("messages", 502, openai_500))["error"]["type"] == "api_error"
    # Anthropic's own type is kept (a 529 the rollout sees as 502 is still overloaded).
    native = '{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}'
    assert json.loads(dialect_error("messages", 502, native))["error"] == {
        "type": "overloaded_error",
        "message": "busy",
    }


def test_responses_errors_keep_the_provider_s_type_code_and_param() -> None:
    quota = (
        '{"error": {"type": "insufficient_quota", "code": "insufficient_quota", '
        '"param": null, "message": "You exceeded your current quota"}}'
    )
    error = json.loads(dialect_error("responses", 429, quota, 429))["error"]
    assert error == {
        "message": "You exceeded your current quota",
        "type": "insufficient_quota",
        "code": "insufficient_quota",
    }
    # The bridge's own refusals keep the documented shape.
    own = json.loads(dialect_error("responses", 400, "Request field 'x' is not accepted"))
    assert own["error"] == {
        "message": "Request field 'x' is not accepted",
        "type": "invalid_request_error",
        "code": 400,
    }
