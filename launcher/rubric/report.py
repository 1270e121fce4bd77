"""The JSON report and the command's result resource (pure functions of an :class:`Evaluation`).

The report has the reference tool's shape (spec Part D.5): ``generated_at``, ``model``,
``rubric``, ``data_path``, ``number``, ``overall_statistics`` and ``records`` (each ``index``,
``label``, ``scores``, ``explanations``, ``errors``, ``statistics``). Added fields: ``usage``
(the judges' tokens in this invocation), ``judges`` (per judge model: statistics, errors,
usage, retries) and, with several judges, per record ``judges``/``mean``/``majority`` and a
top-level ``combined`` object (see :mod:`launcher.rubric.stats`).
"""

from __future__ import annotations

from typing import Any

from launcher.rubric.engine import Evaluation
from launcher.rubric.judge import total_usage
from launcher.rubric.stats import JudgeRuns, agreement, majority, mean, score_statistics

__all__ = ["build_report", "error_count", "judge_runs", "resource"]


def judge_runs(evaluation: Evaluation, record: int, judge: int) -> JudgeRuns:
    """The runs of one judge on one record, in run order."""
    runs = JudgeRuns()
    for k in range(evaluation.number):
        verdict = evaluation.verdicts.get((record, judge, k))
        if verdict is None:
            continue
        if verdict.score is not None:
            runs.scores.append(verdict.score)
            runs.explanations.append(verdict.explanation or "")
        elif verdict.error is not None:
            runs.errors.append(verdict.error)
    return runs


def _names(evaluation: Evaluation) -> list[str]:
    return [judge.model.given for judge in evaluation.judges]


def _record_payload(evaluation: Evaluation, record: int) -> dict[str, Any]:
    per_judge = [judge_runs(evaluation, record, j) for j in range(len(evaluation.judges))]
    names = _names(evaluation)
    source = evaluation.records[record]
    if len(per_judge) == 1:
        return {"index": source.index, "label": source.label, **per_judge[0].payload()}
    scores = [s for runs in per_judge for s in runs.scores]
    judge_scores = [runs.score() for runs in per_judge]
    return {
        "index": source.index,
        "label": source.label,
        "scores": scores,
        "explanations": [e for runs in per_judge for e in runs.explanations],
        "errors": [
            f"[{n}] {e}" for n, runs in zip(names, per_judge, strict=True) for e in runs.errors
        ],
        "statistics": score_statistics(scores),
        "judges": {n: runs.payload() for n, runs in zip(names, per_judge, strict=True)},
        "mean": mean(judge_scores),
        "majority": majority(judge_scores),
    }


def _judges(evaluation: Evaluation) -> list[dict[str, Any]]:
    out = []
    for j, judge in enumerate(evaluation.judges):
        all_runs = [judge_runs(evaluation, r, j) for r in range(len(evaluation.records))]
        out.append(
            {
                "model": judge.model.given,
                "statistics": score_statistics([s for runs in all_runs for s in runs.scores]),
                "error_count": sum(len(runs.errors) for runs in all_runs),
                "usage": evaluation.usage(j).to_json(),
                "retries": judge.retries,
            }
        )
    return out


def _combined(evaluation: Evaluation) -> dict[str, Any]:
    per_record = [
        [judge_runs(evaluation, r, j).score() for j in range(len(evaluation.judges))]
        for r in range(len(evaluation.records))
    ]
    means = [m for m in (mean(scores) for scores in per_record) if m is not None]
    majorities = [m for m in (majority(scores) for scores in per_record) if m is not None]
    return {
        "mean": score_statistics(means),
        "majority": score_statistics(majorities),
        "majority_records": len(majorities),
        "agreement": agreement(per_record).payload(),
    }


def _total_usage(evaluation: Evaluation) -> dict[str, int]:
    return total_usage(evaluation.usage(j) for j in range(len(evaluation.judges))).to_json()


def build_report(evaluation: Evaluation, *, data_path: str, generated_at: str) -> dict[str, Any]:
    """The ``-o`` report document."""
    records = [_record_payload(evaluation, r) for r in range(len(evaluation.records))]
    scores = [s for payload in records for s in payload["scores"]]
    report: dict[str, Any] = {
        "generated_at": generated_at,
        "model": ",".join(_names(evaluation)),
        "rubric": evaluation.rubric,
        "data_path": data_path,
        "number": evaluation.number,
        "overall_statistics": score_statistics(scores),
        "records": records,
        "usage": _total_usage(evaluation),
        "judges": _judges(evaluation),
    }
    if len(evaluation.judges) > 1:
        report["combined"] = _combined(evaluation)
    return report


def error_count(report: dict[str, Any]) -> int:
    """Errors over every record of a report."""
    return sum(len(record["errors"]) for record in report["records"])


def resource(report: dict[str, Any], *, output_path: str | None) -> dict[str, Any]:
    """The command's result resource: ``output_path`` when a report file was written, else
    the records themselves."""
    out: dict[str, Any] = {
        "model": report["model"],
        "data_path": report["data_path"],
        "number": report["number"],
        "statistics": report["overall_statistics"],
        "record_count": len(report["records"]),
        "error_count": error_count(report),
        "usage": report["usage"],
    }
    if "combined" in report:
        out["combined"] = report["combined"]
    if output_path is not None:
        out["output_path"] = output_path
    else:
        out["records"] = report["records"]
    return out
