"""One checked optional table of an eval TOML (``[bridge]``, ``[ray]``): present or not, a table,
and no key outside the known ones, each refusal in one line naming the file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.errors import ValidationError

__all__ = ["optional_table"]


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
