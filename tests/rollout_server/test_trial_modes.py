"""``rollout_trials/`` is private: directories 0700, files 0600, whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_server.local import HEALTH_CHECK_MARKER, _make_dirs
from rollout_server.trajectory import make_private_dirs, render_rollout_files, write_rollout_files


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("open_umask")
def test_trial_files_are_0600_and_directories_0700(tmp_path: Path) -> None:
    trials = tmp_path / "run" / "rollout_trials"
    trials.mkdir(parents=True, mode=0o700)
    rollout_dir = trials / "r1"
    files = render_rollout_files(trajectory={"steps": []}, diagnostics={"failure": None})
    # A temp file an earlier crash left behind, world-readable.
    rollout_dir.mkdir(mode=0o700)
    stale = rollout_dir / ".trajectory.json.tmp"
    stale.write_text("old")
    stale.chmod(0o644)
    rollout_dir.chmod(0o700)
    write_rollout_files(rollout_dir, files)
    written = sorted(p.name for p in rollout_dir.iterdir())
    assert written == ["artifacts", "diagnostics.json", "trajectory.json"]
    assert _mode(rollout_dir / "trajectory.json") == 0o600
    assert _mode(rollout_dir / "diagnostics.json") == 0o600
    assert _mode(rollout_dir / "artifacts") == 0o700


@pytest.mark.usefixtures("open_umask")
def test_missing_parents_are_created_0700(tmp_path: Path) -> None:
    rollout_dir = tmp_path / "trials" / "r2"
    write_rollout_files(
        rollout_dir, render_rollout_files(trajectory={"steps": []}, diagnostics=None)
    )
    for directory in (tmp_path / "trials", rollout_dir, rollout_dir / "artifacts"):
        assert _mode(directory) == 0o700, directory
    assert _mode(rollout_dir / "trajectory.json") == 0o600


@pytest.mark.usefixtures("open_umask")
def test_make_private_dirs_reports_creation_and_refuses_a_file(tmp_path: Path) -> None:
    leaf = tmp_path / "a" / "b" / "c"
    assert make_private_dirs(leaf) is True
    for directory in (tmp_path / "a", tmp_path / "a" / "b", leaf):
        assert _mode(directory) == 0o700, directory
    assert make_private_dirs(leaf) is False
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        make_private_dirs(tmp_path / "file")
    with pytest.raises(NotADirectoryError):
        make_private_dirs(tmp_path / "file" / "below")


@pytest.mark.usefixtures("open_umask")
def test_local_backend_dirs_and_marker(tmp_path: Path) -> None:
    rollout_dir = tmp_path / "trials" / "r3"
    artifacts = _make_dirs(rollout_dir)
    assert artifacts == rollout_dir / "artifacts"
    marker = rollout_dir / HEALTH_CHECK_MARKER
    assert marker.read_bytes() == b"osmosis-health-check"
    for directory in (tmp_path / "trials", rollout_dir, artifacts):
        assert _mode(directory) == 0o700, directory
    marker.unlink()
    assert _make_dirs(rollout_dir) == artifacts  # an existing directory: the marker comes back
    assert marker.read_bytes() == b"osmosis-health-check"
