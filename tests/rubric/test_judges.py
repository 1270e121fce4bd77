"""Several judges (``--judges``): per-judge scores, their mean and majority per record, and
agreement, against hand-computed values from a scripted fake judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.rubric.stats import agreement, majority
from tests.rubric.conftest import conversation, write_jsonl
from tests.rubric.fake_judge import FakeJudge

# candidate -> scores of judges a, b, c
SCRIPT = {
    "r1": (1.0, 1.0, 1.0),
    "r2": (1.0, 0.0, 1.0),
    "r3": (0.0, 0.5, 1.0),
    "r4": (0.0, 0.0, 0.0),
}
JUDGES = ("ja", "jb", "jc")


def _script(model: str, blocks: dict[str, str]) -> str:
    score = SCRIPT[blocks["CANDIDATE_OUTPUT"]][JUDGES.index(model)]
    return json.dumps({"score": score, "explanation": f"{model} says {score}"})


async def test_three_judges(judge: FakeJudge, cli: Any, tmp_path: Path) -> None:
    judge.script = _script
    data = write_jsonl(tmp_path / "d.jsonl", *(conversation(c, id=c) for c in SCRIPT))
    report_path = tmp_path / "report.json"
    outcome = await cli(
        "eval",
        "rubric",
        "-d",
        str(data),
        "-r",
        "R",
        "--judges",
        "openai/ja, openai/jb,openai/jc",
        "-o",
        str(report_path),
    )
    assert outcome.code == 0, outcome
    report = json.loads(report_path.read_text())
    records = {r["label"]: r for r in report["records"]}
    assert [records[c]["mean"] for c in SCRIPT] == pytest.approx([1.0, 2 / 3, 0.5, 0.0])
    assert [records[c]["majority"] for c in SCRIPT] == [1.0, 1.0, None, 0.0]
    assert records["r3"]["judges"]["openai/jb"]["scores"] == [0.5]
    combined = report["combined"]
    assert combined["mean"]["average"] == pytest.approx((1 + 2 / 3 + 0.5 + 0) / 4)
    assert combined["majority"]["average"] == pytest.approx(2 / 3)
    assert combined["majority_records"] == 3
    assert combined["agreement"] == {
        "records": 4,
        "unanimous": 0.5,
        "pairwise": pytest.approx((1 + 1 / 3 + 0 + 1) / 4),
        "mean_abs_diff": pytest.approx((0 + 2 / 3 + 2 / 3 + 0) / 4),
    }
    assert [j["model"] for j in report["judges"]] == ["openai/ja", "openai/jb", "openai/jc"]
    assert [j["usage"]["total_tokens"] for j in report["judges"]] == [60, 60, 60]
    assert report["usage"]["total_tokens"] == 180
    assert report["judges"][1]["statistics"]["average"] == pytest.approx(1.5 / 4)
    assert (
        "  Agreement over 4 record(s): unanimous 50.0%, pairwise 58.3%, mean |difference| 0.3333"
        in outcome.out.splitlines()
    )


def test_majority_needs_more_than_half() -> None:
    assert majority([1.0, 1.0, None]) == 1.0
    assert majority([1.0, None, None]) is None
    assert majority([0.5, 1.0]) is None
    assert majority([0.3333333333, 0.33333333334, 0.0]) == pytest.approx(0.333333)


def test_agreement_ignores_records_a_judge_missed() -> None:
    result = agreement([[1.0, 1.0], [1.0, None], [0.0, 1.0]])
    assert (result.records, result.unanimous, result.pairwise, result.mean_abs_diff) == (
        2,
        0.5,
        0.5,
        0.5,
    )
