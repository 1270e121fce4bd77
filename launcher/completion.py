"""Shell completion of argument values (docs/eval-run.md, *Shell completion*).

Click completes nothing for an argument typed ``str``, and its shell scripts then offer no
completion at all, not even the shell's own file names. These ``shell_complete`` callbacks
hand the shell back its path completion for path arguments, and complete run names from the
workspace's output root for arguments that take a run (falling back to paths, since a run
directory is accepted too). They only read directory listings and never fail: a completion
that cannot be computed offers paths.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import CompletionItem

__all__ = ["dirs", "files", "run_names"]


def files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The shell's own file-name completion."""
    return [CompletionItem(incomplete, type="file")]


def dirs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The shell's own directory-name completion."""
    return [CompletionItem(incomplete, type="dir")]


def _root(ctx: click.Context) -> Path:
    """The output root of named runs: ``--output-root``, ``--workspace``'s, else the nearest
    workspace's (what the commands taking a run resolve a name against)."""
    from launcher.workspace import output_root

    given = ctx.params.get("output_root")
    if isinstance(given, str) and given:
        return output_root(given, Path.cwd())
    workspace = ctx.params.get("workspace")
    if isinstance(workspace, str) and workspace:
        return Path(workspace).expanduser().resolve() / ".osmosis" / "evals"
    return output_root(None, Path.cwd())


def run_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The names of the runs under the output root (:func:`_root`) that start with
    ``incomplete``; file names when none does, or when ``incomplete`` is a path."""
    if os.sep in incomplete or incomplete.startswith((".", "~")):
        return files(ctx, param, incomplete)
    from launcher.errors import CLIError
    from launcher.rundir.manifest import is_archive_name

    try:
        root = _root(ctx)
        names = sorted(
            entry.name
            for entry in root.iterdir()
            if entry.name.startswith(incomplete)
            and not entry.name.startswith(".")
            and not is_archive_name(entry.name)
            and (entry / "manifest.json").is_file()
        )
    except (CLIError, OSError):
        names = []
    return [CompletionItem(n) for n in names] or files(ctx, param, incomplete)
