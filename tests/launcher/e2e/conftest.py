"""End-to-end fixtures: a copy of the example workspace, one shared synced rollout env, and an
orphan check on process groups. Tests run the real ``rollbridge`` CLI as a subprocess (so signals,
``kill -9`` and orphan processes are real) through ``helpers.py``.

Every workspace copy rewrites the rollout's uv path source to this repository's absolute root.
All tests except the one that checks a real first sync share one rollout environment through
``UV_PROJECT_ENVIRONMENT`` (uv syncs it, the launcher runs its interpreter), so each run's
``uv sync`` stage is a fast no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher.e2e.helpers import base_env, make_workspace, processes_in_group, synced_venv


@pytest.fixture(scope="session")
def shared_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synced rollout environment for the whole session."""
    root = tmp_path_factory.mktemp("shared-rollout")
    ws = make_workspace(root / "ws")
    return synced_venv(ws / "rollouts" / "echo", root / "venv")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh copy of the example workspace."""
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def env(shared_env: Path) -> dict[str, str]:
    """The CLI environment using the shared rollout env."""
    return base_env(UV_PROJECT_ENVIRONMENT=str(shared_env))


@pytest.fixture
def no_orphans() -> Iterator[list[int]]:
    """Collect process-group ids a test saw; fail if any of them still has live processes."""
    groups: list[int] = []
    yield groups
    leftovers = {g: processes_in_group(g) for g in groups}
    assert not any(leftovers.values()), leftovers
