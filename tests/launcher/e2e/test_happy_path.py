"""The README command on the example workspace, end to end with real uv and real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launcher.e2e.helpers import (
    base_env,
    journal,
    metrics,
    run_cli,
    run_dir,
)

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"
# The example dataset: 21 rows; 16 pass, 3 score 0, 1 is skipped by the grader, 1 fails.
EXPECTED_SUMMARY = {
    "total_samples": 21,
    "completed_samples": 20,
    "graded": 19,
    "passed": 16,
    "failed": 1,
    "skipped": 1,
    "pass_rate": 0.8,
}


def _check_summary(summary: dict[str, object]) -> None:
    for key, value in EXPECTED_SUMMARY.items():
        assert summary[key] == value, (key, summary)


async def test_readme_command_with_a_real_first_sync(workspace: Path, tmp_path: Path) -> None:
    """A fresh workspace: uv creates the rollout env, every row runs, files are complete."""
    assert not (workspace / "rollouts" / "echo" / ".venv").exists()
    result = await run_cli(
        ["eval", "run", CONFIG, "--yes", "--name", "first"],
        cwd=tmp_path,
        env=base_env(),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert (workspace / "rollouts" / "echo" / ".venv" / "bin" / "python").exists()
    assert "Evaluation run finished: ws/.osmosis/evals/first" in result.stdout
    assert "Results" in result.stdout and "80.0% (16/20 scored" in result.stdout
    # The failed and skipped rows point to their trial directories.
    assert "row 20 run 0: error_type=validation_error -> ws/.osmosis/evals/first/" in result.stdout
    assert "row 18 run 0: removed from scoring" in result.stdout

    run = run_dir(workspace, "first")
    for name in (
        "manifest.json",
        "events.jsonl",
        "index.jsonl",
        "summary.jsonl",
        "progress.json",
        "metrics.json",
        "dataset_rows.jsonl",
        "logs.txt",
    ):
        path = run / name
        assert path.is_file(), name
        assert path.stat().st_mode & 0o777 == 0o600, name
    assert not (run / "server.json").exists()
    assert (run / "index.jsonl").read_bytes() == (run / "summary.jsonl").read_bytes()
    records = journal(run)
    assert len(records) == 21
    assert len({(r["row_index"], r["run_index"]) for r in records}) == 21
    # Token counts from the bridge's ledger are journaled per rollout.
    assert all(isinstance(r.get("tokens"), int) and r["tokens"] > 0 for r in records)
    assert all(r["max_context_tokens"] <= r["tokens"] for r in records)
    doc = metrics(run)
    assert doc["eval_run"]["status"] == "finished"
    _check_summary(doc["summary"])
    assert doc["summary"]["tokens_used"] == sum(r["tokens"] for r in records)
    assert len(list((run / "trajectories").glob("row_*_run_0.json"))) >= 19
    logs = (run / "logs.txt").read_text()
    assert "[deps]" in logs and "[rollout-server]" in logs and "rollout server healthy" in logs


async def test_json_envelope_and_completed_rerun(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """``--json`` prints exactly one envelope; re-running a complete name changes nothing."""
    first = await run_cli(
        ["eval", "run", CONFIG, "--name", "j", "--json", "--yes"], cwd=tmp_path, env=env
    )
    assert first.returncode == 0, first.stderr
    envelope = first.envelope()
    assert envelope["operation"] == "eval.run" and envelope["status"] == "success"
    resource = envelope["result"]
    assert resource["run_name"] == "j" and resource["total_work_items"] == 21
    assert resource["dispatched"] == 21 and resource["succeeded"] == 19
    assert resource["failed"] == 1 and resource["skipped"] == 1
    assert [r["row_index"] for r in resource["failed_rows"]] == [18, 20]
    _check_summary(resource["metrics"])
    assert "→" not in first.stdout

    run = run_dir(workspace, "j")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    again = await run_cli(
        ["eval", "run", CONFIG, "--name", "j", "--json", "--yes"], cwd=tmp_path, env=env
    )
    assert again.returncode == 0, again.stderr
    envelope = again.envelope()
    assert envelope["status"] == "success"
    assert "was already complete; nothing ran" in envelope["message"]
    assert envelope["result"]["dispatched"] == 0
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before


async def test_rich_output_when_piped_prints_one_line_per_item(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    result = await run_cli(
        ["eval", "run", CONFIG, "--name", "piped", "--yes", "--max-in-flight", "2"],
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stdout.splitlines() if "/21 pass " in line]
    assert progress[0].startswith("0/21") and progress[-1].startswith("21/21")
    assert len(progress) == 22
    finished = sorted(int(line.split(" · row ")[1].split(" ")[0]) for line in progress[1:])
    assert finished == list(range(21))  # each item named once, with its outcome
    assert "running 21 work items, up to 2 in flight" in result.stdout
    next_steps = result.stdout.split("Evaluation run finished")[1]
    assert "--name piped --retry-failed" in next_steps
    json.dumps(result.stdout)  # the output is plain text, no control sequences break JSON


async def test_a_run_killed_before_finalize_is_finalized_without_dispatch(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", CONFIG, "--name", "fin", "--yes"]
    first = await run_cli(args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    run = run_dir(workspace, "fin")
    doc = metrics(run)
    doc["eval_run"]["status"] = "running"  # as if killed after the last result was journaled
    (run / "metrics.json").write_text(json.dumps(doc))
    records = journal(run)
    again = await run_cli(args, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert "fin: all 21 work items already have results" in again.stdout
    assert "starting rollout server" not in again.stdout
    assert journal(run) == records
    assert metrics(run)["eval_run"]["status"] == "finished"
    _check_summary(metrics(run)["summary"])
