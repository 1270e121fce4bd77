"""``rollbridge eval list`` and ``rollbridge eval clean``: the local runs of a workspace.

Both read the output root (``-o``, else ``<workspace>/.osmosis/evals``, the workspace being the
nearest directory at or above the current one with ``configs/eval/`` or ``.osmosis/evals/``).
Listing only reads: the journal is the authority for what is done, ``progress.json`` (else the
manifest) for the total, the run's lock for whether a supervisor is working on it now.
Archived runs (``<name>.archive-<stamp>``, from ``--fresh``) are not listed.

A run whose journal is missing, empty or unreadable while other files hold results (index rows,
rollout calls, rollout files) is ``damaged``, never ``empty``: its done count is its index rows.
One that recorded something but no result (only the model check of ``calls.jsonl``: stopped
after the preflight, before its first item finished) is ``incomplete``, as ``eval report`` has it.

``clean`` removes the runs with nothing recorded (a failure before dispatch leaves one behind)
and lock files without a run, after a confirmation. It takes each run's lock first, so it never
touches a run a supervisor holds, and it leaves a run alone whose rollout server or tunnel may
still be alive (``server.json``/``tunnel.json``: the next ``eval run`` reaps those).

Why one module of this size: ``list`` and ``clean`` must classify a run the same way (what counts
as recorded, what as a result); ``clean`` re-checks that classification under the run's lock, so
the two commands and their shared rules live together.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import click

from launcher import completion as complete
from launcher.cli_ui import command_ui
from launcher.errors import LocalEvalError
from launcher.rundir.lock import is_held, run_is_live
from launcher.rundir.manifest import is_archive_name, is_run_dir
from launcher.ui import UI
from launcher.workspace import output_root

__all__ = [
    "RunSummary",
    "command_ui",
    "envelope",
    "eval_clean",
    "eval_list",
    "latest_records",
    "output_root",
    "planned_total",
    "scan_runs",
    "summarize",
]

RunStatus = Literal["running", "complete", "incomplete", "empty", "damaged"]
_LOCKS = ".locks"
_LIVE_CHILD_FILES = ("server.json", "tunnel.json")


@dataclass(frozen=True)
class RunSummary:
    """One line of ``eval list``."""

    name: str
    status: RunStatus
    done: int
    total: int | None
    pass_rate: float | None
    """Passed over graded-or-failed items, skipped ones excluded (None before any result)."""
    model: str | None
    started: str | None
    path: str


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def latest_records(run_dir: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """The latest journal record per ``(row_index, run_index)``; lines that do not parse are
    skipped (a listing is no place to refuse a damaged journal: ``eval run`` does that)."""
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    try:
        data = (run_dir / "events.jsonl").read_bytes()
    except OSError:
        return latest
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is a torn write
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            key = (record.get("row_index"), record.get("run_index"))
            if all(isinstance(k, int) for k in key):
                latest[key] = record  # type: ignore[index]
    return latest


def _index_rows(run_dir: Path) -> int:
    """How many work items ``index.jsonl`` holds a row for (0 when it is missing)."""
    keys: set[tuple[Any, Any]] = set()
    try:
        with (run_dir / "index.jsonl").open("rb") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    keys.add((row.get("row_index"), row.get("run_index")))
    except OSError:
        return 0
    return len(keys)


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def recorded_anything(run_dir: Path) -> bool:
    """Whether the run recorded anything at all: a journal with any bytes (even ones that do
    not parse), index rows, model calls or rollout files. Only a run without any of them is
    ``empty`` (and ``clean`` removes nothing else)."""
    if any(_has_content(run_dir / f) for f in ("events.jsonl", "calls.jsonl")):
        return True
    return recorded_results(run_dir)


def _is_preflight(line: bytes) -> bool:
    try:
        call = json.loads(line)
    except ValueError:
        return False  # a torn or damaged line may be a rollout's call
    return isinstance(call, dict) and call.get("kind") == "preflight"


def recorded_results(run_dir: Path) -> bool:
    """Whether files other than the journal hold results: index rows, rollout files or model
    calls other than the preflight model check."""
    if _has_content(run_dir / "index.jsonl"):
        return True
    for sub in ("rollout_trials", "trajectories", "artifacts"):
        try:
            if any((run_dir / sub).iterdir()):
                return True
        except OSError:
            continue
    try:
        with (run_dir / "calls.jsonl").open("rb") as fh:
            return any(line.strip() and not _is_preflight(line) for line in fh)
    except OSError:
        return False


def planned_total(run_dir: Path, inputs: dict[str, Any]) -> int | None:
    """How many work items the run has in all: ``progress.json``'s ``total_runs``, else the
    manifest's selected rows times ``n`` (None when neither says)."""
    total = _json_file(run_dir / "progress.json").get("total_runs")
    if isinstance(total, int):
        return total
    from launcher.dataset import parse_rows_selector
    from launcher.errors import ValidationError

    dataset, n = inputs.get("dataset"), inputs.get("n")
    selector = dataset.get("selected_source_rows") if isinstance(dataset, dict) else None
    if not isinstance(selector, str) or not isinstance(n, int):
        return None
    try:
        rows = sum(hi - lo + 1 for lo, hi in parse_rows_selector(selector)) if selector else 0
        return rows * n
    except ValidationError:
        return None


