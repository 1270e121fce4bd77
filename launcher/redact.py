"""Secret redaction (runner.md §8.3 and the seed's CLI-wide rule).

A :class:`Redactor` knows a set of secret values and replaces each occurrence of any of them,
and of their whitespace-stripped, JSON-escaped and Python-quoted spellings, with
``[REDACTED]``. Matching is plain substring matching, longest first, so a value containing
another is redacted whole. One compiled regex serves all values; it is rebuilt only when the
set of values changes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["AMBIENT_MIN_LENGTH", "KNOWN_SECRET_ENV_NAMES", "REDACTED", "Redactor", "value_variants"]

REDACTED = "[REDACTED]"

# Provider and platform variables whose values are redacted when they are at least
# AMBIENT_MIN_LENGTH characters long (runner.md §8.3). GOOGLE_APPLICATION_CREDENTIALS is left
# out on purpose: its value is a file path, and redacting paths would hide useful errors.
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
AMBIENT_MIN_LENGTH = 8


def value_variants(value: str) -> set[str]:
    """The spellings of ``value`` that get redacted: as is, stripped, JSON-escaped, repr-quoted.

    Empty strings are dropped. Variants are built for both the raw and the stripped value.
    """
    out: set[str] = set()
    for base in {value, value.strip()}:
        if not base:
            continue
        out.add(base)
        out.add(json.dumps(base)[1:-1])
        out.add(json.dumps(base, ensure_ascii=False)[1:-1])
        out.add(repr(base)[1:-1])
    out.discard("")
    return out


class Redactor:
    """Replace known secret values (and their variants) with ``[REDACTED]``.

    Call it on text (``redactor(text)``) or use :meth:`redact_obj` on JSON-like data.
    It is cheap to call with no values known (the text is returned unchanged).
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._patterns: set[str] = set()
        self._regex: re.Pattern[str] | None = None
        self._dirty = False
        for value in values:
            self.add(value)

    def add(self, value: str | None, *, min_length: int = 1) -> None:
        """Know ``value`` (a configured secret or the per-run bearer): any non-blank length.

        ``min_length`` drops variants shorter than it (used for ambient values, so that a
        long value padded with whitespace does not turn a short stripped form into a pattern).
        """
        if not value or not value.strip():
            # A whitespace-only "secret" would turn every space in the output into [REDACTED].
            return
        for variant in value_variants(value):
            if len(variant) >= min_length and variant not in self._patterns:
                self._patterns.add(variant)
                self._dirty = True

    def add_known_env(self, environ: Mapping[str, str]) -> None:
        """Know the values of the provider/platform variables of §8.3 that are 8+ characters."""
        for name in KNOWN_SECRET_ENV_NAMES:
            value = environ.get(name)
            if value and len(value) >= AMBIENT_MIN_LENGTH:
                self.add(value, min_length=AMBIENT_MIN_LENGTH)

    @property
    def patterns(self) -> frozenset[str]:
        """Every string currently redacted (values and their variants)."""
        return frozenset(self._patterns)

    def _compiled(self) -> re.Pattern[str] | None:
        if self._dirty:
            ordered = sorted(self._patterns, key=lambda p: (-len(p), p))
            # Alternation is leftmost-first, so longest-first ordering makes the longest value
            # win at any position where several match.
            self._regex = re.compile("|".join(re.escape(p) for p in ordered)) if ordered else None
            self._dirty = False
        return self._regex

    def __call__(self, text: str) -> str:
        """``text`` with every known value replaced by ``[REDACTED]``."""
        regex = self._compiled()
        if regex is None or not text:
            return text
        return regex.sub(REDACTED, text)

    def redact_obj(self, obj: Any) -> Any:
        """A copy of JSON-like ``obj`` with every string (keys included) redacted."""
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, Mapping):
            return {
                (self(k) if isinstance(k, str) else k): self.redact_obj(v) for k, v in obj.items()
            }
        if isinstance(obj, list | tuple):
            return [self.redact_obj(v) for v in obj]
        return obj
