"""Fixtures of the Ray tests: a real two-node cluster on this machine (``scripts/ray-testbed``:
the head on the host, node 2 in a network namespace), and a workspace whose echo rollout waits
``ECHO_DELAY_S`` before answering, so a drill finds rollouts in flight on node 2.

Everything here skips, with the reason, without root, iproute2 or Ray.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher.e2e.helpers import REPO, make_workspace, synced_venv

TESTBED = REPO / "scripts" / "ray-testbed"
N2_IP = "10.203.0.2"
LOCK = "/tmp/rollbridge-ray-testbed.lock"

_DELAY = """
import os as _os

import trio as _trio

_DELAY_S = float(_os.environ.get("ECHO_DELAY_S") or 0)
"""


def _needs() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "needs Ray (the rollbridge[ray] extra)"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip netns)"
    if shutil.which("nsenter") is None:
        return "needs nsenter (util-linux)"
    return None


class ClusterBed:
    """The running test bed: its directory and the environment a driver needs."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.env: dict[str, str] = {}
        for line in (directory / "env").read_text().splitlines():
            for pair in line.removeprefix("export ").split():
                key, _, value = pair.partition("=")
                self.env[key] = value
        self.address = self.env["RB_ADDRESS"]
        self.netns = self.env["RB_NETNS"]
        self.n2_tmp = Path(self.env["RB_N2_TMP"])
        """Node 2's temporary file system (its agents' directories)."""

    def script(self, command: str) -> None:
        """Run ``scripts/ray-testbed <command> <dir>``."""
        subprocess.run(
            [str(TESTBED), command, str(self.dir)],
            env={**os.environ, "PYTHON": sys.executable},
            check=True,
            timeout=180,
        )

    def netns_pids(self) -> list[int]:
        """The processes in node 2's namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def alive_nodes(self) -> int:
        """How many nodes the cluster reports alive (asked from a fresh driver); -1 when the
        driver could not say (it failed to connect, or timed out)."""
        code = (
            "import os, ray; ray.init(address=os.environ['RB_ADDRESS'], log_to_driver=False, "
            "logging_level='ERROR'); "
            "print('alive-nodes', sum(1 for n in ray.nodes() if n['Alive']), flush=True)"
        )
        try:
            out = subprocess.run(
                [sys.executable, "-c", code],
                env={**os.environ, **self.env},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return -1
        # Ray prints what it hears of the cluster on the driver's stdout too, log_to_driver
        # off or not (a node's raylet ending: "(raylet) Raylet is terminated ..."), so the
        # count is read from its own marked line, not from the whole output.
        found = re.search(r"^alive-nodes (\d+)$", out.stdout, re.MULTILINE)
        return int(found.group(1)) if found else -1


@pytest.fixture(scope="package")
def testbed() -> Iterator[ClusterBed]:
    """A two-node Ray cluster for this package's tests, torn down after the last of them (even
    after a failure): idle, its 14 processes take about 7 % of a core, which the rest of the
    suite need not pay."""
    reason = _needs()
    if reason is not None:
        pytest.skip(reason)
    # One test bed per machine at a time (its namespace, addresses and Ray port are fixed):
    # a second pytest session waits here for the first one's to come down.
    lock = open(LOCK, "w")  # noqa: SIM115 - held for the session, closed in the finally
    fcntl.flock(lock, fcntl.LOCK_EX)
    # Short: Ray's unix sockets live under it, and their paths must fit in 107 bytes.
    directory = Path(tempfile.mkdtemp(prefix="rtb-", dir="/tmp"))
    try:
        subprocess.run(
            [str(TESTBED), "up", str(directory)],
            env={**os.environ, "PYTHON": sys.executable},
            check=True,
            timeout=240,
        )
        yield ClusterBed(directory)
    finally:
        subprocess.run(
            [str(TESTBED), "down", str(directory)],
            env={**os.environ, "PYTHON": sys.executable},
            check=False,
            timeout=180,
        )
        shutil.rmtree(directory, ignore_errors=True)
        lock.close()


@pytest.fixture(scope="session")
def slow_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synced rollout environment for the cluster tests."""
    root = tmp_path_factory.mktemp("cluster-rollout")
    ws = make_workspace(root / "ws")
    return synced_venv(ws / "rollouts" / "echo", root / "venv")


def slow_workspace(dest: Path, delay_s: float) -> Path:
    """The example workspace whose echo workflow first sleeps ``delay_s`` (an [env] value)."""
    ws = make_workspace(dest)
    main = ws / "rollouts" / "echo" / "main.py"
    text = main.read_text()
    text = text.replace("\n\nclass EchoWorkflow", f"\n{_DELAY}\n\nclass EchoWorkflow", 1)
    text = text.replace(
        "        messages = list(ctx.prompt)\n",
        "        await _trio.sleep(_DELAY_S)\n        messages = list(ctx.prompt)\n",
        1,
    )
    main.write_text(text)
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(config.read_text() + f'\n[env]\nECHO_DELAY_S = "{delay_s}"\n')
    return ws
