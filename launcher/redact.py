"""Secret redaction (docs/spec/supervisor.md §8.3, all CLI output included).

A :class:`Redactor` knows a set of secret values and replaces each occurrence of any of them,
in every spelling :func:`bridge.value_variants` lists (stripped, JSON-escaped, Python-quoted),
with ``[REDACTED]``. Which environment variables hold secrets is the bridge's one policy
(:func:`bridge.secret_env_values`), shared with the bridge's own scrubber. Matching is plain
substring matching, longest first, so a value containing another is redacted whole. One
compiled regex serves all values; it is rebuilt only when the set of values changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from bridge import (
    AMBIENT_MIN_LENGTH,
    KNOWN_SECRET_ENV_NAMES,
    REDACTED,
    literal_pattern,
    secret_env_values,
    value_variants,
)

__all__ = ["AMBIENT_MIN_LENGTH", "KNOWN_SECRET_ENV_NAMES", "REDACTED", "Redactor", "value_variants"]


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
        if not value:
            return
        # A whitespace-only value has no variants: it would turn every space into [REDACTED].
        new = value_variants(value, min_length=min_length) - self._patterns
        if new:
            self._patterns |= new
            self._dirty = True

    def add_known_env(self, environ: Mapping[str, str]) -> None:
        """Know the secret values of ``environ`` (:func:`bridge.secret_env_values`)."""
        for value in secret_env_values(environ):
            self.add(value, min_length=AMBIENT_MIN_LENGTH)

    @property
    def patterns(self) -> frozenset[str]:
        """Every string currently redacted (values and their variants)."""
        return frozenset(self._patterns)

    def _compiled(self) -> re.Pattern[str] | None:
        if self._dirty:
            self._regex = literal_pattern(self._patterns)
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
