"""The Harbor example's workflow mode with ``eval run --ray`` on the real two-node test bed
(scripts/ray-testbed) and the sandbox test bed (scripts/sandbox-testbed).

Node 2 is a network namespace on this host, so its podman shares the host's image and container
store (docs/scale-out.md): node 2's replica builds its rollout environment from the shipped
bundle, finds by itself how its containers reach the bridge (slirp to the agent's loopback relay
inside the namespace), and runs its trials with its own podman processes. Both rollout servers'
containers live in one store side by side: neither server's start-up reaping may take the other's.

Skips, with the reason, without root, Ray, iproute2 or the sandbox test bed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from rollout_server.harbor.containers import OWNER_LABEL, TRIAL_LABEL, owner_token
from tests.cluster.conftest import ClusterBed
from tests.cluster.test_ray_testbed import _agent_dirs, _remote_rollouts
from tests.harbor.conftest import (
    IMAGE,
    _testbed_problem,
    make_harbor_workspace,
    synced_harbor_venv,
)
from tests.harbor.test_reaper import _dead_owner
from tests.launcher.e2e.helpers import (
    base_env,
    journal,
    run_cli,
    run_dir,
    start_cli,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.netns]

LIFELINE = Path(__file__).parents[2] / "launcher" / "cluster" / "lifeline.py"

ROWS = 4
ROW = (
    '{{"user_prompt": "Create the file /app/answer.txt containing the single word hello. '
    '(row {n})", "ground_truth": "hello"}}\n'
)


@pytest.fixture(scope="module")
def sandbox_bed() -> None:
    """Skip unless podman runs the sandbox test bed's image and Harbor's venv is there."""
    problem = _testbed_problem()
    if problem is not None:
        pytest.skip(f"needs the sandbox test bed: {problem}")


@pytest.fixture(scope="module")
def harbor_venv(sandbox_bed: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synced environment of the Harbor example's rollout."""
    return synced_harbor_venv(tmp_path_factory.mktemp("harbor-rollout"))


def _workspace(dest: Path) -> Path:
    """The example with ``ROWS`` rows, one trial at a time per replica (so both get work), and
    the example's directory named for node 2 (its rollout is a shipped copy of
    ``rollouts/harbor_hello`` alone; the tasks stay where both nodes see them)."""
    ws = make_harbor_workspace(dest)
    (ws / "data" / "hello.jsonl").write_text("".join(ROW.format(n=n) for n in range(ROWS)))
    for name in ("workflow", "oracle"):
        config = ws / "configs" / "eval" / f"{name}.toml"
        text = config.read_text().replace('HARBOR_CONCURRENCY = "2"', 'HARBOR_CONCURRENCY = "1"')
        config.write_text(text.replace("[env]\n", f'[env]\nHARBOR_EXAMPLE_DIR = "{ws}"\n', 1))
    return ws


def _args(testbed: ClusterBed, name: str, config: str = "workflow") -> list[str]:
    return [
        "eval", "run", f"ws/configs/eval/{config}.toml", "--yes", "--plain", "--name", name,
        "--ray", testbed.address,
    ]  # fmt: skip


def _env(testbed: ClusterBed, venv: Path) -> dict[str, str]:
    return base_env(UV_PROJECT_ENVIRONMENT=str(venv), HARBOR_TELEMETRY="0", **testbed.env)


def _labelled() -> list[dict[str, str]]:
    """The labels of every trial container on the (shared) engine."""
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={TRIAL_LABEL}", "--format", "json"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return [dict(row.get("Labels") or {}) for row in json.loads(listed.stdout or b"[]")]


def _trial_containers(ids: set[str]) -> list[str]:
    """Containers (any state) of this run's trials, found by their trial label."""
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={TRIAL_LABEL}", "--format", "json"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    names = {f"trial-{i}" for i in ids}
    return [
        row["Names"][0]
        for row in json.loads(listed.stdout or b"[]")
        if (row.get("Labels") or {}).get(TRIAL_LABEL) in names
    ]


def _servers(ws: Path, *, lifelines: bool = True) -> list[psutil.Process]:
    """Live rollout servers of this run on either node (node 2's from its node cache), and
    (with ``lifelines``) lifelines."""
    entry = str(ws / "rollouts" / "harbor_hello" / "main.py")
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "environ"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        shipped = "/rollbridge_rollout/main.py" in cmd and (
            (proc.info["environ"] or {}).get("HARBOR_EXAMPLE_DIR") == str(ws)
        )
        if proc.info["status"] != psutil.STATUS_ZOMBIE and (
            entry in cmd or shipped or (lifelines and "cluster/lifeline.py" in cmd)
        ):
            found.append(proc)
    return found


