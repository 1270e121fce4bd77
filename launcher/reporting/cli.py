"""The click commands ``rollbridge eval report`` and ``rollbridge eval diff``.

Registered on the ``eval`` group by ``launcher/cli.py``. The work is imported lazily inside
each command so ``rollbridge --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import click

from launcher import completion as complete
from launcher.cli_ui import command_ui

__all__ = ["eval_diff", "eval_report"]


_workspace = click.option(
    "-w",
    "--workspace",
    default=None,
    shell_complete=complete.dirs,
    help="Workspace whose .osmosis/evals holds named runs.",
)
_output_root = click.option(
    "--output-root",
    default=None,
    shell_complete=complete.dirs,
    help="Output root of named runs (the -o given to eval run).",
)
_json = click.option("--json", "json_output", is_flag=True, help="Print one JSON envelope.")
_plain = click.option("--plain", is_flag=True, help="Plain text output.")


@click.command("report")
@click.argument("run", type=str, shell_complete=complete.run_names)
@click.option(
    "-o",
    "--output",
    default=None,
    shell_complete=complete.files,
    help="HTML file (default <run dir>/report.html).",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@click.option("--watch", is_flag=True, help="Rewrite the page until the run finishes.")
@_workspace
@_output_root
@_json
@_plain
@click.pass_context
def eval_report(
    ctx: click.Context,
    /,
    run: str,
    output: str | None,
    open_browser: bool,
    watch: bool,
    workspace: str | None,
    output_root: str | None,
    json_output: bool,
    plain: bool,
) -> None:
    """Write one self-contained HTML page for RUN (a run name or a run directory)."""
    from launcher.reporting.commands import RunLocator, report_command

    ui = command_ui(ctx.obj, json_output, plain)
    locator = RunLocator(cwd=Path.cwd(), workspace=workspace, output_root=output_root)
    ctx.exit(
        report_command(ui, locator, run, output=output, open_browser=open_browser, watch=watch)
    )


@click.command("diff")
@click.argument("run_a", type=str, shell_complete=complete.run_names)
@click.argument("run_b", type=str, shell_complete=complete.run_names)
@click.option(
    "-o",
    "--output",
    default=None,
    shell_complete=complete.files,
    help="HTML file (default ./diff-<A>-vs-<B>.html).",
)
@_workspace
@_output_root
@_json
@_plain
@click.pass_context
def eval_diff(
    ctx: click.Context,
    /,
    run_a: str,
    run_b: str,
    output: str | None,
    workspace: str | None,
    output_root: str | None,
    json_output: bool,
    plain: bool,
) -> None:
    """Compare RUN_B against RUN_A item by item (same dataset and rows required)."""
    from launcher.reporting.commands import RunLocator, diff_command

    ui = command_ui(ctx.obj, json_output, plain)
    locator = RunLocator(cwd=Path.cwd(), workspace=workspace, output_root=output_root)
    ctx.exit(diff_command(ui, locator, run_a, run_b, output=output))
