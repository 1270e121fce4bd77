"""Fixtures for the Harbor backend tests: real podman, real Harbor, the real ``rollbridge`` CLI.

The test bed is checked once per session (``podman run --rm local/bookworm-harbor true`` and the
Harbor venv of ``scripts/sandbox-testbed``); without it every test here skips with the reason.
Each test gets a copy of ``examples/harbor`` whose rollout uses this repository's SDK, and all
tests share one synced rollout environment (as the launcher e2e tests do).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rollout_server.harbor.containers import OWNER_LABEL, owner_alive
from tests.launcher.e2e.helpers import REPO, base_env, synced_venv

EXAMPLE = REPO / "examples" / "harbor"
IMAGE = "local/bookworm-harbor"
HARBOR_VENV = Path.home() / ".cache" / "rollbridge" / "harbor-venv"
LABEL = "io.rollbridge.harbor.trial"


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker (also listed in pyproject.toml once the lead adds it)."""
    config.addinivalue_line("markers", "harbor: real Harbor trials in real podman sandboxes")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this directory carries the ``harbor`` marker."""
    for item in items:
        if "tests/harbor/" in str(item.fspath):
            item.add_marker(pytest.mark.harbor)


def _testbed_problem() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (run scripts/sandbox-testbed as root)"
    if not (HARBOR_VENV / "bin" / "harbor").exists():
        return f"no Harbor venv at {HARBOR_VENV} (run scripts/sandbox-testbed)"
    try:
        probe = subprocess.run(
            ["podman", "run", "--rm", IMAGE, "true"], capture_output=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"podman run --rm {IMAGE} true failed: {exc}"
    if probe.returncode != 0:
        return f"podman run --rm {IMAGE} true failed: {probe.stderr.decode().strip()[-300:]}"
    return None


@pytest.fixture(scope="session")
def testbed() -> None:
    """Skip (with the reason printed) unless the sandbox test bed works on this machine."""
    problem = _testbed_problem()
    if problem is not None:
        print(f"harbor tests skipped: {problem}")
        pytest.skip(problem)


def synced_harbor_venv(root: Path) -> Path:
    """A copy of the Harbor example under ``root/ws`` and its rollout's environment synced into
    ``root/venv`` (returned)."""
    ws = make_harbor_workspace(root / "ws")
    return synced_venv(ws / "rollouts" / "harbor_hello", root / "venv")


def make_harbor_workspace(dest: Path) -> Path:
    """Copy ``examples/harbor`` to ``dest`` with an absolute path source to this repository."""
    shutil.copytree(
        EXAMPLE, dest, ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__")
    )
    (dest / "configs" / "training").mkdir(parents=True, exist_ok=True)
    pyproject = dest / "rollouts" / "harbor_hello" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('path = "../../../.."', f'path = "{REPO}"'))
    return dest


@pytest.fixture(scope="session")
def harbor_env(testbed: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The CLI environment, with one synced rollout environment for the session."""
    venv = synced_harbor_venv(tmp_path_factory.mktemp("harbor-rollout"))
    return base_env(UV_PROJECT_ENVIRONMENT=str(venv), HARBOR_TELEMETRY="0")


@pytest.fixture
def harbor_workspace(tmp_path: Path) -> Path:
    """A fresh copy of the Harbor example workspace at ``<tmp>/ws``."""
    return make_harbor_workspace(tmp_path / "ws")


def _ours(owner: str) -> bool:
    """Whether a container's owner label is this session's: a rollout server this test process
    started (its descendant), or one that is gone. Other sessions on the machine (parallel test
    runs, a developer's eval) own live servers that are none of this test's business."""
    pid_text = owner.partition(":")[0]
    if not pid_text.isdigit() or not owner_alive(owner):
        return True
    return int(pid_text) in {p.pid for p in psutil.Process().children(recursive=True)}


def labelled_containers() -> list[str]:
    """Names of every container a Harbor trial of this backend created (running or not) that
    belongs to this test session (see :func:`_ours`)."""
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={LABEL}", "--format", "json"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return [
        row["Names"][0]
        for row in json.loads(listed.stdout or b"[]")
        if _ours(str((row.get("Labels") or {}).get(OWNER_LABEL, "")))
    ]


@pytest.fixture
def no_containers_left() -> Iterator[None]:
    """Fail the test if any trial container is left behind."""
    yield
    assert labelled_containers() == []
