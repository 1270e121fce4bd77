"""The ``rollbridge`` command line: ``rollbridge eval run CONFIG`` and ``rollbridge bridge serve``.

Every error a user can cause ends as one redacted ``Error: ...`` line (or a JSON error envelope
with ``--json``) and exit code 1, never a traceback. A usage error (an unknown option, a bad
option value, a missing argument) is click's: the usage line, a hint and the ``Error:`` line,
exit code 2, as click and the reference CLI do. A group called without a command prints its
help and exits 0. ``ROLLBRIDGE_DEBUG=1`` adds the (redacted) traceback of unexpected errors on
stderr.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from bridge.cli import bridge as bridge_group
from launcher.cli_ui import ambient_redactor
from launcher.errors import CLIError
from launcher.export import eval_export
from launcher.init import eval_init
from launcher.reporting.cli import eval_diff, eval_report
from launcher.rubric.cli import eval_rubric
from launcher.runs import eval_clean, eval_list
from launcher.signals import EXIT_INTERRUPTED
from launcher.ui import CLI_VERSION, UI, OutputMode

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "cli", "main"]

#: Exit code of a usage error (click's own convention).
EXIT_USAGE = 2


def _mode(json_flag: bool, plain_flag: bool) -> OutputMode:
    if json_flag:
        return "json"
    if plain_flag:
        return "plain"
    return "rich"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    CLI_VERSION, "--version", prog_name="rollbridge", message="%(prog)s %(version)s"
)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON result envelope.")
@click.option("--plain", is_flag=True, help="Plain text output: result and next steps only.")
@click.pass_context
def cli(ctx: click.Context, json_output: bool, plain: bool) -> None:
    """rollbridge: run evaluations of LLM agent rollouts on your own machine."""
    ctx.ensure_object(dict)
    ctx.obj["json"] = json_output
    ctx.obj["plain"] = plain


@cli.group("eval")
def eval_group() -> None:
    """Local evaluations."""


@eval_group.command("run")
@click.argument("config", type=str)
@click.option("--name", default=None, help="Run name; re-using a name resumes its pending work.")
@click.option(
    "-o", "--output", default=None, help="Output root (default <workspace>/.osmosis/evals)."
)
@click.option("--dataset-file", default=None, help="A local dataset file (jsonl, csv or parquet).")
@click.option("--secrets-file", default=None, help="Dotenv file for [secrets] names ('-' = stdin).")
@click.option("--rows", default=None, help="Source rows to run, for example '3,7,10-20'.")
@click.option(
    "--limit", type=int, default=None, help="Run only the first N rows (overrides limit)."
)
@click.option("--fresh", is_flag=True, help="Archive the existing results under this name first.")
@click.option("--retry-failed", is_flag=True, help="Also re-run failed and skipped items.")
@click.option("--max-in-flight", type=int, default=None, help="Concurrent rollouts.")
@click.option("-y", "--yes", is_flag=True, help="Skip confirmations.")
@click.option("--tunnel", default=None, help="Force a managed tunnel (only 'cloudflared').")
@click.option(
    "--cloudflared",
    "--cloudflared-path",
    "cloudflared",
    default=None,
    help="Path of the cloudflared binary to use (default: PATH, then pycloudflared's cache).",
)
@click.option(
    "--download-cloudflared",
    is_flag=True,
    help="Allow a one-time download of cloudflared through pycloudflared when none is found.",
)
@click.option("--rollout-port", type=int, default=None, help="Fixed rollout-server port.")
@click.option("--listener-port", type=int, default=None, help="Fixed model-bridge port.")
@click.option("--advertise-url", default=None, help="Public base URL reaching the bridge listener.")
@click.option("--verbose", is_flag=True, help="Stream every logs.txt line to the terminal.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON result envelope.")
@click.option("--plain", is_flag=True, help="Plain text output: result and next steps only.")
@click.pass_context
def eval_run(ctx: click.Context, /, config: str, **flags: object) -> None:
    """Evaluate the rollout of CONFIG (a TOML file under configs/eval/) on its dataset."""
    from launcher.supervisor import EvalOptions, run_eval

    obj = ctx.obj or {}
    mode = _mode(
        bool(flags.pop("json_output")) or obj.get("json", False),
        bool(flags.pop("plain")) or obj.get("plain", False),
    )
    options = EvalOptions(config=config, **flags)  # type: ignore[arg-type]
    ui = UI(mode, verbose=options.verbose, redact=ambient_redactor())
    ctx.obj["ui"] = ui
    ctx.exit(run_eval(options, ui))


eval_group.add_command(eval_report)
eval_group.add_command(eval_diff)
eval_group.add_command(eval_rubric, "rubric")
eval_group.add_command(eval_list)
eval_group.add_command(eval_clean)
eval_group.add_command(eval_export)
cli.add_command(eval_init)
cli.add_command(bridge_group, "bridge")


def _register_daemon() -> None:
    # launcher.daemon.command and launcher.ctl import only click at the top: help stays fast.
    from launcher.ctl import ctl
    from launcher.daemon.command import daemon_command

    cli.add_command(daemon_command, "daemon")
    cli.add_command(ctl, "ctl")


_register_daemon()


def _fallback_ui(argv: list[str]) -> UI:
    mode: OutputMode = "json" if "--json" in argv else "plain" if "--plain" in argv else "rich"
    return UI(mode, redact=ambient_redactor())


def main(argv: list[str] | None = None) -> None:
    """Console entry point (``rollbridge``)."""
    obj: dict[str, object] = {}
    args = sys.argv[1:] if argv is None else argv
    try:
        code = cli.main(args=args, prog_name="rollbridge", standalone_mode=False, obj=obj)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as exc:
        # `rollbridge` (or `rollbridge eval`) alone asks for help: it is not an error.
        click.echo(exc.ctx.get_help())
        sys.exit(0)
    except click.UsageError as exc:
        ui = obj.get("ui") or _fallback_ui(args)
        assert isinstance(ui, UI)
        if ui.mode != "json" and exc.ctx is not None:
            hint = f"Try '{exc.ctx.command_path} --help' for help."
            sys.stderr.write(ui.redact(f"{exc.ctx.get_usage()}\n{hint}\n\n"))
        ui.error(exc.format_message(), code="VALIDATION")
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        ui = obj.get("ui") or _fallback_ui(args)
        assert isinstance(ui, UI)
        ui.error(exc.format_message())
        sys.exit(1)
    except CLIError as exc:
        ui = obj.get("ui") or _fallback_ui(args)
        assert isinstance(ui, UI)
        ui.error(exc.message, code=exc.code, details=exc.details)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # the last line of defence: never a raw traceback
        ui = obj.get("ui") or _fallback_ui(args)
        assert isinstance(ui, UI)
        if os.environ.get("ROLLBRIDGE_DEBUG"):
            ui.err_console.print(ui.redact("".join(traceback.format_exception(exc))), markup=False)
        ui.error(f"{type(exc).__name__}: {exc}", code="INTERNAL")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
