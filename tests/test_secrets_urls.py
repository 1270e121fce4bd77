"""Secrets in and around URLs, and base64 wrapped across lines (rollout_server.net.secrets,
docs/spec/supervisor.md §8.3), in every redactor of the one policy: the launcher's
(``logs.txt``), the bridge's scrubber and the Harbor archive's."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from unittest import mock
from urllib.parse import quote, quote_plus

import pytest

from bridge.scrub import ErrorScrubber
from launcher.redact import REDACTED, Redactor
from launcher.rundir.logs import RunLog
from rollout_server.harbor.archive import scrub_bytes, secret_spellings
from rollout_server.net.secrets import SecretMatcher

# Reserved characters a URL encoder rewrites (+ / = & ? # % : @ and a space), and letters.
KEY = "Ab+Cd/Ef=Gh&Ij?Kl#Mn%Op:Qr@St Uv0123"


def _matcher(*values: str) -> SecretMatcher:
    matcher = SecretMatcher()
    for value in values:
        matcher.add(value)
    return matcher


def _launcher(*values: str) -> Redactor:
    """The launcher's redactor with ``values`` known as environment secrets."""
    redactor = Redactor()
    redactor.add_known_env({f"V{i}_API_KEY": value for i, value in enumerate(values)})
    return redactor


def _every_redactor(text: str, *values: str) -> dict[str, str]:
    """``text`` as each redactor of the policy leaves it, ``values`` being the known secrets."""
    with mock.patch.dict(os.environ, clear=True):
        bridge = ErrorScrubber(values).scrub(text)
    archived = scrub_bytes(text.encode(), secret_spellings(values))
    assert archived is not None  # not dropped: nothing survived the scrub
    return {"launcher": _launcher(*values)(text), "bridge": bridge, "archive": archived.decode()}


# -- a known secret, URL-encoded -----------------------------------------------------------


def _lower_hex(text: str) -> str:
    """``text`` (percent-encoded) with its ``%XX`` in lower-case hex."""
    head, *escapes = text.split("%")
    return "%".join([head, *(part[:2].lower() + part[2:] for part in escapes)])


@pytest.mark.parametrize(
    "encode",
    [
        lambda s: quote(s, safe=""),
        quote,  # "/" kept
        quote_plus,  # form-encoding: "+" for a space
        lambda s: _lower_hex(quote(s, safe="")),  # %2b, %2f, %3d
        lambda s: _lower_hex(quote_plus(s)),
    ],
)
def test_a_url_encoded_known_secret_is_redacted_everywhere(encode: Callable[[str], str]) -> None:
    spelled = encode(KEY)
    assert spelled != KEY
    text = f"GET /cb?state={spelled}&alt=sse HTTP/1.1"
    expected = f"GET /cb?state={REDACTED}&alt=sse HTTP/1.1"
    assert _every_redactor(text, KEY) == dict.fromkeys(("launcher", "bridge", "archive"), expected)


def test_percent_encoding_makes_nothing_else_a_secret() -> None:
    matcher = _matcher(KEY)
    for text in (
        quote(KEY[:10], safe="") + " half of it",  # a piece, not the secret
        quote("Ab+Cd/Ef=Gh&Ij?Kl#Mn%Op:Qr@St Uv0124", safe=""),  # another value
        "%2B%2F%3D%26 and Ab Cd Ef",
    ):
        assert matcher.sub(REDACTED, text) is text


def test_base64_in_a_url_is_redacted_whole() -> None:
    # A Basic credential passed in a query: its + / = are percent-encoded.
    key = "sk-live~~>>??Zq8-Wn3pL0xV7rT2"
    blob = base64.b64encode(f"user:{key}".encode()).decode()
    assert "+" in blob and "/" in blob and "=" in blob
    for spelled in (quote(blob, safe=""), _lower_hex(quote(blob, safe=""))):
        text = f"https://h.example/cb?state={spelled}&next=1"
        expected = f"https://h.example/cb?state={REDACTED}&next=1"
        assert _every_redactor(text, key) == dict.fromkeys(
            ("launcher", "bridge", "archive"), expected
        )
        assert _matcher(key).found(text)


# -- the password of a URL's user information ----------------------------------------------


@pytest.mark.parametrize(
    ("url", "password", "shown"),
    [
        ("postgres://app:hunter2@db:5432/x", "hunter2", "postgres://app:***@db:5432/x"),
        ("redis://:pw@host", "pw", "redis://:***@host"),
        (
            "https://user:ghp_tok3n@github.com/org/repo.git",
            "ghp_tok3n",
            "https://user:***@github.com/org/repo.git",
        ),
        ("amqp://guest:gu%40st@rabbit/vhost", "gu%40st", "amqp://guest:***@rabbit/vhost"),
        # RFC 3986: the host follows the last "@"; the user name ends at the first ":".
        ("postgres://app:p@ss@db/x", "p@ss", "postgres://app:***@db/x"),
        ("ftp://me@mail.example:pw@ftp.example/", "pw", "ftp://me@mail.example:***@ftp.example/"),
        (
            "mysql+pymysql://root:a:b;c@[::1]:3306/d",
            "a:b;c",
            "mysql+pymysql://root:***@[::1]:3306/d",
        ),
        ("HTTPS://U:P4ss@H?x=1#y", "P4ss", "HTTPS://U:***@H?x=1#y"),
    ],
)
def test_a_url_password_is_redacted_whatever_it_is(url: str, password: str, shown: str) -> None:
    expected = shown.replace("***", REDACTED)
    text = f"connecting to {url} failed: timeout"
    # The password is no known value; with secrets known or none.
    out = _every_redactor(text, "unrelated-known-secret")
    assert out["launcher"] == out["archive"] == f"connecting to {expected} failed: timeout"
    assert f":{password}@" not in out["bridge"]  # with its own mask of the user
    assert Redactor()(url) == expected
    assert SecretMatcher().sub(REDACTED, url) == expected
    assert SecretMatcher().found(url)
    assert not SecretMatcher().found(expected)


