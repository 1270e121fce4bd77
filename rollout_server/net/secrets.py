"""Which values are secrets, and how each may be spelled in text: the one redaction policy.

Every redactor uses it: the launcher's (run logs, terminal, journal), the bridge's
:class:`~bridge.scrub.ErrorScrubber` (errors sent to rollouts, bridge log lines) and the Harbor
trial archive's scrubber (:mod:`rollout_server.harbor.archive`, on bytes, with its fail-closed
check). It is pure and uses only the standard library, so it stands on the floor where all
three can import it. (The harness that runs inside Harbor's own venv keeps its own copy: it
cannot import rollbridge.) docs/spec/supervisor.md §8.3 is the rule this module implements.

A secret in the environment is the value of a variable on :data:`KNOWN_SECRET_ENV_NAMES`, of
any variable whose name contains one of :data:`SECRET_NAME_PARTS` (``KEY``, ``TOKEN``,
``SECRET``, ``PASSWORD``, ``PASSWD``, ``PASSPHRASE``) or ends in one of
:data:`SECRET_NAME_ENDINGS` (``_PAT``, ``_PWD``, ``_AUTH``, ``_COOKIE``, ``_CREDENTIALS``), when
the value is at least :data:`AMBIENT_MIN_LENGTH` characters long, unless the variable names a
file (:func:`names_a_file`: ``RAY_AUTH_TOKEN_PATH=/home/me/token``,
``GOOGLE_APPLICATION_CREDENTIALS=/keys/sa.json``) or a place (:func:`names_a_place`:
``OSMOSIS_TOKEN_PLATFORM_URL=https://platform.example``). Names are matched case-sensitively.

A secret is redacted in every spelling a program is likely to print it in: as is,
whitespace-stripped, in any letter case (``KEY.upper()``, ``.lower()``), JSON-escaped (with or
without ``\\/`` for ``/``) and Python-quoted (alone, or inside a larger single-quoted ``repr``),
each at any depth (JSON inside a repr inside JSON...), URL-encoded, and base64-encoded inside a
larger base64 text (an HTTP Basic ``Authorization`` header of ``user:key``). And the password of
a URL's user information is redacted whatever it is (below).

:class:`SecretMatcher` is the mechanism every redactor uses. Rather than listing spellings (there
are exponentially many once escapes nest), it matches each character of a secret in any of the
forms an escaper can give it: itself in either case (after any number of backslashes, for the
characters escapers prefix), a backslash escape (``\\n``, ``\\x0a``, ``\\u000a``,
``\\U0001f600``, a surrogate pair) behind one or more backslashes, or its UTF-8 bytes as ``%XX``
(``+`` for a space). Backslashes may themselves be URL-encoded (``%5C``), hex digits and escape
letters in either case.

Base64 has no per-character form: a secret's encoding depends on where it starts in the
encoded bytes. For each of the three byte alignments, the whole 3-byte groups of the secret
encode to a *core* that is the same whatever surrounds the secret (:func:`base64_cores`, in the
standard and the URL-safe alphabet). A core of at least :data:`BASE64_CORE_MIN` characters
(12 bytes, 96 bits of the secret: unrelated base64 does not hold it by chance) is looked for
literally, case-sensitively, with its ``+`` and ``/`` also as ``%2B`` and ``%2F`` (base64 in
a URL's query), and the whole base64 run that holds it (padding, ``%3D`` included) is
replaced. Not found: base64 of an escaped spelling, and a secret at an alignment that leaves
fewer than 12 whole bytes (one under 12 bytes; one of 12 or 13 bytes at some alignments).
Base64 broken across lines (PEM's 64 columns, MIME's 76) is not found by :meth:`SecretMatcher.sub`;
in text read a line at a time, the fragment rule below finds it.

A secret cut in two by a line break (a provider's echo wrapped at a column, a rollout that
prints a key in two ``print`` calls) matches none of these on either line. For text read a line
at a time (``logs.txt``), :meth:`SecretMatcher.sub_fragments` replaces, on each line, the
longest piece of a secret of at least :data:`FRAGMENT_MIN` characters that ends the line (the
beginning of a secret), the one that starts it (the end of a secret), or the whole line when it
is a piece of one (the middle of a secret wrapped over three lines), whitespace around the line
ignored, in any letter case. Such a piece is part of a secret whatever follows it, so the rule
needs no memory of the previous line and holds nothing back. A piece of a base64 core counts too
(a secret's base64 wrapped at 64 or 76 columns), and with it goes the rest of its base64 run on
that line, as :meth:`SecretMatcher.sub` replaces a whole run. Its limits: a piece shorter than
:data:`FRAGMENT_MIN` characters survives (a secret cut 5 + rest leaves 5 characters; a base64
line of fewer than 8 characters of a core, and the base64 characters around a core that hold
its first or last one or two bytes when a line break separates them from it), only the literal
spelling is looked at (not a JSON- or URL-escaped piece), and a line ending in the first
:data:`FRAGMENT_MIN` characters of a secret (or of its base64) loses them even when they were
something else (a shared key prefix such as ``sk-proj-``).

A URL's user information (``postgres://app:hunter2@db:5432/x``, ``redis://:pw@host``) is a
credential whether or not its password is a known secret: :meth:`SecretMatcher.sub` replaces
the password (``postgres://app:[REDACTED]@db:5432/x``), keeping the scheme, the user and the
host readable, even when no secret is known. As RFC 3986 reads it: after ``scheme://``, the
user runs to its first ``:`` and the password from there to the authority's last ``@`` (the
host follows the last one); ``/``, ``?``, ``#``, whitespace and the characters no URL holds
unencoded (``"``, ``<``, ``[``, ``{``, a backslash...) end the authority. So ``user@host`` (no
password), ``http://host:8080/path`` (a port), an email, ``git@github.com:org/repo`` and
``a:b@c`` (no ``scheme://``) are left alone. Not found: a URL whose ``://`` is itself escaped
(``:\\/\\/``, ``%3A%2F%2F``), and a password holding an unencoded ``/``, ``?`` or ``#`` (left
whole: a URL parser too ends the authority there).

Why one module of this size: the name rule, the spellings and the matcher are one policy that
every redactor (the launcher's, the bridge's and its child's, the archive's) and every check of
a variable's name (``[env]``, the daemon's secrets, the rollout's environment) must apply
alike; split, they would be imported piecewise and drift. Each part is a short section below.
"""

