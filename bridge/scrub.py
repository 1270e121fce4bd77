"""Scrubbing secrets out of text that leaves the bridge (docs/spec/bridge.md §12).

And finding a rollout's bearer inside base64 (:data:`ROLLOUT_BEARER_IN_BASE64`), for this
scrubber and the launcher's redactor (:mod:`launcher.redact`) alike.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import os
import re
from collections.abc import Callable, Iterable

from bridge.bearers import PREFIX as ROLLOUT_BEARER_PREFIX
from bridge.errors import MAX_ERROR_MESSAGE
from rollout_server.net.secrets import (
    AMBIENT_MIN_LENGTH,
    REDACTED,
    SecretMatcher,
    secret_env_values,
)

_PATTERN_MASK = "REDACTED"

# Shapes of credentials worth scrubbing even when we do not know their value: provider keys,
# authorization headers, credentials in URL query strings or URL userinfo, key/value dumps.
# A key's prefix in any case, as known values are matched (rollout_server.net.secrets): output
# that was upper-cased holds SK-… and RBK-…; "Basic" and "Bearer" stay as written, as ordinary
# words in another case ("basic settings") would be masked.
_PATTERNS = re.compile(
    "|".join(
        [
            r"(?i:\bsk-)[A-Za-z0-9_\-]{16,}",
            r"(?i:\brbk-)[A-Za-z0-9_\-]{43}",  # a rollout's own bridge bearer (bridge.bearers)
            r"\bBearer\s+[A-Za-z0-9\-._~+/]{8,}=*",
            r"\bBasic\s+[A-Za-z0-9+/]{8,}={0,2}",
            r"(?<=[?&])(?:key|api[_-]?key|access_token|token|sig|signature|password|secret)=[^\s&'\"]+",
            r"(?i:\b(?:x-)?api[_-]?key)['\"]?\s*[:=]\s*['\"]?[^\s,'\"})\]{}>]{4,}",
            r"\bAIza[0-9A-Za-z_\-]{30,}",
            r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
            r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*",
            r"(?<=://)[^\s/'\":@]{1,256}:[^\s/'\"@]{1,256}(?=@)",
        ]
    )
)
_WHITESPACE = re.compile(r"\s+")

# A base64 run: both alphabets, + and / also percent-encoded, its padding.
_B64_RUN = re.compile(r"(?:[A-Za-z0-9+/_-]|%2[BbFf])+(?:=|%3[Dd])*")
_PERCENT_B64 = re.compile(r"%2[BbFf]|%3[Dd]")
_FROM_PERCENT = {"%2b": "+", "%2f": "/", "%3d": "="}
_FROM_URLSAFE = str.maketrans("-_", "+/")
_PERCENT_FORMS = {"+": ("+", "%2B", "%2b"), "/": ("/", "%2F", "%2f")}
# An anchor shorter than this would be in unrelated base64 by chance too often.
_B64_ANCHOR_MIN = 4
_TO_URLSAFE = str.maketrans("+/", "-_")


def _percent_forms(anchor: str) -> list[str]:
    """``anchor`` with each ``+`` and ``/`` as itself or percent-encoded (either hex case)."""
    forms = [_PERCENT_FORMS.get(char, (char,)) for char in anchor]
    return ["".join(chars) for chars in itertools.product(*forms)]


def _holds_any(text: str, needles: tuple[str, ...]) -> bool:
    """Whether ``text`` contains one of ``needles`` (a loop of fast C searches)."""
    for needle in needles:  # noqa: SIM110 -- any() over a generator costs twice as much
        if needle in text:
            return True
    return False


# Letters by how often English text has them, the most frequent first.
_LETTER_FREQUENCY = "etaoinshrdlcumwfgypbvkjxqz"


def _key_letters(anchors: tuple[str, ...]) -> dict[str, list[str]]:
    """``anchors`` under few of their letters (a greedy cover): upper case first, then the
    letter most of them share, then the rarest in English text."""

    def score(letter: str, left: list[str]) -> tuple[bool, int, int]:
        shared = sum(letter in anchor for anchor in left)
        return letter.isupper(), shared, _LETTER_FREQUENCY.find(letter.lower())

    keyed: dict[str, list[str]] = {}
    left = list(anchors)
    while left:
        letters = {char for anchor in left for char in anchor if char.isalpha()}
        if not letters:  # an anchor of digits and symbols only: keyed by itself
            keyed.setdefault("", []).extend(left)
            break
        key = max(sorted(letters), key=lambda letter: score(letter, left))
        keyed[key] = [anchor for anchor in left if key in anchor]
        left = [anchor for anchor in left if key not in anchor]
    return keyed


class Base64Shape:
    """Base64 runs that decode to text holding a credential known by its shape, not its value
    (a rollout's bearer: :data:`ROLLOUT_BEARER_IN_BASE64`), so that no known value's base64
    core (:func:`rollout_server.net.secrets.base64_cores`) can find it.

    For each of the three byte alignments, the base64 characters that a prefix's bytes alone
    decide are the same whatever surrounds it (``rbk-`` gives ``cmJrL``, ``Jiay`` and
    ``yYmst``); in either alphabet, ``+`` and ``/`` also as ``%2B`` and ``%2F``, they are looked
    for literally. Only a base64 run holding one is decoded (from the group boundary that the
    anchor fixes), and the whole run is replaced when the decoded bytes hold ``shape``. Each of
    ``prefixes`` is the shape's start in one letter case: the shape may ignore case, its base64
    cannot, so a caller lists the cases a program prints.
    """

    def __init__(self, prefixes: Iterable[str], shape: re.Pattern[bytes]) -> None:
        # Each anchor (standard alphabet), with its offset in its 4-character group.
        self._offsets: dict[str, int] = {}
        for prefix in prefixes:
            data = prefix.encode("utf-8")
            for skip in range(3):
                encoded = base64.b64encode(bytes(skip) + data + bytes(2)).decode("ascii")
                first, last = -(-8 * skip // 6), 8 * (skip + len(data)) // 6
                if last - first >= _B64_ANCHOR_MIN:
                    self._offsets[encoded[first:last]] = first % 4
        # Each anchor's spellings, under one of its letters that every spelling keeps: text
        # without that letter (one memchr) is not searched for them. The letters are chosen
        # few, and rare in ordinary text (upper case first): J, Y and Q for rbk- and RBK-.
        self._keyed: list[tuple[str, tuple[str, ...]]] = []
        for key, anchors in _key_letters(tuple(self._offsets)).items():
            spellings: dict[str, None] = {}
            for anchor in anchors:
                spellings.update(dict.fromkeys(_percent_forms(anchor)))
                spellings[anchor.translate(_TO_URLSAFE)] = None
            self._keyed.append((key, tuple(spellings)))
        self._shape = shape

    def sub(self, replacement: str, text: str) -> str:
        """``text`` with every base64 run that holds the shape replaced whole by
        ``replacement``; ``text`` itself when there is none."""
        for key, spellings in self._keyed:  # _anchored, inline: this is the common path
            if key in text and _holds_any(text, spellings):
                break
        else:
            return text
        found = False

        def replace(run: re.Match[str]) -> str:
            nonlocal found
            if self._holds_shape(run[0]):
                found = True
                return replacement
            return run[0]

        clean = _B64_RUN.sub(replace, text)
        return clean if found else text

    def found(self, text: str) -> bool:
        """Whether :meth:`sub` would replace something in ``text``."""
        return self._anchored(text) and any(
            self._holds_shape(run[0]) for run in _B64_RUN.finditer(text)
        )

    def _anchored(self, text: str) -> bool:
        """Whether ``text`` holds a spelling of an anchor."""
        for key, spellings in self._keyed:  # noqa: SIM110 -- as _holds_any
            if key in text and _holds_any(text, spellings):
                return True
        return False

    def _holds_shape(self, run: str) -> bool:
        if not self._anchored(run):
            return False
        if "%" in run:
            run = _PERCENT_B64.sub(lambda m: _FROM_PERCENT[m[0].lower()], run)
        body = run.rstrip("=").translate(_FROM_URLSAFE)
        phases = set()
        for anchor, offset in self._offsets.items():
            at = body.find(anchor)
            while at != -1:
                phases.add((at - offset) % 4)
                at = body.find(anchor, at + 1)
        for phase in phases:
            groups = body[phase:]
            if len(groups) % 4 == 1:  # a lone character is no byte
                groups = groups[:-1]
            try:
                data = base64.b64decode(groups + "=" * (-len(groups) % 4))
            except (binascii.Error, ValueError):
                continue
            if self._shape.search(data) is not None:
                return True
        return False


ROLLOUT_BEARER_IN_BASE64 = Base64Shape(
    (ROLLOUT_BEARER_PREFIX, ROLLOUT_BEARER_PREFIX.upper()),
    re.compile(rb"(?i:" + re.escape(ROLLOUT_BEARER_PREFIX.encode()) + rb")[A-Za-z0-9_\-]{43}"),
)
"""A rollout's own bearer (:mod:`bridge.bearers`) inside base64 (``user:rbk-…`` in a Basic
header, or anywhere else), as issued or upper-cased (``.lower()`` keeps the prefix as issued):
the base64 of its prefix in those two cases is what base64 of it can hold."""


class ErrorScrubber:
    """Removes known secret values and credential-shaped text from error messages and log lines.

    Known values (``secrets``: the run's bearer token, the provider key) and the secret values
    of the environment as it is when the scrubber is made (:mod:`rollout_server.net.secrets`) become
    ``[REDACTED]`` in every spelling the policy knows (:class:`~rollout_server.net.secrets.SecretMatcher`,
    the launcher's mechanism too); only then is credential-shaped text
    masked as ``REDACTED`` (a rollout's bearer inside base64 too: the whole base64 run), so a
    known value is masked whole even where its prefix looks like a key. ``extra`` is an
    outside redactor (the run's) applied last.
    """

    def __init__(
        self, secrets: Iterable[str] = (), extra: Callable[[str], str] | None = None
    ) -> None:
        self._known = SecretMatcher()
        for secret in secrets:
            self._known.add(secret)
        for value in secret_env_values(os.environ):
            self._known.add(value, min_length=AMBIENT_MIN_LENGTH)
        self._extra = extra

    def scrub(self, text: str) -> str:
        """Redact ``text`` without reshaping it (for log lines)."""
        text = self._known.sub(REDACTED, text)
        text = ROLLOUT_BEARER_IN_BASE64.sub(_PATTERN_MASK, text)
        text = _PATTERNS.sub(_PATTERN_MASK, text)
        if self._extra is not None:
            text = self._extra(text)
        return text

    def __call__(self, text: str) -> str:
        """Redact, collapse whitespace and truncate: the message a rollout is sent."""
        text = _WHITESPACE.sub(" ", self.scrub(text)).strip()
        return text[:MAX_ERROR_MESSAGE]