def test_a_url_password_is_redacted_in_logs_txt(tmp_path: Path) -> None:
    echoed: list[str] = []
    with RunLog(tmp_path / "logs.txt", Redactor(), echo=echoed.append) as log:
        log.info("rollout-server", "db=postgres://app:hunter2@db:5432/x", {"url": "redis://:pw@r"})
    written = (tmp_path / "logs.txt").read_text(encoding="utf-8")
    for shown in (written, echoed[0]):
        assert "hunter2" not in shown and ":pw@" not in shown
        assert f"postgres://app:{REDACTED}@db:5432/x" in shown
        assert f"redis://:{REDACTED}@r" in shown


def test_a_known_secret_that_is_a_whole_url_is_redacted_whole() -> None:
    url = "postgres://app:hunter2@db.internal:5432/prod"
    assert _launcher(url)(f"DSN {url} set") == f"DSN {REDACTED} set"


def test_a_redacted_url_stays_as_it_is() -> None:
    matcher = SecretMatcher()
    once = matcher.sub(REDACTED, "postgres://app:hunter2@db/x and https://u:t@h/")
    assert matcher.sub(REDACTED, once) is once
    assert not matcher.found(once)


@pytest.mark.parametrize(
    "text",
    [
        "user@host",
        "ssh user@host.example -p 22",
        "http://host:8080/path",
        "https://registry.npmjs.org:443/@types/node",  # a port, then an "@" in the path
        "http://user@host:8080/",  # a user without a password, and a port
        "ssh://git@github.com:22/org/repo",
        "http://host:8080?next=me@example.com",
        "http://host:8080#me@example.com",
        "http://host:8080 by me@example.com",
        '{"url":"http://h:80","mail":"me@example.com"}',
        "http://[::1]:8080/x",
        "write to alice@example.com or bob@example.org",
        "mailto:alice@example.com",
        "git@github.com:org/repo.git",
        "a:b@c",
        "x:y@z.example/path",
        "https://user:@host/",  # an empty password
        "://app:pw@db",  # no scheme
    ],
)
def test_text_that_is_no_url_password_is_left_alone(text: str) -> None:
    assert SecretMatcher().sub(REDACTED, text) is text
    assert _matcher(KEY).sub(REDACTED, text) is text
    assert not SecretMatcher().found(text)
    out = _every_redactor(text, KEY)
    assert out["launcher"] == out["archive"] == text
    assert REDACTED not in out["bridge"]  # the bridge's own credential shapes aside


# -- base64 wrapped across lines -----------------------------------------------------------

# Long enough that its base64 spans three lines at 64 or 76 columns, the last holding a piece
# of 8+ characters.
LONG = "sk-ant-api03-" + base64.b64encode(hashlib.sha512(b"a").digest() * 2).decode()[:117]

_Encoder = Callable[[bytes], bytes]


def _wrapped(data: bytes, width: int, encode: _Encoder) -> list[str]:
    blob = encode(data).decode()
    return [blob[i : i + width] for i in range(0, len(blob), width)]


def _pieces(lines: list[str]) -> set[str]:
    """Every 8-character piece of the base64 text the lines hold."""
    blob = "".join(lines)
    return {blob[i : i + 8] for i in range(len(blob) - 7)}


@pytest.mark.parametrize("width", [64, 76])
@pytest.mark.parametrize("before", ["", "u", "us", "user:"])  # every byte alignment
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_wrapped_base64_of_a_secret_leaves_no_piece_in_logs_txt(
    tmp_path: Path, width: int, before: str, encode: _Encoder
) -> None:
    lines = _wrapped((before + LONG).encode(), width, encode)
    assert len(lines) == 3
    echoed: list[str] = []
    with RunLog(tmp_path / "logs.txt", _launcher(LONG), echo=echoed.append) as log:
        for line in lines:  # a line at a time, as a child prints them
            log.info("rollout-server", line)
    written = (tmp_path / "logs.txt").read_text(encoding="utf-8")
    assert not {piece for piece in _pieces(lines) if piece in written}
    assert [line.rsplit(" ", 1)[-1] for line in echoed] == [REDACTED] * 3


def test_a_folded_basic_header_keeps_its_name() -> None:
    blob = base64.b64encode(f"user:{LONG}".encode()).decode()
    first, rest = f"Authorization: Basic {blob[:50]}", blob[50:]
    lines = [first] + ["    " + rest[i : i + 60] for i in range(0, len(rest), 60)]
    redactor = _launcher(LONG)
    out = [redactor(redactor.redact_fragments(line)) for line in lines]
    assert out == [f"Authorization: Basic {REDACTED}"] + [f"    {REDACTED}"] * (len(lines) - 1)


def test_wrapped_base64_without_a_secret_is_left_alone() -> None:
    redactor = _launcher(LONG, "another-known-secret-1234")
    lines = _wrapped(bytes(range(256)) * 3, 64, base64.b64encode)
    other = "sk-ant-api03-" + base64.b64encode(hashlib.sha512(b"b").digest() * 2).decode()[:117]
    lines += _wrapped(f"user:{other}".encode(), 64, base64.b64encode)
    for line in lines:
        assert redactor.redact_fragments(line) is line
        assert redactor(line) == line
