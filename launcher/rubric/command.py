"""``rollbridge eval rubric``: score JSONL conversations (``-d``) or the rollouts of a run
directory (``--run``) with one or several LLM judges.

The story: check the flags and read the inputs (every problem is a one-line error before any
call), open the run directory's verdict files when judging a run, judge what has no score
yet, then print, write the report and exit non-zero when any judge call failed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from launcher.errors import CLIError, ValidationError
from launcher.outputs import check_writable, refuse_run_files, write_output
from launcher.redact import Redactor
from launcher.rubric.engine import Evaluation, TaskKey
from launcher.rubric.inputs import (
    DEFAULT_REPORT_NAME,
    JudgeRecord,
    load_records,
    load_rubric,
    output_file,
)
from launcher.rubric.judge import Judge, Verdict
from launcher.rubric.provider import JudgeModel, judge_model
from launcher.rubric.render import JudgeProgress, print_report
from launcher.rubric.report import build_report, error_count, resource
from launcher.rubric.runsource import RunItem, RunSource, load_run, resolve_run_dir
from launcher.rubric.store import RubricStore
from launcher.ui import CLI_VERSION, UI

__all__ = ["RubricOptions", "run_rubric"]

DEPRECATED_API_KEY = (
    "--api-key is deprecated and will be removed in a future release. Set the provider "
    "environment variable instead."
)
COMPLETED = "Rubric evaluation completed."
COMPLETED_WITH_ERRORS = "Rubric evaluation completed with errors."


@dataclass(frozen=True)
class RubricOptions:
    """The command's flags, as click parsed them."""

    rubric: str
    data: str | None = None
    run: str | None = None
    model: str | None = None
    judges: str | None = None
    number: int = 1
    output: str | None = None
    api_key: str | None = None
    timeout: float | None = None
    score_min: float = 0.0
    score_max: float = 1.0


def _models(options: RubricOptions) -> list[JudgeModel]:
    if options.model and options.judges:
        raise ValidationError("--model and --judges are mutually exclusive")
    names = options.judges.split(",") if options.judges else [options.model or ""]
    names = [name.strip() for name in names]
    if not any(names):
        raise ValidationError("--model is required (or --judges m1,m2,...)")
    if not all(names):
        raise ValidationError("--judges must be a comma-separated list of models")
    if len(set(names)) != len(names):
        raise ValidationError("--judges lists a model twice")
    return [judge_model(name) for name in names]


def _check(options: RubricOptions) -> None:
    if options.number < 1:
        raise ValidationError("--number must be at least 1.")
    if (options.data is None) == (options.run is None):
        raise ValidationError("pass either -d/--data or --run, not both or neither")
    if options.timeout is not None and not options.timeout > 0:
        raise ValidationError("--timeout must be greater than 0.")


def _apply_api_key(ui: UI, redactor: Redactor, key: str | None, models: list[JudgeModel]) -> None:
    """The deprecated ``--api-key``: it wins over the environment for the judges' providers."""
    if key is None:
        return
    ui.warning(DEPRECATED_API_KEY, code="DEPRECATION")
    if not key.strip():
        return
    redactor.add(key)
    for model in models:
        if model.key_variable is not None:
            # The upstream paths read credentials from the environment; this process is the
            # command's own, so the key goes nowhere else.
            os.environ[model.key_variable] = key


def _store_line(item: RunItem, judge: Judge, run: int, verdict: Verdict) -> dict[str, Any]:
    return {
        "rollout_id": item.rollout_id,
        "row_index": item.row_index,
        "run_index": item.run_index,
        "judge_run": run,
        "model": judge.model.route,
        "score": verdict.score,
        "explanation": verdict.explanation,
        "error": verdict.error,
        "usage": verdict.usage.to_json(),
        "call": verdict.call,
        "judged_at": datetime.now(UTC).isoformat(),
    }


def _stored_verdict(line: dict[str, Any]) -> Verdict:
    from bridge.usage import CallUsage

    score = line.get("score")
    return Verdict(
        float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
        line.get("explanation") if isinstance(line.get("explanation"), str) else None,
        line.get("error") if isinstance(line.get("error"), str) else None,
        CallUsage.from_json(line.get("usage")),
    )