def _lines(run: Path, needle: str) -> list[str]:
    return [line for line in (run / "logs.txt").read_text().splitlines() if needle in line]


async def test_harbor_workflow_trials_on_both_nodes(
    harbor_venv: Path, testbed: ClusterBed, tmp_path: Path
) -> None:
    ws = _workspace(tmp_path / "ws")
    env = _env(testbed, harbor_venv)
    result = await run_cli(_args(testbed, "hb"), cwd=tmp_path, env=env, timeout=900)
    run = run_dir(ws, "hb")
    logs = (run / "logs.txt").read_text() if (run / "logs.txt").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + logs[-6000:]
    records = journal(run)
    assert sorted(r["row_index"] for r in records) == list(range(ROWS)), records
    assert [(r["status"], r.get("reward")) for r in records] == [("success", 1.0)] * ROWS
    ids = {str(r["rollout_id"]) for r in records}
    remote = _remote_rollouts(run)
    assert remote, "no trial ran on node 2"
    assert remote < ids, "no trial ran on the supervisor's node"
    # The one bridge counted the model calls of every trial, on both nodes.
    assert all(r["tokens"] for r in records), records
    started = _lines(run, "LLM bridge started")[0]
    bridge_port = json.loads(started[started.index("{") :])["port"]
    for rollout_id in ids:
        # Node 2's trial directories came back in the rollout's tar, as the head's are local.
        trial = run / "rollout_trials" / rollout_id
        assert (trial / "harbor" / "result.json").is_file(), sorted(trial.rglob("*"))
        assert (trial / "logs" / "harbor.log").is_file(), sorted(trial.rglob("*"))
        assert list(trial.rglob("container_result.json")), sorted(trial.rglob("*"))
        # Containers reach the bridge through slirp: on the head to the bridge's own port; on
        # node 2 (whose server found its route itself: nobody probed it) to its agent's relay
        # on the namespace's loopback.
        route = json.loads((trial / "diagnostics.json").read_text())["sandbox_route"]
        assert route["kind"] == "slirp", route
        on_head = route["url"] == f"http://10.0.2.2:{bridge_port}"
        assert on_head == (rollout_id not in remote), (route, bridge_port)
    assert not _trial_containers(ids)
    await wait_for(lambda: not _servers(ws), timeout=90, interval=0.5)
    await wait_for(lambda: not _agent_dirs(ws, testbed), timeout=30, interval=0.5)


