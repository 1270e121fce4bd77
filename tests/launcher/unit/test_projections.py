"""index rows, trajectory identity and token fallbacks, safe projection copies (docs/spec/supervisor.md §3.4, §3.7)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import launcher.rundir.projections as projections
from launcher.rundir.journal import TerminalRecord
from launcher.rundir.projections import (
    index_line,
    index_row,
    load_valid_trajectory,
    project_item,
    read_valid_trajectory,
    safe_artifacts,
    trajectory_identity,
    trajectory_usage,
)

RID = "a" * 32


def write_trajectory(run_dir: Path, rollout_id: str = RID, **doc: object) -> Path:
    trial = run_dir / "rollout_trials" / rollout_id
    trial.mkdir(parents=True, exist_ok=True)
    body = {"session_id": rollout_id, "trajectory_id": rollout_id, **doc}
    (trial / "trajectory.json").write_text(json.dumps(body))
    return trial


def test_identity_order() -> None:
    assert (
        trajectory_identity({"extra": {"osmosis": {"rollout_id": "x"}}, "session_id": "y"}) == "x"
    )
    assert trajectory_identity({"session_id": "y", "trajectory_id": "z/1"}) == "y"
    assert trajectory_identity({"trajectory_id": "z/1"}) == "z"
    assert trajectory_identity({"trajectory_id": "z"}) is None


def test_load_valid_trajectory(tmp_path: Path) -> None:
    trials = tmp_path / "rollout_trials"
    assert load_valid_trajectory(trials, RID) is None
    write_trajectory(tmp_path)
    assert load_valid_trajectory(trials, RID) is not None
    (trials / RID / "trajectory.json").write_text(json.dumps({"session_id": "other"}))
    assert load_valid_trajectory(trials, RID) is None
    (trials / RID / "trajectory.json").write_text("[1]")
    assert load_valid_trajectory(trials, RID) is None
    (trials / RID / "trajectory.json").write_text("{broken")
    assert load_valid_trajectory(trials, RID) is None
    # A symlinked trajectory file is never followed.
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"session_id": RID}))
    (trials / RID / "trajectory.json").unlink()
    (trials / RID / "trajectory.json").symlink_to(real)
    assert load_valid_trajectory(trials, RID) is None


def test_trajectory_usage() -> None:
    doc = {
        "final_metrics": {"total_prompt_tokens": 30, "total_completion_tokens": 12},
        "steps": [
            {"metrics": {"prompt_tokens": 10, "completion_tokens": 2}},
            {"metrics": {"prompt_tokens": 20, "completion_tokens": 10}},
            {"message": "no metrics"},
            "junk",
        ],
    }
    assert trajectory_usage(doc) == (42, 30)
    assert trajectory_usage({"final_metrics": {"total_prompt_tokens": True}}) == (None, None)
    assert trajectory_usage({"final_metrics": {"total_completion_tokens": 5}}) == (5, None)


def rec(**kw: object) -> TerminalRecord:
    base: dict = {"row_index": 1, "run_index": 0, "rollout_id": RID, "status": "success"}
    base.update(kw)
    return TerminalRecord(**base)


def test_index_row_order_and_fallbacks() -> None:
    r = rec(reward=1, tokens=None, max_context_tokens=None, duration_ms=12.5, error_type=None)
    traj = {
        "final_metrics": {"total_prompt_tokens": 3, "total_completion_tokens": 2},
        "steps": [{"metrics": {"prompt_tokens": 3, "completion_tokens": 2}}],
    }
    row = index_row(r, traj, resumed=True)
    assert list(row) == [
        "row_index",
        "run_index",
        "rollout_id",
        "trajectory_filename",
        "status",
        "reward",
        "tokens",
        "max_context_tokens",
        "duration_ms",
        "resumed",
    ]
    assert row["tokens"] == 5 and row["max_context_tokens"] == 5 and row["resumed"] is True
    # Journal values win over the trajectory; no trajectory -> no filename, no fallback.
    row = index_row(rec(tokens=0, max_context_tokens=7), traj, resumed=False)
    assert row["tokens"] == 0 and row["max_context_tokens"] == 7 and "resumed" not in row
    row = index_row(rec(status="failed", error_type="timeout"), None, resumed=False)
    assert row == {
        "row_index": 1,
        "run_index": 0,
        "rollout_id": RID,
        "status": "failed",
        "duration_ms": 0.0,
        "error_type": "timeout",
    }
    assert index_line(row).startswith(b'{"row_index": 1, "run_index": 0, ')


def make_artifacts(trial: Path, outside: Path) -> None:
    art = trial / "artifacts"
    (art / "sub").mkdir(parents=True)
    (art / "a.txt").write_text("A")
    (art / "sub" / "b.txt").write_text("B")
    (art / "manifest.json").write_text("{}")
    (art / "sub" / "manifest.json").write_text("{}")  # only the top-level one is reserved
    outside.write_text("secret")
    (art / "link.txt").symlink_to(outside)
    (art / "dirlink").symlink_to(outside.parent)


def test_safe_artifacts(tmp_path: Path) -> None:
    trial = write_trajectory(tmp_path)
    make_artifacts(trial, tmp_path / "outside.txt")
    safe = safe_artifacts(trial / "artifacts")
    assert list(safe.files) == ["a.txt", "sub/b.txt", "sub/manifest.json"]
    reasons = dict(safe.skipped)
    assert reasons["manifest.json"] == "reserved name"
    assert reasons["link.txt"] == "symbolic link"
    assert reasons["dirlink"] == "symbolic link"


def test_symlinked_artifacts_root_is_skipped_whole(tmp_path: Path) -> None:
    trial = write_trajectory(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x").write_text("x")
    (trial / "artifacts").symlink_to(tmp_path / "elsewhere")
    safe = safe_artifacts(trial / "artifacts")
    assert safe.files == {} and safe.skipped == [(".", "artifacts root is a symbolic link")]


def test_oversized_artifact_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial = write_trajectory(tmp_path)
    (trial / "artifacts").mkdir()
    (trial / "artifacts" / "big").write_bytes(b"x" * 11)
    monkeypatch.setattr(projections, "ARTIFACT_MAX_BYTES", 10)
    assert safe_artifacts(trial / "artifacts").skipped == [("big", "larger than 10 bytes")]


def test_project_item_copies_then_mirrors_changes(tmp_path: Path) -> None:
    trial = write_trajectory(tmp_path)
    make_artifacts(trial, tmp_path / "outside.txt")
    warnings: list[tuple[str, dict]] = []
    project_item(tmp_path, rec(), trajectory_valid=True, warn=lambda m, d: warnings.append((m, d)))
    traj = tmp_path / "trajectories" / "row_1_run_0.json"
    art = tmp_path / "artifacts" / "row_1_run_0"
    assert json.loads(traj.read_text())["session_id"] == RID
    copied = sorted(p.relative_to(art).as_posix() for p in art.rglob("*") if p.is_file())
    assert copied == ["a.txt", "sub/b.txt", "sub/manifest.json"]
    assert all(not p.is_symlink() for p in art.rglob("*"))
    assert stat.S_IMODE((art / "a.txt").stat().st_mode) == 0o600
    assert {d["path"] for _, d in warnings} == {"manifest.json", "link.txt", "dirlink"}

    # A new attempt (retry) for the same item: stale files go, new ones come.
    other = "b" * 32
    trial2 = write_trajectory(tmp_path, other)
    (trial2 / "artifacts").mkdir()
    (trial2 / "artifacts" / "only.txt").write_text("new")
    project_item(tmp_path, rec(rollout_id=other), trajectory_valid=True)
    assert json.loads(traj.read_text())["session_id"] == other
    assert sorted(p.name for p in art.rglob("*")) == ["only.txt"]

    # No valid trajectory and no artifacts: both projections disappear.
    project_item(tmp_path, rec(rollout_id="c" * 32), trajectory_valid=False)
    assert not traj.exists() and not art.exists()


def test_a_trajectory_read_once_is_copied_as_validated(tmp_path: Path) -> None:
    trial = write_trajectory(tmp_path, steps=[{"step_id": 1}])
    os.utime(trial / "trajectory.json", ns=(1_000_000_000, 2_000_000_000))
    found = read_valid_trajectory(tmp_path / "rollout_trials", RID)
    assert found is not None and found.doc["steps"] == [{"step_id": 1}]
    # Rewritten after it was read (and validated): the projection is the validated document.
    (trial / "trajectory.json").write_text(json.dumps({"session_id": "someone else"}))
    project_item(tmp_path, rec(), trajectory_valid=True, trajectory=found)
    copy = tmp_path / "trajectories" / "row_1_run_0.json"
    assert copy.read_bytes() == found.data
    assert copy.stat().st_mtime_ns == 2_000_000_000  # the source's mtime, as a copy keeps it
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    inode = copy.stat().st_ino
    project_item(tmp_path, rec(), trajectory_valid=True, trajectory=found)
    assert copy.stat().st_ino == inode  # identical already: not rewritten


def test_read_valid_trajectory_refuses_a_linked_trial(tmp_path: Path) -> None:
    real = write_trajectory(tmp_path / "elsewhere")
    trials = tmp_path / "rollout_trials"
    trials.mkdir()
    (trials / RID).symlink_to(real, target_is_directory=True)
    assert read_valid_trajectory(trials, RID) is None
    assert load_valid_trajectory(trials, RID) is None


def test_project_item_skips_identical_copies(tmp_path: Path) -> None:
    trial = write_trajectory(tmp_path)
    (trial / "artifacts").mkdir()
    (trial / "artifacts" / "a.txt").write_text("A")
    project_item(tmp_path, rec(), trajectory_valid=True)
    copy = tmp_path / "artifacts" / "row_1_run_0" / "a.txt"
    inode = copy.stat().st_ino
    project_item(tmp_path, rec(), trajectory_valid=True)
    assert copy.stat().st_ino == inode  # not rewritten
    (trial / "artifacts" / "a.txt").write_text("changed!")
    project_item(tmp_path, rec(), trajectory_valid=True)
    assert copy.read_text() == "changed!"


@pytest.mark.parametrize("there", ["link", "file", "dir", "nothing"])
@pytest.mark.parametrize("artifacts", [True, False])
def test_whatever_holds_the_artifacts_place_is_replaced(
    tmp_path: Path, there: str, artifacts: bool
) -> None:
    trial = write_trajectory(tmp_path)
    (trial / "artifacts").mkdir()
    if artifacts:
        (trial / "artifacts" / "a.txt").write_text("A")
    art = tmp_path / "artifacts" / "row_1_run_0"
    art.parent.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not ours")
    if there == "link":
        art.symlink_to(outside, target_is_directory=True)
    elif there == "file":
        art.write_text("stale")
    elif there == "dir":
        (art / "sub").mkdir(parents=True)
        (art / "sub" / "stale.txt").write_text("stale")
    project_item(tmp_path, rec(), trajectory_valid=True)
    assert (outside / "keep.txt").read_text() == "not ours"  # a link is never followed
    if artifacts:
        assert not art.is_symlink() and art.is_dir()
        assert sorted(p.relative_to(art).as_posix() for p in art.rglob("*")) == ["a.txt"]
    else:
        assert not art.exists() and not art.is_symlink()  # an empty root projects nothing
    assert safe_artifacts(trial / "artifacts").skipped == []