from __future__ import annotations

import base64
import re
import string
from collections.abc import Mapping

REDACTED = "[REDACTED]"
"""What a known secret value is replaced with."""

# Provider and platform variables that always hold secrets (docs/spec/supervisor.md §8.3).
# GOOGLE_APPLICATION_CREDENTIALS is left out on purpose: its value is a file path, and
# redacting paths would hide useful errors (its name ends in _CREDENTIALS, so a value that is no
# path, the credentials themselves, is still a secret: names_a_file).
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

SECRET_NAME_PARTS: tuple[str, ...] = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
)
"""A variable whose (case-sensitive) name contains one of these holds a secret."""

SECRET_NAME_ENDINGS: tuple[str, ...] = ("_PAT", "_PWD", "_AUTH", "_COOKIE", "_CREDENTIALS")
"""A variable whose (case-sensitive) name ends in one of these holds a secret: ``GITHUB_PAT``,
``MYSQL_PWD``, ``NPM_CONFIG__AUTH``, ``HTTP_COOKIE``, ``GOOGLE_CREDENTIALS``. Only as an ending:
anywhere in a name these words mean something else (``PATH``, ``AUTHOR``, ``COOKIE_DOMAIN``),
and the shell's own ``PWD`` and ``OLDPWD`` (a directory) have no ``_`` before ``PWD``."""

AMBIENT_MIN_LENGTH = 8
"""Shorter environment values are not treated as secrets: redacting them would mangle text."""

_KNOWN = frozenset(KNOWN_SECRET_ENV_NAMES)


