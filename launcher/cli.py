"""The ``rollbridge`` command line: ``rollbridge eval run CONFIG`` and ``rollbridge bridge serve``.

Every error a user can cause ends as one redacted ``Error: ...`` line (or a JSON error envelope
with ``--json``) and exit code 1, never a traceback. A usage error (an unknown option, a bad
option value, a missing argument) is click's: the usage line, a hint and the ``Error:`` line,
exit code 2, as click and the reference CLI do. A group called without a command prints its
help and exits 0. ``ROLLBRIDGE_DEBUG=1`` adds the (redacted) traceback of unexpected errors on
stderr.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from launcher import completion as complete
from launcher.errors import EXIT_INTERRUPTED, CLIError
from launcher.run_flags import shard_and_ray_options

if TYPE_CHECKING:
    from launcher.ui import UI, OutputMode

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "cli", "main"]

#: Exit code of a usage error (click's own convention).
EXIT_USAGE = 2


class _LazyGroup(click.Group):
    """A group whose subcommands from other modules are imported only when one is used.

    ``lazy`` maps a name to ``("module:attribute", help)``, where ``help`` is the command's
    docstring up to its first blank line: ``--help`` lists the group from it, so that printing
    help imports click and nothing else (``tests/launcher/test_cli_lazy.py`` checks that the
    listing matches the commands' own)."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, _, attribute = self.lazy[cmd_name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = [
            name
            for name in self.list_commands(ctx)
            if name not in self.commands or not self.commands[name].hidden
        ]
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        rows = [
            (
                name,
                self.commands[name].get_short_help_str(limit)
                if name in self.commands
                else click.Command(name, help=self.lazy[name][1]).get_short_help_str(limit),
            )
            for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from rollout_server.protocol import sdk_version

    click.echo(f"rollbridge {sdk_version()}")
    ctx.exit()


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    lazy={
        "bridge": ("bridge.cli:bridge", "Run the model bridge on its own."),
        "ctl": (
            "launcher.ctl:ctl",
            "Drive the workspace daemon: start, list, watch, cancel and inspect runs.",
        ),
        "daemon": (
            "launcher.daemon.command:daemon_command",
            "Serve the workspace's control API (docs/daemon.md) until SIGINT or SIGTERM.",
        ),
        "init": (
            "launcher.init:eval_init",
            "Create a workspace in DIRECTORY that `rollbridge eval run` can run at once.",
        ),
    },
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON result envelope.")
@click.option("--plain", is_flag=True, help="Plain text output: result and next steps only.")
@click.pass_context
def cli(ctx: click.Context, json_output: bool, plain: bool) -> None:
    """rollbridge: run evaluations of LLM agent rollouts on your own machine."""
    if json_output and plain:
        # Checked here too, so that a command with no output flags of its own refuses the pair.
        from launcher.cli_ui import CONFLICTING_MODES

        raise click.UsageError(CONFLICTING_MODES)
    ctx.ensure_object(dict)
    ctx.obj["json"] = json_output
    ctx.obj["plain"] = plain


@cli.group(
    "eval",
    cls=_LazyGroup,
    lazy={
        "clean": (
            "launcher.runs:eval_clean",
            "Remove runs with nothing recorded (and lock files without a run), after confirmation.",
        ),
        "diff": (
            "launcher.reporting.cli:eval_diff",
            "Compare RUN_B against RUN_A item by item (same dataset and rows required).",
        ),
        "export": (
            "launcher.export:eval_export",
            "Export RUN (a run name or directory): one row per rollout with its chat messages.",
        ),
        "merge": (
            "launcher.merge:eval_merge",
            "Merge the run directories of `eval run --shard i/N` into one run directory (-o).",
        ),
        "list": (
            "launcher.runs:eval_list",
            "List the local runs: name, status, done/total, pass rate, model, started, path.",
        ),
        "report": (
            "launcher.reporting.cli:eval_report",
            "Write one self-contained HTML page for RUN (a run name or a run directory).",
        ),
        "rubric": (
            "launcher.rubric.cli:eval_rubric",
            "Score conversations (-d) or a run's rollouts (--run) with an LLM judge.",
        ),
        "upload": (
            "launcher.upload.command:eval_upload",
            "Publish a finished local run (RUN: a run name or a run directory) to the platform.",
        ),
    },
)
def eval_group() -> None:
    """Local evaluations."""


@eval_group.command("run")
@click.argument("config", type=str, shell_complete=complete.files)
@click.option("--name", default=None, help="Run name; re-using a name resumes its pending work.")
@click.option(
    "-o",
    "--output",
    default=None,
    shell_complete=complete.dirs,
    help="Output root (default <workspace>/.osmosis/evals).",
)
@click.option(
    "--dataset-file",
    default=None,
    shell_complete=complete.files,
    help="A local dataset file (jsonl, csv or parquet).",
)
@click.option(
    "--secrets-file",
    default=None,
    shell_complete=complete.files,
    help="Dotenv file: [secrets] names and provider keys for the bridge ('-' = stdin).",
)
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
    shell_complete=complete.files,
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
@click.option("--upload", is_flag=True, help="Publish the run to the platform once it is complete.")
@click.option("--workspace", default=None, help="Platform workspace for --upload (default: git's).")
@shard_and_ray_options
@click.option("--json", "json_output", is_flag=True, help="Print one JSON result envelope.")
@click.option("--plain", is_flag=True, help="Plain text output: result and next steps only.")
@click.pass_context
def eval_run(ctx: click.Context, /, config: str, **flags: object) -> None:
    """Evaluate the rollout of CONFIG (a TOML file under configs/eval/) on its dataset."""
    from bridge.spare import BridgeSpare
    from launcher.fdbudget import raise_descriptor_limit

    raise_descriptor_limit()  # before any child process: each inherits it (launcher.fdbudget)
    # First: the bridge's process imports its web stack while this one prepares the run
    # (bridge.spare; the run's bridge takes it, and it is stopped here if none did).
    spare = BridgeSpare.ahead()
    try:
        code = _eval_run(ctx, config, flags)
    finally:
        if spare is not None:
            spare.discard()
    ctx.exit(code)


def _eval_run(ctx: click.Context, config: str, flags: dict[str, object]) -> int:
    from launcher.cli_ui import ambient_redactor, output_mode
    from launcher.supervisor import EvalOptions, run_eval
    from launcher.ui import UI

    mode = output_mode(ctx.obj, bool(flags.pop("json_output")), bool(flags.pop("plain")))
    upload, workspace = bool(flags.pop("upload")), flags.pop("workspace")
    if workspace is not None and not upload:
        raise click.UsageError("--workspace names the platform workspace of --upload")
    options = EvalOptions(config=config, **flags)  # type: ignore[arg-type]
    if upload:  # launcher.upload: resolve the login first, publish after a complete run
        from launcher.upload.command import upload_step

        name = None if workspace is None else str(workspace)
        uploading, after_run = upload_step(mode, options, name)
        ctx.obj["ui"] = uploading
        return run_eval(options, uploading, after_run)
    ui = UI(mode, verbose=options.verbose, redact=ambient_redactor())
    ctx.obj["ui"] = ui
    return run_eval(options, ui)


def _ui(obj: dict[str, object], argv: list[str]) -> UI:
    """The UI the command left in ``obj``, else one for the output flags in ``argv``."""
    from launcher.cli_ui import ambient_redactor
    from launcher.ui import UI

    ui = obj.get("ui")
    if isinstance(ui, UI):
        return ui
    # Both flags are a usage error of their own: no mode was chosen, so it is told as click's.
    json_mode = "--json" in argv and "--plain" not in argv
    mode: OutputMode = "json" if json_mode else "plain" if "--plain" in argv else "rich"
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
        ui = _ui(obj, args)
        if ui.mode != "json" and exc.ctx is not None:
            hint = f"Try '{exc.ctx.command_path} --help' for help."
            sys.stderr.write(ui.redact(f"{exc.ctx.get_usage()}\n{hint}\n\n"))
        ui.error(exc.format_message(), code="VALIDATION")
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        ui = _ui(obj, args)
        ui.error(exc.format_message())
        sys.exit(1)
    except CLIError as exc:
        ui = _ui(obj, args)
        ui.error(exc.message, code=exc.code, details=exc.details)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # the last line of defence: never a raw traceback
        ui = _ui(obj, args)
        if os.environ.get("ROLLBRIDGE_DEBUG"):
            import traceback

            ui.err_console.print(ui.redact("".join(traceback.format_exception(exc))), markup=False)
        ui.error(f"{type(exc).__name__}: {exc}", code="INTERNAL")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
