"""Why a rollout failed, beyond the wire's ``err_message``: the ``failure`` object LocalBackend
leaves in ``diagnostics.json`` (phase, exception type, HTTP status, the bridge's own message),
while the wire result stays exactly the reference's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from rollout_server import LocalBackend
from rollout_server.protocol import RolloutStatus
from tests.fakes.upstream import FakeUpstream

from .conftest import Served
from .helpers import ScriptedWorkflow, request, start
from .test_outcomes import ChatWorkflow, run, triple


def _failure(trials: Path, rollout_id: str) -> Any:
    return json.loads((trials / rollout_id / "diagnostics.json").read_text())["failure"]


async def test_workflow_and_grader_exceptions_name_phase_and_type(served: Served) -> None:
    result = await run(served, "wf", label="L", metadata={"raise": "ValueError"})
    assert triple(result) == ("failure", "validation_error", "workflow says no")
    assert _failure(served.root, "wf") == {"phase": "agent", "type": "ValueError"}
    result = await run(served, "gr", label="L", metadata={"grader_raise": True})
    assert triple(result) == ("failure", "agent_error", "grader says no")
    assert _failure(served.root, "gr") == {"phase": "grader", "type": "RuntimeError"}
    result = await run(served, "to", label="L", metadata={"sleep": 30}, agent_timeout_sec=0.1)
    assert _failure(served.root, "to") == {"phase": "agent"}
    # A success writes no diagnostics, as before.
    await run(served, "ok", label="L")
    assert not (served.root / "ok" / "diagnostics.json").exists()


async def test_sys_exit_in_a_workflow_or_grader_fails_that_rollout_only(served: Served) -> None:
    result = await run(served, "ex", label="L", metadata={"exit": 3})
    assert triple(result) == ("failure", "agent_error", "the workflow called sys.exit(3)")
    assert _failure(served.root, "ex") == {"phase": "agent", "type": "RuntimeError"}
    result = await run(served, "gx", label="L", metadata={"grader_exit": 0})
    assert triple(result)[2] == "the grader called sys.exit(0)"
    # The server is still up and serves the next rollout.
    result = await run(served, "after", label="L")
    assert triple(result)[0] == "success"


async def test_a_grader_failure_without_a_sample_keeps_its_reason(served: Served) -> None:
    # The workflow succeeds without messages; the grader then has nothing to grade. The saved
    # result is the workflow's, but the reported failure is the grader's: its reason is kept.
    result = await run(served, "ns", label="L", metadata={"return": "nomessages"})
    assert triple(result)[:2] == ("failure", "validation_error")
    assert _failure(served.root, "ns") == {"phase": "grader", "type": "ValueError"}


async def test_no_grader_says_so_only_in_diagnostics(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, LocalBackend(ScriptedWorkflow))
        result = await client.run_rollout(request("ng", label="L"))
        assert (result.status, result.err_message, result.err_category) == (
            RolloutStatus.FAILURE,
            None,
            None,
        )
        failure = _failure(tmp_path / "trials", "ng")
        assert failure["phase"] == "grader" and failure["message"].startswith("no grader ran")
        await client.aclose()
        running.force_stop()


async def test_a_model_endpoint_error_is_a_bridge_failure_with_its_status(
    nursery: trio.Nursery, tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.fail_statuses.append(502)
    fake_upstream.fail_body = '{"error": {"message": "upstream 500: provider melted"}}'
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, LocalBackend(ChatWorkflow))
        result = await client.run_rollout(
            request("br", label="L", chat_completions_url=fake_upstream.v1)
        )
        assert result.err_message is not None and "HTTP 502" in result.err_message
        assert _failure(tmp_path / "trials", "br") == {
            "phase": "bridge",
            "type": "ChatError",
            "status": 502,
            "message": "upstream 500: provider melted",
        }
        await client.aclose()
        running.force_stop()


def test_a_provider_5xx_keeps_the_providers_status() -> None:
    """The bridge answers 502 for a provider 5xx and says what the provider answered; the
    failure reason keeps the provider's status and the bridge's message."""
    from rollout_server.backend import describe_exception
    from rollout_server.chat import ChatError

    body = json.dumps(
        {
            "error": {
                "message": "overloaded",
                "type": "bridge_error",
                "code": 502,
                "upstream_status": 503,
            }
        }
    )
    detail = describe_exception(ChatError(502, body, "http://127.0.0.1:1/v1"), "agent")
    assert detail == {
        "phase": "bridge",
        "type": "ChatError",
        "status": 503,
        "bridge_status": 502,
        "message": "overloaded",
    }
    plain = describe_exception(ChatError(401, '{"error":{"message":"no"}}', "u"), "agent")
    assert plain["status"] == 401 and "bridge_status" not in plain


async def test_a_call_that_never_reached_the_endpoint_is_a_network_failure(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Issue 27 item 13: nothing listens at the chat URL (an unreachable advertise host)."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, LocalBackend(ChatWorkflow))
        url = f"http://127.0.0.1:{port}/v1"
        result = await client.run_rollout(request("nc", label="L", chat_completions_url=url))
        failure = _failure(tmp_path / "trials", "nc")
        assert failure["phase"] == "network", failure
        assert failure["message"].startswith(f"could not connect to the chat endpoint {url}/")
        assert result.err_message
        await client.aclose()
        running.force_stop()


def test_a_proxy_page_in_front_of_the_bridge_is_a_network_failure() -> None:
    """A tunnel or proxy at the advertised URL answering for an origin that is down: its page
    is not the bridge's JSON error, so the call never reached the bridge."""
    from rollout_server.backend import describe_exception
    from rollout_server.chat import ChatError

    page = "<html><body>error code: 530\n Origin unreachable</body></html>"
    detail = describe_exception(ChatError(530, page, "https://x.trycloudflare.com/v1"), "agent")
    assert detail["phase"] == "network" and detail["status"] == 530
    assert detail["message"].startswith("HTTP 530 from in front of the chat endpoint: <html>")
    bridge = describe_exception(ChatError(401, '{"detail": "Unauthorized"}', "u"), "agent")
    assert bridge["phase"] == "bridge"


