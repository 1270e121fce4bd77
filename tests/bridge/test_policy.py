"""The request policy as plain functions (docs/spec/bridge.md §2–§5)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.errors import BridgeRequestError
from bridge.policy import (
    InvalidBody,
    blocked_fields,
    check_auth,
    is_stream,
    parse_body,
    prepare,
    response_model,
    valid_rollout_id,
)

HI = [{"role": "user", "content": "hi"}]


def reject(body: dict[str, Any]) -> str:
    with pytest.raises(BridgeRequestError) as info:
        prepare(body)
    assert info.value.status == 400
    return info.value.message


@pytest.mark.parametrize("header", ["Bearer tok", "bearer tok", "BEARER tok"])
def test_auth_accepts_any_scheme_case(header: str) -> None:
    assert check_auth(header, "tok")


@pytest.mark.parametrize(
    "header", [None, "", "Bearer wrong", "Bearer  tok", "Basic tok", "tok", "Bearer", "Bearer tok "]
)
def test_auth_rejects(header: str | None) -> None:
    assert not check_auth(header, "tok")


@pytest.mark.parametrize("rid", ["r1", "9f00aa", "a.b", "run-1_x"])
def test_valid_rollout_ids(rid: str) -> None:
    assert valid_rollout_id(rid)


@pytest.mark.parametrize("rid", ["", ".", "..", "a\\b", "a/b", "a\x00b", "c:x"])
def test_invalid_rollout_ids(rid: str) -> None:
    # "c:x" is one segment on posix but a drive-relative path on Windows: the protocol's floor
    # rejects it for both.
    assert not valid_rollout_id(rid)


@pytest.mark.parametrize("raw", [b"{not json", b"[1,2]", b"", b"null", b'"x"'])
def test_body_must_be_an_object(raw: bytes) -> None:
    with pytest.raises(InvalidBody):
        parse_body(raw)


@pytest.mark.parametrize(
    ("value", "streams"),
    [
        (True, True),
        ("yes", True),
        ("false", True),
        (0, False),
        (False, False),
        (None, False),
        ("", False),
    ],
)
def test_stream_is_truthiness_of_top_level(value: Any, streams: bool) -> None:
    assert is_stream({"stream": value}) is streams
    assert not is_stream({"extra_body": {"stream": True}})


def test_model_is_echoed_or_configured() -> None:
    assert response_model({"model": "placeholder"}, "openai/x") == "placeholder"
    assert response_model({}, "openai/x") == "openai/x"
    assert response_model({"model": ""}, "openai/x") == "openai/x"


def test_envelope_fields_are_not_forwarded() -> None:
    prepared = prepare(
        {
            "model": "placeholder",
            "messages": HI,
            "temperature": 0.3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "metadata": {"a": 1},
        }
    )
    assert prepared.messages == HI
    assert prepared.params == {"temperature": 0.3, "metadata": {"a": 1}}


def test_missing_messages_become_empty_list() -> None:
    assert prepare({}).messages == []


def test_extra_body_merges_recursively_and_wins() -> None:
    prepared = prepare(
        {
            "model": "m",
            "messages": HI,
            "temperature": 0.1,
            "metadata": {"a": 1, "b": {"x": 1}},
            "extra_body": {
                "temperature": 0.9,
                "metadata": {"b": {"y": 2}, "c": 3},
                "messages": [{"role": "user", "content": "IGNORED"}],
                "model": "other",
                "stream": True,
            },
        }
    )
    assert prepared.messages == HI
    assert prepared.params == {
        "temperature": 0.9,
        "metadata": {"a": 1, "b": {"x": 1, "y": 2}, "c": 3},
    }


@pytest.mark.parametrize("extra", [[1], "x", 3])
def test_extra_body_must_be_an_object(extra: Any) -> None:
    assert reject({"extra_body": extra}) == "extra_body must be a JSON object"


def test_null_extra_body_is_absent() -> None:
    assert prepare({"messages": HI, "extra_body": None}).params == {}


def test_nested_extra_body() -> None:
    assert (
        reject({"extra_body": {"extra_body": {}}}) == "extra_body cannot contain another extra_body"
    )
    assert (
        reject({"extra_body": {"extra_body": {}, "api_key": "x"}})
        == "Request fields cannot override eval bridge configuration: api_key"
    )


@pytest.mark.parametrize("body", [{"n": 2}, {"n": 1, "extra_body": {"n": 2}}, {"n": "1"}, {"n": 0}])
def test_n_must_be_one(body: dict[str, Any]) -> None:
    assert reject(body) == "The eval bridge supports only n=1"


@pytest.mark.parametrize("n", [None, 1, 1.0, True])
def test_n_accepted(n: Any) -> None:
    assert "n" not in prepare({"n": n}).params


def test_n_is_checked_before_blocked_fields() -> None:
    assert reject({"n": 2, "api_key": "x"}) == "The eval bridge supports only n=1"


def test_every_blocked_field_is_listed_sorted() -> None:
    body = {
        name: 1
        for name in [
            "base_url",
            "api_key",
            "timeout",
            "num_retries",
            "_x",
            "litellm_foo",
            "aws_region_name",
            "models",
            "preset",
            "usage",
            "system",
            "prompt",
            "extra_headers",
            "mock_response",
        ]
    }
    assert reject(body) == (
        "Request fields cannot override eval bridge configuration: _x, api_key, "
        "aws_region_name, base_url, extra_headers, litellm_foo, mock_response, models, "
        "num_retries, preset, prompt, system, timeout, usage"
    )


def test_blocked_fields_inside_extra_body() -> None:
    assert reject({"extra_body": {"api_base": "http://evil", "vertex_project": "p"}}) == (
        "Request fields cannot override eval bridge configuration: api_base, vertex_project"
    )


@pytest.mark.parametrize(
    "name",
    [
        "watsonx_x", "sagemaker_x", "oci_x", "wx_x", "s3_x", "azure_x", "vertex_x", "litellm_x", "_x",
        "aws_x", "order", "tags", "id", "headers", "input", "contents", "system_instruction",
        "allowed_openai_params", "drop_params", "callbacks", "mock_delay", "api_base", "api_version",
        "organization", "token", "client_id", "client_secret", "custom_llm_provider", "fallbacks",
        "max_retries", "request_timeout", "stream_timeout", "input_cost_per_token", "guardrails",
        "cache", "verbose", "project", "region_name", "anthropic-workspace-id", "systemInstruction",
        "inputText", "user_agent", "ssl_verify", "default_headers", "success_callback",
        "service_tier", "inference_geo",
    ],
)  # fmt: skip
def test_blocked_names(name: str) -> None:
    assert reject({name: 1}) == f"Request fields cannot override eval bridge configuration: {name}"


ALLOWED = [
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "user", "tools",
    "tool_choice", "parallel_tool_calls", "response_format", "logprobs", "top_logprobs",
    "logit_bias", "presence_penalty", "frequency_penalty", "reasoning_effort", "reasoning",
    "thinking", "provider", "transforms", "route", "plugins", "include_reasoning", "top_k", "min_p",
    "top_a", "repetition_penalty", "verbosity", "modalities", "audio", "prediction",
    "web_search_options", "store", "safety_identifier", "prompt_cache_key",
    "metadata", "functions", "function_call", "text", "instructions", "previous_response_id",
    "truncation", "include", "extra_query", "user_id", "session_id", "made_up_field",
]  # fmt: skip


def test_no_allowlist_only_a_blocklist() -> None:
    assert blocked_fields(dict.fromkeys(ALLOWED, 1)) == []
    assert prepare(dict.fromkeys(ALLOWED, 1)).params == dict.fromkeys(ALLOWED, 1)


def test_only_top_level_keys_are_inspected() -> None:
    assert prepare({"provider": {"order": ["a"]}}).params == {"provider": {"order": ["a"]}}
