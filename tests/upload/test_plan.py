"""The upload plan as plain functions on run directories: the files chosen (C.4), what makes a
run directory unfit (C.3), the re-redaction of logs.txt (C.2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.upload.files import UploadError, scrub_logs_file
from launcher.upload.plan import build_plan
from tests.upload.rundir import expected_paths, write_finished_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_finished_run(tmp_path / "evals")


def _rewrite(path: Path, change: object) -> None:
    doc = json.loads(path.read_text())
    change(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def test_plan_selects_exactly_the_spec_files(run_dir: Path) -> None:
    plan = build_plan(run_dir)
    assert [f.path for f in plan.files] == expected_paths(run_dir)
    assert plan.provenance == {
        "sdk_version": "0.1.0",
        "git_head": "1" * 40,
        "git_branch": "main",
        "git_dirty": False,
        "config_path": "configs/eval/echo.toml",
    }
    assert plan.run["evaluation_config"] == {"n": 2, "pass_threshold": 1.0}
    body = plan.start_body(replace=True)
    assert body["reimport"] is True and body["schema_version"] == 1


def test_config_path_override_and_branch(run_dir: Path) -> None:
    _rewrite(run_dir / "manifest.json", lambda d: d["provenance"].update(config_branch="dev"))
    plan = build_plan(run_dir, config_path="configs/eval/moved.toml")
    assert plan.provenance["config_path"] == "configs/eval/moved.toml"
    assert plan.run["experiment_config"]["rollout"]["branch"] == "dev"
    assert "configs/eval/echo.toml" in (run_dir / "manifest.json").read_text()


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        ("metrics.json", lambda d: d["eval_run"].update(status="running"), "not completed"),
        ("progress.json", lambda d: d.update(total_runs=7), "index.jsonl has 6 terminal results"),
        ("manifest.json", lambda d: d.update(run_name="other"), "run_name"),
        ("manifest.json", lambda d: d.update(local_run_id="X" * 32), "local_run_id"),
        ("manifest.json", lambda d: d["inputs"].update(n=True), "inputs.n"),
        ("manifest.json", lambda d: d["provenance"].update(git_dirty="no"), "git_dirty"),
        ("metrics.json", lambda d: d["summary"].update(pass_threshold="1"), "pass_threshold"),
        ("metrics.json", lambda d: d["eval_run"].update(model_name="x"), "model_name"),
    ],
)
def test_unfit_run_directories_are_refused(
    run_dir: Path, file: str, change: object, message: str
) -> None:
    _rewrite(run_dir / file, change)
    with pytest.raises(UploadError, match=message):
        build_plan(run_dir)


def test_index_rules(run_dir: Path) -> None:
    index = run_dir / "index.jsonl"
    lines = index.read_text().splitlines()
    index.write_text("\n".join([lines[0], "", *lines[1:]]) + "\n")
    with pytest.raises(UploadError, match="blank"):
        build_plan(run_dir)
    index.write_text("\n".join([*lines, lines[0]]) + "\n")
    with pytest.raises(UploadError, match="repeats"):
        build_plan(run_dir)


def test_symlinks_are_refused(run_dir: Path, tmp_path: Path) -> None:
    first = json.loads((run_dir / "index.jsonl").read_text().splitlines()[0])["rollout_id"]
    link = run_dir / "rollout_trials" / first / "artifacts" / "deep" / "link.txt"
    os.symlink(tmp_path / "elsewhere", link)
    with pytest.raises(UploadError, match="must not be a symlink"):
        build_plan(run_dir)
    link.unlink()
    skipped = json.loads((run_dir / "index.jsonl").read_text().splitlines()[3])["rollout_id"]
    trial = run_dir / "rollout_trials" / skipped  # a skipped item: no trajectory is read
    trial.rename(tmp_path / "moved")
    trial.symlink_to(tmp_path / "moved")
    with pytest.raises(UploadError, match=f"rollout_trials/{skipped} must not be a symlink"):
        build_plan(run_dir)
    trial.unlink()
    (tmp_path / "moved").rename(trial)
    (tmp_path / "link").symlink_to(run_dir)
    with pytest.raises(UploadError, match="symlink"):
        build_plan(tmp_path / "link")


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("csi\x9b31m.txt".encode(), r"'csi\x9b31m.txt'"),  # C1 control: a terminal escape
        (b"latin1-\xe9.txt", r"'latin1-\udce9.txt'"),  # not UTF-8: no JSON string holds it
    ],
)
def test_artifact_names_that_cannot_be_sent_or_shown_are_refused(
    run_dir: Path, name: bytes, shown: str
) -> None:
    first = json.loads((run_dir / "index.jsonl").read_text().splitlines()[0])["rollout_id"]
    artifacts = run_dir / "rollout_trials" / first / "artifacts"
    fd = os.open(os.fsencode(artifacts) + b"/" + name, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    with pytest.raises(UploadError) as caught:
        build_plan(run_dir)
    message = caught.value.message
    assert (
        message
        == f"{shown[0]}rollout_trials/{first}/artifacts/{shown[1:]} is not a safe upload path"
    )
    assert message.isascii()


def test_a_trajectory_of_another_rollout_is_refused(run_dir: Path) -> None:
    entries = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    a, b = entries[0]["rollout_id"], entries[1]["rollout_id"]
    trials = run_dir / "rollout_trials"
    (trials / a / "trajectory.json").write_bytes((trials / b / "trajectory.json").read_bytes())
    with pytest.raises(UploadError, match="does not belong"):
        build_plan(run_dir)


def test_a_file_changed_after_planning_is_refused(run_dir: Path) -> None:
    plan = build_plan(run_dir)
    (run_dir / "progress.json").write_text((run_dir / "progress.json").read_text() + " ")
    changed = next(f for f in plan.files if f.path == "progress.json")
    with (
        pytest.raises(UploadError, match="changed after the upload plan was built; retry"),
        changed.open_verified(),
    ):
        pass


def test_scrub_replaces_known_values_longest_first(tmp_path: Path) -> None:
    logs = tmp_path / "logs.txt"
    logs.write_text("a sk-LONGKEY-123456 b sk-LONGKEY c short1 d tok-abcdefgh\n")
    env = {
        "OPENAI_API_KEY": "sk-LONGKEY",
        "ANTHROPIC_API_KEY": "sk-LONGKEY-123456",
        "XAI_API_KEY": "short1",
        "MY_SECRET": "tok-abcdefgh",
    }
    assert scrub_logs_file(logs, env)
    assert logs.read_text() == "a [REDACTED] b [REDACTED] c short1 d tok-abcdefgh\n"
    assert logs.stat().st_mode & 0o777 == 0o600
    assert not scrub_logs_file(logs, env)  # unchanged text: not rewritten
    target = tmp_path / "elsewhere.txt"
    target.write_text("sk-LONGKEY\n")
    logs.unlink()
    logs.symlink_to(target)
    assert not scrub_logs_file(logs, env)
    assert target.read_text() == "sk-LONGKEY\n"


def test_scrub_reads_a_large_log_line_by_line(tmp_path: Path) -> None:
    """Every line is scrubbed, the last one without a line break too, and the memory it takes
    does not grow with the file (a 300 MB log took 657 MB when it was read whole)."""
    import tracemalloc

    logs = tmp_path / "logs.txt"
    line = b"2026-12-04T00:00:00Z INFO [x] " + b"y" * 200 + b"\n"
    with logs.open("wb") as out:
        for _ in range(100_000):  # 23 MB
            out.write(line)
        out.write(b"key sk-LONGKEY-123456 \xff last")
    env = {"OPENAI_API_KEY": "sk-LONGKEY-123456"}
    tracemalloc.start()
    try:
        assert scrub_logs_file(logs, env)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024
    data = logs.read_bytes()
    assert data.endswith(b"key [REDACTED] \xff last") and data.count(b"\n") == 100_000
