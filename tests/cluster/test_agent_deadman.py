"""The node agent's dead-man switch (launcher.cluster.agent): with no call from its supervisor
for ``deadman_s``, the agent stops its rollout server by itself (through the lifeline) and
fails every call after. Without Ray: the actor class is driven on an asyncio loop, as Ray
would drive it, with a real rollout server from a synced environment.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from launcher.cluster.agent import AgentSpec, NodeAgent, ReplicaStopped
from launcher.cluster.flags import DEADMAN_ENV, DEADMAN_MIN_S, DEADMAN_S, deadman_seconds
from launcher.cluster.replicas import PING_S
from launcher.errors import ValidationError
from tests.cluster.conftest import slow_workspace


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_the_switch_stops_the_server_only_once_the_supervisor_falls_silent(
    slow_env: Path, tmp_path: Path
) -> None:
    ws = slow_workspace(tmp_path / "ws", 0.0)
    spec = AgentSpec(
        python=str(slow_env / "bin" / "python"),
        entrypoint=str(ws / "rollouts" / "echo" / "main.py"),
        rollout_dir=str(ws / "rollouts" / "echo"),
        config_env={},
        secrets={},
        relay_host="127.0.0.1",
        relay_port=9,  # never reached: no item runs
        stop_grace_s=1.0,
        deadman_s=2.0,
    )

    async def scenario() -> None:
        agent = NodeAgent()
        facts = await agent.start(msgspec.json.encode(spec))
        server = int(facts["server_pid"])
        try:
            # Pinged (as the supervisor does every 2 s, here every 0.1 s) well past the
            # switch's time: the server stays.
            pinged_until = time.monotonic() + 3 * spec.deadman_s
            while time.monotonic() < pinged_until:
                assert await agent.health()
                await asyncio.sleep(0.1)
            assert _alive(server)
            # Silence: the switch stops the server (the lifeline: its group, its directory).
            waiting = asyncio.create_task(agent.collect(8, 1 << 20, 0.0))
            while _alive(server):
                await asyncio.sleep(0.1)
            with pytest.raises(ReplicaStopped, match="no call from the supervisor for 2s"):
                await waiting  # a collect waiting when it stopped
            for call in (agent.health(), agent.submit([]), agent.collect(1, 1, 0.0)):
                with pytest.raises(ReplicaStopped, match="dead-man switch"):
                    await call
            assert any("dead-man switch" in line for line in await agent.tail())
        finally:
            await agent.stop(1.0)

    async def bounded() -> None:
        await asyncio.wait_for(scenario(), timeout=120)

    asyncio.run(bounded())


def test_the_switch_time_comes_from_the_environment_and_bad_values_are_refused() -> None:
    assert deadman_seconds({}) == DEADMAN_S
    assert deadman_seconds({DEADMAN_ENV: " 12.5 "}) == 12.5
    # Below five pings a healthy node would stop its server between two of them.
    assert DEADMAN_MIN_S >= 5 * PING_S
    for short in ("0.5", "2", "9.9"):
        with pytest.raises(ValidationError, match="at least 10 seconds"):
            deadman_seconds({DEADMAN_ENV: short})
    assert deadman_seconds({DEADMAN_ENV: "0"}) == 0.0  # off
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(ValidationError, match=DEADMAN_ENV):
            deadman_seconds({DEADMAN_ENV: bad})


@pytest.mark.slow
def test_a_replica_that_does_not_start_leaves_no_directory_on_the_node(
    slow_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's directory is the lifeline's to remove; a server that never started has no
    lifeline, so the agent removes it itself."""
    ws = slow_workspace(tmp_path / "ws", 0.0)
    main = ws / "rollouts" / "echo" / "main.py"
    main.write_text("raise SystemExit('boom on this node')\n")
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(node_tmp))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    spec = AgentSpec(
        python=str(slow_env / "bin" / "python"),
        entrypoint=str(main),
        rollout_dir=str(ws / "rollouts" / "echo"),
        config_env={},
        secrets={},
        relay_host="127.0.0.1",
        relay_port=9,
        stop_grace_s=1.0,
        deadman_s=0.0,
    )

    async def scenario() -> None:
        agent = NodeAgent()
        try:
            with pytest.raises(Exception):  # noqa: B017 - whatever the server's failure is
                await agent.start(msgspec.json.encode(spec))
        finally:
            await agent.stop(1.0)  # Ray kills the actor; here its loop's thread must end

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    assert [p.name for p in node_tmp.iterdir() if p.name.startswith("rollbridge-agent-")] == []
