"""``usage_live.json``: the supervisor's sampler of the bridge ledger and the daemon's reader,
without child processes (the end-to-end path is in ``test_daemon_live.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from bridge.usage import CallUsage, UsageLedger
from launcher.daemon.live_usage import (
    LIVE_USAGE_FILE,
    dispatched_keys,
    live_rollouts,
    publish_live_usage,
    read_live_usage,
)
from launcher.redact import Redactor
from launcher.rundir.logs import RunLog


async def test_sampler_writes_on_change_only_and_marks_the_end(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    ledger = UsageLedger()
    in_flight = [0]
    path = tmp_path / LIVE_USAGE_FILE
    writes: list[dict[str, object]] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_live_usage, tmp_path, ledger.snapshot, lambda: in_flight[0])

            async def sample() -> dict[str, object]:
                await trio.sleep(0.75)  # past the next sample
                doc: dict[str, object] = json.loads(path.read_text())
                return doc

            first = await sample()
            assert first["in_flight"] == 0 and first["rollouts"] == {}
            ledger.record("r1", CallUsage.from_json({"prompt_tokens": 10, "completion_tokens": 5}))
            ledger.record("r1", CallUsage.from_json({"prompt_tokens": 30, "completion_tokens": 2}))
            ledger.record("r2", CallUsage.from_json({"prompt_tokens": 7, "completion_tokens": 1}))
            in_flight[0] = 2
            second = await sample()
            writes.append(second)
            assert second["in_flight"] == 2
            assert second["rollouts"] == {
                "r1": {
                    "calls": 2,
                    "prompt_tokens": 40,
                    "completion_tokens": 7,
                    "total_tokens": 47,
                    "max_context_tokens": 32,
                },
                "r2": {
                    "calls": 1,
                    "prompt_tokens": 7,
                    "completion_tokens": 1,
                    "total_tokens": 8,
                    "max_context_tokens": 8,
                },
            }
            assert second["totals"] == {
                "calls": 3,
                "prompt_tokens": 47,
                "completion_tokens": 8,
                "total_tokens": 55,
                "max_context_tokens": 32,
            }
            assert read_live_usage(tmp_path, os.getpid()) == second
            assert read_live_usage(tmp_path, os.getpid() + 1) is None
            # Nothing changed: the file is not rewritten (same inode, same timestamp).
            inode = os.stat(path).st_ino
            await trio.sleep(3)
            assert os.stat(path).st_ino == inode
            assert json.loads(path.read_text()) == second
            ledger.pop("r1")
            in_flight[0] = 1
            third = await sample()
            assert list(third["rollouts"]) == ["r2"]  # type: ignore[call-overload]
            nursery.cancel_scope.cancel()
    final = json.loads(path.read_text())
    assert final["done"] is True and final["in_flight"] == 0
    assert read_live_usage(tmp_path, os.getpid()) is None


def test_dispatched_keys_from_real_log_lines(tmp_path: Path) -> None:
    with RunLog(tmp_path / "logs.txt", Redactor()) as log:
        log.log("INFO", "schedule", "running 2 work items, up to 2 in flight")
        log.log(
            "INFO",
            "dispatch",
            "dispatching rollout",
            {"rollout_id": "abc", "row_index": 3, "run_index": 1},
        )
        log.log("WARNING", "cancel", "rollout cancelled", {"rollout_id": "abc"})
    lines = (tmp_path / "logs.txt").read_text().splitlines()
    keys = dispatched_keys(lines)
    assert keys == {"abc": (3, 1)}
    doc = {"in_flight": 2, "rollouts": {"abc": {"calls": 1}, "zzz": {"calls": 2}}, "totals": {}}
    listed = live_rollouts(doc, keys)["rollouts"]
    assert listed == [
        {"rollout_id": "abc", "row_index": 3, "run_index": 1, "calls": 1},
        {"rollout_id": "zzz", "row_index": None, "run_index": None, "calls": 2},
    ]
