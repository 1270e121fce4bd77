"""``rollbridge eval merge A B … -o M``: the runs of ``--shard i/N`` joined into one run directory.

The shards must be parts of one evaluation: every manifest input except ``shard`` equal, one
``N``, each index at most once, each journal record inside its own shard. Anything else is
refused with one line before ``M`` is touched. The merged run is an ordinary run directory:
its manifest holds the inputs of the whole selection (as an unsharded run's would), its
journal the union of the shards' journals, ``rollout_trials/`` the shards' trial directories,
and its projections and ``metrics.json`` are rebuilt from that journal by
:class:`~launcher.rundir.RunDirectory`, so report, export, diff and resume work on it unchanged
(``eval run --name M`` with the same inputs finishes what the shards left pending).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from launcher.cli_ui import command_ui
from launcher.dataset import parse_rows_selector
from launcher.errors import ConflictError, LocalEvalError, ValidationError
from launcher.redact import Redactor
from launcher.rundir import FinalizeResult, RunDirectory, RunLock, RunMeta
from launcher.rundir.atomic import atomic_write_bytes, atomic_write_json
from launcher.rundir.journal import Journal, TerminalRecord, replay_journal
from launcher.rundir.manifest import MANIFEST_NAME, changed_groups, new_manifest, read_manifest
from launcher.rundir.names import validate_run_name
from launcher.rundir.peek import read_metrics
from launcher.shard import SHARD_INPUT, Shard

__all__ = ["ShardRun", "eval_merge", "merge_runs", "read_shard"]

_COMMAND = "rollbridge eval merge"


@dataclass(frozen=True)
class ShardRun:
    """One shard's run directory, read and checked on its own."""

    path: Path
    shard: Shard
    inputs: dict[str, Any]
    """The manifest inputs without ``shard``: what every shard of one evaluation shares."""
    provenance: dict[str, Any]
    facts: dict[str, Any]
    """``metrics.json`` facts the merged run's metrics need (names, pass threshold)."""
    records: list[TerminalRecord]


def _shard_of(path: Path, inputs: dict[str, Any]) -> Shard:
    value = inputs.get(SHARD_INPUT)
    if value is None:
        raise ValidationError(f"{path} is not a shard (it was run without --shard)")
    index, count = (value.get(k) if isinstance(value, dict) else None for k in ("index", "count"))
    if not isinstance(index, int) or not isinstance(count, int) or not 0 <= index < count:
        raise LocalEvalError(f"{path / MANIFEST_NAME}: unreadable shard {value!r}")
    return Shard(index, count)


def read_shard(path: Path) -> ShardRun:
    """Read a shard's manifest, metrics facts and journal; refuse records outside the shard."""
    manifest = read_manifest(
        path / MANIFEST_NAME,
        remedy="Run that shard again under a new name, then merge that run instead.",
    )
    shard = _shard_of(path, manifest.inputs)
    metrics = read_metrics(path)
    eval_run = metrics.get("eval_run") or {}
    summary = metrics.get("summary") or {}
    facts = {
        "dataset_name": eval_run.get("dataset_name"),
        "model_name": eval_run.get("model_name"),
        "rollout_name": eval_run.get("rollout_name"),
        "pass_threshold": summary.get("pass_threshold"),
    }
    if not all(isinstance(v, str) for k, v in facts.items() if k != "pass_threshold") or not (
        isinstance(facts["pass_threshold"], int | float)
    ):
        raise LocalEvalError(f"{path / 'metrics.json'} is missing or unreadable")
    replay = replay_journal(path / "events.jsonl")
    for record in replay.records:
        if record.row_index % shard.count != shard.index:
            raise ConflictError(
                f"{path}: row {record.row_index} is recorded but belongs to shard "
                f"{record.row_index % shard.count}/{shard.count}, not {shard.label}"
            )
    _check_trials(path)
    inputs = {k: v for k, v in manifest.inputs.items() if k != SHARD_INPUT}
    return ShardRun(path, shard, inputs, manifest.provenance, facts, replay.records)


