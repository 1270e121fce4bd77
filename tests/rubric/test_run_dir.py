"""``eval rubric --run`` over a real run of the example workspace: verdicts kept in
``rubric/<digest>.jsonl`` inside the run directory, resumable after ``kill -9`` with no
record judged twice, and the run's own files left untouched."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from launcher.rubric.store import read_rubric_scores
from tests.launcher.e2e.helpers import (
    base_env,
    cli_argv,
    make_workspace,
    run_cli,
    start_cli,
    wait_for,
)
from tests.rubric.conftest import API_KEY
from tests.rubric.fake_judge import FakeJudge

pytestmark = pytest.mark.slow

RUN_FILES = ("events.jsonl", "index.jsonl", "summary.jsonl", "metrics.json", "manifest.json")


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of the example workspace on the offline model (made once)."""
    ws = make_workspace(tmp_path_factory.mktemp("rubric-example") / "ws")
    subprocess.run(
        cli_argv("eval", "run", "configs/eval/echo.toml", "--yes", "--name", "demo", "--plain"),
        cwd=ws,
        env=base_env(),
        check=False,
        capture_output=True,
        timeout=600,
    )
    run_dir = ws / ".osmosis" / "evals" / "demo"
    assert (run_dir / "index.jsonl").is_file()
    return run_dir


@pytest.fixture
def run_copy(example_run: Path, tmp_path: Path) -> Path:
    """A private copy of the example run's workspace, so tests may change it."""
    ws = tmp_path / "ws"
    shutil.copytree(example_run.parents[2], ws, ignore=shutil.ignore_patterns(".venv"))
    return ws / ".osmosis" / "evals" / "demo"


def _env(judge: FakeJudge) -> dict[str, str]:
    return base_env(OPENAI_BASE_URL=judge.v1, OPENAI_API_KEY=API_KEY)


def _digests(run_dir: Path) -> dict[str, str]:
    return {n: hashlib.sha256((run_dir / n).read_bytes()).hexdigest() for n in RUN_FILES}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


RUBRIC = "Score 1 when the reply contains the reference, else 0."


async def test_interrupted_and_resumed(judge: FakeJudge, run_copy: Path, tmp_path: Path) -> None:
    before = _digests(run_copy)
    ws = run_copy.parents[2]
    args = ("eval", "rubric", "--run", "demo", "-r", RUBRIC, "--model", "openai/fake-judge")
    judge.hold_after = 5
    live = await start_cli(args, cwd=ws, env=_env(judge), logdir=tmp_path / "first")
    rubric_dir = run_copy / "rubric"
    await wait_for(
        lambda: any(len(p.read_text().splitlines()) >= 5 for p in rubric_dir.glob("*.jsonl"))
    )
    live.kill9()
    await live.wait()
    (verdicts,) = rubric_dir.glob("*.jsonl")
    first = _lines(verdicts)
    assert len(first) == 5
    asked_first = len(judge.requests)

    judge.release.set()
    judge.hold_after = None
    report = tmp_path / "report.json"
    done = await run_cli([*args, "-o", str(report)], cwd=ws, env=_env(judge))
    assert done.returncode == 0, done.stderr
    assert "Judged now: 16 call(s); kept from earlier runs: 5" in done.stdout
    assert len(judge.requests) - asked_first == 16

    lines = _lines(verdicts)
    keys = [(line["rollout_id"], line["judge_run"]) for line in lines]
    assert len(keys) == len(set(keys)) == 21, "a record was judged twice"
    assert lines[:5] == first
    # Each verdict keeps its judge call's record, billed to no rollout (docs/calls.md).
    calls = [line["call"] for line in lines]
    assert {(c["kind"], c["rollout_id"], c["status"]) for c in calls} == {("judge", None, 200)}
    assert all(c["total_tokens"] == 15 for c in calls)

    index = _lines(run_copy / "index.jsonl")
    assert {row["rollout_id"] for row in index} == {key[0] for key in keys}
    scored = {line["rollout_id"]: line["score"] for line in lines}
    for row in index:
        if row["status"] == "success":
            # The fake judge applies the example grader's rule, so the two agree.
            assert scored[row["rollout_id"]] == row["reward"], row
    assert _digests(run_copy) == before

    document = json.loads(report.read_text())
    assert len(document["records"]) == 21
    assert document["records"][0]["label"] == "row_0_run_0"
    assert document["usage"]["total_tokens"] == 16 * 15  # only this invocation's calls

    (entry,) = read_rubric_scores(run_copy)
    assert entry["model"] == "openai/fake-judge" and entry["rubric"] == RUBRIC
    assert entry["scores"] == scored

    again = await run_cli(args, cwd=ws, env=_env(judge))
    assert again.returncode == 0
    assert "Judged now: 0 call(s); kept from earlier runs: 21" in again.stdout


async def test_prompt_and_skipped_items(judge: FakeJudge, run_copy: Path, tmp_path: Path) -> None:
    index = _lines(run_copy / "index.jsonl")
    gone = next(row for row in index if row["row_index"] == 2)
    (run_copy / "rollout_trials" / gone["rollout_id"] / "trajectory.json").unlink()
    outcome = await run_cli(
        [
            "--json",
            "eval",
            "rubric",
            "--run",
            str(run_copy),
            "-r",
            RUBRIC,
            "--model",
            "openai/j",
            "-n",
            "2",
        ],
        cwd=tmp_path,
        env=_env(judge),
    )
    assert outcome.returncode == 0, outcome.stderr
    resource = outcome.envelope()["result"]
    assert resource["record_count"] == 20
    assert resource["skipped"] == [{"label": "row_2_run_0", "reason": "no trajectory"}]
    assert resource["judged_now"] == 40
    dataset = _lines(run_copy / "dataset_rows.jsonl")
    first_user = next(
        r.body["messages"][1]["content"]
        for r in judge.requests
        if f"<<<BEGIN_ORIGINAL_INPUT>>>\n{dataset[0]['prompt']}\n"
        in r.body["messages"][1]["content"]
    )
    assert f"<<<BEGIN_GROUND_TRUTH>>>\n{dataset[0]['label']}\n<<<END_GROUND_TRUTH>>>" in first_user
    assert (
        f"<<<BEGIN_CANDIDATE_OUTPUT>>>\n{dataset[0]['prompt']}\n<<<END_CANDIDATE_OUTPUT>>>"
        in first_user
    )
