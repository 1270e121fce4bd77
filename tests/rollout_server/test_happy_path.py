"""End to end against a real server: admission, long-poll, success with reward, files."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from rollout_server.protocol import RolloutStatus

from .helpers import request, start


async def test_success_with_reward_and_files(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(20):
        running, client = await start(nursery, tmp_path)
        seen: list[str] = []
        result = await client.run_rollout(
            request("r1", label="L", metadata={"k": 1}, extra_fields={"row_index": 3}),
            on_status=lambda r: seen.append(r.status.value),
        )
        assert result.status == RolloutStatus.SUCCESS
        assert result.sample is not None
        assert result.sample.reward == 1.0
        assert result.sample.label == "L"
        assert result.sample.messages[-1] == {"role": "assistant", "content": "hello"}
        assert seen[-1] == "success"
        trial = tmp_path / "trials" / "r1"
        trajectory = json.loads((trial / "trajectory.json").read_text())
        assert trajectory["schema_version"] == "ATIF-v1.7"
        assert trajectory["session_id"] == trajectory["trajectory_id"] == "r1"
        assert trajectory["extra"]["osmosis"]["rollout_id"] == "r1"
        assert trajectory["extra"]["osmosis"]["reward"] == 1.0
        assert trajectory["extra"]["osmosis"]["request_extra_fields"] == {"row_index": 3}
        assert [s["source"] for s in trajectory["steps"]] == ["user", "agent"]
        assert (trial / ".osmosis-health-check").read_bytes() == b"osmosis-health-check"
        assert (trial / "artifacts" / "note.txt").read_text() == "made by the workflow"
        assert not (trial / "diagnostics.json").exists()
        await client.aclose()
        running.request_shutdown()
