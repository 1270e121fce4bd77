"""Which run directory a ``rollbridge eval report``/``diff`` argument names.

An argument is a path to a run directory (one holding ``manifest.json`` or ``index.jsonl``),
or the name of a run under the output root: ``--output-root`` when given (the ``-o`` of
``eval run``), else ``<workspace>/.osmosis/evals``. The workspace is ``--workspace``, else the
nearest directory at or above the current one that holds ``configs/eval/`` or
``.osmosis/evals/``.
"""

from __future__ import annotations

from pathlib import Path

from launcher.errors import NotFoundError

__all__ = ["find_workspace_root", "resolve_run_dir"]


def _is_run_dir(path: Path) -> bool:
    return path.is_dir() and (
        (path / "manifest.json").is_file() or (path / "index.jsonl").is_file()
    )


def find_workspace_root(cwd: Path) -> Path | None:
    """The nearest directory at or above ``cwd`` that looks like a workspace."""
    for candidate in (cwd, *cwd.parents):
        if (candidate / "configs" / "eval").is_dir() or (candidate / ".osmosis" / "evals").is_dir():
            return candidate
    return None


def resolve_run_dir(
    arg: str,
    *,
    cwd: Path,
    workspace: str | None = None,
    output_root: str | None = None,
    locating_flags: str | None = "--workspace/--output-root",
) -> Path:
    """The run directory ``arg`` names (see the module docstring); NotFoundError otherwise.
    ``locating_flags`` names the calling command's options that say where runs are (None for
    a command without them)."""
    as_path = (cwd / Path(arg).expanduser()).resolve()
    if _is_run_dir(as_path):
        return as_path
    if output_root is not None:
        root = (cwd / Path(output_root).expanduser()).resolve()
    else:
        ws = (
            (cwd / Path(workspace).expanduser()).resolve()
            if workspace
            else find_workspace_root(cwd)
        )
        if ws is None:
            how = (
                f"{locating_flags} with the run's name"
                if locating_flags
                else "run the command inside the run's workspace"
            )
            raise NotFoundError(
                f"'{arg}' is not a run directory and no workspace was found at or above {cwd}; "
                f"pass the run directory, or {how}"
            )
        root = ws / ".osmosis" / "evals"
    if "/" not in arg and "\\" not in arg and arg not in ("", ".", ".."):
        candidate = root / arg
        if _is_run_dir(candidate):
            return candidate
    raise NotFoundError(
        f"no run '{arg}' under {root} (and it is not a run directory); list the runs with "
        f"'ls {root}' or pass the run directory itself"
    )
