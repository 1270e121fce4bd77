"""The UI a CLI command starts with: the mode its flags (or the group's) ask for, and a
redactor that already knows the environment's secret-looking values."""

from __future__ import annotations

import os

from launcher.redact import Redactor
from launcher.ui import UI, OutputMode

__all__ = ["ambient_redactor", "command_ui"]


def ambient_redactor() -> Redactor:
    """Redacts the secret-looking values of the environment, before any config is read."""
    redactor = Redactor()
    redactor.add_known_env(os.environ)
    return redactor


def command_ui(
    group_obj: object, json_flag: bool, plain_flag: bool, *, redactor: Redactor | None = None
) -> UI:
    """The UI of a subcommand, in the mode its own flags or the group's (``group_obj``, the
    click context's ``obj``) ask for; it is also left in ``group_obj["ui"]`` for the CLI's error
    path."""
    obj = group_obj if isinstance(group_obj, dict) else {}
    mode: OutputMode = (
        "json"
        if json_flag or obj.get("json")
        else "plain"
        if plain_flag or obj.get("plain")
        else "rich"
    )
    ui = UI(mode, redact=redactor if redactor is not None else ambient_redactor())
    if isinstance(group_obj, dict):
        group_obj["ui"] = ui
    return ui