def _check_trials(path: Path) -> None:
    """Refuse a shard whose index names trajectories its ``rollout_trials/`` lacks (a shard
    copied without that directory): merged, those rows would have no conversation."""
    missing = 0
    try:
        lines = (path / "index.jsonl").read_bytes().splitlines()
    except OSError:
        return  # an index is rewritten from the journal; nothing to compare against
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or not row.get("trajectory_filename"):
            continue
        rollout_id = row.get("rollout_id")
        if isinstance(rollout_id, str) and not (path / "rollout_trials" / rollout_id).is_dir():
            missing += 1
    if missing:
        raise LocalEvalError(
            f"{path}: {missing} rollout{'s' if missing != 1 else ''} with a trajectory "
            f"{'have' if missing != 1 else 'has'} no directory in rollout_trials/ (was the "
            "shard copied without it?): copy the whole run directory, then merge again"
        )


def _check_agree(shards: list[ShardRun]) -> None:
    first = shards[0]
    seen: dict[int, Path] = {}
    for run in shards:
        if run.shard.count != first.shard.count:
            raise ConflictError(
                f"{run.path} is shard {run.shard.label} but {first.path} is shard "
                f"{first.shard.label}: all shards must split the rows the same way"
            )
        if run.shard.index in seen:
            raise ConflictError(
                f"shard {run.shard.label} is given twice: {seen[run.shard.index]} and {run.path}"
            )
        seen[run.shard.index] = run.path
        groups = changed_groups(first.inputs, run.inputs)
        if groups:
            raise ConflictError(
                f"{run.path} and {first.path} are not shards of one evaluation. "
                f"Changed: {', '.join(groups)}"
            )
        if run.facts != first.facts:
            # Not inputs (a resume may change them), but the merged metrics.json has one of
            # each: the dataset's file name, the model's and rollout's names, pass_threshold.
            differ = "; ".join(
                f"{key} {run.facts.get(key)!r} against {first.facts.get(key)!r}"
                for key in sorted(set(run.facts) | set(first.facts))
                if run.facts.get(key) != first.facts.get(key)
            )
            raise ConflictError(
                f"{run.path} and {first.path} differ in what their metrics name: {differ}; the "
                "merged run has one of each, so run the shards with the same ones"
            )
    ids: dict[str, Path] = {}
    for run in shards:
        for record in run.records:
            other = ids.setdefault(record.rollout_id, run.path)
            if other != run.path:
                raise ConflictError(
                    f"rollout {record.rollout_id} is journaled by both {other} and {run.path}"
                )


def _selected_rows(inputs: dict[str, Any]) -> int:
    selector = (inputs.get("dataset") or {}).get("selected_source_rows")
    if not isinstance(selector, str) or not selector:
        raise LocalEvalError("the shards' manifests hold no dataset selection")
    return sum(hi - lo + 1 for lo, hi in parse_rows_selector(selector))


def _dataset_rows(shards: list[ShardRun]) -> bytes:
    """The shards' ``dataset_rows.jsonl`` lines in ``row_index`` order: the lines an unsharded
    run writes (each line is a function of its row alone)."""
    lines: list[tuple[int, bytes]] = []
    for run in shards:
        path = run.path / "dataset_rows.jsonl"
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise LocalEvalError(f"cannot read {path}: {exc.strerror}") from None
        for line in raw.splitlines(keepends=True):
            try:
                lines.append((int(json.loads(line)["row_index"]), line))
            except (ValueError, KeyError, TypeError):
                raise LocalEvalError(f"{path} is unreadable") from None
    return b"".join(line for _, line in sorted(lines, key=lambda pair: pair[0]))


