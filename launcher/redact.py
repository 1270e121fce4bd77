"""Secret redaction (docs/spec/supervisor.md §8.3, all CLI output included).

A :class:`Redactor` knows a set of secret values and replaces each occurrence of any of them
with ``[REDACTED]``, in every spelling the bridge's one policy knows (stripped, any letter
case, JSON-escaped and Python-quoted at any depth, URL-encoded, inside base64:
:class:`rollout_server.net.secrets.SecretMatcher`, the mechanism the bridge's own scrubber uses
too). The password of a URL's user information (``postgres://app:[REDACTED]@db``) is replaced
whatever it is, by the same policy. Which environment variables hold secrets is that policy's
as well (:func:`bridge.secret_env_values`). Values are matched longest first, so a value
containing another is redacted whole. Text read a line at a time (``logs.txt``) also goes
through :meth:`Redactor.redact_fragments`, for a secret (or its base64) a line break cut in two.

A rollout's own bridge bearer (:mod:`bridge.bearers`: ``rbk-`` and 43 characters, derived per
rollout, so no list holds them all) is found by its shape: as is, in any letter case, and inside
base64 (``Authorization: Basic`` of ``user:rbk-…``; either alphabet, padded or not, ``%2B``/``%2F``
for a URL), found by the base64 of its ``rbk-`` (or ``RBK-``) prefix at the three alignments
(:data:`bridge.scrub.ROLLOUT_BEARER_IN_BASE64`), the whole base64 run replaced. In text read a
line at a time, a line that ends in ``rbk-`` and at least :data:`BEARER_HEAD_MIN` of its
characters loses them (a bearer printed in two pieces); the rest of that bearer, at the start of
the next line, is replaced only when the two lines reach :meth:`Redactor.redact_fragments`
together: alone, a bearer's end is a run of letters, digits, ``-`` and ``_`` like any word.

Files a rollout wrote (its trajectory, diagnostics and artifacts, which the run directory keeps)
go through :meth:`Redactor.redact_bytes` or, for a JSON document, :meth:`Redactor.redact_json_bytes`:
one :meth:`Redactor.found` scan when no secret is there (the usual case, on the per-item path),
the bytes returned as they were.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from bridge import AMBIENT_MIN_LENGTH, KNOWN_SECRET_ENV_NAMES, REDACTED, secret_env_values
from bridge.bearers import PREFIX as ROLLOUT_BEARER_PREFIX
from bridge.scrub import ROLLOUT_BEARER_IN_BASE64
from rollout_server.net.secrets import SecretMatcher

__all__ = [
    "AMBIENT_MIN_LENGTH",
    "BEARER_HEAD_MIN",
    "KNOWN_SECRET_ENV_NAMES",
    "REDACTED",
    "Redactor",
    "json_bytes",
]

# Any case, as known values are: a program that upper-cases its output upper-cases the bearer.
_ROLLOUT_BEARER = re.compile("(?i:" + re.escape(ROLLOUT_BEARER_PREFIX) + ")" + r"[A-Za-z0-9_-]{43}")
_BEARER_PREFIX_UPPER = ROLLOUT_BEARER_PREFIX.upper()
_BEARER_LENGTH = 43
BEARER_HEAD_MIN = 4
"""The fewest characters of a bearer after its ``rbk-`` that make a line's end a bearer's
beginning (:meth:`Redactor.redact_fragments`): with its prefix, 8 characters, as many as the
shortest piece of a known value the rule replaces. ``rbk-`` with one to three more is what
text about the prefix looks like (``rbk-…``, ``rbk-id``), and such a piece holds at most 18 of
the bearer's 258 bits."""

# A bearer's beginning at a line's end (trailing whitespace ignored), any case, as the whole
# bearer is matched; up to one character short of the whole bearer (that one __call__ finds).
_BEARER_HEAD = re.compile(
    "(?i:"
    + re.escape(ROLLOUT_BEARER_PREFIX)
    + ")"
    + rf"([A-Za-z0-9_-]{{0,{_BEARER_LENGTH - 1}}})(?=\s*\Z)"
)
_BEARER_HEAD_SPAN = len(ROLLOUT_BEARER_PREFIX) + _BEARER_LENGTH
_BEARER_REST = re.compile(r"\s*([A-Za-z0-9_-]+)")
_LINE_BREAKS = re.compile(r"(\r\n?|\n)")


