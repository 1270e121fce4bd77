"""Model preflight: which failures stop a run (docs/spec/supervisor.md §2.8, docs/spec/bridge.md §13)."""

from __future__ import annotations

import pytest
import trio

from bridge import OFFLINE_MODEL, PreflightError, preflight
from bridge.preflight import unsendable_credential
from bridge.retry import RetryPolicy
from tests.bridge.scripted import Reply, Scripted

pytestmark = pytest.mark.timeout(120)


async def test_offline_model_passes() -> None:
    with trio.fail_after(10):
        assert await preflight(OFFLINE_MODEL) is None


async def test_probe_request(scripted: Scripted) -> None:
    scripted.reply(
        Reply(
            200, {"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}]}
        )
    )
    with trio.fail_after(20):
        assert await preflight("openai/test-model") is None
    assert scripted.requests[-1] == {
        "model": "test-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 256,
    }


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (400, "BadRequestError"),
        (401, "AuthenticationError"),
        (403, "PermissionDeniedError"),
        (404, "NotFoundError"),
        (422, "UnprocessableEntityError"),
    ],
)
async def test_fatal_statuses(scripted: Scripted, status: int, name: str) -> None:
    scripted.reply(Reply(status, '{"error":{"message":"sk-abcdefghijklmnopqrstuvwxyz rejected"}}'))
    with trio.fail_after(20), pytest.raises(PreflightError) as info:
        await preflight("openai/test-model")
    message = str(info.value)
    assert message.startswith(f"model preflight failed for 'openai/test-model': {name}: ")
    assert "sk-abc" not in message


async def test_rate_limit_is_healthy(scripted: Scripted) -> None:
    scripted.reply(Reply(429, "slow down"))
    with trio.fail_after(20):
        assert await preflight("openai/test-model") is None


@pytest.mark.parametrize(
    ("status", "name"),
    [(500, "InternalServerError"), (502, "BadGatewayError"), (503, "ServiceUnavailableError")],
)
async def test_a_lasting_server_error_is_a_warning(
    scripted: Scripted, status: int, name: str
) -> None:
    """A 502 the provider (or its gateway) answered is a server error like the others; only a
    provider that cannot be reached at all stops the run."""
    scripted.reply(Reply(status, "internal"))
    with trio.fail_after(20):
        warning = await preflight("openai/test-model", retry=QUICK)
    assert warning is not None
    assert warning.startswith(f"Preflight non-fatal error: {name}: ")
    assert warning.endswith("(after 6 attempts)") and len(scripted.requests) == 6


#: The rollout calls' policy with short waits, so a test of its retries takes no time.
QUICK = RetryPolicy(base_delay=0.01, max_delay=0.02)


async def test_unreachable_provider_is_fatal_after_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    retries: list[str] = []
    with trio.fail_after(20), pytest.raises(PreflightError, match="APIConnectionError") as info:
        await preflight("openai/test-model", retry=QUICK, on_retry=retries.append)
    assert str(info.value).endswith("(after 6 attempts)")
    assert (
        retries == ["retrying the model preflight after a provider fault: APIConnectionError"] * 5
    )