def _write_merged(shards: list[ShardRun], dest: Path, meta: RunMeta) -> FinalizeResult:
    first = shards[0]
    provenance = dict(first.provenance)
    provenance["merged_from"] = [
        {"shard": run.shard.label, "run": str(run.path)}
        for run in sorted(shards, key=lambda r: r.shard.index)
    ]
    (dest / "rollout_trials").mkdir(parents=True)
    manifest = new_manifest(dest.name, first.inputs, provenance)
    atomic_write_json(dest / MANIFEST_NAME, manifest.to_dict())
    journal = Journal.open(dest / "events.jsonl")
    try:
        for run in shards:
            for record in run.records:
                trial = run.path / "rollout_trials" / record.rollout_id
                if trial.is_dir() and not (dest / "rollout_trials" / record.rollout_id).exists():
                    shutil.copytree(trial, dest / "rollout_trials" / record.rollout_id)
                journal.append_sync(record)
    finally:
        journal.close()
    atomic_write_bytes(dest / "dataset_rows.jsonl", _dataset_rows(shards))
    rd = RunDirectory.open(
        output_root=dest.parent,
        name=dest.name,
        inputs=first.inputs,
        provenance=provenance,
        fresh=False,
        meta=meta,
        selected_rows=None,
        redactor=Redactor(),
    )
    try:
        rd.log.log("INFO", "merge", f"merged {len(shards)} shards", {"runs": len(shards)})
        return rd.finalize(cancelled=False)
    finally:
        rd.close()


def merge_runs(sources: list[Path], dest: Path) -> FinalizeResult:
    """Merge the shard run directories ``sources`` into the new run directory ``dest``.

    Raises :class:`CLIError` (one line) when the shards do not agree; ``dest`` must not exist.
    """
    validate_run_name(dest.name)
    if dest.exists() or dest.is_symlink():
        raise ConflictError(f"{dest} already exists; choose another -o")
    target = dest.resolve()
    for source in sources:
        shard = source.resolve()
        if target.is_relative_to(shard) or shard.is_relative_to(target):
            raise ValidationError(
                f"-o {dest} is inside the shard {source}: choose a directory beside the shards"
            )
    shards = [read_shard(path) for path in sources]
    _check_agree(shards)
    first = shards[0]
    meta = RunMeta(
        n=int(first.inputs.get("n", 1)),
        pass_threshold=float(first.facts["pass_threshold"]),
        sampled_rows=_selected_rows(first.inputs),
        total_dataset_rows=_total_dataset_rows(first.path),
        dataset_name=first.facts["dataset_name"],
        model_name=first.facts["model_name"],
        rollout_name=first.facts["rollout_name"],
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with RunLock.acquire(dest.parent, dest.name, command=_COMMAND):
        try:
            return _write_merged(shards, dest, meta)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise


def _total_dataset_rows(path: Path) -> int:
    try:
        value = json.loads((path / "progress.json").read_text(encoding="utf-8"))
        return int(value["total_dataset_rows"])
    except (OSError, ValueError, KeyError, TypeError):
        raise LocalEvalError(f"{path / 'progress.json'} is missing or unreadable") from None


@click.command("merge")
@click.argument("runs", nargs=-1, required=True)
@click.option("-o", "--output", "dest", required=True, help="The merged run directory to create.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON envelope.")
@click.option("--plain", is_flag=True, help="Plain text output.")
@click.pass_context
def eval_merge(
    ctx: click.Context, /, runs: tuple[str, ...], dest: str, json_output: bool, plain: bool
) -> None:
    """Merge the run directories of `eval run --shard i/N` into one run directory (-o)."""
    from launcher.reporting.resolve import resolve_run_dir

    ui = command_ui(ctx.obj, json_output, plain)
    cwd = Path.cwd()
    sources = [resolve_run_dir(arg, cwd=cwd, locating_flags=None) for arg in runs]
    target = (cwd / Path(dest).expanduser()).resolve()
    result = merge_runs(sources, target)
    status = "finished" if result.complete else "incomplete"
    message = (
        f"Merged {len(sources)} shard{'' if len(sources) == 1 else 's'} into {target}: "
        f"{result.recorded} of "
        f"{result.total_work_items} work items recorded ({status})"
    )
    if ui.mode == "json":
        ui.envelope(
            "eval.merge",
            message,
            {
                "path": str(target),
                "status": status,
                "recorded": result.recorded,
                "total_work_items": result.total_work_items,
                "summary": result.summary,
            },
        )
    else:
        ui.console.print(message, markup=False)
    ctx.exit(0)