async def test_errors_of_the_official_clients_say_bridge_or_network(nursery: trio.Nursery) -> None:
    """rollout-sdk.md suggests the official ``openai`` and ``anthropic`` clients: their errors on
    a model call are placed like a ChatError's (the bridge answering an error: ``bridge`` with
    its status; no connection: ``network``), not as the workflow's own."""
    import pytest

    openai = pytest.importorskip("openai", reason="needs the openai client (the dev extra)")
    anthropic = pytest.importorskip("anthropic", reason="needs the anthropic client (dev extra)")
    from bridge.server import BridgeConfig, run_bridge
    from rollout_server.backend import describe_exception

    handle = await nursery.start(run_bridge, BridgeConfig(model="rollbridge/echo", token="t" * 32))
    url = handle.rollout_url("r1")
    hi = [{"role": "user", "content": "hi"}]

    def raised(call: Any) -> BaseException:
        try:
            call()
        except Exception as exc:
            return exc
        raise AssertionError("no error")

    def calls() -> list[BaseException]:
        good = openai.OpenAI(base_url=url, api_key="t" * 32, max_retries=0)
        wrong = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
        nowhere = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
        claude = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0)
        return [
            raised(lambda: good.chat.completions.create(model="m", messages=hi, n=2)),
            raised(lambda: wrong.chat.completions.create(model="m", messages=hi)),
            raised(lambda: nowhere.chat.completions.create(model="m", messages=hi)),
            raised(lambda: claude.messages.create(model="m", max_tokens=8, messages=hi)),
        ]

    with trio.fail_after(60):
        refused, unauthorized, unreachable, anthropic_401 = await trio.to_thread.run_sync(calls)
    detail = describe_exception(refused, "agent")
    assert (detail["phase"], detail["type"], detail["status"]) == ("bridge", "BadRequestError", 400)
    assert "n" in detail["message"]
    detail = describe_exception(unauthorized, "agent")
    assert (detail["phase"], detail["status"]) == ("bridge", 401)
    detail = describe_exception(unreachable, "agent")
    assert (detail["phase"], detail["type"]) == ("network", "APIConnectionError")
    detail = describe_exception(anthropic_401, "agent")
    assert (detail["phase"], detail["status"]) == ("bridge", 401)
    assert describe_exception(ValueError("mine"), "agent") == {
        "phase": "agent",
        "type": "ValueError",
    }