async def test_harbor_oracle_trials_on_both_nodes(
    harbor_venv: Path, testbed: ClusterBed, tmp_path: Path
) -> None:
    """A host-side agent: each replica's trials run through its own Harbor worker."""
    ws = _workspace(tmp_path / "ws")
    env = _env(testbed, harbor_venv)
    args = _args(testbed, "ho", "oracle")
    result = await run_cli(args, cwd=tmp_path, env=env, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    run = run_dir(ws, "ho")
    records = journal(run)
    assert sorted(r["row_index"] for r in records) == list(range(ROWS)), records
    assert [(r["status"], r.get("reward")) for r in records] == [("success", 1.0)] * ROWS
    ids = {str(r["rollout_id"]) for r in records}
    remote = _remote_rollouts(run)
    assert remote and remote < ids, (remote, ids)
    for rollout_id in remote:
        assert (run / "rollout_trials" / rollout_id / "harbor" / "result.json").is_file()
    assert not _trial_containers(ids)
    await wait_for(lambda: not _servers(ws), timeout=90, interval=0.5)


def _plant(prefix: list[str], owner: str) -> str:
    """A labelled container owned by ``owner``, started by podman run with ``prefix``."""
    trial = f"trial-rbtest-{uuid.uuid4().hex[:12]}"
    labels = ["--label", f"{TRIAL_LABEL}={trial}", "--label", f"{OWNER_LABEL}={owner}"]
    argv = [*prefix, "podman", "run", "-d", "--network", "none", *labels, IMAGE, "sleep", "300"]
    done = subprocess.run(argv, capture_output=True, timeout=60, check=True)
    return done.stdout.decode().strip()


def _reap(prefix: list[str], root: Path) -> None:
    """A rollout server's start-up reaping, run where ``prefix`` puts it."""
    code = (
        "import sys; from pathlib import Path; "
        "from rollout_server.harbor.reaper import reap_dead_owners; "
        "reap_dead_owners('podman', Path(sys.argv[1]))"
    )
    subprocess.run([*prefix, sys.executable, "-c", code, str(root)], timeout=120, check=True)


def _exists(container: str) -> bool:
    done = subprocess.run(["podman", "container", "exists", container], timeout=60, check=False)
    return done.returncode == 0


def test_each_nodes_reaping_spares_the_other_nodes_live_trials(
    sandbox_bed: None, testbed: ClusterBed, tmp_path: Path
) -> None:
    """Both nodes share one podman store here; owners are ``pid:start time`` in the one pid
    namespace both nodes live in, so each node's start-up reaping removes what dead servers
    left and never what a live server of the other node runs."""
    n2 = ["nsenter", f"--net=/run/netns/{testbed.netns}"]
    owner_on_n2 = subprocess.Popen([*n2, "sleep", "300"])
    planted: list[str] = []
    try:
        head_live = _plant([], owner_token())
        n2_live = _plant(n2, owner_token(owner_on_n2.pid))
        dead_on_head = _plant([], _dead_owner())
        planted += [head_live, n2_live, dead_on_head]
        _reap(n2, tmp_path / "n2-trials")
        assert _exists(head_live) and _exists(n2_live)
        assert not _exists(dead_on_head)
        dead_on_n2 = _plant(n2, _dead_owner())
        planted.append(dead_on_n2)
        _reap([], tmp_path / "head-trials")
        assert _exists(head_live) and _exists(n2_live)
        assert not _exists(dead_on_n2)
    finally:
        owner_on_n2.kill()
        owner_on_n2.wait()
        if planted:
            subprocess.run(["podman", "rm", "-f", "-t", "0", *planted], timeout=60, check=False)


def test_the_lifeline_removes_the_containers_of_the_server_it_stopped(
    sandbox_bed: None, tmp_path: Path
) -> None:
    """A server killed before its shutdown finished leaves its trials' containers; the lifeline
    that stopped it removes those (and no other owner's)."""
    server = subprocess.Popen(["sleep", "300"], start_new_session=True)
    other = subprocess.Popen(["sleep", "300"])
    planted: list[str] = []
    try:
        mine = _plant([], owner_token(server.pid))
        theirs = _plant([], owner_token(other.pid))
        planted += [mine, theirs]
        root = tmp_path / "agent-root"
        root.mkdir()
        read, write = os.pipe()
        starter = subprocess.Popen(
            [sys.executable, str(LIFELINE), str(server.pid), "1", str(root), "containers"],
            stdin=read,
        )
        os.close(read)
        assert starter.wait(timeout=30) == 0
        assert _exists(mine)
        os.close(write)  # the agent is gone
        assert server.wait(timeout=30) == -signal.SIGTERM
        deadline = time.monotonic() + 60
        while _exists(mine) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _exists(mine)
        assert _exists(theirs)
        assert not root.exists()
    finally:
        for proc in (server, other):
            proc.kill()
            proc.wait()
        subprocess.run(["podman", "rm", "-f", "-t", "0", *planted], timeout=60, check=False)


async def test_ctrl_c_mid_trial_leaves_nothing_on_either_node_and_resume_finishes(
    harbor_venv: Path, testbed: ClusterBed, tmp_path: Path
) -> None:
    ws = _workspace(tmp_path / "ws")
    env = _env(testbed, harbor_venv)
    owners: set[str] = set()

    def node2_trial_running() -> bool:
        servers = _servers(ws, lifelines=False)
        owners.update(owner_token(p.pid) for p in servers)
        on_n2 = {owner_token(p.pid) for p in servers if p.pid in set(testbed.netns_pids())}
        return any(labels.get(OWNER_LABEL) in on_n2 for labels in _labelled())

    cli = await start_cli(_args(testbed, "hc"), cwd=tmp_path, env=env, logdir=tmp_path / "cli")
    try:
        await wait_for(node2_trial_running, timeout=300, interval=0.5)
        cli.signal(signal.SIGINT)
        result = await cli.wait(timeout=240)
    finally:
        if cli.process.returncode is None:
            cli.kill9()
    assert result.returncode == 130, result.stdout + result.stderr
    assert len(owners) >= 2, owners  # the head's server and node 2's
    # No trial container of either node's server survives (node 2's server was stopped with
    # a short grace: its lifeline removes what its shutdown did not).
    await wait_for(
        lambda: not [c for c in _labelled() if c.get(OWNER_LABEL) in owners],
        timeout=120,
        interval=1.0,
    )
    await wait_for(lambda: not _servers(ws), timeout=90, interval=0.5)
    again = await run_cli(_args(testbed, "hc"), cwd=tmp_path, env=env, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    records = journal(run_dir(ws, "hc"))
    assert sorted(r["row_index"] for r in records) == list(range(ROWS)), records
    assert {(r["status"], r.get("reward")) for r in records} == {("success", 1.0)}
    await wait_for(lambda: not _servers(ws), timeout=90, interval=0.5)
