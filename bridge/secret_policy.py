"""Which values are secrets, and how each may be spelled in text: the one redaction policy.

Both redactors use it: the launcher's (run logs, terminal, journal) and the bridge's
:class:`~bridge.scrub.ErrorScrubber` (errors sent to rollouts, bridge log lines). It is pure
and uses only the standard library.

A secret in the environment is the value of a variable on :data:`KNOWN_SECRET_ENV_NAMES` or of
any variable whose name contains ``KEY``, ``TOKEN``, ``SECRET`` or ``PASSWORD``, when the value
is at least :data:`AMBIENT_MIN_LENGTH` characters long. A secret is redacted in every spelling
a program is likely to print it in: as is, whitespace-stripped, JSON-escaped (with or without
``\\/`` for ``/``) and Python-quoted (alone, or inside a larger single-quoted ``repr``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

REDACTED = "[REDACTED]"
"""What a known secret value is replaced with."""

# Provider and platform variables that always hold secrets (docs/spec/supervisor.md §8.3).
# GOOGLE_APPLICATION_CREDENTIALS is left out on purpose: its value is a file path, and
# redacting paths would hide useful errors.
KNOWN_SECRET_ENV_NAMES: tuple[str, ...] = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "XAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OPENROUTER_API_KEY",
    "CEREBRAS_API_KEY",
    "AZURE_API_KEY",
    "TOGETHER_API_KEY",
    "FIREWORKS_API_KEY",
    "GROQ_API_KEY",
    "MISTRAL_API_KEY",
    "COHERE_API_KEY",
    "DEEPSEEK_API_KEY",
    "HUGGINGFACE_API_KEY",
    "HF_TOKEN",
    "WANDB_API_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "OSMOSIS_TOKEN",
    "OSMOSIS_API_KEY",
    "DAYTONA_API_KEY",
    "CURSOR_API_KEY",
    "MSWEA_API_KEY",
)

SECRET_NAME_PARTS: tuple[str, ...] = ("KEY", "TOKEN", "SECRET", "PASSWORD")
"""A variable whose (case-sensitive) name contains one of these holds a secret."""

AMBIENT_MIN_LENGTH = 8
"""Shorter environment values are not treated as secrets: redacting them would mangle text."""

_KNOWN = frozenset(KNOWN_SECRET_ENV_NAMES)


def is_secret_env_name(name: str) -> bool:
    """True when an environment variable called ``name`` holds a secret."""
    return name in _KNOWN or any(part in name for part in SECRET_NAME_PARTS)


def secret_env_values(environ: Mapping[str, str]) -> list[str]:
    """The secret values in ``environ`` (see the module docstring), in name order."""
    return [
        environ[name]
        for name in sorted(environ)
        if is_secret_env_name(name) and len(environ[name]) >= AMBIENT_MIN_LENGTH
    ]


def _python_quoted(text: str) -> set[str]:
    # A lone string containing ' (and no ") is shown in double quotes with ' as is; inside a
    # larger string that also contains ", Python quotes with ' and escapes it as \'.
    return {repr(text)[1:-1], repr(text + '"')[1:-2]}


def value_variants(value: str, *, min_length: int = 1) -> set[str]:
    """The spellings of ``value`` that get redacted (see the module docstring).

    A blank value has none (it would turn every space into a mask). Spellings shorter than
    ``min_length`` are dropped, so that a long value padded with whitespace does not turn a
    short stripped form into a pattern.
    """
    if not value.strip():
        return set()
    out: set[str] = set()
    for base in {value, value.strip()}:
        for plain in (
            base,
            json.dumps(base)[1:-1],
            json.dumps(base, ensure_ascii=False)[1:-1],
        ):
            # JSON allows "/" to be written as "\/", and some encoders (PHP's, by default) do.
            for spelling in {plain, plain.replace("/", "\\/")}:
                out.add(spelling)
                out |= _python_quoted(spelling)
    return {v for v in out if len(v) >= min_length}


def literal_pattern(spellings: Iterable[str]) -> re.Pattern[str] | None:
    """One regex matching any of ``spellings`` literally, longest first; None when empty."""
    ordered = sorted({s for s in spellings if s}, key=lambda s: (-len(s), s))
    # Alternation is leftmost-first, so longest-first ordering makes the longest spelling win
    # at any position where several match (a value containing another is masked whole).
    return re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None