def summarize(run_dir: Path, cwd: Path) -> RunSummary:
    """What ``eval list`` shows for one run directory."""
    from launcher.rundir.metrics import aggregate_metrics

    manifest = _json_file(run_dir / "manifest.json")
    inputs = manifest.get("inputs") if isinstance(manifest.get("inputs"), dict) else {}
    assert isinstance(inputs, dict)
    records = list(latest_records(run_dir).values())
    total = planned_total(run_dir, inputs)
    summary = _json_file(run_dir / "metrics.json").get("summary")
    threshold = summary.get("pass_threshold") if isinstance(summary, dict) else None
    pass_rate: float | None = None
    if records:
        rows = [r for r in records if isinstance(r.get("status"), str)]
        limit = float(threshold) if isinstance(threshold, int | float) else 1.0
        metrics = aggregate_metrics(rows, limit)
        pass_rate = float(metrics["pass_rate"]) if metrics["completed_samples"] else None
    done = len(records)
    status: RunStatus
    if run_is_live(run_dir):
        status = "running"
    elif not records and not recorded_anything(run_dir):
        status = "empty"
    elif not records and recorded_results(run_dir):
        # Results exist but the journal (the resume authority) is missing, empty or unreadable:
        # never "empty", so clean keeps it; done counts the index rows instead.
        status = "damaged"
        done = _index_rows(run_dir)
    elif total is not None and len(records) >= total:
        status = "complete"
    else:
        status = "incomplete"
    model = inputs.get("model_path")
    started = manifest.get("created_at")
    try:
        shown = str(run_dir.relative_to(cwd))
    except ValueError:
        shown = str(run_dir)
    return RunSummary(
        name=run_dir.name,
        status=status,
        done=done,
        total=total,
        pass_rate=pass_rate,
        model=model if isinstance(model, str) else None,
        started=started if isinstance(started, str) else None,
        path=shown,
    )


def _made_by_a_supervisor(run_dir: Path) -> bool:
    """Whether the run's manifest is one a supervisor wrote (what ``clean`` requires before it
    removes anything)."""
    manifest = _json_file(run_dir / "manifest.json")
    return isinstance(manifest.get("local_run_id"), str) and isinstance(
        manifest.get("inputs"), dict
    )


