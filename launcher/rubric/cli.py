"""The click definition of ``rollbridge eval rubric`` (the work is in :mod:`launcher.rubric.command`,
imported only when the command runs). The one check made here is the score range of ``--run``:
a usage error, before the run is even looked up."""

from __future__ import annotations

import click

from launcher import completion as complete

__all__ = ["eval_rubric"]


@click.command("rubric")
@click.option(
    "-d",
    "--data",
    default=None,
    shell_complete=complete.files,
    help="JSONL file of conversations to score.",
)
@click.option(
    "--run",
    "run",
    default=None,
    shell_complete=complete.run_names,
    help="A run name (under .osmosis/evals/) or run directory whose rollouts to score.",
)
@click.option("-r", "--rubric", required=True, help="Rubric text, or @path to read it from a file.")
@click.option("--model", default=None, help="Judge model, for example openai/gpt-4o-mini.")
@click.option("--judges", default=None, help="Several judge models, comma-separated.")
@click.option("-n", "--number", type=int, default=1, help="Judge runs per record.")
@click.option(
    "-o",
    "--output",
    default=None,
    shell_complete=complete.files,
    help="Write the JSON report here.",
)
@click.option("--api-key", default=None, help="Deprecated: set the provider's variable instead.")
@click.option("--timeout", type=float, default=None, help="Seconds per judge request.")
@click.option("--score-min", type=float, default=0.0, help="Lowest score (default 0.0).")
@click.option("--score-max", type=float, default=1.0, help="Highest score (default 1.0).")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON result envelope.")
@click.option("--plain", is_flag=True, help="Plain text output: result only.")
@click.pass_context
def eval_rubric(ctx: click.Context, /, json_output: bool, plain: bool, **flags: object) -> None:
    """Score conversations (-d) or a run's rollouts (--run) with an LLM judge."""
    low, high = flags["score_min"], flags["score_max"]
    assert isinstance(low, float) and isinstance(high, float)
    if flags["run"] is not None and not high > low:
        # With -d every record fails with the range error, as in the reference tool (spec
        # D.1); a run's verdict files are no place for errors that no judge gave.
        raise click.UsageError(f"--score-max ({high}) must be greater than --score-min ({low})")
    from launcher.cli_ui import ambient_redactor, command_ui
    from launcher.rubric.command import RubricOptions, run_rubric

    redactor = ambient_redactor()
    ui = command_ui(ctx.obj, json_output, plain, redactor=redactor)
    options = RubricOptions(**flags)  # type: ignore[arg-type]
    ctx.exit(run_rubric(options, ui, redactor))
