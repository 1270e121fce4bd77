"""The UI a CLI command starts with: the mode its flags (or the group's) ask for, and a
redactor that already knows the environment's secret-looking values."""

from __future__ import annotations

import os

import click

from launcher.redact import Redactor
from launcher.ui import UI, OutputMode

__all__ = ["CONFLICTING_MODES", "ambient_redactor", "command_ui", "output_mode"]

#: The usage error of ``--json`` with ``--plain``. The reference refuses the pair too, in these
#: words; a usage error here (exit 2) rather than its exit 1, as for any other flag misuse.
CONFLICTING_MODES = (
    "Conflicting output format selectors: json, plain. Choose at most one of --json or --plain."
)


def ambient_redactor() -> Redactor:
    """Redacts the secret-looking values of the environment, before any config is read."""
    redactor = Redactor()
    redactor.add_known_env(os.environ)
    return redactor


def output_mode(group_obj: object, json_flag: bool, plain_flag: bool) -> OutputMode:
    """The mode a subcommand's own ``--json``/``--plain`` and the group's (``group_obj``) ask for.

    Both asked for, in any places (``rollbridge --json eval list --plain``), is a usage error:
    neither wins silently."""
    obj = group_obj if isinstance(group_obj, dict) else {}
    json_mode = json_flag or bool(obj.get("json"))
    plain_mode = plain_flag or bool(obj.get("plain"))
    if json_mode and plain_mode:
        raise click.UsageError(CONFLICTING_MODES)
    return "json" if json_mode else "plain" if plain_mode else "rich"


def command_ui(
    group_obj: object, json_flag: bool, plain_flag: bool, *, redactor: Redactor | None = None
) -> UI:
    """The UI of a subcommand, in the mode its own flags or the group's (``group_obj``, the
    click context's ``obj``) ask for; it is also left in ``group_obj["ui"]`` for the CLI's error
    path."""
    ui = UI(
        output_mode(group_obj, json_flag, plain_flag),
        redact=redactor if redactor is not None else ambient_redactor(),
    )
    if isinstance(group_obj, dict):
        group_obj["ui"] = ui
    return ui
