"""What a workspace holds, for an IDE's tree views: the eval configs (with what each names, or
why it does not load), the rollouts and the datasets. Read from disk on every request; nothing
is cached, so a file an editor just saved is seen at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.config import load_eval_config
from launcher.errors import CLIError

__all__ = ["DATASET_EXTENSIONS", "diff_doc", "list_configs", "list_datasets", "list_rollouts"]

DATASET_EXTENSIONS = (".jsonl", ".csv", ".parquet")


def _rel(workspace: Path, path: Path) -> str:
    return path.relative_to(workspace).as_posix()


def list_configs(workspace: Path) -> list[dict[str, Any]]:
    """``configs/eval/*.toml``: each with its ``[experiment]`` when it loads, else the CLI's
    message (the structural check only; ``POST /v1/configs/validate`` does the full one)."""
    out: list[dict[str, Any]] = []
    for path in sorted((workspace / "configs" / "eval").glob("*.toml")):
        doc: dict[str, Any] = {"path": _rel(workspace, path), "name": path.stem}
        try:
            config = load_eval_config(path)
        except CLIError as exc:
            doc |= {"loads": False, "error": exc.message}
        else:
            experiment = config.experiment
            doc |= {
                "loads": True,
                "rollout": experiment.rollout,
                "entrypoint": experiment.entrypoint,
                "model": experiment.model_path,
                "dataset": experiment.dataset,
                "secrets_required": list(config.secrets_required),
            }
        out.append(doc)
    return out


def list_rollouts(workspace: Path) -> list[dict[str, Any]]:
    """``rollouts/*/``: each with its top-level Python files (entrypoint candidates) and
    whether it has a ``pyproject.toml`` (what ``uv sync`` needs)."""
    root = workspace / "rollouts"
    if not root.is_dir():
        return []
    return [
        {
            "name": path.name,
            "path": _rel(workspace, path),
            "python_files": sorted(p.name for p in path.glob("*.py")),
            "has_pyproject": (path / "pyproject.toml").is_file(),
        }
        for path in sorted(root.iterdir())
        if path.is_dir() and not path.name.startswith(".")
    ]


def list_datasets(workspace: Path) -> list[dict[str, Any]]:
    """``data/*.jsonl|csv|parquet``: name (as a config's ``dataset`` may give it), format,
    size in bytes."""
    root = workspace / "data"
    if not root.is_dir():
        return []
    return [
        {
            "name": path.name,
            "path": _rel(workspace, path),
            "format": path.suffix[1:],
            "bytes": path.stat().st_size,
        }
        for path in sorted(root.iterdir())
        if path.is_file() and path.suffix in DATASET_EXTENSIONS
    ]


def diff_doc(run_a: Path, run_b: Path, *, page: bool) -> dict[str, Any] | str:
    """``eval diff``'s comparison of two run directories: its JSON result, or its HTML page
    (raises CLIError as the command does, for runs that cannot be paired)."""
    from launcher.reporting.diff import diff_runs
    from launcher.reporting.diff_page import render_diff
    from launcher.reporting.load import load_run

    result = diff_runs(load_run(run_a), load_run(run_b))
    return render_diff(result) if page else result.to_json()
