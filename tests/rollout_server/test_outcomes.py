"""How results are built (docs/spec/protocol.md §9, §19 items 6, 7, 14, 17, 20) through a real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from rollout_server import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    LocalBackend,
    RolloutSample,
    SampleSource,
    chat,
    get_rollout_context,
    reply_text,
)
from rollout_server.protocol import RolloutErrorCategory, RolloutResultResponse, RolloutStatus
from tests.fakes.upstream import FakeUpstream

from .conftest import Served
from .helpers import ScriptedGrader, ScriptedWorkflow, request, start


async def run(served: Served, rollout_id: str, **fields: Any) -> RolloutResultResponse:
    with trio.fail_after(20):
        return await served.client.run_rollout(request(rollout_id, **fields))


def triple(result: RolloutResultResponse) -> tuple[str, str | None, str | None]:
    category = result.err_category.value if result.err_category else None
    return result.status.value, category, result.err_message


async def test_grade_false_success_has_null_reward(served: Served) -> None:
    result = await run(served, "g0", label="L", grade=False)
    assert result.status == RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.reward is None


async def test_remove_sample_nulls_reward(served: Served) -> None:
    result = await run(served, "rm", label="L", metadata={"remove": True})
    assert result.status == RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.remove_sample is True
    assert result.sample.reward is None
    # The trajectory keeps the unnulled value.
    trajectory = json.loads((served.root / "rm" / "trajectory.json").read_text())
    assert trajectory["extra"]["osmosis"]["reward"] == 1.0


async def test_no_label_no_metadata_is_bare_failure(served: Served) -> None:
    result = await run(served, "bare")
    assert (result.status, result.sample, result.err_message, result.err_category) == (
        RolloutStatus.FAILURE,
        None,
        None,
        None,
    )


async def test_no_grader_is_bare_failure(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, LocalBackend(ScriptedWorkflow))
        result = await client.run_rollout(request("ng", label="L"))
        assert (result.status, result.sample, result.err_message, result.err_category) == (
            RolloutStatus.FAILURE,
            None,
            None,
            None,
        )
        await client.aclose()
        running.force_stop()


async def test_grader_timeout_keeps_sample_without_reward(served: Served) -> None:
    result = await run(
        served, "gt", label="L", metadata={"grader_sleep": 30}, grader_timeout_sec=0.2
    )
    assert triple(result) == ("failure", "timeout", "grader exceeded its 0.2s deadline")
    assert result.sample is not None
    assert result.sample.reward is None


async def test_agent_timeout_message(served: Served) -> None:
    result = await run(served, "at", label="L", metadata={"sleep": 30}, agent_timeout_sec=0.2)
    assert triple(result) == ("failure", "timeout", "workflow exceeded its 0.2s deadline")
    assert result.sample is None


@pytest.mark.parametrize("limit", [0, -3])
async def test_zero_or_negative_timeout_is_expired_not_422(served: Served, limit: float) -> None:
    result = await run(
        served, f"z{limit}", label="L", metadata={"sleep": 5}, agent_timeout_sec=limit
    )
    assert triple(result) == (
        "failure",
        "timeout",
        f"workflow exceeded its {float(limit)}s deadline",
    )


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"raise": "ValueError"}, ("failure", "validation_error", "workflow says no")),
        ({"raise": "RuntimeError"}, ("failure", "agent_error", "workflow says no")),
        ({"raise": "TimeoutError"}, ("failure", "timeout", "workflow says no")),
        (
            {"return": "bad"},
            (
                "failure",
                "validation_error",
                "run() must return AgentWorkflowOutput, a message list, or None; got int",
            ),
        ),
        ({"grader_raise": True}, ("failure", "agent_error", "grader says no")),
        (
            {"no_reward": True},
            ("failure", "validation_error", "Sample has no reward after grading"),
        ),
    ],
)
async def test_error_categories(
    served: Served, metadata: dict[str, Any], expected: tuple[str, str, str]
) -> None:
    result = await run(served, "e-" + "-".join(map(str, metadata)), label="L", metadata=metadata)
    assert triple(result) == expected
    if result.sample is not None:
        assert result.sample.reward is None


async def test_no_messages_means_no_sample_to_grade(served: Served) -> None:
    result = await run(served, "nm", label="L", metadata={"return": "nomessages"})
    status, category, message = triple(result)
    assert (status, category) == ("failure", "validation_error")
    assert message is not None and message.startswith("No sample to grade.")


async def test_message_list_return_and_label(served: Served) -> None:
    result = await run(served, "ml", label="L", metadata={"return": "list", "reward": 0.25})
    assert result.status == RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.reward == 0.25
    assert result.sample.label == "L"


async def test_json_safety_drops_bad_values(served: Served) -> None:
    result = await run(served, "js", label="L", metadata={"bad_metrics": True, "reward": 0.5})
    assert result.status == RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.metrics == {"ok": 2, "1": "one"}
    assert result.sample.extra_fields == {"fine": "yes"}
    assert result.sample.reward == 0.5


async def test_unencodable_messages_reduce_the_sample(served: Served) -> None:
    result = await run(served, "nanmsg", label="L", metadata={"return": "nan_message", "reward": 1})
    assert result.status == RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.messages == []
    assert result.sample.reward == 1.0
    assert result.sample.label == "L"


class SourceWorkflow(AgentWorkflow[Any]):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> None:
        rollout = get_rollout_context()
        assert rollout is not None

        class Source(SampleSource):
            async def get_sample(self) -> RolloutSample:
                return RolloutSample([{"role": "assistant", "content": "from source"}], label="S")

        rollout.set_sample_source(Source())
        with pytest.raises(ValueError):
            rollout.set_sample_source(Source())


async def test_none_return_uses_the_sample_source(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(15):
        running, client = await start(
            nursery, tmp_path, LocalBackend(SourceWorkflow, ScriptedGrader)
        )
        result = await client.run_rollout(request("src", label="L", metadata={"reward": 0.75}))
        assert result.status == RolloutStatus.SUCCESS
        assert result.sample is not None
        assert result.sample.messages == [{"role": "assistant", "content": "from source"}]
        assert result.sample.reward == 0.75
        await client.aclose()
        running.force_stop()


class ChatWorkflow(AgentWorkflow[Any]):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> list[dict[str, Any]]:
        response = await chat(ctx.prompt, temperature=0)
        return [*ctx.prompt, {"role": "assistant", "content": reply_text(response)}]


async def test_chat_helper_passes_url_and_key_through(
    nursery: trio.Nursery, tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, LocalBackend(ChatWorkflow, ScriptedGrader))
        base = fake_upstream.v1 + "/rollouts/ch1"
        result = await client.run_rollout(
            request(
                "ch1",
                label="L",
                chat_completions_url=base,
                llm_api_key="per-run-token",
                initial_messages=[{"role": "user", "content": "ping pong"}],
            )
        )
        assert result.status == RolloutStatus.SUCCESS
        assert result.sample is not None
        assert result.sample.messages[-1]["content"] == "echo: ping pong"
        recorded = fake_upstream.requests[-1]
        assert recorded.path == "/v1/rollouts/ch1/chat/completions"
        assert recorded.headers["authorization"] == "Bearer per-run-token"
        assert recorded.body["temperature"] == 0
        await client.aclose()
        running.force_stop()


async def test_chat_url_and_key_fall_back_to_environment(
    nursery: trio.Nursery,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OSMOSIS_CHAT_COMPLETIONS_URL", fake_upstream.v1)
    monkeypatch.setenv("OSMOSIS_API_KEY", "env-key")
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, LocalBackend(ChatWorkflow, ScriptedGrader))
        result = await client.run_rollout(request("ch2", label="L", chat_completions_url=""))
        assert result.status == RolloutStatus.SUCCESS
        assert fake_upstream.requests[-1].headers["authorization"] == "Bearer env-key"
        await client.aclose()
        running.force_stop()


async def test_chat_error_fails_the_rollout_with_status(
    nursery: trio.Nursery, tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.fail_statuses.append(401)
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, LocalBackend(ChatWorkflow, ScriptedGrader))
        result = await client.run_rollout(
            request("ch3", label="L", chat_completions_url=fake_upstream.v1)
        )
        status, category, message = triple(result)
        assert (status, category) == ("failure", "agent_error")
        assert message is not None and "HTTP 401" in message
        await client.aclose()
        running.force_stop()


class DiagnosticBackend(ExecutionBackend):
    """Fails with diagnostics and a sample whose trajectory is disabled, or succeeds with both."""

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        sample = RolloutSample([{"role": "assistant", "content": "x"}], label=request.label)
        if request.id == "diag-fail":
            sample.trajectory_messages = None
            return ExecutionOutcome(
                ExecutionResult(
                    RolloutStatus.FAILURE,
                    sample=sample,
                    err_message="sandbox broke \udcff",
                    err_category=RolloutErrorCategory.HTTP_ERROR,
                    extra_fields={"phase": "setup", "backend": "custom", "when": object()},
                )
            )
        sample.reward = 0.5
        return ExecutionOutcome(
            ExecutionResult(RolloutStatus.SUCCESS, sample=sample, extra_fields={"z": 1, "a": 2})
        )


async def test_diagnostics_file_and_disabled_trajectory(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, DiagnosticBackend())
        result = await client.run_rollout(request("diag-fail", label="L"))
        assert triple(result) == ("failure", "http_error", "sandbox broke ?")
        assert result.sample is not None and result.sample.reward is None
        trial = tmp_path / "trials" / "diag-fail"
        assert not (trial / "trajectory.json").exists()
        diagnostics = json.loads((trial / "diagnostics.json").read_text())
        assert list(diagnostics) == ["backend", "phase", "when"]
        assert diagnostics["when"].startswith("<object object")
        result = await client.run_rollout(request("diag-ok", label="L"))
        assert result.sample is not None and result.sample.reward == 0.5
        assert result.sample.extra_fields == {}
        trial = tmp_path / "trials" / "diag-ok"
        assert json.loads((trial / "trajectory.json").read_text())["session_id"] == "diag-ok"
        assert (trial / "diagnostics.json").read_text().startswith('{\n  "a": 2,')
        assert (trial / "artifacts").is_dir()
        await client.aclose()
        running.force_stop()