def is_secret_env_name(name: str) -> bool:
    """True when an environment variable called ``name`` holds a secret."""
    return (
        name in _KNOWN
        or any(part in name for part in SECRET_NAME_PARTS)
        or name.endswith(SECRET_NAME_ENDINGS)
    )


# A credentials variable may hold the credentials (JSON, for Terraform's GOOGLE_CREDENTIALS) or
# their file's path (GOOGLE_APPLICATION_CREDENTIALS); a *_PWD one a password or a directory.
_FILE_NAME_SUFFIXES = ("_PATH", "_FILE", "_DIR", "_CREDENTIALS", "_PWD")
_A_PATH = re.compile(r"(/|~|\.{1,2}/|[A-Za-z]:[\\/])")


def names_a_file(name: str, value: str) -> bool:
    """Whether ``name=value`` points at a file or directory rather than holding a secret: a
    name ending in ``_PATH``, ``_FILE``, ``_DIR``, ``_CREDENTIALS`` or ``_PWD``
    (``RAY_AUTH_TOKEN_PATH``, ``AWS_WEB_IDENTITY_TOKEN_FILE``,
    ``GOOGLE_APPLICATION_CREDENTIALS``) whose value is a path. Its value is left readable: it is
    what a user must see to fix a wrong one. (The file's content is the secret; a value that is
    no path stays a secret.)"""
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
        # [uU]: the matcher reads text lower-cased, where a \U escape reads \u.
        forms.append(_BACKSLASHES + "[uU]" + _hex(code, 8))
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


def _any_case_forms(char: str) -> str:
    """:func:`_char_forms` of ``char`` and of its other-case letter, for a letter an escaper
    writes as ``\\u00e9``: the matcher reads text lower-cased, but the escape of ``É``
    (``\\u00c9``) stays another escape."""
    if char in _NEVER_ESCAPED:
        return _char_forms(char)
    variants = dict.fromkeys(v for v in (char, char.lower(), char.upper()) if len(v) == 1)
    if len(variants) == 1:
        return _char_forms(char)
    return "(?:" + "|".join(_char_forms(v) for v in variants) + ")"


def spelling_pattern(value: str) -> str:
    """A regex (source) matching ``value`` in every escaped spelling of the module docstring;
    of ``value.lower()``, it matches every letter case in lower-cased text."""
    return "".join(_any_case_forms(char) for char in value)


BASE64_CORE_MIN = 16
"""A secret's base64 core (the module docstring) is looked for only when at least this long."""

FRAGMENT_MIN = 8
"""The shortest piece of a secret at a line's edge that :meth:`SecretMatcher.sub_fragments`
replaces (the length below which a known environment value is no secret either)."""

# Both alphabets: a core without + / - _ is the same in either, so the run that holds a core
# is read as either (a URL path around a URL-safe run goes with it: more hidden, nothing shown).
# And % for a run in a URL (%2B, %2F, %3D): one class keeps the scan of a run fast.
_B64_CLASS = "[A-Za-z0-9+/_%-]"
_B64_CHARS = frozenset(string.ascii_letters + string.digits + "+/_%-")
_CORE_CHAR_FORMS = {"+": r"(?:\+|%2[bB])", "/": r"(?:/|%2[fF])"}
_TO_URLSAFE = str.maketrans("+/", "-_")
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
_LINE_BREAKS = re.compile(r"(\r\n?|\n)")

# What ends a URL's authority (/ ? #), with whitespace and what no URL holds unencoded: so the
# text around a URL (JSON, a sentence) is never read as its user information.
_NOT_IN_AUTHORITY = r"\s/?#\[\]\"<>\\^`{}|"
# The literal "://" first, for a fast search; the password runs to the authority's last "@"
# (greedy, then back to it), the user to its first ":" (an email as user name keeps its "@").
_URL_PASSWORD = re.compile(
    rf"(://(?<=[A-Za-z0-9+.-]://)[^{_NOT_IN_AUTHORITY}:]*:)[^{_NOT_IN_AUTHORITY}]+(?=@)"
)


