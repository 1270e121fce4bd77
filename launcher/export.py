"""``rollbridge eval export RUN``: one row per rollout, in the shape RL training reads.

A row is the latest journal record of a work item (what a resume or ``--retry-failed`` kept),
joined with its trajectory turned back into chat messages, its model calls from
``calls.jsonl`` (launcher.export_calls, docs/calls.md), the run's model and dataset digest.
The schema is documented in docs/eval-run.md ("Exporting a run"); JSON Lines and Parquet carry
the same fields (Parquet through the ``parquet`` extra, pyarrow).

Trajectories are ATIF documents (rollout_server.trajectory): a step per message, tool results
folded into the calling step's ``observation``. They are unfolded here: a ``system``/``user``/
``agent`` step becomes a ``system``/``user``/``assistant`` message (its ``original_role`` when
it had one), its tool calls OpenAI ``tool_calls`` with the arguments as a JSON string, and each
observation result a ``tool`` message after it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import click

from launcher import completion as complete
from launcher.errors import DependencyError, LocalEvalError
from launcher.outputs import output_path, refuse_run_files, write_output
from launcher.ui import UI
from rollout_server.protocol import RAW_ARGUMENTS

__all__ = ["EXPORT_FIELDS", "eval_export", "export_rows", "trajectory_messages"]

ExportFormat = Literal["jsonl", "parquet"]

#: The fields of a row, in order (docs/eval-run.md lists their types and meaning).
EXPORT_FIELDS = (
    "run_name",
    "local_run_id",
    "row_index",
    "run_index",
    "source_row_index",
    "rollout_id",
    "status",
    "reward",
    "error_type",
    "error",
    "tokens",
    "max_context_tokens",
    "calls",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "retries",
    "metrics",
    "duration_ms",
    "model",
    "dataset_sha256",
    "label",
    "messages",
    "call_records",
)

_ROLES = {"system": "system", "user": "user", "agent": "assistant"}


def _tool_call(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    arguments = call.get("arguments")
    extra = call.get("extra")
    # build_trajectory keeps arguments that were not a JSON object as {"raw": <text>}, marked
    # in `extra`: give the text back (an object whose one key is "raw" stays an object).
    if (
        isinstance(extra, dict)
        and extra.get(RAW_ARGUMENTS) is True
        and isinstance(arguments, dict)
        and isinstance(arguments.get("raw"), str)
    ):
        text = arguments["raw"]
    else:
        text = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {
        "id": call.get("tool_call_id"),
        "type": "function",
        "function": {"name": call.get("function_name"), "arguments": text},
    }


def trajectory_messages(trajectory: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The chat messages of an ATIF trajectory (see the module docstring); [] without one."""
    messages: list[dict[str, Any]] = []
    steps = trajectory.get("steps") if trajectory else None
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        extra = step.get("extra")
        original = extra.get("original_role") if isinstance(extra, dict) else None
        source = step.get("source")
        role = original if isinstance(original, str) else _ROLES.get(str(source), "user")
        content = step.get("message")
        message: dict[str, Any] = {
            "role": role,
            "content": content if isinstance(content, str) else "",
        }
        calls = [c for c in map(_tool_call, step.get("tool_calls") or []) if c is not None]
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
        observation = step.get("observation")
        results = observation.get("results") if isinstance(observation, dict) else None
        for result in results if isinstance(results, list) else []:
            if isinstance(result, dict):
                text = result.get("content")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": result.get("source_call_id"),
                        "content": text if isinstance(text, str) else "",
                    }
                )
    return messages


def _label(trajectory: dict[str, Any] | None) -> str | None:
    extra = trajectory.get("extra") if trajectory else None
    osmosis = extra.get("osmosis") if isinstance(extra, dict) else None
    label = osmosis.get("label") if isinstance(osmosis, dict) else None
    return label if isinstance(label, str) else None


