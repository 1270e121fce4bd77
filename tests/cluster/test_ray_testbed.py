"""``eval run --ray`` on a real two-node Ray cluster (scripts/ray-testbed), and node-loss drills.

Each test ends with every row journaled exactly once, the example's outcomes unchanged (no row
failed because of the drill), and no rollout server or lifeline of the run left on either node.
The tests share one cluster; a drill that takes node 2 away brings it back before it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from launcher.cluster.flags import DEADMAN_ENV
from tests.cluster.conftest import N2_IP, ClusterBed, slow_workspace
from tests.launcher.e2e.helpers import (
    base_env,
    count_log,
    journal,
    metrics,
    run_cli,
    run_dir,
    start_cli,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.netns]

CONFIG = "ws/configs/eval/echo.toml"
# The example dataset: 21 rows; 16 pass, 3 score 0, 1 is skipped by the grader, 1 fails.
EXPECTED = {"total_samples": 21, "passed": 16, "failed": 1, "skipped": 1}


def _env(testbed: ClusterBed, slow_env: Path) -> dict[str, str]:
    return base_env(UV_PROJECT_ENVIRONMENT=str(slow_env), **testbed.env)


def _args(testbed: ClusterBed, name: str) -> list[str]:
    return [
        "eval", "run", CONFIG, "--yes", "--plain", "--name", name,
        "--ray", testbed.address, "--max-in-flight", "8",
    ]  # fmt: skip


def _leftovers(ws: Path) -> list[psutil.Process]:
    """Live rollout servers of this workspace (node 2's run from the test bed's node cache),
    and lifelines, on any node."""
    entry = str(ws / "rollouts" / "echo" / "main.py")
    shipped = (f"{tempfile.gettempdir()}/rtb-", "/rollbridge_rollout/main.py")
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if proc.info["status"] != psutil.STATUS_ZOMBIE and (
            entry in cmd or "cluster/lifeline.py" in cmd or all(s in cmd for s in shipped)
        ):
            found.append(proc)
    return found


def _remote_rollouts(run: Path) -> set[str]:
    ids = set()
    for line in (run / "logs.txt").read_text().splitlines():
        if "rollout finished on replica" in line and f'"replica":"{N2_IP}"' in line:
            ids.add(line.split('"rollout_id":"')[1].split('"')[0])
    return ids


def _check_once(run: Path) -> list[dict[str, object]]:
    records = journal(run)
    keys = [(r["row_index"], r["run_index"]) for r in records]
    assert len(keys) == 21 and len(set(keys)) == 21, sorted(keys)
    summary = metrics(run)["summary"]
    assert {k: summary[k] for k in EXPECTED} == EXPECTED, summary
    assert metrics(run)["eval_run"]["status"] == "finished"
    return records


def _kill9(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _agent_dirs(ws: Path, testbed: ClusterBed) -> list[Path]:
    """Node-local directories of agents started since ``ws`` was made (this test's), on the
    head and in node 2's temporary file system."""
    made = ws.stat().st_mtime - 1
    roots = (Path(tempfile.gettempdir()), testbed.n2_tmp)
    return [
        d for root in roots for d in root.glob("rollbridge-agent-*") if d.stat().st_mtime >= made
    ]


async def _no_leftovers(ws: Path, testbed: ClusterBed, *, dirs: bool = True) -> None:
    """No server or lifeline left; with ``dirs``, no agent directory either (the lifeline
    removes it; a node that lost power keeps it)."""
    await wait_for(lambda: not _leftovers(ws), timeout=90, interval=0.5)
    if dirs:
        await wait_for(lambda: not _agent_dirs(ws, testbed), timeout=30, interval=0.5)


async def _restore_node2(testbed: ClusterBed) -> None:
    """Bring the cluster back to two alive nodes (node 2 as a new node if it was lost)."""
    if await trio.to_thread.run_sync(testbed.alive_nodes) == 2 and testbed.netns_pids():
        return
    _kill9(testbed.netns_pids())  # what the test bed started in the namespace
    with trio.fail_after(90):
        while await trio.to_thread.run_sync(testbed.alive_nodes) != 1:
            await trio.sleep(1)
    testbed.script("start-n2")
    with trio.fail_after(120):
        while await trio.to_thread.run_sync(testbed.alive_nodes) != 2:
            await trio.sleep(1)


async def test_two_nodes_every_row_once_tokens_on_both(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    ws = slow_workspace(tmp_path / "ws", 0.5)
    result = await run_cli(
        _args(testbed, "two"), cwd=tmp_path, env=_env(testbed, slow_env), timeout=240
    )
    assert result.returncode == 0, result.stderr + result.stdout
    run = run_dir(ws, "two")
    records = _check_once(run)
    remote = _remote_rollouts(run)
    assert remote, "no rollout ran on node 2"
    assert len(remote) < 21, "no rollout ran on the supervisor's node"
    # Tokens are counted by the one bridge for rollouts of both nodes.
    for where in (True, False):
        counted = [r for r in records if (r["rollout_id"] in remote) == where and r["tokens"]]
        assert counted, f"no tokens for rollouts {'on' if where else 'off'} node 2"
    # Each remote rollout's trial directory was brought back before its record.
    for record in records:
        if record["rollout_id"] in remote and record["status"] == "success":
            trial = run / "rollout_trials" / str(record["rollout_id"])
            assert (trial / "trajectory.json").is_file()
    await _no_leftovers(ws, testbed)


_RECORD_IMPORTS = (
    "import json as _json\n"
    "import pathlib as _pl\n"
    "from rollout_server import get_rollout_context as _context\n"
)


def _record_rollouts(ws: Path, dest: Path) -> None:
    """Make the workspace's rollout write its rollout's chat URL and bearer to
    ``dest/<rollout_id>.json`` as it starts (on whichever node it runs)."""
    main = ws / "rollouts" / "echo" / "main.py"
    record = (
        "        _rc = _context()\n"
        "        (_pl.Path(_os.environ['RB_ROLLOUTS_DIR']) / f'{_rc.rollout_id}.json').write_text("
        "_json.dumps({'url': _rc.chat_completions_url, 'key': _rc.api_key}))\n"
    )
    sleep = "        await _trio.sleep(_DELAY_S)\n"
    future = "from __future__ import annotations\n"
    text = main.read_text().replace(sleep, record + sleep, 1)
    text = text.replace(future, future + _RECORD_IMPORTS, 1)
    main.write_text(text)
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(config.read_text() + f'RB_ROLLOUTS_DIR = "{dest}"\n')  # in its [env]


def _call_through_relay(run: Path, rollouts: Path, rollout_id: str) -> int:
    """A model call for ``rollout_id`` sent to the supervisor's relay (with that rollout's own
    bearer, as a node's agent relay would send it); its status."""
    listening = next(
        line for line in (run / "logs.txt").read_text().splitlines() if "relay listening" in line
    )
    details = json.loads(listening[listening.index("{") :])
    key = json.loads((rollouts / f"{rollout_id}.json").read_text())["key"]
    scheme = "https" if details["tls"] else "http"
    base = f"{scheme}://{details['host']}:{details['port']}"
    # The test is not a pinned node: it checks the bridge's answer, not the certificate.
    with httpx.Client(verify=False, timeout=30) as client:
        reply = client.post(
            f"{base}/v1/rollouts/{rollout_id}/chat/completions",
            json={"messages": [{"role": "user", "content": "still here?"}]},
            headers={"Authorization": f"Bearer {key}"},
        )
    return reply.status_code


def _door_connections(run: Path, peer: str) -> int:
    """Open connections from ``peer`` to the bridge's door on the head (whatever process holds
    them: the bridge's, once handed over)."""
    listening = next(
        line for line in (run / "logs.txt").read_text().splitlines() if "relay listening" in line
    )
    port = json.loads(listening[listening.index("{") :])["port"]
    return sum(
        1
        for conn in psutil.net_connections("tcp")
        if conn.laddr
        and conn.laddr.port == port
        and conn.raddr
        and conn.raddr.ip == peer
        and conn.status == psutil.CONN_ESTABLISHED
    )


def _closed_on_leave(run: Path) -> list[dict[str, object]]:
    return [
        json.loads(line[line.index("{") :])
        for line in (run / "logs.txt").read_text().splitlines()
        if "bridge connections of a node that left closed" in line
    ]


def _requeued_ids(run: Path) -> list[str]:
    return [
        line.split('"rollout_id":"')[1].split('"')[0]
        for line in (run / "logs.txt").read_text().splitlines()
        if "replica lost; requeued" in line
    ]


async def _drill(
    testbed: ClusterBed,
    slow_env: Path,
    tmp_path: Path,
    action: Callable[[Path], Awaitable[None]],
    *,
    delay_s: float = 3.0,
    requeues: bool = True,
    rollouts: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[Path, Path]:
    # Each drill starts from two alive nodes, whatever an earlier test's clean-up managed.
    await _restore_node2(testbed)
    ws = slow_workspace(tmp_path / "ws", delay_s)
    if rollouts is not None:
        _record_rollouts(ws, rollouts)
    run = run_dir(ws, "drill")
    cli = await start_cli(
        _args(testbed, "drill"),
        cwd=tmp_path,
        env={**_env(testbed, slow_env), **(env or {})},
        logdir=tmp_path / "cli",
    )
    try:
        await wait_for(
            lambda: (
                count_log(run, "replica ready") >= 1 and count_log(run, "dispatching rollout") >= 8
            ),
            timeout=180,
        )
        await action(run)
        result = await cli.wait(timeout=300)
    finally:
        if cli.process.returncode is None:
            cli.kill9()
    assert result.returncode == 0, result.stderr + result.stdout
    _check_once(run)
    # Lost, or (a clean leave, drained) left.
    assert count_log(run, "replica lost") + count_log(run, "replica left") >= 1
    if requeues:
        assert count_log(run, "requeued") >= 1
    return ws, run


async def test_drill_power_loss_of_node2(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    async def power_loss(_run: Path) -> None:
        _kill9(testbed.netns_pids())

    try:
        ws, _ = await _drill(testbed, slow_env, tmp_path, power_loss)
        await _no_leftovers(ws, testbed, dirs=False)
        assert not testbed.netns_pids()
    finally:
        await _restore_node2(testbed)


async def test_drill_link_cut(testbed: ClusterBed, slow_env: Path, tmp_path: Path) -> None:
    def link(state: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", testbed.netns, "ip", "link", "set",
             testbed.env["RB_PEER_IF"], state],
            check=True,
        )  # fmt: skip

    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    statuses: list[int] = []

    async def cut(run: Path) -> None:
        # Node 2's rollouts have called the model through the door: their connections stay
        # open (kept alive) while the link is down, until the node is declared dead.
        await wait_for(lambda: _door_connections(run, N2_IP) >= 1, timeout=120, interval=0.2)
        link("down")
        # Once an item is requeued, its old rollout id is refused: a node cut off, or
        # anything else holding the bearer, spends nothing more under it.
        await wait_for(lambda: _requeued_ids(run), timeout=180, interval=0.2)
        old = _requeued_ids(run)[0]
        statuses.append(await trio.to_thread.run_sync(_call_through_relay, run, rollouts, old))

    try:
        ws, run = await _drill(
            testbed, slow_env, tmp_path, cut, rollouts=rollouts, env={DEADMAN_ENV: "10"}
        )
        assert statuses == [410]
        assert count_log(run, "refusing model calls") >= 1
        # Declared dead, node 2 lost its way to the bridge: what it had open was closed.
        closed = [c for c in _closed_on_leave(run) if c["node"] == N2_IP]
        assert closed and int(str(closed[0]["connections"])) >= 1
        # Still cut off, with no call from the supervisor for 10 s: node 2's agent stopped
        # its rollout server by itself (the dead-man switch), and the lifeline its directory.
        await _no_leftovers(ws, testbed)
        # Back on the network, node 2 learns it was declared dead; its agent goes.
        link("up")
        await _no_leftovers(ws, testbed)
    finally:
        link("up")
        await _restore_node2(testbed)


async def test_drill_node_leaves_and_rejoins(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    async def leave_and_join(run: Path) -> None:
        testbed.script("stop-n2")
        # A clean leave: node 2's replica takes no new work, finishes what it has, and its
        # agent stops so that the node's drain can end.
        await wait_for(lambda: count_log(run, "replica draining") >= 1, timeout=60)
        # Drained, it has left (not lost: every item finished); were Ray quicker to drop the
        # node than the agent's stop to return, the node's leaving says lost, and no item is
        # requeued either way (requeues=False below).
        await wait_for(
            lambda: count_log(run, "replica left") + count_log(run, "replica lost") >= 1,
            timeout=120,
        )
        await wait_for(lambda: not testbed.netns_pids(), timeout=90, interval=0.5)
        testbed.script("start-n2")

    try:
        ws, run = await _drill(
            testbed, slow_env, tmp_path, leave_and_join, delay_s=6.0, requeues=False
        )
        # The node came back as a new node and got a new replica during the run.
        assert count_log(run, "replica ready") >= 2
        await _no_leftovers(ws, testbed)
    finally:
        await _restore_node2(testbed)


async def test_drill_supervisor_kill9_then_resume(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    ws = slow_workspace(tmp_path / "ws", 3.0)
    run = run_dir(ws, "killed")
    env = _env(testbed, slow_env)
    cli = await start_cli(_args(testbed, "killed"), cwd=tmp_path, env=env, logdir=tmp_path / "cli")
    try:
        await wait_for(
            lambda: (
                count_log(run, "replica ready") >= 1 and count_log(run, "dispatching rollout") >= 8
            ),
            timeout=180,
        )
    finally:
        cli.kill9()
    await cli.wait(timeout=30)
    # Node 2's agent fate-shares with its owner and its lifeline stops the server there.
    await wait_for(
        lambda: not [p for p in _leftovers(ws) if p.pid in testbed.netns_pids()],
        timeout=90,
        interval=0.5,
    )
    before = len(journal(run))
    assert before < 21
    result = await run_cli(_args(testbed, "killed"), cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    _check_once(run)
    await _no_leftovers(ws, testbed)


async def test_ctrl_c_stops_every_replica_and_resume_finishes(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    ws = slow_workspace(tmp_path / "ws", 3.0)
    run = run_dir(ws, "interrupted")
    env = _env(testbed, slow_env)
    cli = await start_cli(
        _args(testbed, "interrupted"), cwd=tmp_path, env=env, logdir=tmp_path / "cli"
    )
    try:
        await wait_for(
            lambda: (
                count_log(run, "replica ready") >= 1 and count_log(run, "dispatching rollout") >= 8
            ),
            timeout=180,
        )
        cli.signal(signal.SIGINT)
        result = await cli.wait(timeout=120)
    finally:
        if cli.process.returncode is None:
            cli.kill9()
    assert result.returncode == 130, result.stderr + result.stdout
    # Nothing of the run survives its supervisor: not on the head, not on node 2.
    assert not _leftovers(ws)
    await _no_leftovers(ws, testbed)
    assert len(journal(run)) < 21
    again = await run_cli(_args(testbed, "interrupted"), cwd=tmp_path, env=env, timeout=300)
    assert again.returncode == 0, again.stderr + again.stdout
    _check_once(run)


async def test_a_node_that_joins_mid_run_adds_its_capacity(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    """Node 2 away when the run starts: dispatch runs on the head's replica alone (its
    capacity); node 2 joins, gets a replica, and the run's concurrency grows by its capacity,
    so rows run there beside the head's, each once."""
    await _restore_node2(testbed)
    testbed.script("stop-n2")
    with trio.fail_after(120):
        while await trio.to_thread.run_sync(testbed.alive_nodes) != 1:
            await trio.sleep(1)
    ws = slow_workspace(tmp_path / "ws", 4.0)
    run = run_dir(ws, "grow")
    cli = await start_cli(
        _args(testbed, "grow"), cwd=tmp_path, env=_env(testbed, slow_env), logdir=tmp_path / "cli"
    )
    try:
        await wait_for(lambda: count_log(run, "dispatching rollout") >= 2, timeout=180)
        testbed.script("start-n2")
        result = await cli.wait(timeout=300)
    finally:
        if cli.process.returncode is None:
            cli.kill9()
        await _restore_node2(testbed)
    assert result.returncode == 0, result.stderr + result.stdout
    _check_once(run)
    assert count_log(run, "in flight (replicas joined)") >= 1, (run / "logs.txt").read_text()
    assert _remote_rollouts(run)
    await _no_leftovers(ws, testbed)
