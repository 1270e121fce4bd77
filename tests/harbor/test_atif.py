"""A host-side Harbor agent's ATIF trajectory becomes the row's conversation (harbor.atif), in
the message shape of a LocalBackend rollout, with a hand-made ``agent/trajectory.json`` of the
form terminus-2 writes (the sandbox test bed is not needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.export import trajectory_messages
from rollout_server.backend import ExecutionRequest
from rollout_server.harbor.results import trial_outcome
from rollout_server.sdk import RolloutSample
from rollout_server.trajectory import build_trajectory

SECRET = "sk-trial-secret-0123456789abcdef"
ATIF: dict[str, Any] = {
    "schema_version": "ATIF-v1.5",
    "session_id": "harbor-session",
    "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "openai/m"},
    "steps": [
        {"step_id": 1, "source": "system", "message": "You are a terminal agent."},
        {"step_id": 2, "source": "user", "message": "Create hello.txt"},
        {
            "step_id": 3,
            "source": "agent",
            "message": "I will create the file.",
            "reasoning_content": "simple",
            "tool_calls": [
                {
                    "tool_call_id": "call_1",
                    "function_name": "bash_command",
                    "arguments": {"keystrokes": "echo hi > hello.txt\n"},
                }
            ],
            "observation": {"results": [{"source_call_id": "call_1", "content": "$ "}]},
            "metrics": {"prompt_tokens": 100, "completion_tokens": 20, "cached_tokens": 60},
        },
        {
            "step_id": 4,
            "source": "agent",
            "message": [{"type": "text", "text": f"Done (key {SECRET})."}],
            "observation": {"results": [{"content": "terminal: hello.txt exists"}]},
        },
    ],
    "final_metrics": {"total_prompt_tokens": 220, "total_completion_tokens": 30},
}
EXPECTED = [
    {"role": "system", "content": "You are a terminal agent."},
    {"role": "user", "content": "Create hello.txt"},
    {
        "role": "assistant",
        "content": "I will create the file.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "bash_command",
                    "arguments": '{"keystrokes": "echo hi > hello.txt\\n"}',
                },
            }
        ],
        "reasoning_content": "simple",
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "$ "},
    {"role": "assistant", "content": "Done (key [REDACTED])."},
    {"role": "user", "content": "terminal: hello.txt exists"},
]


def _trial(tmp_path: Path, atif: dict[str, Any] | None) -> Path:
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    result = {"verifier_result": {"rewards": {"reward": 1.0}}, "agent_result": {}}
    (trial / "result.json").write_text(json.dumps(result))
    if atif is not None:
        (trial / "agent" / "trajectory.json").write_text(json.dumps(atif))
    return trial


def _outcome(tmp_path: Path, atif: dict[str, Any] | None) -> RolloutSample:
    request = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "Create hello.txt"}])
    trial = _trial(tmp_path, atif)
    outcome = trial_outcome(trial, request, 0, tmp_path / "trial.log", [SECRET], None)
    sample = outcome.reported().sample
    assert sample is not None and sample.reward == 1.0
    return sample


def test_every_agent_turn_is_the_rows_conversation(tmp_path: Path) -> None:
    sample = _outcome(tmp_path, ATIF)
    assert sample.messages == EXPECTED
    # The row's trajectory.json, read back as the export reads it, holds the same turns (the
    # reasoning text aside, which ATIF steps of our own do not carry).
    document = build_trajectory("r1", sample, sdk_version="t")
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in EXPECTED]
    assert trajectory_messages(document) == plain


def test_without_a_trajectory_the_prompt_stays(tmp_path: Path) -> None:
    sample = _outcome(tmp_path, None)
    assert sample.messages == [{"role": "user", "content": "Create hello.txt"}]


def test_a_trial_that_failed_after_turns_keeps_them(tmp_path: Path) -> None:
    """The agent ran past its timeout: the row failed, and its turns are still the row's
    record (the trajectory the export and the report read), as a grader's failure keeps its
    sample. A trial that failed before any turn has none."""
    from rollout_server.protocol import RolloutStatus

    request = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "Create hello.txt"}])
    trial = _trial(tmp_path, ATIF)
    timed_out = {"exception_type": "AgentTimeoutError", "exception_message": "after 15.0 s"}
    (trial / "result.json").write_text(json.dumps({"exception_info": timed_out}))
    outcome = trial_outcome(trial, request, 1, tmp_path / "trial.log", [SECRET], None)
    reported = outcome.reported()
    assert reported.status == RolloutStatus.FAILURE and reported.err_category == "timeout"
    assert reported.sample is not None and reported.sample.messages == EXPECTED
    saved = outcome.saved().sample
    assert saved is not None and saved.trajectory_messages == EXPECTED
    (trial / "agent" / "trajectory.json").unlink()
    bare = trial_outcome(trial, request, 1, tmp_path / "trial.log", [SECRET], None)
    assert bare.reported().sample is None