def export_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The export rows of ``run_dir``, ordered by row then run index."""
    from launcher.export_calls import export_call
    from launcher.rundir.calls import CALLS_FILENAME, read_calls
    from launcher.rundir.journal import replay_journal
    from launcher.rundir.projections import load_valid_trajectory
    from launcher.runs import recorded_results

    try:
        manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise LocalEvalError(f"{run_dir / 'manifest.json'} is missing or unreadable") from None
    inputs = manifest.get("inputs") if isinstance(manifest, dict) else None
    inputs = inputs if isinstance(inputs, dict) else {}
    dataset = inputs.get("dataset")
    dataset = dataset if isinstance(dataset, dict) else {}
    replay = replay_journal(run_dir / "events.jsonl")
    if not replay.latest and recorded_results(run_dir):
        # Results elsewhere but none in the journal (missing or empty): an empty export would
        # say the run has none. eval list calls such a run damaged.
        raise LocalEvalError(
            f"{run_dir / 'events.jsonl'}, the run's journal, is missing or empty while the run "
            "holds results (index.jsonl, rollout files or calls): the run is damaged, and "
            "nothing was exported"
        )
    calls, _ = read_calls(
        run_dir / CALLS_FILENAME, (record.rollout_id for record in replay.latest.values())
    )
    rows = []
    for key in sorted(replay.latest):
        record = replay.latest[key]
        trajectory = load_valid_trajectory(run_dir / "rollout_trials", record.rollout_id)
        rows.append(
            {
                "run_name": run_dir.name,
                "local_run_id": manifest.get("local_run_id"),
                "row_index": record.row_index,
                "run_index": record.run_index,
                "source_row_index": record.source_row_index,
                "rollout_id": record.rollout_id,
                "status": record.status,
                "reward": record.to_dict().get("reward"),  # non-finite rewards are left out
                "error_type": record.error_type,
                "error": record.error.to_json() if record.error is not None else None,
                "tokens": record.tokens,
                "max_context_tokens": record.max_context_tokens,
                "calls": record.calls,
                "cached_tokens": record.cached_tokens,
                "cache_write_tokens": record.cache_write_tokens,
                "reasoning_tokens": record.reasoning_tokens,
                "retries": record.retries,
                "metrics": record.metrics,
                "duration_ms": float(record.duration_ms or 0.0),
                "model": inputs.get("model_path"),
                "dataset_sha256": dataset.get("sha256"),
                "label": _label(trajectory),
                "messages": trajectory_messages(trajectory),
                "call_records": [export_call(c) for c in calls.get(record.rollout_id, [])],
            }
        )
    return rows


def _parquet_schema() -> Any:
    import pyarrow as pa

    from launcher.export_calls import call_arrow_type

    tool_call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(tool_call)),
            ("tool_call_id", pa.string()),
        ]
    )
    error = pa.struct(
        [
            ("phase", pa.string()),
            ("type", pa.string()),
            ("message", pa.string()),
            ("status", pa.int64()),
        ]
    )
    return pa.schema(
        [
            ("run_name", pa.string()),
            ("local_run_id", pa.string()),
            ("row_index", pa.int64()),
            ("run_index", pa.int64()),
            ("source_row_index", pa.int64()),
            ("rollout_id", pa.string()),
            ("status", pa.string()),
            ("reward", pa.float64()),
            ("error_type", pa.string()),
            ("error", error),
            ("tokens", pa.int64()),
            ("max_context_tokens", pa.int64()),
            ("calls", pa.int64()),
            ("cached_tokens", pa.int64()),
            ("cache_write_tokens", pa.int64()),
            ("reasoning_tokens", pa.int64()),
            ("retries", pa.int64()),
            ("metrics", pa.string()),
            ("duration_ms", pa.float64()),
            ("model", pa.string()),
            ("dataset_sha256", pa.string()),
            ("label", pa.string()),
            ("messages", pa.list_(message)),
            ("call_records", pa.list_(call_arrow_type())),
        ]
    )


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DependencyError(
            'Parquet export requires: pip install "rollbridge[parquet]"',
            details={"missing_module": "pyarrow", "extra": "parquet"},
        ) from None
    # Metrics are free-form (numbers, strings, booleans by name): a JSON text in Parquet.
    flat = [
        {**row, "metrics": json.dumps(row["metrics"]) if row["metrics"] is not None else None}
        for row in rows
    ]
    # Built in memory, so the file is written as the JSON Lines one is (launcher.outputs): a
    # FIFO written in place, a failure named by -o's path rather than a temporary file's.
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(flat, schema=_parquet_schema()), sink)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _jsonl(rows: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(
        (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        for row in rows
    )


def export_command(
    ui: UI, run_dir: Path, *, fmt: ExportFormat, output: str | None, cwd: Path
) -> int:
    """Write the export of ``run_dir`` (``-o -``: JSON Lines on stdout)."""
    if output == "-" and ui.mode == "json":
        # stdout carries the rows; an envelope among them would break both.
        raise LocalEvalError(
            "-o - (stdout) cannot go with --json: the rows are the output; write them to a "
            "file (-o FILE) to get the JSON envelope"
        )
    if output == "-":
        if fmt != "jsonl":
            raise LocalEvalError("-o - (stdout) works with --format jsonl only")
        sys.stdout.buffer.write(_jsonl(export_rows(run_dir)))
        sys.stdout.flush()
        return 0
    default = run_dir / "export.jsonl"
    target = output_path(output, cwd) if output else run_dir / f"export.{fmt}"
    own = [default, run_dir / "export.parquet"]
    refuse_run_files(target, cwd=cwd, runs=[run_dir], allowed=own, what="export", default=default)
    rows = export_rows(run_dir)
    target = write_output(target, _parquet(rows) if fmt == "parquet" else _jsonl(rows))
    message = f"Exported {len(rows)} rollouts of {run_dir.name} to {target}"
    if ui.mode == "json":
        from launcher.runs import envelope

        envelope(
            ui, "eval.export", message, {"path": str(target), "rows": len(rows), "format": fmt}
        )
    else:
        ui.console.print(message, markup=False, highlight=False)
    return 0


def _run_dir(run: str, output_root: str | None, cwd: Path) -> Path:
    from launcher.reporting.resolve import resolve_run_dir

    return resolve_run_dir(run, cwd=cwd, output_root=output_root, locating_flags="--output-root")


@click.command("export")
@click.argument("run", type=str, shell_complete=complete.run_names)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "parquet"]),
    default="jsonl",
    show_default=True,
    help="File format.",
)
@click.option(
    "-o",
    "--output",
    default=None,
    shell_complete=complete.files,
    help="Output file (default <run dir>/export.<format>; '-' = stdout).",
)
@click.option(
    "--output-root",
    default=None,
    shell_complete=complete.dirs,
    help="Output root of named runs (the -o given to eval run).",
)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON envelope.")
@click.option("--plain", is_flag=True, help="Plain text output.")
@click.pass_context
def eval_export(
    ctx: click.Context,
    /,
    run: str,
    fmt: ExportFormat,
    output: str | None,
    output_root: str | None,
    json_output: bool,
    plain: bool,
) -> None:
    """Export RUN (a run name or directory): one row per rollout with its chat messages."""
    from launcher.cli_ui import command_ui

    ui = command_ui(ctx.obj, json_output, plain)
    cwd = Path.cwd()
    ctx.exit(export_command(ui, _run_dir(run, output_root, cwd), fmt=fmt, output=output, cwd=cwd))
