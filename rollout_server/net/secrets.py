"""Which values are secrets, and how each may be spelled in text: the one redaction policy.

Every redactor uses it: the launcher's (run logs, terminal, journal), the bridge's
:class:`~bridge.scrub.ErrorScrubber` (errors sent to rollouts, bridge log lines) and the Harbor
trial archive's scrubber (:mod:`rollout_server.harbor.archive`, on bytes, with its fail-closed
check). It is pure and uses only the standard library, so it stands on the floor where all
three can import it. (The harness that runs inside Harbor's own venv keeps its own copy: it
cannot import rollbridge.)

A secret in the environment is the value of a variable on :data:`KNOWN_SECRET_ENV_NAMES` or of
any variable whose name contains ``KEY``, ``TOKEN``, ``SECRET`` or ``PASSWORD``, when the value
is at least :data:`AMBIENT_MIN_LENGTH` characters long, unless the variable names a file
(:func:`names_a_file`: ``RAY_AUTH_TOKEN_PATH=/home/me/token``) or a place
(:func:`names_a_place`: ``OSMOSIS_TOKEN_PLATFORM_URL=https://platform.example``). A secret is redacted in every spelling
a program is likely to print it in: as is, whitespace-stripped, JSON-escaped (with or without
``\\/`` for ``/``) and Python-quoted (alone, or inside a larger single-quoted ``repr``), each
at any depth (JSON inside a repr inside JSON...), and URL-encoded.

:class:`SecretMatcher` is the mechanism both redactors use. Rather than listing spellings (there
are exponentially many once escapes nest), it matches each character of a secret in any of the
forms an escaper can give it: itself (after any number of backslashes, for the characters
escapers prefix), a backslash escape (``\\n``, ``\\x0a``, ``\\u000a``, ``\\U0001f600``, a
surrogate pair) behind one or more backslashes, or its UTF-8 bytes as ``%XX`` (``+`` for a
space). Backslashes may themselves be URL-encoded (``%5C``), hex digits in either case.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping

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


_FILE_NAME_SUFFIXES = ("_PATH", "_FILE", "_DIR")
_A_PATH = re.compile(r"(/|~|\.{1,2}/|[A-Za-z]:[\\/])")


def names_a_file(name: str, value: str) -> bool:
    """Whether ``name=value`` points at a file rather than holding a secret: a name ending in
    ``_PATH``, ``_FILE`` or ``_DIR`` (``RAY_AUTH_TOKEN_PATH``, ``AWS_WEB_IDENTITY_TOKEN_FILE``)
    whose value is a path. Its value is left readable: it is what a user must see to fix a
    wrong one. (The file's content is the secret; a value that is no path stays a secret.)"""
    return (
        name not in _KNOWN
        and name.endswith(_FILE_NAME_SUFFIXES)
        and _A_PATH.match(value) is not None
    )


_PLACE_NAME_SUFFIXES = ("_URL", "_URI")
# A URL with no credentials in it: no user information, query or fragment.
_A_BARE_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@?#]+(?:/[^\s@?#]*)?")


def names_a_place(name: str, value: str) -> bool:
    """Whether ``name=value`` is where something is rather than a secret: a name ending in
    ``_URL`` or ``_URI`` (``OSMOSIS_TOKEN_PLATFORM_URL``: the platform a token is bound to)
    whose value is a URL with no user information, query or fragment. Redacted, it hid every
    platform address from the user; a URL that may carry a credential stays a secret."""
    return (
        name not in _KNOWN
        and name.endswith(_PLACE_NAME_SUFFIXES)
        and _A_BARE_URL.fullmatch(value) is not None
    )


def secret_env_values(environ: Mapping[str, str]) -> list[str]:
    """The secret values in ``environ`` (see the module docstring), in name order."""
    return [
        environ[name]
        for name in sorted(environ)
        if is_secret_env_name(name)
        and len(environ[name]) >= AMBIENT_MIN_LENGTH
        and not names_a_file(name, environ[name])
        and not names_a_place(name, environ[name])
    ]


# The characters escapers put a backslash in front of while keeping the character itself.
_PREFIXED = frozenset("\"'\\/")
_SHORT_ESCAPES = {
    "\n": "n",
    "\t": "t",
    "\r": "r",
    "\b": "b",
    "\f": "f",
    "\v": "v",
    "\a": "a",
    "\0": "0",
}
# No escaper (JSON, repr, URL quoting) touches these: they stand for themselves in every spelling.
_NEVER_ESCAPED = frozenset(string.ascii_letters + string.digits + "_-")
# A value is looked for only where one of its runs of such characters occurs (a plain literal
# search, cheap on text holding no secret), when its longest run is at least this long.
_ANCHOR_MIN = 4
_ANCHOR_RUN = re.compile(r"[A-Za-z0-9_-]+")
# One or more backslashes, raw or URL-encoded: the depth of the escaping.
_BACKSLASHES = r"(?:\\|%5[cC])+"


def _hex(number: int, width: int) -> str:
    """A regex for ``number`` as ``width`` hex digits in either case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{number:0{width}x}")


def _char_forms(char: str) -> str:
    """A regex matching ``char`` in any spelling an escaper (at any depth) can give it."""
    if char in _NEVER_ESCAPED:
        return char
    forms = [re.escape(char)]
    code = ord(char)
    if char in _SHORT_ESCAPES:
        forms.append(_BACKSLASHES + _SHORT_ESCAPES[char])
    if code < 0x100:
        forms.append(_BACKSLASHES + "x" + _hex(code, 2))
    if code < 0x10000:
        forms.append(_BACKSLASHES + "u" + _hex(code, 4))
    else:
        high, low = divmod(code - 0x10000, 0x400)
        forms.append(_BACKSLASHES + "U" + _hex(code, 8))
        forms.append(
            _BACKSLASHES + "u" + _hex(0xD800 + high, 4) + _BACKSLASHES + "u" + _hex(0xDC00 + low, 4)
        )
    try:
        encoded = char.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate has no URL form
        encoded = b""
    if encoded:
        forms.append("".join("%" + _hex(byte, 2) for byte in encoded))
    if char == " ":
        forms.append(r"\+")
    pattern = forms[0] if len(forms) == 1 else "(?:" + "|".join(forms) + ")"
    # Escaping a prefixed character adds backslashes in front of whichever form it has
    # (``\\"``, and ``%5C%22`` once that is URL-encoded).
    return rf"(?:\\|%5[cC])*{pattern}" if char in _PREFIXED else pattern


def spelling_pattern(value: str) -> str:
    """A regex (source) matching ``value`` in every spelling of the module docstring."""
    return "".join(_char_forms(char) for char in value)


class SecretMatcher:
    """The known secrets, matched in every spelling by one compiled regex.

    Values are matched longest first, so a value containing another is replaced whole; the
    regex is rebuilt only when a value is added.
    """

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._regex: re.Pattern[str] | None = None
        self._anchors: re.Pattern[str] | None = None
        self._dirty = False

    def add(self, value: str | None, *, min_length: int = 1) -> None:
        """Know ``value`` and its whitespace-stripped form, each when at least ``min_length``
        long (so that a long padded value does not turn a short stripped form into a secret),
        and each line of a value of several lines.

        A blank value is ignored: it would turn every space into a mask.
        """
        if not value or not value.strip():
            return
        new = {v for v in (value, value.strip()) if len(v) >= min_length} - self._values
        if new:
            self._values |= new
            self._dirty = True
        if "\n" in value or "\r" in value:
            # A value of several lines (a PEM key, a pasted key broken in two) reaches a log a
            # line at a time: each line of it is a secret too (when not too short to be one).
            for line in re.split(r"[\r\n]+", value):
                self.add(line, min_length=max(min_length, AMBIENT_MIN_LENGTH))

    @property
    def values(self) -> frozenset[str]:
        """Every value currently matched."""
        return frozenset(self._values)

    def sub(self, replacement: str, text: str) -> str:
        """``text`` with every spelling of every known value replaced by ``replacement``."""
        if self._dirty:
            self._compile()
        if self._regex is None or not text:
            return text
        if self._anchors is not None and self._anchors.search(text) is None:
            return text
        return self._regex.sub(replacement, text)

    def found(self, text: str) -> bool:
        """Some spelling of some known value occurs in ``text``."""
        if self._dirty:
            self._compile()
        return self._regex is not None and self._regex.search(text) is not None

    def sub_bytes(self, replacement: bytes, data: bytes) -> bytes:
        """:meth:`sub` on bytes: ``data`` is read as UTF-8 (bytes that are not UTF-8 kept as
        they are), so a secret's UTF-8 bytes and its escaped spellings are all found."""
        text = data.decode("utf-8", "surrogateescape")
        clean = self.sub(replacement.decode("utf-8"), text)
        return data if clean is text else clean.encode("utf-8", "surrogateescape")

    def found_bytes(self, data: bytes) -> bool:
        """:meth:`found` on bytes read as :meth:`sub_bytes` reads them."""
        return self.found(data.decode("utf-8", "surrogateescape"))

    def _compile(self) -> None:
        ordered = sorted(self._values, key=lambda v: (-len(v), v))
        # Alternation is leftmost-first: longest first makes the longest value win.
        self._regex = re.compile("|".join(spelling_pattern(v) for v in ordered))
        anchors = [max(_ANCHOR_RUN.findall(v) or [""], key=len) for v in ordered]
        # One value without a usable anchor means every text must go through the full regex.
        usable = all(len(a) >= _ANCHOR_MIN for a in anchors)
        self._anchors = re.compile("|".join(map(re.escape, anchors))) if usable else None
        self._dirty = False