def scan_runs(root: Path, cwd: Path) -> list[RunSummary]:
    """Every run directory under ``root`` (archives excluded), oldest first."""
    try:
        entries = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LocalEvalError(f"cannot read the output root {root}: {exc.strerror or exc}") from None
    runs = [
        summarize(p, cwd)
        for p in entries
        if not p.name.startswith(".") and not is_archive_name(p.name) and is_run_dir(p)
    ]
    return sorted(runs, key=lambda r: (r.started or "", r.name))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _started(value: str | None) -> str:
    # 2026-01-02T03:04:05.678Z -> 2026-01-02 03:04Z: a listing needs the minute, not the µs.
    return "-" if not value else value[:16].replace("T", " ") + ("Z" if value.endswith("Z") else "")


def _done(run: RunSummary) -> str:
    return f"{run.done}/{'?' if run.total is None else run.total}"


def envelope(ui: UI, operation: str, message: str, result: dict[str, Any]) -> None:
    """The one JSON document of ``--json`` (see :meth:`launcher.ui.UI.envelope`)."""
    ui.envelope(operation, message, result)


def list_command(ui: UI, root: Path, cwd: Path) -> int:
    """Print the runs under ``root``."""
    runs = scan_runs(root, cwd)
    message = f"{len(runs)} run{'s' if len(runs) != 1 else ''} under {root}"
    if ui.mode == "json":
        envelope(ui, "eval.list", message, {"runs": [asdict(r) for r in runs]})
        return 0
    columns = ("name", "status", "done", "pass rate", "model", "started", "path")
    rows = [
        (
            r.name,
            r.status,
            _done(r),
            _rate(r.pass_rate),
            r.model or "-",
            _started(r.started),
            r.path,
        )
        for r in runs
    ]
    if ui.mode == "plain" or not ui.tty:
        # Porcelain, as for --plain: tab-separated, no header, whole values (a pipe or a file
        # reads it with `cut -f`). Straight to the (redacting) stream: rich would expand tabs.
        ui.console.file.write("".join("\t".join(row) + "\n" for row in rows))
        ui.console.file.flush()
        if ui.mode == "plain":
            return 0
        _clean_hint(ui, runs, stderr=True)
        return 0
    if not runs:
        ui.console.print(f"No runs under {root}.", markup=False)
        return 0
    from launcher.list_layout import fit_table

    # Fit the terminal: names whole, the path cut in the middle, then columns dropped.
    lines = fit_table(
        columns,
        rows,
        ui.console.width,
        drop_order=("started", "model", "path", "pass rate"),
        middle=("path",),
    )
    ui.console.print(lines[0], style="bold", markup=False, highlight=False, soft_wrap=True)
    for text in lines[1:]:
        ui.console.print(text, markup=False, highlight=False, soft_wrap=True)
    _clean_hint(ui, runs, stderr=False)
    return 0


def _clean_hint(ui: UI, runs: list[RunSummary], *, stderr: bool) -> None:
    empty = sum(r.status == "empty" for r in runs)
    if empty:
        (ui.err_console if stderr else ui.console).print(
            f"{empty} run{'s' if empty != 1 else ''} with nothing recorded: "
            "`rollbridge eval clean` removes them.",
            markup=False,
        )


def _orphan_locks(root: Path) -> list[Path]:
    try:
        locks = sorted((root / _LOCKS).glob("*.lock"))
    except OSError:
        return []
    return [p for p in locks if not (root / p.stem).exists() and not is_held(p)]


