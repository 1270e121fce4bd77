"""Checks of an eval TOML's tables, each refusal in one line naming the file: an optional table
(``[bridge]``, ``[ray]``) is a table with no key outside the known ones; an ``[env]`` entry
holds no secret."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.errors import ValidationError
from rollout_server.net.secrets import (
    AMBIENT_MIN_LENGTH,
    is_secret_env_name,
    names_a_file,
    names_a_place,
)

__all__ = ["check_env_entry", "optional_table"]


def optional_table(
    data: dict[str, Any], name: str, known: Sequence[str], path: Path
) -> dict[str, Any] | None:
    """``data[name]`` checked as a table of ``known`` keys; None when it is absent."""
    section = data.get(name)
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ValidationError(f"[{name}] must be a table in {path}")
    unknown = sorted(set(section) - set(known))
    if unknown:
        raise ValidationError(
            f"Unrecognized key(s) in [{name}] of {path}: {', '.join(unknown)} "
            f"(known: {', '.join(known)})"
        )
    return section


def check_env_entry(name: str, value: str, path: Path) -> None:
    """Refuse the ``[env]`` entry ``name = value`` when it is a secret by the secret policy's
    rule: ``[env]`` is recorded verbatim in manifest.json, ``[secrets]`` by name only.

    A secret name (``*KEY*``, ``*TOKEN*``, a known provider key...) is one unless it points at
    a file or a place (``*_PATH = "/..."``, ``*_URL = "https://..."``). A value shorter than
    any key (``TOKENIZERS_PARALLELISM = "false"``, ``MAX_TOKENS = "512"``) is none: the
    redactor leaves such values alone too.
    """
    if (
        is_secret_env_name(name)
        and len(value) >= AMBIENT_MIN_LENGTH
        and not names_a_file(name, value)
        and not names_a_place(name, value)
    ):
        raise ValidationError(
            f"{name} in [env] of {path} names a secret, and [env] values are recorded in "
            f"manifest.json: remove it from [env] and list {name} in [secrets].required"
        )
