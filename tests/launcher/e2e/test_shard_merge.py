"""``eval run --shard i/N`` and ``eval merge``: two shards of the echo example, merged, equal one
unsharded run of the same inputs; shards that do not belong together are refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.launcher.e2e.helpers import journal, metrics, run_cli, run_dir

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"
# Per-invocation identity and timing: the only metrics.json fields allowed to differ.
RUN_IDENTITY = {"id", "name", "started_at", "completed_at", "duration_ms"}


async def _run(tmp_path: Path, env: dict[str, str], *args: str) -> None:
    result = await run_cli(["eval", "run", CONFIG, "--yes", *args], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr + result.stdout


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    eval_run = {k: v for k, v in doc["eval_run"].items() if k not in RUN_IDENTITY}
    return {**doc, "eval_run": eval_run}


def _keys(run: Path) -> list[tuple[int, int]]:
    return sorted((r["row_index"], r["run_index"]) for r in journal(run))


async def test_two_shards_merged_equal_one_run(
    workspace: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    await _run(tmp_path, env, "--name", "whole")
    await _run(tmp_path, env, "--name", "s0", "--shard", "0/2")
    await _run(tmp_path, env, "--name", "s1", "--shard", "1/2")
    s0, s1, whole = (run_dir(workspace, n) for n in ("s0", "s1", "whole"))
    # Whole rows per shard, disjoint, together every row.
    assert {row for row, _ in _keys(s0)} == set(range(0, 21, 2))
    assert {row for row, _ in _keys(s1)} == set(range(1, 21, 2))
    assert metrics(s0)["eval_run"]["status"] == "finished"

    merged = tmp_path / "merged"
    result = await run_cli(
        ["eval", "merge", str(s0), str(s1), "-o", str(merged)], cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "21 of 21 work items recorded (finished)" in result.stdout
    assert _keys(merged) == _keys(whole)
    assert len(journal(merged)) == 21
    assert _comparable(metrics(merged)) == _comparable(metrics(whole))
    manifest = json.loads((merged / "manifest.json").read_text())
    assert manifest["inputs"] == json.loads((whole / "manifest.json").read_text())["inputs"]
    assert (merged / "dataset_rows.jsonl").read_bytes() == (
        whole / "dataset_rows.jsonl"
    ).read_bytes()
    for record in journal(merged):
        assert (merged / "rollout_trials" / record["rollout_id"]).is_dir()

    # The merged run resumes as an ordinary run of the same inputs: nothing left to do.
    again = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "merged", "-o", str(tmp_path)],
        cwd=tmp_path,
        env=env,
    )
    assert again.returncode == 0, again.stderr + again.stdout
    assert "already complete" in again.stdout

    # The same shard twice, a shard of other inputs: one line each, nothing written.
    twice = await run_cli(
        ["eval", "merge", str(s0), str(s0), "-o", str(tmp_path / "bad")], cwd=tmp_path, env=env
    )
    assert twice.returncode == 1
    assert "shard 0/2 is given twice" in twice.stderr
    assert len(twice.stderr.strip().splitlines()) == 1
    await _run(tmp_path, env, "--name", "other", "--shard", "1/2", "--limit", "10")
    other = run_dir(workspace, "other")
    mixed = await run_cli(
        ["eval", "merge", str(s0), str(other), "-o", str(tmp_path / "bad")], cwd=tmp_path, env=env
    )
    assert mixed.returncode == 1
    assert "are not shards of one evaluation. Changed: dataset" in mixed.stderr
    assert len(mixed.stderr.strip().splitlines()) == 1
    # Shards whose metrics would name another dataset file: refused, saying what differs.
    renamed = tmp_path / "s1-renamed"
    shutil.copytree(s1, renamed)
    doc = json.loads((renamed / "metrics.json").read_text())
    doc["eval_run"]["dataset_name"] = "echo-copy.jsonl"
    (renamed / "metrics.json").write_text(json.dumps(doc))
    named = await run_cli(
        ["eval", "merge", str(s0), str(renamed), "-o", str(tmp_path / "bad")], cwd=tmp_path, env=env
    )
    assert named.returncode == 1 and len(named.stderr.strip().splitlines()) == 1
    assert "dataset_name 'echo-copy.jsonl' against 'echo.jsonl'" in named.stderr
    # By name outside a workspace: the hint names no option merge lacks.
    outside = await run_cli(["eval", "merge", "s0", "s1", "-o", "m"], cwd=tmp_path, env=env)
    assert outside.returncode == 1 and "--workspace" not in outside.stderr
    assert "pass the run directory, or run the command inside the run's workspace" in (
        outside.stderr
    )
    # A shard whose manifest is broken: the advice is merge's, not a run's (--fresh).
    (other / "manifest.json").write_text("{")
    broken = await run_cli(
        ["eval", "merge", str(s0), str(other), "-o", str(tmp_path / "bad")], cwd=tmp_path, env=env
    )
    assert broken.returncode == 1 and len(broken.stderr.strip().splitlines()) == 1
    assert "manifest.json is unreadable" in broken.stderr and "--fresh" not in broken.stderr
    assert "Run that shard again under a new name" in broken.stderr
    # A shard copied without its trial directories: its rows would have no conversation.
    bare = tmp_path / "s1-bare"
    shutil.copytree(s1, bare)
    shutil.rmtree(bare / "rollout_trials")
    lacking = await run_cli(
        ["eval", "merge", str(s0), str(bare), "-o", str(tmp_path / "bad")], cwd=tmp_path, env=env
    )
    assert lacking.returncode == 1 and len(lacking.stderr.strip().splitlines()) == 1
    assert "have no directory in rollout_trials/" in lacking.stderr
    # The merged run inside a shard's directory: refused.
    inside = await run_cli(
        ["eval", "merge", str(s0), str(s1), "-o", str(s0 / "sub")], cwd=tmp_path, env=env
    )
    assert inside.returncode == 1 and len(inside.stderr.strip().splitlines()) == 1
    assert "is inside the shard" in inside.stderr and not (s0 / "sub").exists()
    assert not (tmp_path / "bad").exists()


async def test_a_shard_resumes_only_as_the_same_shard(
    workspace: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    await _run(tmp_path, env, "--name", "s", "--shard", "0/3", "--limit", "6")
    assert _keys(run_dir(workspace, "s")) == [(0, 0), (3, 0)]
    result = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "s", "--shard", "1/3", "--limit", "6"],
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1
    assert "Changed: shard" in result.stderr
    assert "To resume it as it was made, run it with --shard 0/3." in result.stderr
    unsharded = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "s", "--limit", "6"], cwd=tmp_path, env=env
    )
    assert unsharded.returncode == 1
    assert "run it with --shard 0/3." in unsharded.stderr


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("2/2", "i between 0 and N-1"),
        ("x", "--shard must look like i/N"),
        ("\uff11/2", "--shard must look like i/N"),  # a full-width digit is no ASCII one
        ("0/99999999999999999999999", "--shard must look like i/N"),
        ("30/40", "holds no rows: the selection has only 21"),
    ],
)
async def test_bad_shard_is_one_line(
    workspace: Path, tmp_path: Path, env: dict[str, str], flag: str, message: str
) -> None:
    result = await run_cli(["eval", "run", CONFIG, "--yes", "--shard", flag], cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