def base64_cores(value: str) -> frozenset[str]:
    """The parts of ``value``'s base64 encoding that are the same wherever it starts in the
    encoded bytes: for each of the three alignments, the encoding of its whole 3-byte groups
    (a group's four characters depend on its three bytes alone), in the standard and the
    URL-safe alphabet, when at least :data:`BASE64_CORE_MIN` characters long."""
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no program base64-encodes one
        return frozenset()
    cores: set[str] = set()
    for skip in range(3):
        groups = data[skip:]
        groups = groups[: len(groups) // 3 * 3]
        if len(groups) // 3 * 4 >= BASE64_CORE_MIN:
            core = base64.b64encode(groups).decode("ascii")
            cores.update((core, core.translate(_TO_URLSAFE)))
    return frozenset(cores)


def _core_pattern(core: str) -> str:
    """A regex for ``core`` as is, or in a URL (its ``+`` and ``/`` percent-encoded)."""
    return "".join(_CORE_CHAR_FORMS.get(char, char) for char in core)


def _run_end(text: str, start: int) -> int:
    """Where the base64 run of ``text`` from ``start`` ends, its padding included."""
    end = start
    while end < len(text) and text[end] in _B64_CHARS:
        end += 1
    while end < len(text) and text[end] == "=":
        end += 1
    return end


def _run_start(text: str, end: int) -> int:
    """Where the base64 run of ``text`` that reaches ``end`` starts."""
    start = end
    while start and text[start - 1] in _B64_CHARS:
        start -= 1
    return start


def _end_at_start(low: str, pieces: tuple[str, ...]) -> int:
    """The length of the longest end of one of ``pieces`` (>= FRAGMENT_MIN) ``low`` starts with."""
    gram = low[:FRAGMENT_MIN]
    best = 0
    for piece in pieces:
        at = piece.find(gram)
        while at != -1 and len(piece) - at > best:
            if low.startswith(piece[at:]):
                best = len(piece) - at
                break
            at = piece.find(gram, at + 1)
    return best


def _start_at_end(low: str, pieces: tuple[str, ...]) -> int:
    """The length of the longest beginning of one of ``pieces`` (>= FRAGMENT_MIN) ``low`` ends
    with."""
    gram = low[-FRAGMENT_MIN:]
    best = 0
    for piece in pieces:
        at = piece.rfind(gram)
        while at != -1 and at + FRAGMENT_MIN > best:
            if low.endswith(piece[: at + FRAGMENT_MIN]):
                best = at + FRAGMENT_MIN
                break
            at = piece.rfind(gram, 0, at + FRAGMENT_MIN - 1)
    return best


def _anchor(text: str, run: re.Pattern[str]) -> str:
    """The longest run of ``run`` in ``text`` (empty when none)."""
    runs: list[str] = run.findall(text)
    return max(runs or [""], key=len)


def _holds_any(text: str, anchors: tuple[str, ...] | None) -> bool:
    """Whether ``text`` contains one of ``anchors`` (always, when there are none to look for).
    A loop of ``in`` beats one regex of alternatives here: each ``in`` is a fast C search, an
    alternation is tried at every character that starts one of them."""
    if anchors is None:
        return True
    for anchor in anchors:  # noqa: SIM110 -- any() over a generator costs twice as much
        if anchor in text:
            return True
    return False


class SecretMatcher:
    """The known secrets, matched in every spelling by one compiled regex (and their base64
    cores by another).

    Values are matched longest first, so a value containing another is replaced whole; the
    regexes are rebuilt only when a value is added. Letter case is ignored by matching the
    lower-cased values in the lower-cased text, with a case-sensitive regex: one compiled
    with :data:`re.IGNORECASE` took three times as long (it loses the literal-prefix search).
    """

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._regex: re.Pattern[str] | None = None
        self._any_case: re.Pattern[str] | None = None
        self._anchors: tuple[str, ...] | None = None
        self._base64: re.Pattern[str] | None = None
        self._base64_anchors: tuple[str, ...] | None = None
        self._pieces: tuple[str, ...] = ()
        self._core_pieces: tuple[str, ...] = ()
        self._grams: frozenset[str] = frozenset()
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
        """``text`` with every spelling of every known value replaced by ``replacement`` (a
        base64 run holding one replaced whole), and then every URL's password (the module
        docstring); ``text`` itself when none occurs."""
        if self._dirty:
            self._compile()
        if not text:
            return text
        if self._base64 is not None and _holds_any(text, self._base64_anchors):
            text = self._base64.sub(lambda _: replacement, text)  # taken literally
        if self._regex is not None:
            low = text.lower()
            if self._anchors is None or _holds_any(low, self._anchors):
                text = self._sub_values(replacement, text, low)
        # After the values: a known value that is a whole URL is replaced whole. The "@" first:
        # one character is looked for much faster than three (memchr).
        if "@" in text and "://" in text:
            text = _URL_PASSWORD.sub(lambda match: match[1] + replacement, text)
        return text

    def sub_fragments(self, replacement: str, text: str) -> str:
        """``text`` with, on each of its lines, a piece of a known value of at least
        :data:`FRAGMENT_MIN` characters replaced where a line break may have cut the value:
        the longest that ends the line (a value's beginning), the longest that starts it (a
        value's end), or the whole line when it is a piece of one (the module docstring has
        the rule and its limits). For text read a line at a time; apply :meth:`sub` too.

        In text of several lines, the values are first replaced whole (:meth:`sub`): a value
        that spans a break (a PEM key) would no longer match once its lines' edges are cut."""
        if self._dirty:
            self._compile()
        if not self._grams or len(text) < FRAGMENT_MIN:
            return text
        if "\n" not in text and "\r" not in text:
            return self._line_fragments(replacement, text)
        text = self.sub(replacement, text)
        parts = _LINE_BREAKS.split(text)  # lines at even indexes, their breaks between
        parts[::2] = [self._line_fragments(replacement, line) for line in parts[::2]]
        return "".join(parts)

    def found(self, text: str) -> bool:
        """Some spelling of some known value, or a URL's password, occurs in ``text``: something
        :meth:`sub` would replace."""
        if self._dirty:
            self._compile()
        if "@" in text and "://" in text and _URL_PASSWORD.search(text) is not None:
            return True
        if (
            self._base64 is not None
            and _holds_any(text, self._base64_anchors)
            and self._base64.search(text) is not None
        ):
            return True
        if self._regex is None:
            return False
        low = text.lower()
        if self._anchors is not None and not _holds_any(low, self._anchors):
            return False
        if len(low) != len(text):
            return self._ignoring_case().search(text) is not None
        return self._regex.search(low) is not None

    def sub_bytes(self, replacement: bytes, data: bytes) -> bytes:
        """:meth:`sub` on bytes: ``data`` is read as UTF-8 (bytes that are not UTF-8 kept as
        they are), so a secret's UTF-8 bytes and its escaped spellings are all found."""
        text = data.decode("utf-8", "surrogateescape")
        clean = self.sub(replacement.decode("utf-8"), text)
        return data if clean is text else clean.encode("utf-8", "surrogateescape")

    def found_bytes(self, data: bytes) -> bool:
        """:meth:`found` on bytes read as :meth:`sub_bytes` reads them."""
        return self.found(data.decode("utf-8", "surrogateescape"))

    def _sub_values(self, replacement: str, text: str, low: str) -> str:
        """:meth:`sub` of the known values' spellings (not base64) in ``text``, read as
        ``low`` (``text`` lower-cased)."""
        assert self._regex is not None
        if len(low) != len(text):  # lower() lengthened a letter (İ): positions would shift
            return self._ignoring_case().sub(lambda _: replacement, text)
        pieces: list[str] = []
        last = 0
        for match in self._regex.finditer(low):
            pieces += (text[last : match.start()], replacement)
            last = match.end()
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _ignoring_case(self) -> re.Pattern[str]:
        """The regex matching any case in text as it is, for the rare text whose lower-cased
        form has another length (compiled when first needed)."""
        assert self._regex is not None
        if self._any_case is None:
            self._any_case = re.compile(self._regex.pattern, re.IGNORECASE)
        return self._any_case

    def _line_fragments(self, replacement: str, line: str) -> str:
        lead = len(line) - len(line.lstrip())
        end = len(line.rstrip())
        if end - lead < FRAGMENT_MIN:
            return line
        # A piece of a value of FRAGMENT_MIN characters or more begins (and ends) with one of
        # the value's FRAGMENT_MIN-grams: one set lookup at each edge clears almost every line.
        starts = line[lead : lead + FRAGMENT_MIN].lower() in self._grams
        ends = line[end - FRAGMENT_MIN : end].lower() in self._grams
        if not (starts or ends):
            return line
        body = line[lead:end]
        low = body.lower()
        if len(low) != len(body):  # lower() lengthened a letter (İ): positions would shift
            low = body
        if starts and ends and any(low in piece for piece in self._pieces + self._core_pieces):
            head, tail = len(body), 0
        else:
            head = tail = 0
            if starts:
                head = _end_at_start(low, self._pieces)
                core = _end_at_start(low, self._core_pieces)
                if core:  # with the rest of its base64 run: the value's last bytes, padding
                    head = max(head, _run_end(body, core))
            if ends:
                tail = _start_at_end(low, self._pieces)
                core = _start_at_end(low, self._core_pieces)
                if core:  # with the start of its base64 run: the value's first bytes
                    tail = max(tail, len(body) - _run_start(body, len(body) - core))
        if not head and not tail:
            return line
        if head + tail >= len(body):
            return line[:lead] + replacement + line[end:]
        kept = body[head : len(body) - tail]
        return (
            line[:lead]
            + (replacement if head else "")
            + kept
            + (replacement if tail else "")
            + line[end:]
        )

    def _compile(self) -> None:
        ordered = sorted(self._values, key=lambda v: (-len(v), v))
        # Alternation is leftmost-first: longest first makes the longest value win.
        lowered = dict.fromkeys(v.lower() for v in ordered)
        self._regex = re.compile("|".join(map(spelling_pattern, lowered)))
        self._any_case = None
        anchors = [_anchor(v, _ANCHOR_RUN).lower() for v in ordered]
        # One value without a usable anchor means every text must go through the full regex.
        usable = all(len(a) >= _ANCHOR_MIN for a in anchors)
        self._anchors = tuple(dict.fromkeys(anchors)) if usable else None
        cores = sorted(set().union(*map(base64_cores, ordered)), key=lambda c: (-len(c), c))
        if cores:
            # A run starts only where no base64 character precedes it, so each run is scanned
            # once (linear); within it, the lazy prefix tries the cores at each offset.
            self._base64 = re.compile(
                rf"(?<!{_B64_CLASS}){_B64_CLASS}*?(?:{'|'.join(map(_core_pattern, cores))})"
                rf"{_B64_CLASS}*=*"
            )
            hints = [_anchor(core, _ALNUM_RUN) for core in cores]
            usable = all(len(h) >= _ANCHOR_MIN for h in hints)
            self._base64_anchors = tuple(dict.fromkeys(hints)) if usable else None
        else:
            self._base64 = None
            self._base64_anchors = None
        pieces = (v.lower() for v in ordered if "\n" not in v and "\r" not in v)
        self._pieces = tuple(dict.fromkeys(p for p in pieces if len(p) >= FRAGMENT_MIN))
        # Lower-cased as the lines are read: looser than base64's case, but still 8 characters.
        self._core_pieces = tuple(dict.fromkeys(core.lower() for core in cores))
        self._grams = frozenset(
            piece[i : i + FRAGMENT_MIN]
            for piece in self._pieces + self._core_pieces
            for i in range(len(piece) - FRAGMENT_MIN + 1)
        )
        self._dirty = False
