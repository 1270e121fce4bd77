"""Background teardowns (``rollout_server/harbor/teardown.py``).

Against a stand-in engine (no test bed needed): a finished trial's containers, networks, images,
named volumes and staging dir are removed after the hand-off, at most ``limit`` trials at a time,
and closing waits for all of them. With the sandbox test bed: a real oracle trial's result is
answered while its container still exists, ``/health`` counts the teardown, and the backend's
stop waits for it and leaves no container behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import trio
import trio.testing

from rollout_server.backend import ExecutionRequest
from rollout_server.harbor import HarborBackend
from rollout_server.harbor.containers import TRIAL_LABEL
from rollout_server.harbor.teardown import Teardowns
from rollout_server.harbor.timings import TrialClock
from rollout_server.protocol import RolloutStatus
from rollout_server.service import RolloutService
from tests.harbor.conftest import EXAMPLE

# rm of a trial blocks until its gate file exists: the test decides when a teardown can end.
FAKE_ENGINE = """#!/bin/sh
echo "$*" >> "$ENGINE_LOG"
case "$1" in
  ps) trial="${4#label=io.rollbridge.harbor.trial=}"
      printf '[{"Id": "id-%s", "Names": ["%s__env_main_1"], "Labels": {}}]\\n' "$trial" "$trial" ;;
  rm) trial="${6#id-}"
      while [ ! -e "$GATES/$trial" ]; do sleep 0.02; done ;;
  network) [ "$2" = ls ] && printf 'podman\\ntrial-a__env_default\\ntrial-b__env_default\\n' ;;
  volume) [ "$2" = ls ] && printf 'trial-a__env_data\\nother_data\\n' ;;
esac
exit 0
"""


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "engine"
    script.write_text(FAKE_ENGINE)
    script.chmod(0o755)
    (tmp_path / "gates").mkdir()
    monkeypatch.setenv("ENGINE_LOG", str(tmp_path / "engine.log"))
    monkeypatch.setenv("GATES", str(tmp_path / "gates"))
    return script


def _staging(tmp_path: Path, name: str) -> Path:
    staging = tmp_path / "staging" / name
    staging.mkdir(parents=True)
    (staging / "owner.json").write_text(json.dumps({"owner": "1:1", "trial": name}))
    return staging


async def test_teardowns_are_bounded_and_closing_waits_for_every_one(
    engine: Path, tmp_path: Path
) -> None:
    teardowns = Teardowns(str(engine), limit=1)
    handed: list[str] = []
    a, b = _staging(tmp_path, "a"), _staging(tmp_path, "b")
    with trio.fail_after(60):
        await teardowns.hand_off("trial-a", a, TrialClock("a", "trial-a"))
        assert teardowns.in_flight == 1

        async def second() -> None:
            await teardowns.hand_off("trial-b", b, TrialClock("b", "trial-b"))
            handed.append("trial-b")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            # trial-a's rm cannot end before its gate opens: trial-b waits for the only slot.
            assert handed == [] and teardowns.in_flight == 1 and a.exists()
            (tmp_path / "gates" / "trial-a").touch()
        assert handed == ["trial-b"]
        assert not a.exists()
        assert b.exists() and teardowns.in_flight == 1

        closed: list[bool] = []

        async def close() -> None:
            await teardowns.aclose()
            closed.append(True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(close)
            await trio.testing.wait_all_tasks_blocked()
            assert closed == []
            (tmp_path / "gates" / "trial-b").touch()
        assert closed == [True] and teardowns.in_flight == 0 and not b.exists()
    calls = (tmp_path / "engine.log").read_text().splitlines()
    assert "rm -f -v -t 0 id-trial-a" in calls
    assert "network rm -f trial-a__env_default" in calls
    assert "volume rm -f trial-a__env_data" in calls
    assert "network rm -f trial-b__env_default" in calls
    assert not any("other_data" in c and "rm" in c for c in calls)


async def test_the_same_trial_waits_for_its_previous_teardown(engine: Path, tmp_path: Path) -> None:
    teardowns = Teardowns(str(engine), limit=4)
    waited: list[bool] = []
    with trio.fail_after(60):
        await teardowns.hand_off("trial-a", _staging(tmp_path, "a"), TrialClock("a", "trial-a"))

        async def again() -> None:
            await teardowns.wait_for("trial-a")
            waited.append(True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(again)
            await trio.testing.wait_all_tasks_blocked()
            assert waited == []
            (tmp_path / "gates" / "trial-a").touch()
        assert waited == [True]
        await teardowns.wait_for("trial-b")  # nothing of it in flight: returns at once
        await teardowns.aclose()


def _trial_containers(trial: str) -> list[str]:
    """Names of the containers labelled with ``trial`` (blocking: nothing else runs meanwhile)."""
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={TRIAL_LABEL}={trial}", "--format", "json"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return [row["Names"][0] for row in json.loads(listed.stdout or b"[]")]


@pytest.mark.timeout(300)
async def test_a_trial_is_answered_before_its_teardown_and_stop_waits_for_it(
    testbed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.delenv("ROLLBRIDGE_HARBOR_OVERLAP", raising=False)
    backend = HarborBackend(
        EXAMPLE / "tasks" / "hello",
        agent="oracle",
        concurrency=1,
        trials_root=tmp_path / "root",
    )
    service = RolloutService(backend)
    rollout_dir = tmp_path / "rollouts" / "overlap1"
    request = ExecutionRequest(
        id="overlap1",
        prompt=[{"role": "user", "content": "Write hello to /app/answer.txt"}],
        rollout_dir=rollout_dir,
    )
    staging = tmp_path / "root" / "staging" / "overlap1"
    try:
        with trio.fail_after(240):
            outcome = await backend.execute(request)
            # No checkpoint since execute returned: the teardown handed off has not run yet.
            # The rollout is answered (reward, scrubbed archive) while its container exists.
            assert outcome.reported().status == RolloutStatus.SUCCESS
            assert outcome.reported().sample is not None
            assert (rollout_dir / "harbor" / "result.json").is_file()
            assert backend.health()["tearing_down"] == 1
            assert service.health()["lifecycle"]["active_rollouts"] == 1
            assert _trial_containers("trial-overlap1") != []
            assert staging.is_dir()  # the reaper's mark stays until the teardown ended
            await backend.shutdown()
    finally:
        with trio.CancelScope(shield=True):
            await backend.shutdown()
    assert backend.health()["tearing_down"] == 0
    assert service.health()["lifecycle"]["active_rollouts"] == 0
    assert _trial_containers("trial-overlap1") == []
    assert not staging.exists()