class Redactor:
    """Replace known secret values (and their variants) with ``[REDACTED]``.

    Call it on text (``redactor(text)``) or use :meth:`redact_obj` on JSON-like data.
    It is cheap to call with no values known (then only a URL's password is replaced).
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._matcher = SecretMatcher()
        for value in values:
            self.add(value)

    def add(self, value: str | None, *, min_length: int = 1) -> None:
        """Know ``value`` (a configured secret or the per-run bearer): any non-blank length.

        ``min_length`` drops variants shorter than it (used for ambient values, so that a
        long value padded with whitespace does not turn a short stripped form into a pattern).
        """
        self._matcher.add(value, min_length=min_length)

    def add_known_env(self, environ: Mapping[str, str]) -> None:
        """Know the secret values of ``environ`` (:func:`bridge.secret_env_values`)."""
        for value in secret_env_values(environ):
            self.add(value, min_length=AMBIENT_MIN_LENGTH)

    @property
    def patterns(self) -> frozenset[str]:
        """Every value currently redacted (as given, and whitespace-stripped)."""
        return self._matcher.values

    def __call__(self, text: str) -> str:
        """``text`` with every known value, in any spelling, replaced by ``[REDACTED]``, and
        every URL's password and every rollout's own bridge bearer (:mod:`bridge.bearers`:
        derived per rollout, so no list holds them all)."""
        text = self._matcher.sub(REDACTED, text)
        text = ROLLOUT_BEARER_IN_BASE64.sub(REDACTED, text)
        if ROLLOUT_BEARER_PREFIX in text or _BEARER_PREFIX_UPPER in text:
            text = _ROLLOUT_BEARER.sub(REDACTED, text)
        return text

    def found(self, text: str) -> bool:
        """Whether :meth:`__call__` would change ``text``: one scan, for text that usually
        holds no secret."""
        if self._matcher.found(text):
            return True
        if (
            ROLLOUT_BEARER_PREFIX in text or _BEARER_PREFIX_UPPER in text
        ) and _ROLLOUT_BEARER.search(text) is not None:
            return True
        return ROLLOUT_BEARER_IN_BASE64.found(text)

    def redact_bytes(self, data: bytes) -> bytes:
        """``data`` redacted as :meth:`__call__` redacts text, read as UTF-8 (bytes that are
        not UTF-8 kept as they are); ``data`` itself (the same object) when nothing is found."""
        text = data.decode("utf-8", "surrogateescape")
        if not self.found(text):
            return data
        return self(text).encode("utf-8", "surrogateescape")

    def redact_json_bytes(self, data: bytes, *, indent: int | None = 2) -> bytes:
        """:meth:`redact_bytes` of a JSON document's bytes, still a JSON document: where the
        replacement in the text would break it (a match that took a backslash of the text
        around it), the document's strings are redacted (:meth:`redact_obj`) and it is
        written again (``indent``; None: on one line, for a JSON Lines record). Bytes that
        were not JSON are redacted as text."""
        clean = self.redact_bytes(data)
        if clean is data:
            return data
        try:
            json.loads(clean)
            return clean
        except (ValueError, RecursionError):
            pass
        try:
            original = json.loads(data)
            document = self.redact_obj(original)
        except (ValueError, RecursionError):
            return clean
        if document == original:  # the match was no secret's: an escape's letter began it
            return data
        return json_bytes(document, indent=indent)

    def redact_fragments(self, text: str) -> str:
        """``text`` with a piece of a known value (8+ characters) at the start or the end of
        each of its lines replaced by ``[REDACTED]``: the part of a secret a line break cut
        off (:meth:`~rollout_server.net.secrets.SecretMatcher.sub_fragments` has the rule and
        its limits). For text written a line at a time; the whole values need ``self(text)``.

        And a bearer's beginning that ends a line (``rbk-`` and :data:`BEARER_HEAD_MIN` or more
        of its characters); when the next line of ``text`` starts with the rest of it (the run
        that makes 43 characters), that rest too, and then a shorter beginning as well."""
        # One line (the usual case): only its last 47 characters can hold a bearer's beginning.
        edge = text if "\n" in text or "\r" in text else text.rstrip()[-_BEARER_HEAD_SPAN:]
        if ROLLOUT_BEARER_PREFIX in edge or _BEARER_PREFIX_UPPER in edge:
            text = _bearer_pieces(text)
        return self._matcher.sub_fragments(REDACTED, text)

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


def _bearer_pieces(text: str) -> str:
    """:meth:`Redactor.redact_fragments`'s rule for a bearer cut by a line break."""
    parts = _LINE_BREAKS.split(text)  # lines at even indexes, their breaks between
    for index in range(0, len(parts), 2):
        head = _BEARER_HEAD.search(parts[index])
        if head is None:
            continue
        after = index + 2
        rest = _BEARER_REST.match(parts[after]) if after < len(parts) else None
        if rest is not None and len(head[1]) + len(rest[1]) == _BEARER_LENGTH:
            parts[after] = parts[after][: rest.start(1)] + REDACTED + parts[after][rest.end(1) :]
        elif len(head[1]) < BEARER_HEAD_MIN:
            continue
        line = parts[index]
        parts[index] = line[: head.start()] + REDACTED + line[head.end() :]
    return "".join(parts)


def json_bytes(document: Any, *, indent: int | None) -> bytes:
    """``document`` as JSON bytes: UTF-8, or ``\\u`` escapes when it holds a lone surrogate
    (JSON's ``"\\ud800"``, which UTF-8 cannot carry)."""
    try:
        return json.dumps(document, indent=indent, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(document, indent=indent).encode("ascii")
