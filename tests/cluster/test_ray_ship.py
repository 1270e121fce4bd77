"""``eval run --ray`` with node 2 running the rollout from its shipped bundle
(launcher/cluster/ship.py), on the real two-node test bed (scripts/ray-testbed).

Node 2 has no route off the test bed's veth pair and its Ray node runs with ``UV_OFFLINE=1``
and a node cache of its own (``RB_N2_CACHE``); each workspace here gets a file no other run had,
so its bundle's digest is new and node 2 must build the environment during the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rollout_server.harbor.bundle import default_cache_root
from rollout_server.protocol import ENV_ARTIFACT_ROOT
from tests.cluster.conftest import N2_IP, ClusterBed, slow_workspace
from tests.cluster.test_ray_testbed import (
    _args,
    _check_once,
    _env,
    _no_leftovers,
    _remote_rollouts,
)
from tests.launcher.e2e.helpers import run_cli, run_dir, start_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def _fresh_workspace(dest: Path, delay_s: float) -> Path:
    ws = slow_workspace(dest, delay_s)
    (ws / "rollouts" / "echo" / "nonce.txt").write_text(uuid.uuid4().hex + "\n")
    return ws


def _node2_servers(testbed: ClusterBed) -> list[tuple[list[str], dict[str, str], str]]:
    """(cmdline, environment, cwd) of the rollout servers running in node 2's namespace."""
    found = []
    for pid in testbed.netns_pids():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            cmdline = proc.cmdline()
            if any(part.endswith("/rollbridge_rollout/main.py") for part in cmdline):
                found.append((cmdline, proc.environ(), proc.cwd()))
    return found


def _default_route(testbed: ClusterBed) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", testbed.netns, "ip", "route", "show", "default"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@contextlib.contextmanager
def _cache_blocked(cache: Path) -> Iterator[None]:
    """A file where node 2's cache directory should be (so building there fails)."""
    aside = cache.with_name("n2-cache.aside")
    if cache.exists():
        cache.rename(aside)
    cache.write_text("a file where node 2's cache should be\n")
    try:
        yield
    finally:
        cache.unlink()
        if aside.exists():
            aside.rename(cache)


def _log_lines(run: Path, needle: str) -> list[str]:
    return [line for line in (run / "logs.txt").read_text().splitlines() if needle in line]


def _shipped_once(run: Path) -> str:
    """The digest of the one bundle the run shipped (each test's is new: dropped from the
    head's bundle cache, which would otherwise keep a copy of uv for each)."""
    lines = _log_lines(run, "rollout bundle shipped")
    assert len(lines) == 1, lines
    digest = lines[0].split('"bundle":"')[1].split('"')[0]
    shutil.rmtree(default_cache_root() / digest, ignore_errors=True)
    return digest


async def test_node2_builds_its_environment_offline_from_the_bundle(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    cache = Path(testbed.env["RB_N2_CACHE"])
    assert _default_route(testbed) == "", "node 2 has a route off the test bed"
    # Environments of earlier edits, older than any real one: the build prunes the cache to
    # the 5 most recently used (ship.KEEP), so at least the two oldest of these go.
    stale = [f"{n:064x}" for n in range(1, 7)]
    for age, name in enumerate(stale):
        (cache / name / "venv").mkdir(parents=True, exist_ok=True)
        (cache / f"{name}.lock").touch()
        os.utime(cache / f"{name}.lock", (1e6 - age, 1e6 - age))
    ws = _fresh_workspace(tmp_path / "ws", 2.0)
    env = _env(testbed, slow_env)
    cli = await start_cli(_args(testbed, "shipped"), cwd=tmp_path, env=env, logdir=tmp_path / "cli")
    try:
        await wait_for(lambda: _node2_servers(testbed), timeout=180, interval=0.2)
        servers = _node2_servers(testbed)
        result = await cli.wait(timeout=300)
    finally:
        if cli.process.returncode is None:
            cli.kill9()
    assert result.returncode == 0, result.stderr + result.stdout
    run = run_dir(ws, "shipped")
    _check_once(run)
    assert _remote_rollouts(run), "no rollout ran on node 2"
    # Node 2's server runs from the venv built in its node cache, not the head's rollout venv.
    assert len(servers) == 1, servers
    cmdline, environ, cwd = servers[0]
    python = Path(cmdline[0])
    assert python.is_relative_to(cache) and python.parts[-3:] == ("venv", "bin", "python")
    assert not python.is_relative_to(slow_env) and not python.is_relative_to(ws)
    assert Path(cwd).is_relative_to(cache)
    assert environ.get("UV_OFFLINE") == "1"
    # Its trials are written, packed and deleted in node 2's own temporary file system.
    assert Path(environ[ENV_ARTIFACT_ROOT]).is_relative_to(testbed.n2_tmp), environ
    digest = _shipped_once(run)
    assert python.is_relative_to(cache / digest)
    built = _log_lines(run, "replica environment built")
    assert len(built) == 1 and f'"node":"{N2_IP}"' in built[0], built
    assert f'"python":"{python}"' in built[0]
    pruned = _log_lines(run, "node cache pruned")
    assert len(pruned) == 1 and f'"node":"{N2_IP}"' in pruned[0], pruned
    assert not (cache / stale[-1]).exists() and not (cache / stale[-2]).exists()
    assert (cache / digest).is_dir(), "the run's own environment was pruned"
    # A second run of the same rollout finds node 2's environment ready.
    again = await run_cli(_args(testbed, "again"), cwd=tmp_path, env=env, timeout=300)
    assert again.returncode == 0, again.stderr + again.stdout
    second = run_dir(ws, "again")
    _check_once(second)
    reused = _log_lines(second, "replica environment reused")
    assert len(reused) == 1 and f'"python":"{python}"' in reused[0], reused
    assert not _log_lines(second, "replica environment built")
    assert _shipped_once(second) == digest
    assert not _log_lines(second, "node cache pruned"), "a reuse pruned the cache"
    for name in stale:
        shutil.rmtree(cache / name, ignore_errors=True)
        (cache / f"{name}.lock").unlink(missing_ok=True)
    await _no_leftovers(ws, testbed)


async def test_a_failed_build_on_node2_leaves_the_run_to_the_head(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    with _cache_blocked(Path(testbed.env["RB_N2_CACHE"])):
        ws = _fresh_workspace(tmp_path / "ws", 0.2)
        result = await run_cli(
            _args(testbed, "refused"), cwd=tmp_path, env=_env(testbed, slow_env), timeout=300
        )
        assert result.returncode == 0, result.stderr + result.stdout
        run = run_dir(ws, "refused")
        _check_once(run)
        refused = _log_lines(run, "node refused")
        assert len(refused) == 1, refused
        assert "ShipError: cannot build the rollout environment" in refused[0]
        assert f'"node":"{N2_IP}"' in refused[0]
        # Said on the terminal too, and the replica line does not hide it.
        assert f"node {N2_IP} refused: its replica did not start" in result.stderr
        assert _log_lines(run, "1 replica (no other node, 1 refused besides the supervisor's)")
        assert not _remote_rollouts(run)
        _shipped_once(run)
        await _no_leftovers(ws, testbed)