async def _judge_all(
    ui: UI,
    options: RubricOptions,
    rubric: str,
    models: list[JudgeModel],
    source: RunSource | list[JudgeRecord],
) -> tuple[Evaluation, list[Path]]:
    """Judge what has no score yet; with a run source, verdicts are loaded and appended."""
    from bridge.upstreams.direct import new_client

    records = source.records if isinstance(source, RunSource) else source
    async with new_client() as client:
        judges = [Judge(m, client, timeout=options.timeout, redact=ui.redact) for m in models]
        evaluation = Evaluation(
            rubric, records, judges, options.number, options.score_min, options.score_max
        )
        stores: list[RubricStore] = []
        try:
            if isinstance(source, RunSource):
                for judge in judges:
                    stores.append(
                        RubricStore.open(
                            source.run_dir,
                            rubric=rubric,
                            model=judge.model.route,
                            score_min=options.score_min,
                            score_max=options.score_max,
                        )
                    )
                _load_stored(evaluation, source, stores)
            tasks = evaluation.pending()
            with JudgeProgress(ui, len(tasks)) as progress:

                async def on_verdict(key: TaskKey, verdict: Verdict) -> None:
                    if stores:
                        assert isinstance(source, RunSource)
                        record, j, run = key
                        line = _store_line(source.items[record], judges[j], run, verdict)
                        await stores[j].append(line)
                    progress.advance()

                await evaluation.run(tasks, on_verdict)
        finally:
            for store in stores:
                store.close()
    return evaluation, [store.path for store in stores]


def _load_stored(evaluation: Evaluation, source: RunSource, stores: list[RubricStore]) -> None:
    for key in list(evaluation.keys()):
        record, judge, run = key
        line = stores[judge].get(source.items[record].rollout_id, run)
        if line is not None:
            evaluation.verdicts[key] = _stored_verdict(line)


def _output(options: RubricOptions, run_dir: Path | None) -> Path | None:
    """Where ``-o`` writes the report, checked before any judge call (launcher.outputs): not
    among runs' files (but ``rubric_eval_result.json`` in the judged run's directory), its
    directory creatable and writable."""
    if options.output is None:
        return None
    path = output_file(options.output)
    cwd = Path.cwd()
    runs = [run_dir] if run_dir is not None else []
    own = [run_dir / DEFAULT_REPORT_NAME] if run_dir is not None else []
    refuse_run_files(cwd / path, cwd=cwd, runs=runs, allowed=own, what="report")
    check_writable(cwd / path)
    return path


def _write_report(path: Path, report: dict[str, Any]) -> None:
    data = json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    write_output(Path.cwd() / path, data.encode("utf-8"))


def _emit_success(ui: UI, resource_: dict[str, Any]) -> None:
    if ui.mode == "json":
        envelope = {
            "schema_version": 1,
            "cli_version": CLI_VERSION,
            "operation": "eval.rubric",
            "status": "success",
            "message": COMPLETED,
            "result": resource_,
        }
        # The console's stream redacts whatever passes through it.
        ui.console.file.write(json.dumps(envelope, ensure_ascii=False) + "\n")
        ui.console.file.flush()
    elif ui.mode == "plain":
        ui.console.file.write(COMPLETED + "\n")
        ui.console.file.flush()


def run_rubric(options: RubricOptions, ui: UI, redactor: Redactor) -> int:
    """Run the command; returns the exit code (raises :class:`CLIError` for errors)."""
    _check(options)
    models = _models(options)
    rubric = load_rubric(options.rubric)
    source: RunSource | list[JudgeRecord]
    if options.run is not None:
        run_dir = resolve_run_dir(options.run, Path.cwd())
        path = _output(options, run_dir)
        source = load_run(run_dir)
        data_path = str(source.run_dir)
        notes = [f"Skipped {label}: {reason}" for label, reason in source.skipped]
    else:
        assert options.data is not None
        path = _output(options, None)
        source = load_records(options.data)
        data_path = str(Path(options.data).expanduser())
        notes = []
    _apply_api_key(ui, redactor, options.api_key, models)
    evaluation, files = trio.run(_judge_all, ui, options, rubric, models, source)
    generated_at = datetime.now(UTC).isoformat()
    report = build_report(evaluation, data_path=data_path, generated_at=generated_at)
    notes += [f"Verdicts: {path}" for path in files]
    judged_now = len(evaluation.fresh)
    if isinstance(source, RunSource):
        kept = sum(
            1
            for k, v in evaluation.verdicts.items()
            if k not in evaluation.fresh and v.score is not None
        )
        notes.append(f"Judged now: {judged_now} call(s); kept from earlier runs: {kept}")
    print_report(ui, report, notes=notes)
    output_path: str | None = None
    if path is not None:
        _write_report(path, report)
        output_path = str(path)
        if ui.rich:
            ui.console.print(ui.redact(f"Wrote results to {path}"), markup=False)
    result = resource(report, output_path=output_path)
    if isinstance(source, RunSource):
        result["run_dir"] = str(source.run_dir)
        result["verdict_files"] = [str(path) for path in files]
        result["judged_now"] = judged_now
        result["skipped"] = [{"label": label, "reason": why} for label, why in source.skipped]
    if error_count(report):
        raise CLIError(COMPLETED_WITH_ERRORS, code="PLATFORM_ERROR", details=result)
    _emit_success(ui, result)
    return 0