def clean_command(ui: UI, root: Path, cwd: Path, *, yes: bool) -> int:
    """Remove the runs with nothing recorded, and lock files without a run, once confirmed."""
    from launcher.rundir.lock import RunLock

    empty = [r for r in scan_runs(root, cwd) if r.status == "empty"]
    kept = [r for r in empty if any((root / r.name / f).exists() for f in _LIVE_CHILD_FILES)]
    unsure = [r for r in empty if r not in kept and not _made_by_a_supervisor(root / r.name)]
    doomed = [r for r in empty if r not in kept and r not in unsure]
    for run in unsure:
        ui.warning(
            f"kept {run.path}: its manifest.json is not one rollbridge wrote; remove it by hand "
            "if it is a run you no longer need",
            "CLEAN_KEPT",
        )
    locks = _orphan_locks(root)
    for run in kept:
        ui.warning(
            f"kept {run.path}: its rollout server or tunnel may still be running; "
            f"`rollbridge eval run` with --name {run.name} stops it",
            "CLEAN_KEPT",
        )
    if not doomed and not locks:
        message = f"Nothing to clean under {root}."
        if ui.mode == "json":
            envelope(ui, "eval.clean", message, {"removed": [], "locks_removed": 0})
        else:
            ui.console.print(message, markup=False)
        return 0
    if not yes:
        if not ui.interactive:
            raise LocalEvalError(
                f"{len(doomed)} empty run(s) and {len(locks)} stale lock(s) would be removed; "
                "pass --yes to confirm"
            )
        for run in doomed:
            ui.console.print(f"  {run.path}", markup=False)
        prompt = f"Remove {len(doomed)} run(s) with nothing recorded"
        prompt += f" and {len(locks)} stale lock(s)?" if locks else "?"
        if not ui.confirm(prompt, default=False):
            ui.console.print("Nothing removed.", markup=False)
            return 0
    removed: list[str] = []
    for run in doomed:
        lock = RunLock.try_acquire(root, run.name)
        if lock is None:
            continue  # a supervisor took it meanwhile
        try:
            run_dir = root / run.name
            # Checked again under the lock: a run may have recorded something since the scan.
            if (
                not recorded_anything(run_dir)
                and not any((run_dir / f).exists() for f in _LIVE_CHILD_FILES)
                and _made_by_a_supervisor(run_dir)
            ):
                shutil.rmtree(run_dir)
                lock.path.unlink(missing_ok=True)
                removed.append(run.path)
        finally:
            lock.release()
    for path in locks:
        path.unlink(missing_ok=True)
    message = f"Removed {len(removed)} run(s) with nothing recorded"
    message += f" and {len(locks)} stale lock(s)." if locks else "."
    if ui.mode == "json":
        envelope(ui, "eval.clean", message, {"removed": removed, "locks_removed": len(locks)})
    else:
        ui.console.print(message, markup=False)
    return 0


_output = click.option(
    "-o",
    "--output",
    default=None,
    shell_complete=complete.dirs,
    help="Output root (default <workspace>/.osmosis/evals).",
)
_json = click.option("--json", "json_output", is_flag=True, help="Print one JSON envelope.")
_plain = click.option("--plain", is_flag=True, help="Plain text: one tab-separated line per run.")


def _checked_root(output: str | None, cwd: Path) -> Path:
    """The output root; a one-line error when ``-o`` names nothing or a file."""
    root = output_root(output, cwd)
    if output is not None and not root.exists():
        raise LocalEvalError(f"{root} does not exist; -o takes the output root of your runs")
    if root.exists() and not root.is_dir():
        raise LocalEvalError(f"{root} is not a directory; -o takes the output root of your runs")
    return root


@click.command("list")
@_output
@_json
@_plain
@click.pass_context
def eval_list(ctx: click.Context, /, output: str | None, json_output: bool, plain: bool) -> None:
    """List the local runs: name, status, done/total, pass rate, model, started, path."""
    ui = command_ui(ctx.obj, json_output, plain)
    cwd = Path.cwd()
    ctx.exit(list_command(ui, _checked_root(output, cwd), cwd))


@click.command("clean")
@_output
@click.option("-y", "--yes", is_flag=True, help="Remove without asking.")
@_json
@_plain
@click.pass_context
def eval_clean(
    ctx: click.Context, /, output: str | None, yes: bool, json_output: bool, plain: bool
) -> None:
    """Remove runs with nothing recorded (and lock files without a run), after confirmation."""
    ui = command_ui(ctx.obj, json_output, plain)
    cwd = Path.cwd()
    ctx.exit(clean_command(ui, _checked_root(output, cwd), cwd, yes=yes))
