"""Run names (docs/spec/supervisor.md §4.1): generated ``adjective-animal-number`` names and ``--name`` checks."""

from __future__ import annotations

import secrets
from pathlib import Path

from launcher.errors import LocalEvalError, ValidationError

__all__ = ["ADJECTIVES", "ANIMALS", "generate_run_name", "random_run_name", "validate_run_name"]

ADJECTIVES: tuple[str, ...] = tuple(
    [
        "brave",
        "calm",
        "daring",
        "eager",
        "fierce",
        "gentle",
        "happy",
        "keen",
        "lively",
        "mellow",
        "noble",
        "patient",
        "quick",
        "serene",
        "swift",
        "tender",
        "vivid",
        "warm",
        "zealous",
        "agile",
        "bold",
        "clever",
        "diligent",
        "elegant",
        "fluent",
        "graceful",
        "humble",
        "jolly",
        "kindly",
        "lucid",
        "mighty",
        "nimble",
        "polite",
        "radiant",
        "silent",
        "tranquil",
        "upbeat",
        "witty",
        "youthful",
        "zen",
    ]
)
ANIMALS: tuple[str, ...] = tuple(
    [
        "falcon",
        "tiger",
        "dolphin",
        "eagle",
        "panther",
        "wolf",
        "hawk",
        "lion",
        "bear",
        "fox",
        "owl",
        "raven",
        "shark",
        "whale",
        "cobra",
        "jaguar",
        "lynx",
        "otter",
        "puma",
        "seal",
        "badger",
        "crane",
        "dove",
        "finch",
        "gecko",
        "heron",
        "ibis",
        "koala",
        "lemur",
        "manta",
        "newt",
        "oriole",
        "parrot",
        "quail",
        "robin",
        "stork",
        "toucan",
        "viper",
        "wombat",
        "zebra",
    ]
)

_MAX_LEN = 96
_ATTEMPTS = 100


def validate_run_name(name: str) -> str:
    """Return ``name`` if it is a usable run directory name, else raise ValidationError (§4.1)."""
    if not name:
        raise ValidationError("run name must not be empty")
    if len(name) > _MAX_LEN:
        raise ValidationError(f"run name must be at most {_MAX_LEN} characters: {name!r}")
    if "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
        raise ValidationError(f"run name must be a single path segment: {name!r}")
    if name == ".locks":
        raise ValidationError("run name '.locks' is reserved")
    if name[0] in "-." or not all(ch.isalnum() or ch in "._-" for ch in name):
        raise ValidationError(
            "run name must start with a letter or digit and use only letters, digits, "
            f"'.', '_', or '-': {name!r}"
        )
    return name


def random_run_name() -> str:
    """One random ``adjective-animal-number`` name (number 0-99, unpadded)."""
    return f"{secrets.choice(ADJECTIVES)}-{secrets.choice(ANIMALS)}-{secrets.randbelow(100)}"


def generate_run_name(output_root: Path) -> str:
    """A generated name with no existing ``<output_root>/<name>`` (up to 100 tries).

    Two processes may still pick the same name at once; the run lock catches that.
    """
    for _ in range(_ATTEMPTS):
        name = random_run_name()
        if not (output_root / name).exists() and not (output_root / name).is_symlink():
            return validate_run_name(name)
    raise LocalEvalError("could not generate an unused local evaluation run name")
