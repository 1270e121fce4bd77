"""Redaction is one mechanism, and no 8-byte piece of a secret survives it (issue 12).

For random secrets (configured: any length >= 1; known environment variables: >= 8 characters;
any characters: quotes, backslashes, unicode, whitespace) embedded in text that is then spelled
through a random chain of encoders (JSON, Python ``repr``, URL-encoding; up to three deep),
nothing written or printed — the run's ``logs.txt``, the terminal streams, the bridge's error
messages and log lines — holds any 8-byte sequence of the secret's UTF-8 bytes.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from bridge.scrub import ErrorScrubber
from launcher.redact import REDACTED, Redactor
from launcher.rundir.logs import RunLog
from launcher.ui import RedactingStream

WINDOW = 8

_ENCODERS: dict[str, Callable[[str], str]] = {
    "json": json.dumps,
    "json-utf8": lambda s: json.dumps(s, ensure_ascii=False),
    "json-solidus": lambda s: json.dumps(s).replace("/", "\\/"),
    "repr": repr,
    "repr-in-larger": lambda s: repr(f"said \"{s}\" 'x'"),
    "url": lambda s: urllib.parse.quote(s, safe=""),
    "url-path": urllib.parse.quote,
    "url-plus": urllib.parse.quote_plus,
}

_SECRETS = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
_PIPELINE = st.lists(st.sampled_from(sorted(_ENCODERS)), max_size=3).filter(
    # One URL-encoding at most: a doubly URL-encoded secret (%2541) is no spelling we claim.
    lambda chain: sum(name.startswith("url") for name in chain) <= 1
)
_CONTEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 :=", max_size=12)


def _windows(data: bytes) -> set[bytes]:
    return {data[i : i + WINDOW] for i in range(len(data) - WINDOW + 1)}


def _spell(text: str, chain: list[str]) -> str:
    for name in chain:
        text = _ENCODERS[name](text)
    return text


def _sinks(redactor: Redactor, scrubber: ErrorScrubber, text: str) -> dict[str, bytes]:
    """Everything a secret can reach: logs.txt, the terminal streams, the bridge's messages."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "logs.txt"
        echoed: list[str] = []
        with RunLog(path, redactor, echo=echoed.append) as log:
            log.error("result", text, {"error": text})
        written = path.read_bytes()
    terminal = io.StringIO()
    RedactingStream(terminal, redactor).write(text)
    return {
        "logs.txt": written,
        "--verbose": "\n".join(echoed).encode(),
        "terminal": terminal.getvalue().encode(),
        "bridge error": scrubber(text).encode(),
        "bridge log": scrubber.scrub(text).encode(),
    }


def _check(secret: str, before: str, after: str, chain: list[str], *, from_env: bool) -> None:
    # Context characters the secret does not hold, so whatever of the secret is found in the
    # output came from the secret (or is the marker and the encoders' own quoting, which a
    # control text with the marker in the secret's place shows).
    before = "".join(c for c in before if c not in secret)
    after = "".join(c for c in after if c not in secret)
    secret_bytes = secret.encode("utf-8")
    assume(not _windows(secret_bytes) & _windows((REDACTED * 3).encode()))
    text = _spell(before + secret + after, chain)
    control = _spell(before + REDACTED + after, chain)
    environ = {"ACME_API_KEY": secret} if from_env else {}
    with mock.patch.dict(os.environ, environ, clear=False):
        redactor = Redactor()
        if from_env:
            redactor.add_known_env(environ)
        else:
            redactor.add(secret)
        scrubber = ErrorScrubber([] if from_env else [secret])
        allowed = set().union(*(_windows(v) for v in _sinks(redactor, scrubber, control).values()))
        for sink, output in _sinks(redactor, scrubber, text).items():
            leaked = (_windows(secret_bytes) & _windows(output)) - allowed
            assert not leaked, (sink, chain, text, output, leaked)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(secret=_SECRETS, before=_CONTEXT, after=_CONTEXT, chain=_PIPELINE)
@example(
    secret="sk-proj-abc/def\"ghi\\jkl'mno é😀\n\t",
    before="k ",
    after=" z",
    chain=["json", "repr", "json"],
)
@example(secret="it's-a-secret-value", before="", after="", chain=["repr-in-larger"])
@example(secret='abcdefgh"ijklmnop', before="q=", after="", chain=["json", "url"])
@example(secret="  padded secret value  ", before="", after="", chain=[])
def test_a_configured_secret_leaves_no_8_byte_piece(
    secret: str, before: str, after: str, chain: list[str]
) -> None:
    _check(secret, before, after, chain, from_env=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    # An environment value can hold any character but NUL.
    secret=_SECRETS.filter(lambda s: len(s) >= 8 and "\x00" not in s),
    before=_CONTEXT,
    after=_CONTEXT,
    chain=_PIPELINE,
)
@example(secret="sk-\"key\\with/every'thing", before="", after="", chain=["json-solidus", "repr"])
def test_a_known_variable_leaves_no_8_byte_piece(
    secret: str, before: str, after: str, chain: list[str]
) -> None:
    _check(secret, before, after, chain, from_env=True)
