"""``RolloutSample.trajectory_messages`` defaults to a deep copy of ``messages``."""

from __future__ import annotations

from typing import Any

from rollout_server.sdk import RolloutSample


def test_trajectory_messages_are_an_independent_copy() -> None:
    call = {"id": "c1", "function": {"name": "f", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    sample = RolloutSample(messages)
    assert sample.trajectory_messages == messages
    call["function"]["name"] = "changed"
    messages[0]["content"].append("more")
    assert sample.trajectory_messages is not None
    assert sample.trajectory_messages[1]["tool_calls"][0]["function"]["name"] == "f"
    assert sample.trajectory_messages[0]["content"] == [{"type": "text", "text": "hi"}]


def test_shared_and_foreign_values_are_copied_like_deepcopy() -> None:
    class Note:
        def __init__(self, text: str) -> None:
            self.text = text

    shared = {"role": "user", "content": "same"}
    note = Note("n")
    sample = RolloutSample([shared, shared, {"role": "assistant", "content": "x", "note": note}])
    copied = sample.trajectory_messages
    assert copied is not None
    assert copied[0] is copied[1] and copied[0] is not shared  # sharing kept, as deepcopy does
    assert isinstance(copied[2]["note"], Note) and copied[2]["note"] is not note