@pytest.mark.parametrize("status", [502, 503, 500])
async def test_one_transient_fault_is_retried_and_passes(scripted: Scripted, status: int) -> None:
    """Issue 27 item 11: one 5xx at start no longer stops (or warns about) the run."""
    ok = Reply(
        200, {"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}]}
    )
    scripted.reply(Reply(status, "bad gateway"), ok)
    retries: list[str] = []
    with trio.fail_after(20):
        assert await preflight("openai/test-model", retry=QUICK, on_retry=retries.append) is None
    assert len(scripted.requests) == 2 and len(retries) == 1


async def test_a_rate_limit_is_not_retried(scripted: Scripted) -> None:
    scripted.reply(Reply(429, "slow down"))
    with trio.fail_after(20):
        assert await preflight("openai/test-model", retry=QUICK) is None
    assert len(scripted.requests) == 1


async def test_a_fatal_answer_is_not_retried(scripted: Scripted) -> None:
    scripted.reply(Reply(401, "bad key"))
    with trio.fail_after(20), pytest.raises(PreflightError, match="AuthenticationError"):
        await preflight("openai/test-model", retry=QUICK)
    assert len(scripted.requests) == 1


async def test_missing_key_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with trio.fail_after(20), pytest.raises(PreflightError, match="OPENAI_API_KEY is not set"):
        await preflight("openai/test-model")


async def test_invalid_model_format() -> None:
    with trio.fail_after(60), pytest.raises(PreflightError) as info:
        await preflight("bogusmodel")
    message = str(info.value)
    assert message.startswith("model preflight failed for 'bogusmodel': ")
    assert "Invalid LiteLLM model format" in message
    assert "Received: 'bogusmodel'" in message


async def test_litellm_path_auth_failure_is_fatal(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.bridge.scripted import run_scripted

    upstream: Scripted = await nursery.start(run_scripted, Scripted())
    upstream.reply(
        Reply(
            401, {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}
        )
    )
    monkeypatch.setenv("ANTHROPIC_API_BASE", upstream.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-0123456789abcdef")
    with trio.fail_after(60), pytest.raises(PreflightError, match="AuthenticationError"):
        await preflight("anthropic/claude-sonnet-4-6")


async def test_litellm_path_rate_limit_passes(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.bridge.scripted import run_scripted

    upstream: Scripted = await nursery.start(run_scripted, Scripted())
    upstream.reply(
        Reply(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "busy"}})
    )
    monkeypatch.setenv("ANTHROPIC_API_BASE", upstream.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-0123456789abcdef")
    with trio.fail_after(60):
        assert await preflight("anthropic/claude-sonnet-4-6") is None


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("openai/test-model", "OPENAI_API_KEY"),
        ("openrouter/vendor/model", "OR_API_KEY"),
        ("anthropic/claude-sonnet-4-6", "ANTHROPIC_API_KEY"),
    ],
)
async def test_a_non_ascii_key_is_fatal_and_named_not_shown(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, model: str, name: str
) -> None:
    # Before the fix this was a "non-fatal" warning, and every rollout then failed.
    value = "sk-\u201cpasted-key-0123456789\u201d"
    monkeypatch.setenv(name, value)
    with trio.fail_after(20), pytest.raises(PreflightError) as info:
        await preflight(model)
    message = str(info.value)
    assert message.startswith(f"model preflight failed for '{model}': {name} contains non-ASCII")
    assert "\n" not in message
    assert "pasted-key" not in message and value not in message
    assert scripted.requests == []  # refused before any call


async def test_non_ascii_values_of_other_variables_do_not_matter(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.reply(
        Reply(
            200, {"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}]}
        )
    )
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-\u00e9t\u00e9-0123456789")
    monkeypatch.setenv("MY_PASSWORD", "caf\u00e9-caf\u00e9-caf\u00e9")
    with trio.fail_after(20):
        assert await preflight("openai/test-model") is None


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("openai/test-model", "OPENAI_API_KEY"),
        ("openrouter/vendor/model", "OR_API_KEY"),
        ("anthropic/claude-sonnet-4-6", "ANTHROPIC_API_KEY"),
    ],
)
@pytest.mark.parametrize("cut", ["\n", "\r\n", "\x1b", "\t"])
async def test_a_key_with_a_control_character_is_fatal_and_named_not_shown(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, model: str, name: str, cut: str
) -> None:
    # A dotenv value that spans lines: before the fix each call failed with h11's
    # "Illegal header value" and every row with a 502.
    monkeypatch.setenv(name, f"sk-test-{cut}SECRETVALUE123")
    with trio.fail_after(20), pytest.raises(PreflightError) as info:
        await preflight(model)
    message = str(info.value)
    assert message.startswith(
        f"model preflight failed for '{model}': {name} contains a line break or other control "
        "character, so no request can carry it"
    )
    assert "\n" not in message and "SECRETVALUE" not in message
    assert scripted.requests == []  # refused before any call


async def test_a_key_litellm_reports_missing_is_fatal_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unprefixed model goes through LiteLLM, which reports a missing OpenAI key as a 500:
    it was retried, then only a warning, and every row failed 45 s later."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    retries: list[str] = []
    calls: list[dict[str, object]] = []
    with trio.fail_after(60), pytest.raises(PreflightError) as info:
        await preflight("gpt-4o", retry=QUICK, on_retry=retries.append, on_call=calls.append)
    assert str(info.value) == (
        "model preflight failed for 'gpt-4o': AuthenticationError: OPENAI_API_KEY is not set; "
        "export it or put it in --secrets-file to use 'gpt-4o'"
    )
    assert retries == [] and len(calls) == 1


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("", "the model name is empty; write provider/model"),
        ("openai/", "'openai/' names no model after the provider"),
        ("rollbridge/nope", "'rollbridge/nope' is not a model: the only rollbridge/ model is "),
    ],
)
async def test_a_name_that_names_no_model_is_fatal_in_one_line(model: str, said: str) -> None:
    with trio.fail_after(10), pytest.raises(PreflightError) as info:
        await preflight(model)
    message = str(info.value)
    assert message.startswith(f"model preflight failed for '{model}': {said}")
    assert "\n" not in message and "LiteLLM" not in message


def test_a_credentials_file_path_is_no_key_to_check() -> None:
    """``GOOGLE_APPLICATION_CREDENTIALS`` names a file, which may have any name; it is never
    sent as it is, so its path is not held to a key's rules (a key named so is)."""
    path = {"GOOGLE_APPLICATION_CREDENTIALS": "/home/jos\u00e9/keys/sa.json"}
    assert unsendable_credential("gemini/gemini-2.5-pro", path) is None
    json_key = {"GOOGLE_APPLICATION_CREDENTIALS": '{"private_key": "caf\u00e9"}'}
    said = unsendable_credential("gemini/gemini-2.5-pro", json_key)
    assert said is not None and said.startswith("GOOGLE_APPLICATION_CREDENTIALS contains non-ASCII")
